// See device_updater.h for the design. The checks and their texts follow swarm/optim's
// optimizer.cc (AdamState::validate / import_state, prepare_step) and host_updater.h.
#include "kernels/cuda/device_updater.h"

#include <cmath>
#include <cstring>
#include <set>
#include <string_view>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/cuda/optimizer.h"
#include "swarm/core/optim_math.h"
#include "swarm/core/optimizer_state.h"

namespace swarm::cuda {
namespace {

bool is_cuda_f32(const TensorView& t) { return t.dtype() == DType::f32 && t.device() == Device::cuda; }

bool same_param(const DeviceParam& a, const DeviceParam& b) {
  return a.weight == b.weight && a.grad == b.grad && a.m == b.m && a.v == b.v && a.compute_copy == b.compute_copy &&
         a.numel == b.numel && a.apply_weight_decay == b.apply_weight_decay;
}

bool same_params(std::span<const DeviceParam> a, std::span<const DeviceParam> b) {
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k) {
    if (!same_param(a[k], b[k])) return false;
  }
  return true;
}

}  // namespace

namespace detail {

OwnedStream& OwnedStream::operator=(OwnedStream&& other) noexcept {
  if (this != &other) {
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

// A destructor cannot report; cudaStreamDestroy only fails once the context is gone.
OwnedStream::~OwnedStream() {
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
}

Result<cudaStream_t> OwnedStream::get() {
  if (stream_ == nullptr) SWARM_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamDefault));
  return stream_;
}

PinnedFloats& PinnedFloats::operator=(PinnedFloats&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    capacity_ = std::exchange(other.capacity_, 0);
  }
  return *this;
}

PinnedFloats::~PinnedFloats() { release(); }

void PinnedFloats::release() {
  if (data_ != nullptr) (void)cudaFreeHost(data_);
  data_ = nullptr;
  capacity_ = 0;
}

Status PinnedFloats::reserve(size_t n) {
  if (n <= capacity_) return Status::ok();
  release();
  void* memory = nullptr;
  SWARM_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&memory, n * sizeof(float), cudaHostAllocDefault));
  data_ = static_cast<float*>(memory);
  capacity_ = n;
  return Status::ok();
}

}  // namespace detail

Status DeviceUpdater::step(std::span<const StageParameterView> params, float lr) {
  SWARM_RETURN_IF_ERROR(validate(params, lr, /*check_grads=*/true));
  SWARM_ASSIGN_OR_RETURN(cudaStream_t stream, ready_stream());
  return run_step(params, lr, stream);
}

Status DeviceUpdater::step_with_gradients(std::span<const StageParameterView> params,
                                          std::span<const float> gradients, float lr) {
  size_t offset = 0;
  for (const auto& view : params) {
    const auto n = static_cast<size_t>(view.value.numel());
    if (n > gradients.size() - offset) {
      return invalid_argument("a gradient of {} values is too short for the stage", gradients.size());
    }
    offset += n;
  }
  if (offset != gradients.size()) {
    return invalid_argument("a gradient of {} values for a stage of {}", gradients.size(), offset);
  }
  SWARM_RETURN_IF_ERROR(validate(params, lr, /*check_grads=*/false));
  SWARM_ASSIGN_OR_RETURN(cudaStream_t stream, ready_stream());
  SWARM_RETURN_IF_ERROR(upload_gradients(gradients, stream));
  std::vector<StageParameterView> views(params.begin(), params.end());
  float* staged = static_cast<float*>(staging_.raw_data());
  offset = 0;
  for (auto& view : views) {
    view.grad = TensorView(staged + offset, DType::f32, view.value.shape(), Device::cuda);
    offset += static_cast<size_t>(view.value.numel());
  }
  return run_step(views, lr, stream);
}

