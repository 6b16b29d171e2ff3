// State download between in-process donors: chunked, hash-verified, and resumed
// from another donor at the same offset when the first one dies.
#include <doctest/doctest.h>

#include "swarm/averaging/state_transfer.h"
#include "transports/inproc/inproc_transport.h"
#include "swarm/protocol/validating_handler.h"

namespace swarm {
namespace {

Checkpoint sample_state(int64_t step, float fill) {
  Checkpoint c;
  c.step = step;
  Tensor w = *Tensor::empty(Shape{300}, DType::f32);
  for (int i = 0; i < 300; ++i) w.data<float>()[i] = fill + static_cast<float>(i);
  c.tensors.push_back({"param/w", std::move(w)});
  return c;
}

struct Donor {
  std::string id;
  StateDonor donor;
  Checkpoint state;
  std::optional<InprocServer> server;
  std::shared_ptr<wire::ValidationCounters> counters = std::make_shared<wire::ValidationCounters>();

  Donor(std::string name, Checkpoint s) : id(std::move(name)), state(std::move(s)) {
    server.emplace(*InprocTransport::bind(address(), ServerOptions{}));
    REQUIRE(server
                ->serve(validating_handler(wire::Limits{}, counters,
                                           [this](const PeerIdentity&, const wire::DecodedMessage& m) {
                                             return donor.handle(m, 0, state.step, [this]() -> Result<Checkpoint> {
                                               return state;
                                             });
                                           }))
                .is_ok());
  }
  std::string address() const { return "inproc://state-" + id; }
  AllReduceMember member() const { return {id, address()}; }
};

TEST_CASE("a download in small chunks returns exactly the donor's state") {
  Donor d("one", sample_state(5, 1.0f));
  ClientCache<InprocTransport> clients;
  StateTransferConfig config{.chunk_bytes = 100};
  StateDownloadReport report;
  auto got = download_state(clients, 0, {d.member()}, config, &report);
  REQUIRE_MESSAGE(got.is_ok(), got.status().to_string());
  CHECK(got->step == 5);
  CHECK(content_hash(got->tensors) == content_hash(d.state.tensors));
  CHECK(report.donors_used == std::vector<std::string>{"one"});
  CHECK(report.bytes > 1200);
  CHECK(report.resumed_at == -1);
}

TEST_CASE("when the donor dies mid-download, the joiner finishes from another donor at the same offset") {
  Donor first("first", sample_state(9, 2.0f));
  Donor second("second", sample_state(9, 2.0f));  // a replica: the same state, byte for byte
  first.donor.after_chunk = [&](int64_t served) -> Status {
    if (served < 3) return Status::ok();
    return unavailable("donor died (test hook)");
  };
  ClientCache<InprocTransport> clients;
  StateTransferConfig config{.chunk_bytes = 128};
  StateDownloadReport report;
  auto got = download_state(clients, 0, {first.member(), second.member()}, config, &report);
  REQUIRE_MESSAGE(got.is_ok(), got.status().to_string());
  CHECK(content_hash(got->tensors) == content_hash(second.state.tensors));
  CHECK(report.donors_used == std::vector<std::string>{"first", "second"});
  CHECK(report.resumed_at == 2 * 128);  // two chunks kept; the third died with its donor
}

TEST_CASE("a second donor with other state makes the download start over, and still succeed") {
  Donor first("first-b", sample_state(9, 2.0f));
  Donor other("other-b", sample_state(10, 3.0f));
  first.donor.after_chunk = [&](int64_t served) -> Status { return unavailable("dies at once"); };
  ClientCache<InprocTransport> clients;
  StateDownloadReport report;
  auto got = download_state(clients, 0, {first.member(), other.member()}, StateTransferConfig{.chunk_bytes = 128},
                            &report);
  REQUIRE(got.is_ok());
  CHECK(got->step == 10);
  CHECK(report.resumed_at == -1);
}

TEST_CASE("no live donor is an unavailable error, not a hang") {
  ClientCache<InprocTransport> clients;
  auto got = download_state(clients, 0, {{"ghost", "inproc://state-nobody"}},
                            StateTransferConfig{.call_timeout_seconds = 0.2}, nullptr);
  CHECK_FALSE(got.is_ok());
}

TEST_CASE("a chunk request for a snapshot the donor no longer holds is refused") {
  Donor d("moving", sample_state(1, 0.0f));
  ClientCache<InprocTransport> clients;
  auto client = clients.get(d.address());
  auto frames = encode_state_request(0, {{"op", "chunk"}, {"hash", "0000000000000001"}, {"offset", 0}, {"length", 8}});
  auto reply = decode_result_reply(client->call(std::move(*frames), Clock::now() + std::chrono::seconds(2)).get());
  CHECK(reply.status().code() == StatusCode::failed_precondition);
}

}  // namespace
}  // namespace swarm

