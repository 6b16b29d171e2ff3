#include "models/gpt/inputs.h"

namespace swarm::gpt {
namespace {

Status validate_batch_and_length(const TensorView& t, const GptConfig& config, std::string_view what) {
  if (t.shape()[0] < 1) return invalid_argument("{} has an empty batch", what);
  if (t.shape()[1] < 1 || t.shape()[1] > config.max_seq_len) {
    return invalid_argument("{} has sequence length {}, outside [1, {}]", what, t.shape()[1],
                            config.max_seq_len);
  }
  return Status::ok();
}

}  // namespace

Status validate_tokens(const TensorView& tokens, const GptConfig& config, std::string_view what) {
  if (tokens.dtype() != DType::i32 || tokens.shape().rank() != 2) {
    return invalid_argument("{} must be i32 [batch, seq], got {}", what, tokens.describe());
  }
  SWARM_RETURN_IF_ERROR(validate_batch_and_length(tokens, config, what));
  if (tokens.device() == Device::cpu) {
    for (int32_t id : tokens.span<const int32_t>()) {
      if (id < 0 || id >= config.vocab_size) {
        return invalid_argument("{} holds token id {}, outside the vocabulary [0, {})", what, id,
                                config.vocab_size);
      }
    }
  }
  return Status::ok();
}

Status validate_hidden(const TensorView& hidden, const GptConfig& config, std::string_view what) {
  if (hidden.dtype() != DType::f32 || hidden.shape().rank() != 3 ||
      hidden.shape()[2] != config.d_model) {
    return invalid_argument("{} must be f32 [batch, seq, {}], got {}", what, config.d_model,
                            hidden.describe());
  }
  return validate_batch_and_length(hidden, config, what);
}

}  // namespace swarm::gpt
