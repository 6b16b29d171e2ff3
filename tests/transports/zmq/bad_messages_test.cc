// A server behind validating_handler on real ZeroMQ sockets: every kind of
// malformed request gets an error reply, valid clients keep being served, and
// memory stays bounded over 100,000 bad messages.
#include <sys/resource.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <random>

#include <fmt/core.h>

#include <doctest/doctest.h>

#include "swarm/protocol/validating_handler.h"
#include "transports/zmq/zmq_transport.h"

namespace swarm {
namespace {

using namespace std::chrono_literals;

Deadline in(std::chrono::milliseconds ms) { return Clock::now() + ms; }

wire::Frames valid_forward() {
  Tensor hidden = *Tensor::empty(Shape{2, 4, 8}, DType::f32);
  Tensor tokens = *Tensor::zeros(Shape{2, 4}, DType::i32);
  for (int i = 0; i < 64; ++i) hidden.data<float>()[i] = 0.5f * i;
  wire::MessageHeader header;
  header.kind = wire::MessageKind::forward;
  header.stage = 1;
  header.request_id = 7;
  std::vector<TensorView> views{hidden, tokens};
  return *wire::encode_message(header, views);
}

wire::Frames with_header(wire::Frames frames, const std::function<void(wire::MessageHeader&)>& edit) {
  wire::MessageHeader header = wire::decode_message(frames.views(), wire::Limits{})->header;
  edit(header);
  frames.parts[0] = wire::serialize_header(header);
  return frames;
}

// One malformed variant of a valid message per case.
std::vector<std::pair<std::string, wire::Frames>> bad_messages() {
  std::vector<std::pair<std::string, wire::Frames>> cases;
  auto add = [&](std::string name, wire::Frames frames) { cases.emplace_back(std::move(name), std::move(frames)); };
  wire::Frames v = valid_forward();
  {
    auto f = v;
    f.parts[0] = f.parts[0].str().substr(0, f.parts[0].size() / 2);
    add("truncated header frame", f);
  }
  add("garbage header", wire::Frames{{std::string("not a header"), v.parts[1], v.parts[2]}});
  {
    auto f = v;
    f.parts.pop_back();
    add("one frame missing", f);
  }
  {
    auto f = v;
    f.parts.push_back(std::string("extra"));
    add("one frame too many", f);
  }
  {
    auto f = v;
    f.parts[1].mutable_string().resize(f.parts[1].size() - 4);
    add("truncated tensor frame", f);
  }
  add("shape disagrees with payload",
      with_header(v, [](wire::MessageHeader& h) { h.tensors[0].dims = {2, 4, 9}; }));
  add("2^60 elements", with_header(v, [](wire::MessageHeader& h) {
        h.tensors[0].dims = {int64_t{1} << 30, int64_t{1} << 30};
      }));
  add("unknown kind", with_header(v, [](wire::MessageHeader& h) { h.kind = static_cast<wire::MessageKind>(200); }));
  add("unknown version", with_header(v, [](wire::MessageHeader& h) { h.version = 99; }));
  {
    auto f = v;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(f.parts[1].mutable_string().data() + 12, &nan, sizeof(nan));
    add("NaN in a float payload", f);
  }
  add("no frames at all", wire::Frames{});
  return cases;
}

struct Served {
  ZmqServer server;
  std::shared_ptr<wire::ValidationCounters> counters;
  std::shared_ptr<std::atomic<int>> handled;
};

Served serve_validating() {
  auto counters = std::make_shared<wire::ValidationCounters>();
  auto handled = std::make_shared<std::atomic<int>>(0);
  auto server = ZmqTransport::bind("tcp://127.0.0.1:*", {});
  REQUIRE(server.is_ok());
  REQUIRE(server->serve(validating_handler(wire::Limits{}, counters,
                                           [handled](const PeerIdentity&, const wire::DecodedMessage& m) {
                                             ++*handled;
                                             double sum = 0;
                                             for (float x : m.tensors[0].view.span<const float>()) sum += x;
                                             return wire::Frames{{fmt::format("sum={}", sum)}};
                                           }))
              .is_ok());
  return {std::move(server).value(), counters, handled};
}

Status reply_status(const wire::Frames& reply) {
  auto decoded = wire::decode_message(reply.views(), wire::Limits{});
  if (!decoded.is_ok()) return Status::ok();  // not an error message (a plain result)
  if (decoded->header.kind != wire::MessageKind::error) return Status::ok();
  return wire::status_from_error_reply(decoded->header);
}

TEST_CASE("each malformed request gets an error reply, and valid clients keep being served") {
  Served served = serve_validating();
  ZmqClient attacker = *ZmqTransport::connect(served.server.address(), {});
  ZmqClient honest = *ZmqTransport::connect(served.server.address(), {});
  int errors = 0;
  for (auto& [name, frames] : bad_messages()) {
    CAPTURE(name);
    auto reply = attacker.call(std::move(frames), in(10s)).get();
    REQUIRE(reply.is_ok());
    Status status = reply_status(*reply);
    CHECK_FALSE(status.is_ok());
    if (!status.is_ok()) ++errors;
    MESSAGE(name << " -> " << status.to_string());
    auto good = honest.call(valid_forward(), in(10s)).get();
    REQUIRE(good.is_ok());
    CHECK(good->parts[0] == "sum=1008");
  }
  CHECK(errors == static_cast<int>(bad_messages().size()));
  CHECK(*served.handled == static_cast<int>(bad_messages().size()));  // the honest ones only
  CHECK(served.counters->total() == bad_messages().size());
}

long peak_rss_kib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

TEST_CASE("memory stays bounded over 100,000 bad messages") {
  Served served = serve_validating();
  ZmqClient attacker = *ZmqTransport::connect(served.server.address(), {});
  const auto cases = bad_messages();
  std::mt19937 rng(2024);
  // Warm up allocators and queues, then measure.
  for (int i = 0; i < 1000; ++i) (void)attacker.call(wire::Frames(cases[i % cases.size()].second), in(10s)).get();
  const long before = peak_rss_kib();
  constexpr int kMessages = 100000;
  constexpr size_t kWindow = 64;
  std::deque<Call> window;
  int error_replies = 0;
  auto settle = [&] {
    auto reply = window.front().get();
    window.pop_front();
    if (reply.is_ok() && !reply_status(*reply).is_ok()) ++error_replies;
  };
  for (int i = 0; i < kMessages; ++i) {
    wire::Frames frames = cases[rng() % cases.size()].second;
    // Also random byte damage on top, so the generator is not just eleven fixed messages.
    if (!frames.parts.empty() && rng() % 2 == 0) {
      std::string& part = frames.parts[rng() % frames.parts.size()].mutable_string();
      if (!part.empty()) part[rng() % part.size()] ^= static_cast<char>(1 + rng() % 255);
    }
    window.push_back(attacker.call(std::move(frames), in(30s)));
    if (window.size() >= kWindow) settle();
  }
  while (!window.empty()) settle();
  const long after = peak_rss_kib();
  fmt::print("peak RSS: {:.1f} MiB after warm-up, {:.1f} MiB after {} bad messages (+{:.1f} MiB)\n",
             before / 1024.0, after / 1024.0, kMessages, (after - before) / 1024.0);
  // A flipped byte can land in a tensor payload and leave the message valid;
  // everything else must come back as an error.
  CHECK(error_replies + served.handled->load() == kMessages);
  CHECK(error_replies > kMessages * 9 / 10);
  CHECK(after - before < 32 * 1024);
  // And the server still answers properly afterwards.
  ZmqClient honest = *ZmqTransport::connect(served.server.address(), {});
  auto good = honest.call(valid_forward(), in(10s)).get();
  REQUIRE(good.is_ok());
  CHECK(good->parts[0] == "sum=1008");
}

}  // namespace
}  // namespace swarm