// AdamState::validate and prepare_step's checks, for device tensors. check_grads = false skips
// the grads (step_with_gradients makes them).
Status DeviceUpdater::validate(std::span<const StageParameterView> params, float lr, bool check_grads) const {
  SWARM_RETURN_IF_ERROR(config_status_.with_context("optimizer config"));
  SWARM_RETURN_IF_ERROR(validate_learning_rate(lr));
  std::set<std::string_view> seen;
  for (const StageParameterView& p : params) {
    if (p.name.empty()) return invalid_argument("a parameter has an empty name");
    if (!seen.insert(p.name).second) return invalid_argument("parameter '{}' is listed twice", p.name);
    if (!check_grads && !is_cuda_f32(p.value)) {
      return invalid_argument("parameter '{}': value {} must be f32 on cuda", p.name, p.value.describe());
    }
    if (check_grads && (!is_cuda_f32(p.value) || !is_cuda_f32(p.grad))) {
      return invalid_argument("parameter '{}': value {} and grad {} must both be f32 on cuda", p.name,
                              p.value.describe(), p.grad.describe());
    }
    if (check_grads && !(p.value.shape() == p.grad.shape())) {
      return invalid_argument("parameter '{}': value shape {} but grad shape {}", p.name,
                              p.value.shape().to_string(), p.grad.shape().to_string());
    }
    if (p.value.numel() > 0 && (p.value.raw_data() == nullptr || (check_grads && p.grad.raw_data() == nullptr))) {
      return invalid_argument("parameter '{}' has no data", p.name);
    }
    auto it = moments_.find(p.name);
    if (it != moments_.end() && !(it->second.m.shape() == p.value.shape())) {
      return invalid_argument("parameter '{}' has shape {} but its optimizer state has {}", p.name,
                              p.value.shape().to_string(), it->second.m.shape().to_string());
    }
  }
  return Status::ok();
}

// The allocator, the stream and the GradNormResult, made on first use.
Result<cudaStream_t> DeviceUpdater::ready_stream() {
  SWARM_RETURN_IF_ERROR(install_cuda_allocator());
  SWARM_ASSIGN_OR_RETURN(cudaStream_t stream, stream_.get());
  if (!grad_norm_.defined()) {
    SWARM_ASSIGN_OR_RETURN(grad_norm_,
                           Tensor::zeros(Shape{static_cast<int64_t>(sizeof(GradNormResult))}, DType::u8, Device::cuda));
  }
  return stream;
}

// Host gradient -> pinned buffer -> staging_ (async on `stream`; the step's end waits for it).
Status DeviceUpdater::upload_gradients(std::span<const float> gradients, cudaStream_t stream) {
  const size_t n = gradients.size();
  if (n == 0) return Status::ok();
  if (!staging_.defined() || static_cast<size_t>(staging_.numel()) < n) {
    staging_ = Tensor();  // hand the old block back before asking for a bigger one
    SWARM_ASSIGN_OR_RETURN(staging_, Tensor::empty(Shape{static_cast<int64_t>(n)}, DType::f32, Device::cuda));
  }
  SWARM_RETURN_IF_ERROR(pinned_.reserve(n));
  std::memcpy(pinned_.data(), gradients.data(), n * sizeof(float));
  SWARM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(staging_.raw_data(), pinned_.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream));
  return Status::ok();
}

// Validated params: zero moments for new names (kept only if the step is not refused), the
// kernels, then the outcome. A CUDA failure after the launch may leave the step half applied.
Status DeviceUpdater::run_step(std::span<const StageParameterView> params, float lr, cudaStream_t stream) {
  MomentMap created;
  for (const StageParameterView& p : params) {
    if (moments_.count(p.name) != 0) continue;
    SWARM_ASSIGN_OR_RETURN(Tensor m, Tensor::zeros(p.value.shape(), DType::f32, Device::cuda));
    SWARM_ASSIGN_OR_RETURN(Tensor v, Tensor::zeros(p.value.shape(), DType::f32, Device::cuda));
    created.emplace(p.name, Moments{std::move(m), std::move(v)});
  }
  SWARM_RETURN_IF_ERROR(use_params(params, created));
  const Status launched = launch(lr, stream);
  Result<GradNormResult> outcome = finish(stream);  // also after a failed launch: nothing may still run
  SWARM_RETURN_IF_ERROR(launched);
  if (!outcome.is_ok()) return outcome.status();
  if (outcome.value().refused != 0) {
    return invalid_argument("global gradient norm {} is not finite; step skipped", outcome.value().norm);
  }
  moments_.merge(created);
  ++steps_;
  return Status::ok();
}