namespace swarm {
namespace {

// A hostile joiner's requests, sent straight to a live donor.
Result<ReceivedMessage> ask(Donor& donor, const nlohmann::json& meta) {
  auto client = InprocTransport::connect(donor.address(), {});
  REQUIRE(client.is_ok());
  auto frames = encode_state_request(0, meta);
  REQUIRE(frames.is_ok());
  return decode_result_reply(client->call(std::move(frames).value(), Clock::now() + std::chrono::seconds(5)).get());
}

TEST_CASE("forged chunk requests get an error reply and the donor keeps serving") {
  Donor d("hostile-target", sample_state(3, 1.0f));
  auto info = ask(d, {{"op", "info"}});
  REQUIRE(info.is_ok());
  const auto meta = *control_json(info->message);
  const std::string hash = meta.at("hash").get<std::string>();
  const int64_t size = meta.at("bytes").get<int64_t>();

  // offset + length wraps past INT64_MAX: it once read far outside the state (SIGSEGV).
  const int64_t huge = std::numeric_limits<int64_t>::max() - 10;
  for (const nlohmann::json& forged : {
           nlohmann::json{{"op", "chunk"}, {"hash", hash}, {"offset", huge}, {"length", 100}},
           nlohmann::json{{"op", "chunk"}, {"hash", hash}, {"offset", 1}, {"length", huge}},
           nlohmann::json{{"op", "chunk"}, {"hash", hash}, {"offset", size}, {"length", 1}},
           nlohmann::json{{"op", "chunk"}, {"hash", hash}, {"offset", -1}, {"length", 4}},
           nlohmann::json{{"op", "chunk"}, {"hash", hash}, {"offset", "0"}, {"length", 4}},  // wrong JSON types
           nlohmann::json{{"op", "chunk"}, {"hash", 12}, {"offset", 0}, {"length", 4}},
           nlohmann::json{{"op", "chunk"}, {"hash", hash}, {"offset", 0.5}, {"length", 4}},
           nlohmann::json{{"op", 7}},
           nlohmann::json{{"op", "chunk"}},
       }) {
    auto reply = ask(d, forged);
    INFO(forged.dump());
    REQUIRE_FALSE(reply.is_ok());
    CHECK(reply.status().code() == StatusCode::invalid_argument);
  }
  // An honest joiner is still served, byte for byte.
  ClientCache<InprocTransport> clients;
  auto got = download_state(clients, 0, {d.member()}, StateTransferConfig{.chunk_bytes = 256}, nullptr);
  REQUIRE_MESSAGE(got.is_ok(), got.status().to_string());
  CHECK(content_hash(got->tensors) == content_hash(d.state.tensors));
}

// A donor that lies about its state's size: the joiner must not try to fetch it.
struct LyingDonor {
  nlohmann::json info;
  int64_t chunk_requests = 0;
  std::optional<InprocServer> server;
  std::shared_ptr<wire::ValidationCounters> counters = std::make_shared<wire::ValidationCounters>();

  explicit LyingDonor(nlohmann::json claimed) : info(std::move(claimed)) {
    server.emplace(*InprocTransport::bind("inproc://liar-" + info.dump().substr(0, 40), ServerOptions{}));
    REQUIRE(server
                ->serve(validating_handler(wire::Limits{}, counters,
                                           [this](const PeerIdentity&, const wire::DecodedMessage& m) {
                                             auto meta = *control_json(m);
                                             if (meta.value("op", "") != "info") ++chunk_requests;
                                             return *encode_control_message(wire::MessageKind::result, 0,
                                                                            m.header.request_id, info, nullptr);
                                           }))
                .is_ok());
  }
  AllReduceMember member() const { return {"liar", "inproc://liar-" + info.dump().substr(0, 40)}; }
};

TEST_CASE("a donor's state info is checked before anything is fetched: size cap and field types") {
  ClientCache<InprocTransport> clients;
  StateTransferConfig config{.chunk_bytes = 256, .call_timeout_seconds = 2.0, .max_state_bytes = state_bytes_cap(300)};
  for (const nlohmann::json& claimed : {
           nlohmann::json{{"step", 4}, {"bytes", int64_t{1} << 40}, {"hash", "00000000000000ab"}},  // far beyond the cap
           nlohmann::json{{"step", 4}, {"bytes", "1000"}, {"hash", "00000000000000ab"}},
           nlohmann::json{{"step", -4}, {"bytes", 1000}, {"hash", "00000000000000ab"}},
           nlohmann::json{{"step", 4}, {"bytes", 1000}, {"hash", 171}},
       }) {
    INFO(claimed.dump());
    LyingDonor liar(claimed);
    auto got = download_state(clients, 0, {liar.member()}, config, nullptr);
    REQUIRE_FALSE(got.is_ok());
    CHECK(got.status().code() == StatusCode::data_loss);
    CHECK(liar.chunk_requests == 0);
  }
  CHECK(state_bytes_cap(300) < 2 << 20);
}

}  // namespace
}  // namespace swarm

