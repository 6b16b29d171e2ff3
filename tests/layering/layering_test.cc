// The layering rules of DESIGN §2, checked on every C++/CUDA source and header
// of swarm/, transports/, kernels/, models/ and apps/ (bench/ and tests/ are exempt).
//
// The rules (names as the failures print them; see layering_rules.h):
//   swarm-is-a-library        swarm/ never includes transports/, models/, kernels/ or apps/.
//   trainer-peer-independent  swarm/trainer never includes swarm/peer, nor swarm/peer swarm/trainer.
//   runtime-uses-concepts     runtimes (swarm/peer, swarm/trainer, swarm/averaging) never include an
//                             implementation: swarm/registry, transports/, swarm/compression,
//                             swarm/wiring, models/, kernels/.
//   kernels-see-core-and-api  kernels/ includes nothing from swarm/ but swarm/core and swarm/api.
//   api-is-concepts-only      swarm/api includes nothing of the project but swarm/core and swarm/api.
//   core-is-the-bottom        swarm/core includes nothing of the project outside swarm/core.
//   impl-never-sees-runtime   implementations (transports/, swarm/registry, swarm/compression,
//                             swarm/wiring, kernels/, models/) never include a runtime.
//
// The sources reach the test as Bazel inputs (each package's :layering_sources
// filegroup), so it re-runs whenever one changes; layering_files.txt lists them.
// A failure names file:line, the include and the rule.
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/layering/layering_rules.h"