// Points list_ at the params, their moments (existing or `created`) and grads.
Status DeviceUpdater::use_params(std::span<const StageParameterView> params, const MomentMap& created) {
  std::vector<DeviceParam> wanted;
  wanted.reserve(params.size());
  for (const StageParameterView& p : params) {
    auto it = moments_.find(p.name);
    const Moments& moments = it != moments_.end() ? it->second : created.find(p.name)->second;
    wanted.push_back(DeviceParam{p.value.data<float>(), p.grad.data<const float>(), moments.m.data<float>(),
                                 moments.v.data<float>(), /*compute_copy=*/nullptr, p.value.numel(),
                                 p.apply_weight_decay});
  }
  if (same_params(wanted, list_.params())) return Status::ok();
  SWARM_ASSIGN_OR_RETURN(DeviceParamList list, DeviceParamList::create(wanted));
  list_ = std::move(list);
  return Status::ok();
}

// The norm, then the update of the rule, queued on `stream`.
Status DeviceUpdater::launch(float lr, cudaStream_t stream) {
  auto* norm = static_cast<GradNormResult*>(grad_norm_.raw_data());
  SWARM_RETURN_IF_ERROR(global_grad_norm(list_, settings_.clip_norm, norm, stream));
  const optim::AdamCoefficients c =
      optim::adam_coefficients(settings_.beta1, settings_.beta2, settings_.eps, steps_ + 1);
  if (settings_.lamb) {
    return lamb_step(list_, norm, c, lr, settings_.weight_decay, settings_.max_trust_ratio, stream);
  }
  return adamw_step(list_, norm, c, lr, settings_.weight_decay, stream);
}

// Waits for the step and reads its GradNormResult back.
Result<GradNormResult> DeviceUpdater::finish(cudaStream_t stream) {
  GradNormResult result;
  SWARM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&result, grad_norm_.raw_data(), sizeof(result), cudaMemcpyDeviceToHost, stream));
  SWARM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return result;
}

Result<OptimizerState> DeviceUpdater::export_state() const {
  OptimizerState entries;
  entries.reserve(2 * moments_.size() + 1);
  for (const auto& [name, moments] : moments_) {
    SWARM_ASSIGN_OR_RETURN(Tensor m, Tensor::copy_of(moments.m, Device::cpu));
    SWARM_ASSIGN_OR_RETURN(Tensor v, Tensor::copy_of(moments.v, Device::cpu));
    entries.emplace_back(std::string(kFirstMomentPrefix) + name, std::move(m));
    entries.emplace_back(std::string(kSecondMomentPrefix) + name, std::move(v));
  }
  SWARM_ASSIGN_OR_RETURN(Tensor step, Tensor::zeros(Shape{1}, DType::i64));
  step.data<int64_t>()[0] = steps_;
  entries.emplace_back(std::string(kStepStateName), std::move(step));
  return entries;
}

Status DeviceUpdater::import_state(const OptimizerState& state) {
  SWARM_ASSIGN_OR_RETURN(ParsedOptimizerState parsed, parse_optimizer_state(state));
  if (!parsed.moments.empty()) SWARM_RETURN_IF_ERROR(install_cuda_allocator());
  MomentMap uploaded;  // all uploads first: a failure keeps the current state
  for (const auto& [param, host] : parsed.moments) {
    SWARM_ASSIGN_OR_RETURN(Tensor m, Tensor::copy_of(*host.m, Device::cuda));
    SWARM_ASSIGN_OR_RETURN(Tensor v, Tensor::copy_of(*host.v, Device::cuda));
    uploaded.emplace(param, Moments{std::move(m), std::move(v)});
  }
  moments_ = std::move(uploaded);
  steps_ = parsed.steps;
  return Status::ok();
}

}  // namespace swarm::cuda
