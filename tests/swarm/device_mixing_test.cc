// The replicas of one stage step on one device: a peer refuses to start on, or
// move into, a stage that peers of another device announce, with an error that
// names both devices; announcements carry the device, and a peer whose stage
// steps on CUDA announces "cuda". The CUDA side here is a HostUpdater labelled
// Device::cuda, so the test runs without a GPU: what is checked is the refusal,
// which reads only the label.
#include <string>

#include <doctest/doctest.h>

#include "kernels/cpu/cpu_backend.h"
#include "models/gpt/gpt_stage.h"
#include "swarm/compression/codecs.h"
#include "swarm/optim/host_updater.h"
#include "swarm/peer/peer.h"
#include "swarm/registry/in_process_registry.h"
#include "tests/swarm/tiny_gpt.h"
#include "transports/inproc/inproc_transport.h"

namespace swarm {
namespace {

using CpuStage = gpt::GptStage<CpuBackend>;

struct CudaLabelledUpdater : optim::HostUpdater {
  using HostUpdater::HostUpdater;
  static constexpr Device device = Device::cuda;
};
static_assert(ParameterUpdater<CudaLabelledUpdater>);

// The CPU GPT stage, as a stage whose replicas would step on CUDA.
struct CudaLabelledStage : CpuStage {
  using updater_type = CudaLabelledUpdater;
  explicit CudaLabelledStage(CpuStage stage) : CpuStage(std::move(stage)) {}
};
static_assert(Stage<CudaLabelledStage>);
static_assert(std::same_as<stage_updater_t<CudaLabelledStage>, CudaLabelledUpdater>);
static_assert(std::same_as<stage_updater_t<CpuStage>, optim::HostUpdater>);

using CpuPeer = Peer<CpuStage, InprocTransport, InProcessRegistry, compression::StandardCodecs>;
using CudaPeer = Peer<CudaLabelledStage, InprocTransport, InProcessRegistry, compression::StandardCodecs>;

PeerConfig config_for(int stage, const std::string& id) {
  PeerConfig config;
  config.stage_index = stage;
  config.num_stages = 2;
  config.peer_id = id;
  config.bind_address = "inproc://" + id;
  config.announce_period_seconds = 0.05;
  config.announce_ttl_seconds = 5.0;
  return config;
}

Result<CpuStage> cpu_stage(int index) {
  return CpuStage::create(testing::tiny_gpt_config(), (*gpt::partition_layers(testing::tiny_gpt_config(), 2))[index], 7);
}
Result<CudaLabelledStage> cuda_stage(int index) {
  SWARM_ASSIGN_OR_RETURN(CpuStage stage, cpu_stage(index));
  return CudaLabelledStage(std::move(stage));
}

// Waits, with a deadline, until `peer` is announced on `stage` with `device`.
bool announced(InProcessRegistry& registry, const std::string& peer, int stage, const std::string& device) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < deadline) {
    auto peers = read_stage_announcements(registry, 2);
    auto it = peers.find(peer);
    if (it != peers.end() && it->second.stage == stage && it->second.device == device) return true;
    std::this_thread::yield();
  }
  return false;
}

TEST_CASE("a peer refuses to start on, or move into, a stage served on another device") {
  InProcessRegistry registry;
  CpuPeer on_cpu(config_for(1, "cpu-s1"), cpu_stage, &registry);
  REQUIRE(on_cpu.start().is_ok());
  REQUIRE(announced(registry, "cpu-s1", 1, "cpu"));

  // Starting on the CPU peer's stage is refused before it serves or announces anything.
  CudaPeer joiner(config_for(1, "cuda-s1"), cuda_stage, &registry);
  Status refused = joiner.start();
  CHECK(refused.code() == StatusCode::failed_precondition);
  CHECK_MESSAGE(refused.message().find("stage 1 is served by peer cpu-s1, whose replica steps on cpu; this peer's "
                                       "steps on cuda") != std::string::npos,
                refused.message());
  CHECK(read_stage_announcements(registry, 2).count("cuda-s1") == 0);

  // An empty stage is fine, and the peer announces where it steps.
  CudaPeer mover(config_for(0, "cuda-s0"), cuda_stage, &registry);
  REQUIRE(mover.start().is_ok());
  REQUIRE(announced(registry, "cuda-s0", 0, "cuda"));
  // A move into the CPU stage is refused; the peer keeps serving its own stage.
  CHECK_FALSE(mover.move_to(1));
  CHECK(mover.stage_index() == 0);
  CHECK(mover.stats().moves == 0);
  // And a CPU peer may join the CPU stage.
  CpuPeer mate(config_for(1, "cpu-s1b"), cpu_stage, &registry);
  CHECK(mate.start().is_ok());
}

TEST_CASE("a forged announcement of another device cannot shut a served stage to its peers") {
  InProcessRegistry registry;
  CpuPeer honest(config_for(1, "cpu-s1"), cpu_stage, &registry);
  REQUIRE(honest.start().is_ok());
  REQUIRE(announced(registry, "cpu-s1", 1, "cpu"));
  // A member claims a CUDA peer on both stages; nothing serves behind it.
  PeerAnnouncementRecord forged{"forged1", "inproc://nowhere", 1, 1e6, 0, true, "cuda"};
  REQUIRE(registry.announce(stage_registry_key(1), "forged1", forged.to_json(), registry.now() + 60).is_ok());
  forged.peer_id = "forged0";
  forged.stage = 0;
  REQUIRE(registry.announce(stage_registry_key(0), "forged0", forged.to_json(), registry.now() + 60).is_ok());
  REQUIRE(read_stage_announcements(registry, 2).at("forged1").device == "cuda");
  // Stage 1 has a CPU peer: a CPU joiner is accepted beside the forgery.
  CpuPeer joiner(config_for(1, "cpu-s1b"), cpu_stage, &registry);
  CHECK(joiner.start().is_ok());
  // Stage 0 holds the forged record alone: as far as any peer can tell it steps on CUDA.
  CpuPeer lone(config_for(0, "cpu-s0"), cpu_stage, &registry);
  CHECK(lone.start().code() == StatusCode::failed_precondition);
}

}  // namespace
}  // namespace swarm