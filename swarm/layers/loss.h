// loss: the last layer of the stage that takes the targets. Each gives the mean
// loss as f32 [1] and, on backward, the gradient of d(loss) * mean loss.
//
// A swarm stacks requests into one batch and expects the batch's loss to be
// the rows' mean (swarm/testing/stage_check.h), so both losses average over
// rows; the MSE also over each row's features, i.e. over all elements.
//
//   SoftmaxCrossEntropy<Cpu>  logits f32 [rows, classes], targets i32 [rows] class ids
//   SoftmaxCrossEntropy<Cpu, ReportAccuracy>  the same, and its forward also gives the
//                             fraction of rows whose largest logit is the target's:
//                             f32 [2] = [loss, accuracy] (metric_names(): "accuracy")
//   MeanSquaredError<Cpu>     predictions f32 [rows, n], targets f32 [rows, n]
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <string>
#include <vector>

#include "swarm/layers/backend_ops.h"
#include "swarm/layers/layer.h"

namespace swarm::layers {

// The mean of the per-row losses [rows], as f32 [1] on the backend's device.
// Summed on the host in row order, in double: the same bytes every time.
template <Backend B>
Result<Tensor> mean_of_rows(const Tensor& losses) {
  SWARM_RETURN_IF_ERROR(B::synchronize(typename B::stream_type{}));
  Tensor keep;
  SWARM_ASSIGN_OR_RETURN(TensorView host, host_view(losses, keep));
  double total = 0;
  for (float loss : host.span<const float>()) total += loss;
  SWARM_ASSIGN_OR_RETURN(Tensor mean, Tensor::empty(Shape{1}, DType::f32));
  mean.data<float>()[0] = static_cast<float>(total / static_cast<double>(losses.numel()));
  if (B::device == Device::cpu) return mean;
  return Tensor::copy_of(mean, B::device);
}

// [loss, metrics...] as f32 [1 + metrics] on the backend's device, from the mean loss.
template <Backend B>
Result<Tensor> append_to_loss(const Tensor& mean, const std::vector<float>& metrics) {
  Tensor keep;
  SWARM_ASSIGN_OR_RETURN(TensorView host, host_view(mean, keep));
  SWARM_ASSIGN_OR_RETURN(Tensor out, Tensor::empty(Shape{static_cast<int64_t>(1 + metrics.size())}, DType::f32));
  out.data<float>()[0] = host.data<float>()[0];
  std::copy(metrics.begin(), metrics.end(), out.data<float>() + 1);
  if (B::device == Device::cpu) return out;
  return Tensor::copy_of(out, B::device);
}

// d(loss) from the loss's output gradient, f32 [1].
template <Backend B>
Result<float> loss_gradient(const TensorView& dloss, std::string_view who) {
  if (dloss.dtype() != DType::f32 || dloss.numel() != 1 || dloss.device() != B::device) {
    return invalid_argument("{}'s output gradient is f32 [1] on {}, got {}", who, device_name(B::device),
                            dloss.describe());
  }
  Tensor keep;
  SWARM_ASSIGN_OR_RETURN(TensorView host, host_view(dloss, keep));
  return host.data<float>()[0];
}

// What a classification loss reports besides its loss.
struct NoMetrics {};
struct ReportAccuracy {};

template <Backend B, typename Metrics = NoMetrics>
class SoftmaxCrossEntropy {
 public:
  using backend = B;
  static constexpr const char* kName = "SoftmaxCrossEntropy";

  TensorSpec target_spec(int64_t) const { return {DType::i32, {-1}}; }
  std::vector<std::string> metric_names() const {
    if constexpr (std::same_as<Metrics, ReportAccuracy>) return {"accuracy"};
    return {};
  }

  Result<Tensor> forward(const TensorView& logits, const TensorView& targets) const {
    SWARM_RETURN_IF_ERROR(check(logits, targets));
    const int rows = static_cast<int>(logits.shape()[0]), classes = static_cast<int>(logits.shape()[1]);
    SWARM_ASSIGN_OR_RETURN(Tensor losses, Tensor::empty(Shape{rows}, DType::f32, B::device));
    B::cross_entropy_forward_backward(losses.data<float>(), nullptr, logits.data<float>(), targets.data<int32_t>(),
                                      rows, classes, 1.0f, typename B::stream_type{});
    if constexpr (std::same_as<Metrics, ReportAccuracy>) {
      SWARM_ASSIGN_OR_RETURN(Tensor mean, mean_of_rows<B>(losses));
      SWARM_ASSIGN_OR_RETURN(float accuracy, accuracy_of(logits, targets));
      return append_to_loss<B>(mean, {accuracy});
    } else {
      return mean_of_rows<B>(losses);
    }
  }

