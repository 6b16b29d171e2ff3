// tiny_gpt: the GPT the in-process swarm tests serve: small enough that a stage's
// forward and backward take well under a millisecond, so tests are bound by the
// behaviour they check, not by compute.
#pragma once

#include "models/gpt/config.h"

namespace swarm::testing {

inline gpt::GptConfig tiny_gpt_config() {
  gpt::GptConfig config;
  config.vocab_size = 32;
  config.max_seq_len = 16;
  config.d_model = 16;
  config.n_heads = 2;
  config.n_layers = 2;
  return config;
}

}  // namespace swarm::testing
