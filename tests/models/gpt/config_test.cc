#include "models/gpt/config.h"

#include <string>

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
  GptConfig gpt2{50257, 1024, 768, 12, 12, 1, {}};
  // 124,439,808 with a tied head, plus the separate 50257 x 768 head.
  CHECK(gpt2.parameter_count() == 124439808 + 50257 * 768);
}

bool message_has(const Status& status, const std::string& text) {
  return status.message().find(text) != std::string::npos;
}

TEST_CASE("parse_boundary_layers reads one layer for all cuts or one per cut") {
  auto one = parse_boundary_layers("bottleneck:4");
  REQUIRE(one.is_ok());
  CHECK(*one == std::vector<BoundaryLayer>{{BoundaryKind::bottleneck, 4}});
  auto list = parse_boundary_layers("maxout:2,none,bottleneck:2");
  REQUIRE(list.is_ok());
  CHECK(*list == std::vector<BoundaryLayer>{{BoundaryKind::maxout, 2}, {}, {BoundaryKind::bottleneck, 2}});
  auto none = parse_boundary_layers("none");
  REQUIRE(none.is_ok());
  CHECK(*none == std::vector<BoundaryLayer>{{BoundaryKind::none, 1}});
  auto spaced = parse_boundary_layers(" maxout:4 , none ");
  REQUIRE(spaced.is_ok());
  CHECK(*spaced == std::vector<BoundaryLayer>{{BoundaryKind::maxout, 4}, {}});
  // format_boundary_layers is the inverse.
  CHECK(format_boundary_layers(*list) == "maxout:2,none,bottleneck:2");
  CHECK(*parse_boundary_layers(format_boundary_layers(*list)) == *list);
  CHECK(format_boundary_layers({}) == "none");
  CHECK((*one)[0].wire_width(128) == 32);
}

TEST_CASE("parse_boundary_layers refuses bad text with a message naming the problem") {
  struct Case {
    const char* text;
    const char* message;
  };
  for (const Case& c : {Case{"", "empty"}, Case{"   ", "empty"}, Case{"maxout:3", "k 2 or 4"},
                        Case{"bottleneck:8", "k 2 or 4"}, Case{"bottleneck:1", "k 2 or 4"},
                        Case{"bottleneck", "lacks its k"}, Case{"maxout", "lacks its k"},
                        Case{"none:2", "takes no k"}, Case{"linear:2", "unknown boundary layer \"linear\""},
                        Case{"Bottleneck:2", "unknown"}, Case{"bottleneck:x", "not an integer"},
                        Case{"bottleneck:2x", "not an integer"}, Case{"bottleneck:", "not an integer"},
                        Case{"bottleneck:99999999999999999999", "not an integer"},
                        Case{"none,,none", "empty entry"}, Case{"none,", "empty entry"},
                        Case{",none", "empty entry"}}) {
    CAPTURE(c.text);
    auto parsed = parse_boundary_layers(c.text);
    REQUIRE_FALSE(parsed.is_ok());
    CHECK(parsed.status().code() == StatusCode::invalid_argument);
    CAPTURE(parsed.status().message());
    CHECK(message_has(parsed.status(), c.message));
  }
}