  Result<Tensor> backward(const TensorView& logits, const TensorView& targets, const TensorView& dloss) const {
    SWARM_RETURN_IF_ERROR(check(logits, targets));
    SWARM_ASSIGN_OR_RETURN(float scale, loss_gradient<B>(dloss, kName));
    const int rows = static_cast<int>(logits.shape()[0]), classes = static_cast<int>(logits.shape()[1]);
    SWARM_ASSIGN_OR_RETURN(Tensor losses, Tensor::empty(Shape{rows}, DType::f32, B::device));
    SWARM_ASSIGN_OR_RETURN(Tensor dlogits, new_rows<B>(rows, classes));
    B::cross_entropy_forward_backward(losses.data<float>(), dlogits.data<float>(), logits.data<float>(),
                                      targets.data<int32_t>(), rows, classes, scale / static_cast<float>(rows),
                                      typename B::stream_type{});
    return dlogits;
  }

 private:
  // The fraction of rows whose largest logit (the first of equal ones) is the target's.
  static Result<float> accuracy_of(const TensorView& logits, const TensorView& targets) {
    Tensor keep_logits, keep_targets;
    SWARM_ASSIGN_OR_RETURN(TensorView host_logits, host_view(logits, keep_logits));
    SWARM_ASSIGN_OR_RETURN(TensorView host_targets, host_view(targets, keep_targets));
    const int64_t rows = host_logits.shape()[0], classes = host_logits.shape()[1];
    const float* z = host_logits.data<float>();
    int64_t right = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = z + r * classes;
      right += std::max_element(row, row + classes) - row == host_targets.data<int32_t>()[r];
    }
    return static_cast<float>(static_cast<double>(right) / static_cast<double>(rows));
  }

  Status check(const TensorView& logits, const TensorView& targets) const {
    SWARM_RETURN_IF_ERROR(check_rows<B>(logits, kAnyWidth, kName));
    const int64_t rows = logits.shape()[0];
    if (targets.dtype() != DType::i32 || targets.shape() != Shape{rows} || targets.device() != B::device) {
      return invalid_argument("{} takes one i32 class id per row, [{}] on {}, got {}", kName, rows,
                              device_name(B::device), targets.describe());
    }
    return check_ids(targets, logits.shape()[1], "class id");
  }
};

template <MeanSquaredErrorBackend B>
class MeanSquaredError {
 public:
  using backend = B;
  static constexpr const char* kName = "MeanSquaredError";

  TensorSpec target_spec(int64_t width) const { return {DType::f32, {-1, width}}; }

  Result<Tensor> forward(const TensorView& predictions, const TensorView& targets) const {
    SWARM_RETURN_IF_ERROR(check(predictions, targets));
    const int rows = static_cast<int>(predictions.shape()[0]), width = static_cast<int>(predictions.shape()[1]);
    SWARM_ASSIGN_OR_RETURN(Tensor losses, Tensor::empty(Shape{rows}, DType::f32, B::device));
    B::mean_squared_error_forward_backward(losses.data<float>(), nullptr, predictions.data<float>(),
                                           targets.data<float>(), rows, width, 1.0f, typename B::stream_type{});
    return mean_of_rows<B>(losses);
  }

  Result<Tensor> backward(const TensorView& predictions, const TensorView& targets, const TensorView& dloss) const {
    SWARM_RETURN_IF_ERROR(check(predictions, targets));
    SWARM_ASSIGN_OR_RETURN(float scale, loss_gradient<B>(dloss, kName));
    const int rows = static_cast<int>(predictions.shape()[0]), width = static_cast<int>(predictions.shape()[1]);
    SWARM_ASSIGN_OR_RETURN(Tensor losses, Tensor::empty(Shape{rows}, DType::f32, B::device));
    SWARM_ASSIGN_OR_RETURN(Tensor dpredictions, new_rows<B>(rows, width));
    B::mean_squared_error_forward_backward(losses.data<float>(), dpredictions.data<float>(),
                                           predictions.data<float>(), targets.data<float>(), rows, width,
                                           scale / static_cast<float>(rows), typename B::stream_type{});
    return dpredictions;
  }

 private:
  Status check(const TensorView& predictions, const TensorView& targets) const {
    SWARM_RETURN_IF_ERROR(check_rows<B>(predictions, kAnyWidth, kName));
    if (targets.dtype() != DType::f32 || targets.shape() != predictions.shape() || targets.device() != B::device) {
      return invalid_argument("{} takes f32 targets shaped like its predictions, {} on {}, got {}", kName,
                              predictions.shape().to_string(), device_name(B::device), targets.describe());
    }
    return Status::ok();
  }
};

}  // namespace swarm::layers
