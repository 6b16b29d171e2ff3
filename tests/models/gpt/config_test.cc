#include "models/gpt/config.h"

#include <doctest/doctest.h>

namespace swarm::gpt {
namespace {

TEST_CASE("partition_layers makes contiguous runs that differ by at most one layer") {
  GptConfig config;
  config.n_layers = 7;
  auto stages = partition_layers(config, 3);
  REQUIRE(stages.is_ok());
  REQUIRE(stages->size() == 3);
  CHECK((*stages)[0].first_layer == 0);
  CHECK((*stages)[0].end_layer == 3);
  CHECK((*stages)[1].first_layer == 3);
  CHECK((*stages)[1].end_layer == 5);
  CHECK((*stages)[2].end_layer == 7);
  CHECK((*stages)[0].has_embedding());
  CHECK_FALSE((*stages)[0].has_head());
  CHECK((*stages)[2].has_head());
  CHECK(partition_layers(config, 8).status().code() == StatusCode::invalid_argument);
  CHECK(partition_layers(config, 0).status().code() == StatusCode::invalid_argument);
}

TEST_CASE("partition_at takes explicit boundaries and rejects empty stages") {
  GptConfig config;
  auto stages = partition_at(config, {0, 1, 4});
  REQUIRE(stages.is_ok());
  CHECK((*stages)[1].num_layers() == 3);
  CHECK_FALSE(partition_at(config, {0, 2, 2, 4}).is_ok());
  CHECK_FALSE(partition_at(config, {0, 3}).is_ok());
}

TEST_CASE("config validation and JSON round-trip") {
  GptConfig config;
  config.d_model = 96;
  config.n_heads = 3;
  config.layer_repeat = 2;
  CHECK(config.validate().is_ok());
  auto back = GptConfig::from_json(config.to_json());
  REQUIRE(back.is_ok());
  CHECK(*back == config);
  config.n_heads = 5;
  CHECK(config.validate().code() == StatusCode::invalid_argument);
  CHECK_FALSE(GptConfig::from_json("{\"vocab_size\": 256}").is_ok());
  CHECK_FALSE(GptConfig::from_json("not json").is_ok());
}

TEST_CASE("parameter_count matches GPT-2 small's 124M with untied head") {
  GptConfig gpt2{50257, 1024, 768, 12, 12, 1};
  // 124,439,808 with a tied head, plus the separate 50257 x 768 head.
  CHECK(gpt2.parameter_count() == 124439808 + 50257 * 768);
}

}  // namespace
}  // namespace swarm::gpt
