// inputs: validation of what a stage is handed, before anything is allocated.
//
// Stage inputs may come from a remote peer, so every mismatch is a Status with
// a message that names the tensor, never a crash.
//
//   SWARM_RETURN_IF_ERROR(swarm::gpt::validate_tokens(tokens, config, "input tokens"));
#pragma once

#include <string_view>

#include "models/gpt/config.h"
#include "swarm/core/tensor.h"

namespace swarm::gpt {

// i32 [B, T] with B >= 1, 1 <= T <= max_seq_len, and (for host tensors) every
// id in [0, vocab_size).
Status validate_tokens(const TensorView& tokens, const GptConfig& config, std::string_view what);

// A hash of a host input (and targets) identifying a forward; 0 for device
// tensors, which are not fingerprinted.
uint64_t input_fingerprint(const TensorView& input, const TensorView* targets);

// f32 [B, T, width] with the same B and T bounds; width is d_model, or d_model / k
// across a compressing stage cut.
Status validate_hidden(const TensorView& hidden, const GptConfig& config, int64_t width, std::string_view what);

}  // namespace swarm::gpt