namespace swarm {
namespace {

// ---- A downloaded state is checked before anyone loads it. ----

// What StageSync checks, for the one-tensor states of these tests: the layout (one
// f32 "param/w" of 300 values), finite values, and the parameters hash a majority
// vouched for.
StateCheck check_against(uint64_t vouched_hash, int64_t vouched_step) {
  StateCheck check;
  check.step = [=](int64_t step) {
    return step == vouched_step ? Status::ok() : failed_precondition("nobody vouches for step {}", step);
  };
  check.state = [=](const Checkpoint& state) -> Status {
    if (state.tensors.size() != 1 || state.tensors[0].name != "param/w" ||
        state.tensors[0].tensor.shape() != Shape{300} || state.tensors[0].tensor.dtype() != DType::f32) {
      return invalid_argument("not this stage's layout");
    }
    SWARM_RETURN_IF_ERROR(check_finite(state));
    if (content_hash(state.tensors) != vouched_hash) return data_loss("not the hash the majority published");
    return Status::ok();
  };
  return check;
}

TEST_CASE("forged states (wrong hash, NaN, wrong size) are refused before load; the honest donor's is taken") {
  const Checkpoint honest = sample_state(6, 1.0f);
  Checkpoint other_values = sample_state(6, 1.5f);  // self-consistent bytes, but not the stage's parameters
  Checkpoint nan = sample_state(6, 1.0f);
  nan.tensors[0].tensor.data<float>()[17] = std::numeric_limits<float>::quiet_NaN();
  Checkpoint bigger;
  bigger.step = 6;
  bigger.tensors.push_back({"param/w", *Tensor::zeros(Shape{301}, DType::f32)});
  Donor wrong_hash("forged-hash", other_values), not_finite("forged-nan", nan), wrong_size("forged-size", bigger);
  Donor good("honest", honest);
  ClientCache<InprocTransport> clients;
  StateDownloadReport report;
  auto got = download_state(clients, 0, {wrong_hash.member(), not_finite.member(), wrong_size.member(), good.member()},
                            StateTransferConfig{.chunk_bytes = 512}, &report,
                            check_against(content_hash(honest.tensors), 6));
  REQUIRE_MESSAGE(got.is_ok(), got.status().to_string());
  CHECK(content_hash(got->tensors) == content_hash(honest.tensors));
  REQUIRE(report.refused.size() == 3);
  CHECK(report.refused[0].starts_with("forged-hash: not the hash"));
  CHECK(report.refused[1].find("not finite") != std::string::npos);
  CHECK(report.refused[2].starts_with("forged-size: not this stage's layout"));
  CHECK(report.donors_used.back() == "honest");
  CHECK(report.resumed_at == -1);  // nothing of a refused state was kept

  // With only forgers, nothing passes: the last refusal is the error.
  StateDownloadReport none;
  auto refused = download_state(clients, 0, {wrong_hash.member(), not_finite.member()},
                                StateTransferConfig{.chunk_bytes = 512}, &none,
                                check_against(content_hash(honest.tensors), 6));
  CHECK(refused.status().code() == StatusCode::invalid_argument);
  CHECK(none.refused.size() == 2);
}

TEST_CASE("a donor offering a step nobody vouches for is refused before a byte is fetched") {
  Donor ahead("unvouched", sample_state(40, 0.0f));
  Donor good("vouched", sample_state(6, 1.0f));
  int64_t ahead_chunks = 0;
  ahead.donor.after_chunk = [&](int64_t served) -> Status {
    ahead_chunks = served;
    return Status::ok();
  };
  ClientCache<InprocTransport> clients;
  StateDownloadReport report;
  auto got = download_state(clients, 0, {ahead.member(), good.member()}, StateTransferConfig{.chunk_bytes = 512},
                            &report, check_against(content_hash(good.state.tensors), 6));
  REQUIRE_MESSAGE(got.is_ok(), got.status().to_string());
  CHECK(got->step == 6);
  CHECK(ahead_chunks == 0);
  REQUIRE(report.refused.size() == 1);
  CHECK(report.refused[0].starts_with("unvouched: nobody vouches for step 40"));
  CHECK(report.donors_used == std::vector<std::string>{"vouched"});
}

// Serves `bytes` as a state of `step` under a hash it claims, whatever the bytes are.
struct ScriptedDonor {
  std::string name;
  std::string bytes;
  uint64_t claimed_hash;
  int64_t step;
  std::optional<InprocServer> server;
  std::shared_ptr<wire::ValidationCounters> counters = std::make_shared<wire::ValidationCounters>();

