// The harness's transport: Outgoing frames in, decode + parse + receive at the
// destination, the receive's Status back to the sender as a reply, and a call
// timeout for whatever never answers.
#include <fmt/format.h>
#include <xxhash.h>

#include "swarm/wire/wire.h"
#include "tests/sync_harness/harness_peer.h"
#include "tests/sync_harness/sync_harness.h"

namespace swarm::sync {

namespace {

uint64_t frames_hash(const wire::Frames& frames) {
  uint64_t h = 0;
  for (const auto& v : frames.views()) h = XXH3_64bits_withSeed(v.data(), v.size(), h);
  return h;
}

// What the transport hands the protocol: the real decode and parse, or why not.
Result<RoundMessage> unwrap(const wire::Frames& frames) {
  SWARM_ASSIGN_OR_RETURN(wire::DecodedMessage decoded, wire::decode_message(frames.views(), wire::Limits{}));
  return parse_round_message(decoded, RoundCodec::raw(), RoundMessageLimits{});
}

}  // namespace

void Harness::send(int from, Outgoing out) {
  const int to = index_of_address(out.address);
  const RoundOp op = out.op;
  mix((uint64_t(tick_) << 20) ^ (uint64_t(from + 1) << 12) ^ (uint64_t(to + 1) << 4) ^ uint64_t(op));
  mix(frames_hash(out.frames));
  Flight f;
  f.from = from;
  f.from_incarnation = peers_[static_cast<size_t>(from)]->incarnation;
  f.to = to;
  f.out = std::make_shared<const Outgoing>(std::move(out));
  f.sent_at = now_;
  f.call = network_.new_call();
  const double delay = options_.net_delay_min + rng_.next_unit() * (options_.net_delay_max - options_.net_delay_min);
  if (to < 0) {  // nobody listens there: refused at once
    f.kind = Flight::Kind::reply;
    f.due = now_ + delay;
    f.status = unavailable("nothing listens at {}", f.out->address);
    network_.push(std::move(f));
    return;
  }
  Flight timeout = f;
  timeout.kind = Flight::Kind::timeout;
  timeout.due = now_ + options_.call_timeout;
  network_.push(timeout);
  int phase = -1;
  if (op == RoundOp::part && network_.needs_phase()) {
    if (auto m = unwrap(f.out->frames); m.is_ok()) phase = m->phase;
  }
  const FaultVerdict verdict = network_.judge(op, phase, from, to, now_, rng_);
  if (verdict.drop) {
    ++stats_.dropped;
    return;  // the timeout tells the sender
  }
  f.kind = Flight::Kind::deliver;
  f.due = now_ + delay + verdict.extra_delay;
  if (verdict.duplicate) {
    ++stats_.duplicated;
    Flight copy = f;
    copy.call = 0;  // the transport's retransmission: nobody waits for its answer
    copy.due += options_.net_delay_min + rng_.next_unit() * (options_.net_delay_max - options_.net_delay_min);
    network_.push(std::move(copy));
  }
  network_.push(std::move(f));
}

void Harness::inject(int to, const RoundMessage& message, double delay) {
  auto frames = encode_round_message(message, RoundCodec::raw());
  if (!frames.is_ok()) return;
  Flight f;
  f.kind = Flight::Kind::deliver;
  f.from = -1;
  f.to = to;
  f.out = std::make_shared<const Outgoing>(
      Outgoing{id(to), peers_[static_cast<size_t>(to)]->address, message.op, message.group, std::move(frames).value()});
  f.sent_at = now_;
  f.due = now_ + delay;
  ++stats_.injected;
  network_.push(std::move(f));
}

void Harness::handle(Flight f) {
  if (f.kind == Flight::Kind::deliver) {
    Peer& p = *peers_[static_cast<size_t>(f.to)];
    if (!p.alive) return;  // the sender's timeout answers for it
    if (now_ < p.stopped_until) {
      f.due = p.stopped_until;  // waits in the socket; order kept by the original seq
      network_.push(std::move(f));
      return;
    }
    deliver(std::move(f));
    return;
  }
  if (f.from < 0) return;
  Peer& p = *peers_[static_cast<size_t>(f.from)];
  if (!p.alive || p.incarnation != f.from_incarnation) return;
  if (now_ < p.stopped_until) {  // a stopped process reads its answers when it resumes
    f.due = p.stopped_until;
    network_.push(std::move(f));
    return;
  }
  if (!network_.resolve(f.call)) return;
  if (f.kind == Flight::Kind::timeout) {
    ++stats_.timeouts;
    notify_failure(f, deadline_exceeded("no answer from {} in {} s", f.out->to, options_.call_timeout));
  } else if (!f.status.is_ok()) {
    notify_failure(f, f.status);
  }
}

void Harness::deliver(Flight f) {
  Peer& p = *peers_[static_cast<size_t>(f.to)];
  Result<RoundMessage> m = unwrap(f.out->frames);
  Status status = m.is_ok() ? p.rounds->receive(*m, now_) : m.status();
  ++stats_.delivered;
  if (options_.log) {
    fmt::print(stderr, "{:8.2f} {} <- {} {} step {} group {:016x} {}\n", now_, p.id, m.is_ok() ? m->sender : "?",
               round_op_name(f.out->op), m.is_ok() ? m->step : -1, f.out->group, status.to_string());
  }
  if (!status.is_ok()) ++stats_.refused;
  if (f.from < 0 && !status.is_ok()) ++stats_.injected_refused;
  mix((uint64_t(tick_) << 20) ^ (uint64_t(f.to) << 8) ^ uint64_t(status.code()));
  drain(p);
  if (f.call == 0 || f.from < 0) return;
  Flight reply = f;
  reply.kind = Flight::Kind::reply;
  reply.status = std::move(status);
  reply.due = now_ + options_.net_delay_min + rng_.next_unit() * (options_.net_delay_max - options_.net_delay_min);
  network_.push(std::move(reply));
}

void Harness::notify_failure(const Flight& f, const Status& why) {
  Peer& p = *peers_[static_cast<size_t>(f.from)];
  if (options_.log) {
    fmt::print(stderr, "{:8.2f} {} failed {} -> {} group {:016x}: {}\n", now_, p.id, round_op_name(f.out->op), f.out->to,
               f.out->group, why.to_string());
  }
  p.rounds->delivery_failed(*f.out, why, now_);
  drain(p);
}

}  // namespace swarm::sync
