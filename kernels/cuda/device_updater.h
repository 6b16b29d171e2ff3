// device_updater: the CUDA model of ParameterUpdater, AdamW or LAMB over fp32 master weights,
// gradients and moments that all live in device memory.
//
// Design: the CPU model (swarm/optim/host_updater.h) is the specification; this class only moves
// the arithmetic to the device, through the kernels that are already bit-identical to it:
// global_grad_norm (grad_norm.h) writes the norm, the clip coefficient and the refusal flag into
// a GradNormResult in device memory, then adamw_step / lamb_step (optimizer.h) read them, so a
// step is three or four launches with no host round trip in between. The host learns the outcome
// once, at the end, when it reads the GradNormResult back after synchronizing the stream: a
// refused step (non-finite norm) changed nothing on the device, is not counted, and keeps any
// moments it would have created, exactly as on the CPU.
//   - One blocking stream owned by the updater, created on the first step (so an updater can be
//     built where no device exists); it orders after the legacy default stream the stages and the
//     allocator use. Every step ends synchronized: the runtime reads the weights right after.
//   - Memory comes from the project's device allocator (installed on first use). The moments are
//     device tensors per parameter name; the DeviceParamList uploaded for the kernels is kept and
//     rebuilt only when a pointer, a size or a decay flag changes, which in training is never.
//   - step_with_gradients copies the host gradient into a pinned buffer, then one async upload
//     into a device staging buffer; both are kept across calls.
//   - Everything the CPU rejects is rejected before the device is touched, with the same texts.
//
// The optimizer's settings are swarm::optim's OptimizerConfig and Rule, but kernels/ may include
// only swarm/core and swarm/api (DESIGN §2), so they are declared, not included, here: the
// constructor is a template pinned to exactly those two types, instantiated by callers that have
// swarm/optim/optimizer.h (swarm/peer's Replica does).
//
//   swarm::cuda::DeviceUpdater lamb(config, swarm::optim::Rule::lamb);
//   SWARM_RETURN_IF_ERROR(lamb.step_with_gradients(stage.parameter_views(), averaged, lr));
//   SWARM_ASSIGN_OR_RETURN(auto state, lamb.export_state());   // host tensors, swarm/optim's names
#pragma once

#include <cuda_runtime_api.h>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/grad_norm.h"
#include "swarm/api/stage.h"
#include "swarm/api/updater.h"
#include "swarm/core/status.h"
#include "swarm/core/tensor.h"

namespace swarm::optim {
struct OptimizerConfig;  // swarm/optim/optimizer.h
enum class Rule;         // swarm/optim/optimizer.h: adamw, lamb
}  // namespace swarm::optim

namespace swarm::cuda {
namespace detail {

// A cudaStream_t created on first use and destroyed with its owner.
class OwnedStream {
 public:
  OwnedStream() = default;
  OwnedStream(OwnedStream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}
  OwnedStream& operator=(OwnedStream&& other) noexcept;
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  ~OwnedStream();

  // Creates the stream (blocking, on the current device) the first time.
  Result<cudaStream_t> get();

 private:
  cudaStream_t stream_ = nullptr;
};

// Page-locked host floats (cudaHostAlloc), grown on demand, for async uploads.
class PinnedFloats {
 public:
  PinnedFloats() = default;
  PinnedFloats(PinnedFloats&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), capacity_(std::exchange(other.capacity_, 0)) {}
  PinnedFloats& operator=(PinnedFloats&& other) noexcept;
  PinnedFloats(const PinnedFloats&) = delete;
  PinnedFloats& operator=(const PinnedFloats&) = delete;
  ~PinnedFloats();

  // Room for at least n floats; the old contents are not kept.
  Status reserve(size_t n);
  float* data() const { return data_; }

 private:
  void release();

  float* data_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace detail

class DeviceUpdater {
 public:
  using updater_concept = updater_t;
  static constexpr Device device = Device::cuda;

  // As HostUpdater(config, rule): Rule::adamw, else LAMB. A bad config is reported by every step.
  template <typename Config, typename RuleT>
    requires std::same_as<Config, optim::OptimizerConfig> && std::same_as<RuleT, optim::Rule>
  DeviceUpdater(const Config& config, RuleT rule)
      : DeviceUpdater(Settings{config.beta1, config.beta2, config.eps, config.weight_decay, config.clip_norm,
                               config.max_trust_ratio, rule != RuleT::adamw},
                      config.validate()) {}

  // Clips by the global norm of the params' grads and updates their values in place. Every value
  // and grad must be f32 on cuda. Errors (invalid_argument) as the CPU optimizer's, and a
  // non-finite norm; on error no weight, moment or step count changes. CUDA failures are
  // reported with file:line.
  Status step(std::span<const StageParameterView> params, float lr);

  // As step, with the gradient given on the host, concatenated in params order (view.grad is
  // ignored); it must have exactly as many values as the params.
  Status step_with_gradients(std::span<const StageParameterView> params, std::span<const float> gradients,
                             float lr);

  int64_t steps_taken() const { return steps_; }

  // Host copies: "adam.m/<name>" and "adam.v/<name>" (f32, the param's shape) in name order, then
  // "optimizer.step" (one i64), as swarm::optim exports them.
  Result<OptimizerState> export_state() const;
  // Replaces the whole state with a (host) state as export_state makes, or on error keeps the
  // current one. Checks as swarm::optim's import_state.
  Status import_state(const OptimizerState& state);

 private:
  struct Settings {
    float beta1 = 0.9f;
    float beta2 = 0.95f;
    float eps = 1e-6f;
    float weight_decay = 0.01f;
    float clip_norm = 1.0f;
    float max_trust_ratio = 10.0f;
    bool lamb = true;
  };
  struct Moments {
    Tensor m;  // f32 on cuda, the param's shape
    Tensor v;
  };
  using MomentMap = std::map<std::string, Moments, std::less<>>;

  DeviceUpdater(const Settings& settings, Status config_status)
      : settings_(settings), config_status_(std::move(config_status)) {}

  Status validate(std::span<const StageParameterView> params, float lr, bool check_grads) const;
  Result<cudaStream_t> ready_stream();
  Status upload_gradients(std::span<const float> gradients, cudaStream_t stream);
  Status run_step(std::span<const StageParameterView> params, float lr, cudaStream_t stream);
  Status use_params(std::span<const StageParameterView> params, const MomentMap& created);
  Status launch(float lr, cudaStream_t stream);
  Result<GradNormResult> finish(cudaStream_t stream);

  Settings settings_;
  Status config_status_;  // OptimizerConfig::validate() of the config given
  MomentMap moments_;
  int64_t steps_ = 0;

  detail::OwnedStream stream_;
  Tensor grad_norm_;         // one GradNormResult in device memory
  DeviceParamList list_;     // the last params stepped, as the kernels see them
  Tensor staging_;           // device f32: the gradient of step_with_gradients
  detail::PinnedFloats pinned_;
};

static_assert(ParameterUpdater<DeviceUpdater>);

}  // namespace swarm::cuda