  ScriptedDonor(std::string id, std::string content, uint64_t hash, int64_t at)
      : name(std::move(id)), bytes(std::move(content)), claimed_hash(hash), step(at) {
    server.emplace(*InprocTransport::bind(address(), ServerOptions{}));
    REQUIRE(server->serve(validating_handler(wire::Limits{}, counters,
                                             [this](const PeerIdentity&, const wire::DecodedMessage& m) {
                                               return answer(m);
                                             }))
                .is_ok());
  }
  wire::Frames answer(const wire::DecodedMessage& m) {
    auto meta = *control_json(m);
    if (meta.value("op", "") == "info") {
      return *encode_control_message(wire::MessageKind::result, 0, m.header.request_id,
                                     {{"step", step}, {"bytes", static_cast<int64_t>(bytes.size())},
                                      {"hash", hex64(claimed_hash)}},
                                     nullptr);
    }
    const int64_t offset = meta.at("offset").get<int64_t>(), length = meta.at("length").get<int64_t>();
    TensorView payload(bytes.data() + offset, DType::u8, Shape{length}, Device::cpu);
    return *encode_control_message(wire::MessageKind::result, 0, m.header.request_id, {{"offset", offset}}, &payload);
  }
  std::string address() const { return "inproc://scripted-" + name; }
  AllReduceMember member() const { return {name, address()}; }
};

TEST_CASE("bytes that do not match the donor's own hash, or do not decode, are refused; the next donor serves") {
  const Checkpoint honest = sample_state(6, 1.0f);
  const std::string honest_bytes = *encode_checkpoint(honest);
  const uint64_t honest_hash = XXH3_64bits(honest_bytes.data(), honest_bytes.size());
  std::string flipped = honest_bytes;
  flipped[flipped.size() / 2] ^= 0x40;
  ScriptedDonor liar("claims-honest-hash", flipped, honest_hash, 6);  // another state under the honest hash
  const std::string garbage(honest_bytes.size(), 'x');
  ScriptedDonor junk("junk", garbage, XXH3_64bits(garbage.data(), garbage.size()), 6);  // consistent, not a state
  Donor good("after-liars", honest);
  ClientCache<InprocTransport> clients;
  StateDownloadReport report;
  auto got = download_state(clients, 0, {liar.member(), junk.member(), good.member()},
                            StateTransferConfig{.chunk_bytes = 256}, &report,
                            check_against(content_hash(honest.tensors), 6));
  REQUIRE_MESSAGE(got.is_ok(), got.status().to_string());
  CHECK(content_hash(got->tensors) == content_hash(honest.tensors));
  REQUIRE(report.refused.size() == 2);
  CHECK(report.refused[0].find("do not match the hash") != std::string::npos);
  CHECK(report.refused[1].starts_with("junk:"));
  // The honest donor offers the liar's claimed hash: still, nothing was resumed from the refused bytes.
  CHECK(report.resumed_at == -1);
}

TEST_CASE("check_finite finds NaN and infinity in f32, f16 and bf16 tensors, and ignores integers") {
  Checkpoint state = sample_state(1, 0.0f);
  CHECK(check_finite(state).is_ok());
  state.tensors[0].tensor.data<float>()[299] = std::numeric_limits<float>::infinity();
  CHECK(check_finite(state).code() == StatusCode::invalid_argument);
  for (auto [dtype, bits] : {std::pair{DType::f16, uint16_t{0x7c00}}, std::pair{DType::bf16, uint16_t{0x7fc1}}}) {
    Checkpoint half;
    Tensor t = *Tensor::zeros(Shape{4}, dtype);
    half.tensors.push_back({"param/h", t});
    CHECK(check_finite(half).is_ok());
    static_cast<uint16_t*>(t.raw_data())[2] = bits;
    CHECK(check_finite(half).code() == StatusCode::invalid_argument);
  }
  Checkpoint counts;
  Tensor steps = *Tensor::zeros(Shape{1}, DType::i64);
  steps.data<int64_t>()[0] = -1;  // all ones: no float, so no NaN
  counts.tensors.push_back({"optim/optimizer.step", steps});
  CHECK(check_finite(counts).is_ok());
}

}  // namespace
}  // namespace swarm
