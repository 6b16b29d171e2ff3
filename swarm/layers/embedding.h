// embedding: i32 tokens [batch, positions] -> f32 rows [batch * positions, channels],
// a token's vector plus, optionally, its position's.
//
// With `positions` > 0 there is a learned position table [positions, channels]
// and a row of tokens may be at most that long: token t of a row gets
// table[token] + position_table[t], GPT-2's embedding. With 0 (the default)
// the embedding is token-only: the backend's op is given a zero position table
// and the position gradient is discarded. The output is rows, not
// [batch, positions, channels], because every layer here works on rows; the
// row of token (b, t) is b * positions + t.
//
// Only the first layer of a stage may be an embedding (its input gradient is
// undefined: tokens are not differentiable). Tables are seeded uniform in
// +-1, unit scale like torch.nn.Embedding.
//
//   swarm::layers::Embedding<Cpu> tokens(/*vocabulary=*/256, /*channels=*/32);
//   swarm::layers::Embedding<Cpu> with_positions(256, 32, /*positions=*/64);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "swarm/layers/layer.h"

namespace swarm::layers {

template <Backend B>
class Embedding {
 public:
  using backend = B;
  static constexpr bool takes_tokens = true;

  Embedding(int vocabulary, int channels, int positions = 0)
      : vocabulary_(vocabulary), channels_(channels), positions_(positions) {}

  Status initialize(uint64_t seed) {
    if (vocabulary_ <= 0 || channels_ <= 0 || positions_ < 0 || int64_t{vocabulary_} * channels_ > INT_MAX ||
        int64_t{positions_} * channels_ > INT_MAX) {
      return invalid_argument("{}: sizes must be positive (positions may be 0), tables under 2^31 floats", name());
    }
    SeededUniform random(seed);
    auto draw = [&] { return random.next(1.0f); };
    SWARM_ASSIGN_OR_RETURN(token_table_, make_parameter<B>("tokens", Shape{vocabulary_, channels_}, true, draw));
    if (positions_ > 0) {
      SWARM_ASSIGN_OR_RETURN(position_table_, make_parameter<B>("positions", Shape{positions_, channels_}, true, draw));
    }
    return Status::ok();
  }

  int64_t input_features() const { return kAnyWidth; }
  int64_t output_features(int64_t) const { return channels_; }

  Result<Tensor> forward(const TensorView& tokens) const {
    SWARM_RETURN_IF_ERROR(check_tokens(tokens));
    const int batch = static_cast<int>(tokens.shape()[0]), length = static_cast<int>(tokens.shape()[1]);
    SWARM_ASSIGN_OR_RETURN(Tensor y, new_rows<B>(int64_t{batch} * length, channels_));
    SWARM_ASSIGN_OR_RETURN(Tensor zero_positions, zero_position_table(length));
    const Tensor& positions = positions_ > 0 ? position_table_.value : zero_positions;
    B::embedding_forward(y.data<float>(), tokens.data<int32_t>(), token_table_.value.data<float>(),
                         positions.data<float>(), batch, length, channels_, vocabulary_, typename B::stream_type{});
    return y;
  }

  // Adds the table gradients; returns an undefined Tensor.
  Result<Tensor> backward(const TensorView& tokens, const TensorView& dy) {
    SWARM_RETURN_IF_ERROR(check_tokens(tokens));
    const int batch = static_cast<int>(tokens.shape()[0]), length = static_cast<int>(tokens.shape()[1]);
    SWARM_RETURN_IF_ERROR(check_gradient<B>(dy, Shape{int64_t{batch} * length, channels_}, name()));
    SWARM_ASSIGN_OR_RETURN(Tensor discarded_positions, zero_position_table(length));
    const Tensor& dpositions = positions_ > 0 ? position_table_.grad : discarded_positions;
    B::embedding_backward(token_table_.grad.data<float>(), dpositions.data<float>(), dy.data<float>(),
                          tokens.data<int32_t>(), batch, length, channels_, vocabulary_, typename B::stream_type{});
    return Tensor();
  }

  void append_parameter_views(const std::string& prefix, std::vector<StageParameterView>& views) {
    views.push_back(token_table_.view(prefix));
    if (positions_ > 0) views.push_back(position_table_.view(prefix));
  }

  Status zero_grad() {
    zero_grad_of<B>(token_table_);
    if (positions_ > 0) zero_grad_of<B>(position_table_);
    return Status::ok();
  }

 private:
  Status check_tokens(const TensorView& tokens) const {
    if (tokens.dtype() != DType::i32 || tokens.shape().rank() != 2 || tokens.shape()[0] < 1 ||
        tokens.shape()[1] < 1 || tokens.device() != B::device) {
      return invalid_argument("{} takes i32 [batch, positions] on {}, got {}", name(), device_name(B::device),
                              tokens.describe());
    }
    if (positions_ > 0 && tokens.shape()[1] > positions_) {
      return invalid_argument("{} has {} positions, got rows of {} tokens", name(), positions_, tokens.shape()[1]);
    }
    if (tokens.numel() * channels_ > INT_MAX) {
      return invalid_argument("{}: {} tokens make more than 2^31 outputs", name(), tokens.numel());
    }
    return check_ids(tokens, vocabulary_, "token");
  }

  // Stands in for the position table of a token-only embedding; undefined otherwise.
  Result<Tensor> zero_position_table(int length) const {
    if (positions_ > 0) return Tensor();
    return Tensor::zeros(Shape{length, channels_}, DType::f32, B::device);
  }

  std::string name() const {
    return positions_ > 0 ? fmt::format("Embedding({} tokens, {} positions -> {})", vocabulary_, positions_, channels_)
                          : fmt::format("Embedding({} tokens -> {})", vocabulary_, channels_);
  }

  int vocabulary_, channels_, positions_;
  Parameter token_table_, position_table_;
};

}  // namespace swarm::layers
