#include "models/gpt/inputs.h"

#include <xxhash.h>

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

uint64_t input_fingerprint(const TensorView& input, const TensorView* targets) {
  if (input.device() != Device::cpu || (targets != nullptr && targets->device() != Device::cpu)) return 0;
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  const auto add_tensor = [&](const TensorView& t) {
    const int rank = t.shape().rank();
    XXH3_64bits_update(state, &rank, sizeof(rank));
    XXH3_64bits_update(state, t.shape().dims().data(), sizeof(int64_t) * rank);
    XXH3_64bits_update(state, t.raw_data(), t.size_bytes());
  };
  add_tensor(input);
  if (targets != nullptr) add_tensor(*targets);
  const uint64_t hash = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return hash == 0 ? 1 : hash;
}

Status validate_hidden(const TensorView& hidden, const GptConfig& config, int64_t width, std::string_view what) {
  if (hidden.dtype() != DType::f32 || hidden.shape().rank() != 3 || hidden.shape()[2] != width) {
    return invalid_argument("{} must be f32 [batch, seq, {}], got {}", what, width, hidden.describe());
  }
  return validate_batch_and_length(hidden, config, what);
}

}  // namespace swarm::gpt
