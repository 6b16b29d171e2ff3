#include "tests/sync_harness/sync_harness.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tests/sync_harness/harness_peer.h"

namespace swarm::sync {

namespace {
constexpr size_t kMaxViolations = 20;
}

Harness::Harness(HarnessOptions options)
    : options_(std::move(options)),
      rng_(options_.seed),
      registry_(options_.record_ttl, options_.record_ttl + 30.0) {
  if (std::getenv("SYNC_LOG") != nullptr) options_.log = true;  // a replay's diagnosis, without a rebuild
  RoundsConfig probe = options_.rounds;
  probe.peer_id = "p0";
  if (Status valid = probe.validate(options_.publish_period); !valid.is_ok()) {
    violations_.push_back("config: " + valid.to_string());
  }
  for (int i = 0; i < options_.peers; ++i) peers_.push_back(make_peer(i));
}

Harness::~Harness() = default;

std::unique_ptr<Harness::Peer> Harness::make_peer(int i) {
  auto p = std::make_unique<Peer>();
  p->index = i;
  p->id = fmt::format("p{}", i);
  p->address = "sim://" + p->id;
  p->replica = std::make_unique<StubReplica>([this, i](int64_t step, uint64_t hash) { on_step(i, step, hash); });
  RoundsConfig config = options_.rounds;
  config.peer_id = p->id;
  config.address = p->address;
  config.stage = 0;
  p->rounds = std::make_unique<StageRounds>(config, p->replica.get(), RoundCodec::raw(), now_);
  // Processes do not start in lockstep: publications and reads are spread over a period.
  p->next_publish = now_ + rng_.next_unit() * options_.publish_period;
  p->next_read = now_ + rng_.next_unit() * options_.read_period;
  p->faults.delay = rng_.next_unit() * options_.view_delay_max;
  return p;
}

const std::string& Harness::id(int i) const { return peers_.at(static_cast<size_t>(i))->id; }
const StageRounds& Harness::rounds(int i) const { return *peers_.at(static_cast<size_t>(i))->rounds; }
const StubReplica& Harness::replica(int i) const { return *peers_.at(static_cast<size_t>(i))->replica; }
bool Harness::alive(int i) const { return peers_.at(static_cast<size_t>(i))->alive; }
bool Harness::active(int i) const {
  const Peer& p = *peers_.at(static_cast<size_t>(i));
  return p.alive && now_ >= p.stopped_until;
}
ReaderFaults& Harness::view(int i) { return peers_.at(static_cast<size_t>(i))->faults; }
std::vector<RoundEvent> Harness::events(int i) const { return peers_.at(static_cast<size_t>(i))->events; }

void Harness::kill(int i) {
  Peer& p = *peers_.at(static_cast<size_t>(i));
  p.alive = false;
  mix(0xdead0000u + static_cast<uint64_t>(i));
}

void Harness::restart(int i) {
  Peer& old = *peers_.at(static_cast<size_t>(i));
  const uint64_t incarnation = old.incarnation + 1;
  const ReaderFaults faults = old.faults;
  graveyard_.push_back(std::move(old.replica));
  peers_[static_cast<size_t>(i)] = make_peer(i);
  peers_[static_cast<size_t>(i)]->incarnation = incarnation;
  peers_[static_cast<size_t>(i)]->faults = faults;
  mix(0x5ea10000u + static_cast<uint64_t>(i));
}

void Harness::stop(int i, double seconds) {
  Peer& p = *peers_.at(static_cast<size_t>(i));
  p.stopped_until = std::max(p.stopped_until, now_ + seconds);
  mix(0x570b0000u + static_cast<uint64_t>(i));
}

void Harness::forge_record(const ProgressRecord& record) {
  forged_.push_back(record);
  next_forge_ = now_;
}

void Harness::tamper_records(int i, std::function<void(ProgressRecord&)> lie) {
  peers_.at(static_cast<size_t>(i))->lie = std::move(lie);
}

void Harness::run_until(double t) {
  const auto last = static_cast<int64_t>(std::llround(t / options_.tick));
  while (tick_ < last) tick_once();
}

void Harness::tick_once() {
  ++tick_;
  now_ = static_cast<double>(tick_) * options_.tick;
  while (auto f = network_.pop_due(now_)) handle(std::move(*f));
  if (!forged_.empty() && now_ >= next_forge_) {
    for (const auto& r : forged_) registry_.publish(r, now_);
    next_forge_ = now_ + options_.publish_period;
  }
  for (auto& p : peers_) {
    if (active(p->index)) publish_due(*p);
  }
  feed();
  for (auto& p : peers_) {
    if (active(p->index)) drive(*p);
  }
  if (tick_ % 100 == 0) registry_.prune(now_);
  if (options_.log && tick_ % 100 == 0) {
    for (const auto& p : peers_) {
      if (!p->alive) continue;
      fmt::print(stderr, "{:8.2f} {} state: mode {} step {} in_round {} leader '{}' members [{}] pending {} rate {:.1f} stopped {}\n", now_, p->id,
                 static_cast<int>(p->rounds->mode()), p->replica->step(), p->rounds->in_round(), p->rounds->leader(),
                 fmt::join(p->rounds->membership(), " "), p->replica->pending_samples(), p->rate, now_ < p->stopped_until);
    }
  }
}

void Harness::publish_due(Peer& p) {
  if (now_ < p.next_publish) return;
  ProgressRecord record = p.rounds->progress(now_);
  if (p.lie) p.lie(record);
  if (!registry_.publish(std::move(record), now_)) {
    if (violations_.size() < kMaxViolations) violations_.push_back("record: " + p.id + "'s record does not survive its JSON");
  } else {
    p.rounds->published(now_);
  }
  p.next_publish = std::max(p.next_publish + options_.publish_period, now_ + 0.5 * options_.publish_period);
}

// As the peer's driver reads (swarm/peer/stage_sync.h): each get's records merge
// into what it knew, its own left out; what went stale is forgotten; the protocol
// sees the rest, whether or not this get answered.
void Harness::read_due(Peer& p) {
  if (now_ < p.next_read) return;
  p.next_read = now_ + options_.read_period;
  // Both draws happen for every read, so a fault's probability does not shift the rest of the run.
  const double lost = rng_.next_unit(), slow = rng_.next_unit();
  if (lost >= p.faults.lost && !p.faults.blind) {
    const double as_of = now_ - p.faults.delay - (slow < p.faults.slow ? p.faults.slow_extra : 0.0);
    for (auto& r : registry_.read(as_of)) {
      if (r.peer_id == p.id) continue;
      auto& known = p.known[r.peer_id];
      if (r.published_at >= known.published_at) known = std::move(r);
    }
  }
  std::erase_if(p.known, [&](const auto& entry) {
    return entry.second.published_at < now_ - options_.rounds.stale_seconds;
  });
  std::vector<ProgressRecord> view;
  view.reserve(p.known.size());
  for (const auto& [id, r] : p.known) view.push_back(r);
  p.rounds->observe(view, now_);
}

void Harness::feed() {
  std::vector<Peer*> serving;
  for (auto& p : peers_) {
    p->fed_this_tick = 0;
    if (active(p->index) && p->rounds->serving()) serving.push_back(p.get());
  }
  // Microbatches arrive at the stage's rate whether or not anyone takes them; none is counted unless fed.
  const double per_tick = options_.samples_per_second * options_.tick;
  const double mean_batch = 0.5 * (1 + options_.max_microbatch);
  const double u = rng_.next_unit();
  int microbatches = static_cast<int>(per_tick / mean_batch);
  if (u < per_tick / mean_batch - microbatches) ++microbatches;
  for (int m = 0; m < microbatches; ++m) {
    const int64_t n = 1 + static_cast<int64_t>(rng_.below(static_cast<uint64_t>(options_.max_microbatch)));
    if (serving.empty()) continue;
    Peer& p = *serving[rng_.below(serving.size())];
    p.replica->add_samples(n, rng_);
    p.fed_this_tick += n;
    stats_.fed += n;
  }
  for (auto& p : peers_) {
    const double instant = static_cast<double>(p->fed_this_tick) / options_.tick;
    p->rate += (instant - p->rate) * options_.tick;  // about a second's average
  }
}

void Harness::drive(Peer& p) {
  read_due(p);
  p.rounds->set_rate(p.rate);
  p.rounds->tick(now_);
  maybe_resync(p);
  drain(p);
}

void Harness::drain(Peer& p) {
  for (auto& out : p.rounds->take_outbox()) send(p.index, std::move(out));
  for (auto& e : p.rounds->take_events()) {
    ++stats_.kind[static_cast<int>(e.kind)];
    mix((uint64_t(p.index) << 56) ^ (uint64_t(e.kind) << 48) ^ uint64_t(e.step));
    mix(e.group);
    if (options_.log) {
      fmt::print(stderr, "{:8.2f} {} event {} step {} group {:016x} led {} members {} {}\n", now_, p.id,
                 static_cast<int>(e.kind), e.step, e.group, e.led, e.members, e.text);
    }
    p.events.push_back(std::move(e));
  }
}

// The driver's download, as state_transfer and StageSync::resync do it: ask the
// donors in order for their state, take the first one's as it is then (a donor
// that stepped since hands over a newer one), and once it arrived load it, wait
// for the records to vouch for it (bounded), or refuse it, as the protocol judges.
void Harness::maybe_resync(Peer& p) {
  if (p.rounds->mode() != StageRounds::Mode::resyncing) {
    p.pick_at.reset();
    p.load_at.reset();
    p.downloaded.reset();
    return;
  }
  if (!p.pick_at && !p.load_at) {
    p.pick_at = now_ + 0.01 + rng_.next_unit() * 0.04;
    return;
  }
  if (p.pick_at) {
    if (now_ < *p.pick_at) return;
    p.pick_at.reset();
    if (const auto& target = p.rounds->resync_target()) {
      for (const auto& donor : target->donors) {
        const int d = index_of_address(donor.address);
        if (d < 0 || d == p.index || !active(d)) continue;
        p.downloaded = peers_[static_cast<size_t>(d)]->replica->snapshot();
        break;
      }
    }
    if (p.downloaded) {
      p.load_at = now_ + options_.resync_min + rng_.next_unit() * (options_.resync_max - options_.resync_min);
      return;
    }
  } else if (now_ < *p.load_at) {
    return;
  }
  bool loaded = false;
  if (p.downloaded) {
    const auto verdict = p.rounds->judge_download(p.downloaded->step, p.downloaded->hash);
    if (verdict == StageRounds::Downloaded::wait && now_ < *p.load_at + options_.rounds.stale_seconds) return;
    loaded = verdict == StageRounds::Downloaded::load;
  }
  p.load_at.reset();
  if (loaded) p.replica->load_state(*p.downloaded);
  p.downloaded.reset();
  ++(loaded ? stats_.resyncs_loaded : stats_.resyncs_failed);
  if (options_.log) fmt::print(stderr, "{:8.2f} {} download {} -> step {}\n", now_, p.id, loaded, p.replica->step());
  mix(0x10ad0000u ^ (uint64_t(p.index) << 8) ^ uint64_t(loaded));
  mix(p.replica->params_hash());
  p.rounds->resync_finished(loaded, now_);
}

int Harness::index_of_address(const std::string& address) const {
  for (const auto& p : peers_) {
    if (p->address == address) return p->index;
  }
  return -1;
}

void Harness::on_step(int i, int64_t step, uint64_t hash) {
  ++stats_.steps_applied;
  mix((uint64_t(i) << 56) ^ uint64_t(step));
  mix(hash);
  if (options_.log) fmt::print(stderr, "{:8.2f} {} applied step {} hash {:016x}\n", now_, id(i), step, hash);
  const bool first = step > lineage_.newest();
  if (first) newest_at_.emplace_back(now_, step);
  const auto seen = lineage_.record(step, hash, now_);
  if (!seen || *seen == hash) return;
  // Another hash at this step: a split stage if a live replica (stopped ones
  // included) descends from the other, else that lineage died with its holders.
  for (const auto& p : peers_) {
    if (!p->alive || p->index == i) continue;
    const auto theirs = p->replica->hash_at(step);
    if (theirs && *theirs != hash) {
      if (violations_.size() < kMaxViolations) {
        violations_.push_back(fmt::format("lineage: two at step {}: {} holds {:016x}, {} stepped to {:016x} at t={:.2f}",
                                          step, p->id, *theirs, id(i), hash, now_));
      }
      return;
    }
  }
  ++stats_.lineages_lost;
  lineage_.replace(step, hash);
}

int64_t Harness::stage_step() const { return lineage_.newest(); }

double Harness::step_rate(double from, double to) const {
  auto newest_before = [&](double t) {
    int64_t newest = 0;
    for (const auto& [at, step] : newest_at_) {
      if (at < t) newest = step;
    }
    return newest;
  };
  return to > from ? static_cast<double>(newest_before(to) - newest_before(from)) / (to - from) : 0.0;
}

void Harness::check_ledger() {
  int64_t total = 0;
  for (const auto& r : graveyard_) total += r->ledger().total();
  for (const auto& p : peers_) {
    total += p->replica->ledger().total();
    if (!p->alive) continue;
    const int64_t held = p->rounds->progress(now_).samples - p->replica->pending_samples();
    if (held != p->replica->ledger().in_round && violations_.size() < kMaxViolations) {
      violations_.push_back(fmt::format("ledger: {} holds {} samples for its round, its replica counts {} in a round", p->id,
                                        held, p->replica->ledger().in_round));
    }
  }
  if (total != stats_.fed && violations_.size() < kMaxViolations) {
    violations_.push_back(fmt::format("ledger: {} samples fed, {} accounted for by the replicas", stats_.fed, total));
  }
}

void Harness::mix(uint64_t v) {
  uint64_t z = (digest_ ^ v) + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  digest_ = z ^ (z >> 31);
}

void Harness::mix_text(const std::string& s) {
  for (size_t i = 0; i < s.size(); i += 8) {
    uint64_t w = 0;
    for (size_t k = i; k < std::min(s.size(), i + 8); ++k) w = (w << 8) | static_cast<unsigned char>(s[k]);
    mix(w);
  }
}

}  // namespace swarm::sync
