#include "tests/sync_harness/fault_fuzzer.h"

#include <algorithm>

#include <fmt/format.h>

#include "swarm/core/random.h"

namespace swarm::sync {

namespace {

struct Action {
  enum class Kind { kill, restart, stop, view_delay, view_blind, view_lossy, view_heal, rule };
  double at = 0;
  Kind kind = Kind::kill;
  int peer = 0;
  double amount = 0;  // stop: seconds; view_delay: seconds behind; view_lossy: probability a get fails
  FaultRule rule;
};

double between(SplitMix64& rng, double lo, double hi) { return lo + rng.next_unit() * (hi - lo); }

template <typename T, size_t N>
T pick(SplitMix64& rng, const T (&choices)[N]) {
  return choices[rng.below(N)];
}

std::string describe(const Action& a) {
  switch (a.kind) {
    case Action::Kind::kill: return fmt::format("{:6.2f} kill p{}", a.at, a.peer);
    case Action::Kind::restart: return fmt::format("{:6.2f} restart p{}", a.at, a.peer);
    case Action::Kind::stop: return fmt::format("{:6.2f} stop p{} for {:.2f} s", a.at, a.peer, a.amount);
    case Action::Kind::view_delay: return fmt::format("{:6.2f} p{}'s view {:.1f} s behind", a.at, a.peer, a.amount);
    case Action::Kind::view_blind: return fmt::format("{:6.2f} p{}'s view blind", a.at, a.peer);
    case Action::Kind::view_lossy: return fmt::format("{:6.2f} p{}'s gets lost with p={:.2f}", a.at, a.peer, a.amount);
    case Action::Kind::view_heal: return fmt::format("{:6.2f} p{}'s view heals", a.at, a.peer);
    case Action::Kind::rule: {
      const FaultRule& r = a.rule;
      return fmt::format("{:6.2f} until {:.2f}: {} phase {} from {} to {}: drop {:.1f} duplicate {:.1f} delay {:.2f}+{:.2f}",
                         r.start, r.end, r.op ? std::string(round_op_name(*r.op)) : "any op", r.phase, r.from, r.to,
                         r.drop, r.duplicate, r.delay, r.jitter);
    }
  }
  return "?";
}

// The faults of one schedule, in time order: every one starts in [1, heal) and is over by `heal`.
std::vector<Action> draw_actions(SplitMix64& rng, int peers, double heal) {
  std::vector<Action> out;
  const int count = 1 + static_cast<int>(rng.below(8));
  for (int k = 0; k < count; ++k) {
    Action a;
    a.at = between(rng, 1.0, heal - 0.5);
    a.peer = static_cast<int>(rng.below(static_cast<uint64_t>(peers)));
    const double room = heal - a.at;
    const double span = between(rng, 0.2, std::min(8.0, room));
    switch (rng.below(9)) {
      case 0:
        a.kind = Action::Kind::kill;
        if (rng.below(3) != 0) {  // most come back while the faults still run
          Action back{a.at + between(rng, 0.2, room), Action::Kind::restart, a.peer, 0, {}};
          if (back.at < heal) out.push_back(back);
        }
        break;
      case 1:
        a.kind = Action::Kind::restart;  // a crash and an immediate restart: a fresh replica at step 0
        break;
      case 2:
        a.kind = Action::Kind::stop;
        a.amount = span;
        break;
      case 3:
      case 4:
      case 5: {
        const Action::Kind kinds[] = {Action::Kind::view_delay, Action::Kind::view_blind, Action::Kind::view_lossy};
        a.kind = kinds[rng.below(3)];
        // Within the design's envelope: a view lags, or loses its gets, for less
        // than the 5 s after which a record counts as gone. Past it, a peer that
        // never committed cannot tell a registry outage from an empty stage (its
        // driver drops its own record), and serves alone by design.
        const double delays[] = {0.3, 0.8, 1.5, 3.0};
        a.amount = a.kind == Action::Kind::view_delay ? pick(rng, delays) : between(rng, 0.3, 0.95);
        out.push_back({a.at + std::min(span, 4.0), Action::Kind::view_heal, a.peer, 0, {}});
        break;
      }
      default: {
        a.kind = Action::Kind::rule;
        FaultRule& r = a.rule;
        if (rng.below(4) != 0) r.op = static_cast<RoundOp>(rng.below(6));  // join .. abort
        if (r.op == RoundOp::part && rng.below(2) == 0) r.phase = static_cast<int>(rng.below(2));
        if (rng.below(2) == 0) r.from = static_cast<int>(rng.below(static_cast<uint64_t>(peers)));
        if (rng.below(2) == 0) r.to = static_cast<int>(rng.below(static_cast<uint64_t>(peers)));
        r.start = a.at;
        r.end = a.at + span;
        const double drops[] = {0.0, 0.2, 0.5, 1.0};
        const double dups[] = {0.0, 0.0, 0.3, 1.0};
        const double delays[] = {0.0, 0.0, 0.3, 1.5, 4.0};
        r.drop = pick(rng, drops);
        r.duplicate = pick(rng, dups);
        r.delay = pick(rng, delays);
        r.jitter = r.delay > 0 ? between(rng, 0, r.delay) : 0;
        break;
      }
    }
    out.push_back(a);
  }
  std::stable_sort(out.begin(), out.end(), [](const Action& x, const Action& y) { return x.at < y.at; });
  return out;
}

void apply(Harness& h, const Action& a) {
  switch (a.kind) {
    case Action::Kind::kill:
      if (h.alive(a.peer)) h.kill(a.peer);
      return;
    case Action::Kind::restart: h.restart(a.peer); return;
    case Action::Kind::stop:
      if (h.alive(a.peer)) h.stop(a.peer, a.amount);
      return;
    case Action::Kind::view_delay: h.view(a.peer).delay = a.amount; return;
    case Action::Kind::view_blind: h.view(a.peer).blind = true; return;
    case Action::Kind::view_lossy:
      h.view(a.peer).lost = a.amount;
      h.view(a.peer).slow = 0.5;
      return;
    case Action::Kind::view_heal: h.view(a.peer) = ReaderFaults{.delay = 0.05}; return;
    case Action::Kind::rule: h.add_fault(a.rule); return;
  }
}

}  // namespace

std::string replay_command(uint64_t seed) {
  return fmt::format(
      "SYNC_FUZZ_SEED={} SYNC_LOG=1 bazel-bin/tests/sync_harness/sync_harness_test -tc='the fuzzer*'  "
      "(after ./bazelw build //tests/sync_harness:sync_harness_test)",
      seed);
}

FuzzOutcome run_schedule(uint64_t seed, const FuzzOptions& options) {
  SplitMix64 rng(seed ^ 0xfa017ull);
  FuzzOutcome out;
  out.seed = seed;
  out.peers = 2 + static_cast<int>(rng.below(4));
  HarnessOptions ho{.seed = seed, .peers = out.peers, .log = options.log};
  ho.view_delay_max = between(rng, 0.0, 0.3);
  ho.net_delay_max = between(rng, 0.005, 0.05);
  const double heal = options.fault_seconds;
  const std::vector<Action> actions = draw_actions(rng, out.peers, heal);
  std::vector<bool> back_at_heal(static_cast<size_t>(out.peers));
  for (size_t i = 0; i < back_at_heal.size(); ++i) back_at_heal[i] = rng.below(2) == 0;
  for (const auto& a : actions) out.schedule += describe(a) + "\n";

  Harness h(ho);
  for (const auto& a : actions) {
    h.run_until(a.at);
    apply(h, a);
  }
  h.run_until(heal);
  // Every fault heals; some of the dead come back as fresh processes.
  h.clear_faults();
  int alive = 0;
  for (int i = 0; i < out.peers; ++i) {
    h.view(i) = ReaderFaults{.delay = 0.05};
    if (!h.alive(i) && back_at_heal[static_cast<size_t>(i)]) {
      h.restart(i);
      out.schedule += fmt::format("{:6.2f} restart p{} (healing)\n", heal, i);
    }
    alive += h.alive(i);
  }
  out.schedule += fmt::format("{:6.2f} faults heal; {} of {} peers alive\n", heal, alive, out.peers);
  const int64_t applied_at_heal = h.stats().steps_applied;
  out.liveness_checked = 2 * alive > out.peers;
  h.run_for(options.liveness_bound);
  if (out.liveness_checked && h.stats().steps_applied == applied_at_heal) {
    std::string peers;
    for (int i = 0; i < out.peers; ++i) {
      const char* modes[] = {"looking", "serving", "resyncing"};
      peers += !h.alive(i) ? fmt::format(" p{} dead;", i)
                           : fmt::format(" p{} {} at {} leader '{}' members {};", i,
                                         modes[static_cast<int>(h.rounds(i).mode())], h.replica(i).step(),
                                         h.rounds(i).leader(), h.rounds(i).membership().size());
    }
    out.violations.push_back(fmt::format("liveness: no replica stepped in the {} s after the faults healed (t={:.1f}):{}",
                                         options.liveness_bound, heal, peers));
  }
  h.run_until(heal + options.tail_seconds);
  h.check_ledger();
  for (const auto& v : h.violations()) out.violations.push_back(v);

  int64_t lo = INT64_MAX, hi = INT64_MIN;
  out.converged = true;
  for (int i = 0; i < out.peers; ++i) {
    if (!h.alive(i)) continue;
    out.converged = out.converged && h.rounds(i).mode() == StageRounds::Mode::serving;
    lo = std::min(lo, h.replica(i).step());
    hi = std::max(hi, h.replica(i).step());
  }
  out.converged = out.converged && hi - lo <= 1;
  out.digest = h.digest();
  out.simulated_seconds = h.now();
  out.stats = h.stats();
  return out;
}

}  // namespace swarm::sync