namespace swarm::layering {
namespace {

std::vector<std::string_view> rules_broken_by(const std::string& file, const std::string& line) {
  std::vector<std::string_view> out;
  for (const Violation& v : check_file(file, line)) out.push_back(v.rule);
  return out;
}

bool catches(const std::string& file, const std::string& line, std::string_view rule) {
  auto broken = rules_broken_by(file, line);
  return std::find(broken.begin(), broken.end(), rule) != broken.end();
}

TEST_CASE("self-check: each rule catches a violating include") {
  // swarm-is-a-library
  CHECK(catches("swarm/wire/wire.h", "#include \"transports/zmq/zmq_transport.h\"", "swarm-is-a-library"));
  CHECK(catches("swarm/optim/optimizer.cc", "#include \"kernels/cpu/cpu_backend.h\"", "swarm-is-a-library"));
  CHECK(catches("swarm/data/split.cc", "#include \"models/gpt/config.h\"", "swarm-is-a-library"));
  CHECK(catches("swarm/protocol/records.h", "#include \"apps/chaos.h\"", "swarm-is-a-library"));
  // trainer-peer-independent
  CHECK(catches("swarm/trainer/trainer.h", "#include \"swarm/peer/peer.h\"", "trainer-peer-independent"));
  CHECK(catches("swarm/peer/peer.h", "#include \"swarm/trainer/trainer.h\"", "trainer-peer-independent"));
  // runtime-uses-concepts
  CHECK(catches("swarm/peer/peer.h", "#include \"swarm/registry/in_process_registry.h\"",
                "runtime-uses-concepts"));
  CHECK(catches("swarm/trainer/trainer.h", "#include \"transports/inproc/inproc_transport.h\"",
                "runtime-uses-concepts"));
  CHECK(catches("swarm/averaging/all_reduce.h", "#include \"swarm/compression/codecs.h\"",
                "runtime-uses-concepts"));
  CHECK(catches("swarm/trainer/trainer.h", "#include \"swarm/wiring/stochastic_wiring.h\"",
                "runtime-uses-concepts"));
  CHECK(catches("swarm/peer/peer.h", "#include \"models/gpt/gpt_stage.h\"", "runtime-uses-concepts"));
  CHECK(catches("swarm/averaging/progress.cc", "#include \"kernels/cpu/ops.h\"", "runtime-uses-concepts"));
  // kernels-see-core-and-api
  CHECK(catches("kernels/cuda/quantize.cu", "#include \"swarm/compression/blockwise8.h\"",
                "kernels-see-core-and-api"));
  CHECK(catches("kernels/cpu/ops.h", "#include \"swarm/wire/wire.h\"", "kernels-see-core-and-api"));
  // api-is-concepts-only
  CHECK(catches("swarm/api/transport.h", "#include \"swarm/wire/wire.h\"", "api-is-concepts-only"));
  CHECK(catches("swarm/api/stage.h", "#include \"models/gpt/config.h\"", "api-is-concepts-only"));
  // core-is-the-bottom
  CHECK(catches("swarm/core/tensor.h", "#include \"swarm/api/backend.h\"", "core-is-the-bottom"));
  CHECK(catches("swarm/core/log.cc", "#include \"third_party/stub.h\"", "core-is-the-bottom"));
  // policy-is-pure
  CHECK(catches("swarm/rebalance/rebalancer.cc", "#include \"swarm/registry/dht_registry.h\"", "policy-is-pure"));
  CHECK(catches("swarm/rebalance/rebalancer.h", "#include \"swarm/peer/peer.h\"", "policy-is-pure"));
  CHECK(rules_broken_by("swarm/rebalance/rebalancer.cc", "#include \"swarm/core/random.h\"").empty());
  CHECK(rules_broken_by("swarm/peer/rebalancing.h", "#include \"swarm/rebalance/rebalancer.h\"").empty());

  // impl-never-sees-runtime
  CHECK(catches("transports/zmq/zmq_transport.h", "#include \"swarm/peer/peer.h\"", "impl-never-sees-runtime"));
  CHECK(catches("swarm/registry/dht_registry.cc", "#include \"swarm/averaging/progress.h\"",
                "impl-never-sees-runtime"));
  CHECK(catches("swarm/compression/codecs.h", "#include \"swarm/trainer/trainer.h\"", "impl-never-sees-runtime"));
  CHECK(catches("swarm/wiring/router.h", "#include \"swarm/trainer/trainer.h\"", "impl-never-sees-runtime"));
  CHECK(catches("kernels/cpu/ops.h", "#include \"swarm/averaging/all_reduce.h\"", "impl-never-sees-runtime"));
  CHECK(catches("models/gpt/gpt_stage.h", "#include \"swarm/peer/peer.h\"", "impl-never-sees-runtime"));
}

TEST_CASE("self-check: the spellings of an include are all caught") {
  CHECK(catches("swarm/peer/peer.h", "  #  include   \"transports/zmq/zmq_transport.h\"  // why", "swarm-is-a-library"));
  CHECK(catches("swarm/peer/peer.h", "#include <transports/zmq/zmq_transport.h>", "runtime-uses-concepts"));
  CHECK(catches("swarm/peer/peer.h", "#include \"swarm/peer/../trainer/trainer.h\"", "trainer-peer-independent"));
  // Relative to the including file, as the compiler resolves it.
  const std::set<std::string> known = {"swarm/peer/peer.h", "swarm/trainer/trainer.h"};
  auto found = check_file("swarm/trainer/trainer.h", "#include \"../peer/peer.h\"", known);
  REQUIRE(found.size() == 1);
  CHECK(found[0].rule == "trainer-peer-independent");
  CHECK(found[0].include == "swarm/peer/peer.h");
  // One include may break several rules; each is reported, with its line.
  auto both = check_file("swarm/averaging/a.h", "// header\n\n#include \"transports/netem/netem_transport.h\"\n");
  REQUIRE(both.size() == 2);
  CHECK(both[0].line == 3);
  CHECK(both[0].rule == "swarm-is-a-library");
  CHECK(both[1].rule == "runtime-uses-concepts");
  CHECK(both[0].describe().find("swarm/averaging/a.h:3: includes \"transports/netem/netem_transport.h\"") == 0);
}

TEST_CASE("self-check: allowed includes pass") {
  CHECK(rules_broken_by("swarm/peer/peer.h", "#include \"swarm/api/stage.h\"").empty());
  CHECK(rules_broken_by("swarm/peer/peer.h", "#include \"swarm/peer/stage_state.h\"").empty());
  CHECK(rules_broken_by("swarm/peer/peer.h", "#include \"swarm/averaging/all_reduce.h\"").empty());
  CHECK(rules_broken_by("swarm/peer/peer.h", "#include \"swarm/protocol/records.h\"").empty());
  CHECK(rules_broken_by("swarm/trainer/trainer.h", "#include \"swarm/wire/wire.h\"").empty());
  CHECK(rules_broken_by("swarm/trainer/trainer.h", "#include \"swarm/api/router.h\"").empty());
  CHECK(rules_broken_by("kernels/cpu/cpu_backend.h", "#include \"swarm/api/backend.h\"").empty());
  CHECK(rules_broken_by("kernels/cuda/quantize.cu", "#include \"swarm/core/codebook8.h\"").empty());
  CHECK(rules_broken_by("kernels/cuda/layernorm.cu", "#include \"kernels/common/row_stats.h\"").empty());
  CHECK(rules_broken_by("swarm/api/transport.h", "#include \"swarm/core/frame.h\"").empty());
  CHECK(rules_broken_by("swarm/api/stage.h", "#include <vector>").empty());
  CHECK(rules_broken_by("swarm/core/log.h", "#include \"swarm/core/status.h\"").empty());
  CHECK(rules_broken_by("swarm/core/log.h", "#include <fmt/format.h>").empty());
  CHECK(rules_broken_by("transports/zmq/zmq_transport.h", "#include \"swarm/wire/wire.h\"").empty());
  CHECK(rules_broken_by("transports/zmq/zmq_transport.h", "#include \"swarm/api/transport.h\"").empty());
  CHECK(rules_broken_by("models/gpt/gpt_stage.h", "#include \"kernels/cpu/cpu_backend.h\"").empty());
  CHECK(rules_broken_by("swarm/registry/dht_registry.h", "#include \"swarm/api/registry.h\"").empty());
  // apps/ picks the implementations and instantiates the runtimes.
  CHECK(rules_broken_by("apps/swarm_roles.cc", "#include \"swarm/peer/peer.h\"").empty());
  CHECK(rules_broken_by("apps/swarm_roles.cc", "#include \"transports/zmq/zmq_transport.h\"").empty());
  // bench/ and tests/ are exempt.
  CHECK(rules_broken_by("tests/swarm/x_test.cc", "#include \"transports/zmq/zmq_transport.h\"").empty());
  CHECK(rules_broken_by("bench/routing_bench.cc", "#include \"swarm/peer/peer.h\"").empty());
  // Commented out, or inside a string: no include.
  CHECK(rules_broken_by("swarm/peer/peer.h", "// #include \"transports/zmq/zmq_transport.h\"").empty());
  CHECK(rules_broken_by("swarm/peer/peer.h", "/*\n#include \"transports/zmq/zmq_transport.h\"\n*/").empty());
  CHECK(rules_broken_by("swarm/peer/peer.h", "/* a */ int x; // #include \"models/gpt/config.h\"").empty());
  CHECK(rules_broken_by("swarm/peer/peer.h", "const char* s = \"#include \\\"models/gpt/config.h\\\"\";").empty());
  // A block comment ends; the include after it counts.
  CHECK(catches("swarm/peer/peer.h", "/* x */ #include \"models/gpt/config.h\"", "runtime-uses-concepts"));
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST_CASE("the sources keep the layering rules") {
  // Written by the :layering_file_list genrule from every :layering_sources filegroup;
  // the test runs in its runfiles tree, where these paths are the sources themselves.
  std::ifstream list("tests/layering/layering_files.txt");
  REQUIRE_MESSAGE(list.good(), "tests/layering/layering_files.txt is missing from the runfiles");
  std::set<std::string> files;
  for (std::string line; std::getline(list, line);) {
    if (!line.empty()) files.insert(line);
  }
  // A broken glob or a dropped filegroup must not pass as "no violations".
  REQUIRE_MESSAGE(!files.empty(), "no sources to check: the :layering_sources filegroups are empty");
  for (std::string dir : {"swarm/core", "swarm/api", "swarm/peer", "swarm/trainer", "swarm/averaging",
                          "transports", "kernels", "models", "apps"}) {
    const bool present = std::any_of(files.begin(), files.end(), [&](const std::string& f) { return under(f, dir); });
    CHECK_MESSAGE(present, "no sources of ", dir, "/ reached the test: is its :layering_sources filegroup listed?");
  }

  std::vector<Violation> violations;
  for (const std::string& file : files) {
    std::ifstream in(file, std::ios::binary);
    REQUIRE_MESSAGE(in.good(), "cannot read ", file);
    for (Violation& v : check_file(file, read_all(file), files)) violations.push_back(std::move(v));
  }
  MESSAGE("checked ", files.size(), " files");
  for (const Violation& v : violations) FAIL_CHECK(v.describe());
  CHECK(violations.empty());
}

}  // namespace
}  // namespace swarm::layering