TEST_CASE("boundary layers: validation, JSON round trip and refusal of bad JSON") {
  GptConfig config;  // d_model 128
  config.boundaries = *parse_boundary_layers("maxout:2,none,bottleneck:4");
  CHECK(config.validate().is_ok());
  auto back = GptConfig::from_json(config.to_json());
  REQUIRE(back.is_ok());
  CHECK(*back == config);

  // Without boundary layers the JSON is what it was before the field existed,
  // and a config without the field loads with none.
  GptConfig plain;
  CHECK(plain.to_json().find("boundaries") == std::string::npos);
  CHECK(plain.to_json() ==
        R"({"d_model":128,"layer_repeat":1,"max_seq_len":128,"n_heads":4,"n_layers":4,"vocab_size":256})");
  auto old = GptConfig::from_json(
      R"({"vocab_size":256,"max_seq_len":128,"d_model":128,"n_heads":4,"n_layers":4,"layer_repeat":1})");
  REQUIRE(old.is_ok());
  CHECK(old->boundaries.empty());
  CHECK(*old == plain);

  GptConfig odd;
  odd.d_model = 6;
  odd.n_heads = 2;
  odd.boundaries = {{BoundaryKind::bottleneck, 4}};
  CHECK(odd.validate().code() == StatusCode::invalid_argument);
  CHECK(message_has(odd.validate(), "d_model 6 is not divisible by k 4"));
  odd.boundaries = {{BoundaryKind::maxout, 3}};
  CHECK(message_has(odd.validate(), "k 2 or 4"));
  odd.boundaries = {{BoundaryKind::none, 2}};
  CHECK(message_has(odd.validate(), "takes no k"));

  const std::string head = R"({"vocab_size":256,"max_seq_len":128,"d_model":128,"n_heads":4,"n_layers":4,)"
                           R"("layer_repeat":1,"boundaries":)";
  struct Case {
    const char* boundaries;
    const char* message;
  };
  for (const Case& c : {Case{R"("bottleneck:2")", "not an array"}, Case{R"([{"kind":"linear","k":2}])", "unknown"},
                        Case{R"([{"kind":"maxout","k":3}])", "k 2 or 4"},
                        Case{R"([{"kind":"maxout","k":8589934594}])", "k 2 or 4"},
                        Case{R"([{"kind":"bottleneck"}])", "lacks \"k\""},
                        Case{R"([{"kind":"bottleneck","k":"2"}])", "not an integer"},
                        Case{R"([{"kind":"none","k":2}])", "takes no k"}, Case{R"([{"k":2}])", "\"kind\""},
                        Case{R"(["maxout:2"])", "\"kind\""}}) {
    CAPTURE(c.boundaries);
    auto parsed = GptConfig::from_json(head + c.boundaries + "}");
    REQUIRE_FALSE(parsed.is_ok());
    CAPTURE(parsed.status().message());
    CHECK(message_has(parsed.status(), c.message));
  }
  GptConfig narrow;
  narrow.d_model = 6;
  narrow.n_heads = 2;
  std::string text = narrow.to_json();
  text.insert(text.size() - 1, R"(,"boundaries":[{"kind":"maxout","k":4}])");
  CHECK(message_has(GptConfig::from_json(text).status(), "not divisible by k 4"));
}

TEST_CASE("boundary layers must fit the stage count: one for all cuts, or one per cut") {
  GptConfig config;  // 4 layers
  config.boundaries = *parse_boundary_layers("bottleneck:2,maxout:4");
  CHECK(partition_layers(config, 3).is_ok());
  auto status = partition_layers(config, 2).status();
  CHECK(status.code() == StatusCode::invalid_argument);
  CAPTURE(status.message());
  CHECK(message_has(status, "lists 2 boundary layers"));
  CHECK(message_has(status, "2 stages have 1 boundary between them"));
  CHECK_FALSE(partition_at(config, {0, 2, 4}).is_ok());
  CHECK(partition_at(config, {0, 1, 2, 4}).is_ok());
  CHECK_FALSE(partition_layers(config, 1).is_ok());
  CHECK(config.boundary_after(0) == BoundaryLayer{BoundaryKind::bottleneck, 2});
  CHECK(config.boundary_after(1) == BoundaryLayer{BoundaryKind::maxout, 4});

  // A single entry applies to every cut, and to a one-stage model (no cuts) too.
  config.boundaries = *parse_boundary_layers("maxout:2");
  for (int stages : {1, 2, 3, 4}) CHECK(partition_layers(config, stages).is_ok());
  CHECK(config.boundary_after(2) == BoundaryLayer{BoundaryKind::maxout, 2});
  config.boundaries.clear();
  CHECK(config.boundary_after(1) == BoundaryLayer{});
}

TEST_CASE("parameter_count adds the boundary layers of the split") {
  GptConfig config;  // d_model 128
  const int64_t C = 128;
  const int64_t plain = config.parameter_count();
  CHECK(config.parameter_count(3) == plain);  // no boundary layers: the split changes nothing
  config.boundaries = *parse_boundary_layers("bottleneck:4");
  CHECK(config.parameter_count() == plain);  // one stage, no cuts
  // Sender LayerNorm + Linear(C -> C/4); receiver Linear(C/4 -> C) + LayerNorm.
  const int64_t bottleneck4 = (2 * C + C * 32 + 32) + (32 * C + C + 2 * C);
  CHECK(config.parameter_count(2) == plain + bottleneck4);
  CHECK(config.parameter_count(3) == plain + 2 * bottleneck4);
  config.boundaries = *parse_boundary_layers("maxout:2,none");
  const int64_t maxout2 = 2 * C + (64 * C + C + 2 * C);  // maxout itself has no parameters
  CHECK(config.parameter_count(3) == plain + maxout2);
}

}  // namespace
}  // namespace swarm::gpt
