#include "swarm/wiring/stochastic_wiring.h"

#include <cmath>
#include <utility>

namespace swarm {

Status StochasticWiringConfig::validate() const {
  if (!(ema_alpha > 0 && ema_alpha <= 1)) {
    return invalid_argument("ema_alpha must be in (0, 1], got {}", ema_alpha);
  }
  if (!(backward_cost > 0) || !std::isfinite(backward_cost)) {
    return invalid_argument("backward_cost must be positive and finite, got {}", backward_cost);
  }
  if (!(default_seconds_per_sample > 0) || !std::isfinite(default_seconds_per_sample)) {
    return invalid_argument("default_seconds_per_sample must be positive and finite, got {}",
                            default_seconds_per_sample);
  }
  return Status::ok();
}

Result<StochasticWiringRouter> StochasticWiringRouter::create(const StochasticWiringConfig& config) {
  SWARM_RETURN_IF_ERROR(config.validate().with_context("stochastic wiring config"));
  return StochasticWiringRouter(config, Unchecked{});
}

void StochasticWiringRouter::set_peers(const std::vector<PeerAnnouncement>& peers, double now) {
  bans_.forget_expired(now);
  ++generation_;
  // Taken once, before anyone joins, so peers joining together all start level with
  // the current front of the stage rather than with each other's increments.
  const double entry_vtime = min_key();
  for (const PeerAnnouncement& a : peers) {
    if (a.expires_at <= now) continue;  // a record the registry should already have dropped
    if (!bans_.empty() && bans_.still_banned(a)) continue;
    const int64_t found = index_.find(a.id);
    if (found < 0) {
      add_peer(a, entry_vtime, generation_);
      continue;
    }
    const uint32_t slot = static_cast<uint32_t>(found);
    Slot& s = slots_[slot];
    if (s.seen == generation_ && a.expires_at <= s.expires_at) continue;  // older duplicate
    s.seen = generation_;
    s.expires_at = a.expires_at;
    s.queue_length = a.queue_length;
    const double penalty =
        config_.use_queue_length ? static_cast<double>(std::max<int64_t>(0, a.queue_length)) * estimate(s) : 0;
    if (penalty != s.penalty) {
      s.penalty = penalty;
      ++s.version;
      push(slot);
    }
  }
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].live && slots_[i].seen != generation_) remove_peer(i);
  }
  if (heap_.size() > 2 * index_.size() + 32) rebuild_heap();
}

std::optional<PeerId> StochasticWiringRouter::choose_impl(double cost,
                                                          const std::vector<PeerId>* exclude) {
  std::optional<PeerId> chosen;
  set_aside_.clear();
  for (;;) {
    drop_stale_top();
    if (heap_.empty()) break;
    Entry& top = heap_[0];
    Slot& s = slots_[top.slot];
    if (exclude != nullptr && wiring::contains(*exclude, s.id)) {
      // Held out of the heap for this one choice, then put back with its key intact:
      // being tried and excluded is not the same as being given work.
      set_aside_.push_back(top);
      heap_[0] = heap_.back();
      heap_.pop_back();
      if (!heap_.empty()) sift_down(0);
      continue;
    }
    floor_vtime_ = top.key;
    s.vtime += cost * estimate(s);
    top.key = key_of(s);
    sift_down(0);
    chosen = s.id;
    break;
  }
  for (const Entry& e : set_aside_) {
    heap_.push_back(e);
    sift_up(heap_.size() - 1);
  }
  return chosen;
}

void StochasticWiringRouter::report(const PeerId& peer, TaskKind kind, int64_t task_size,
                                    Outcome outcome, double duration_seconds, double now) {
  const int64_t found = index_.find(peer);
  if (found < 0) return;
  const uint32_t slot = static_cast<uint32_t>(found);
  Slot& s = slots_[slot];
  const double cost = task_cost(kind, task_size);
  // A zero-size task or a nonsense duration says nothing about speed.
  const bool measurable = cost > 0 && duration_seconds >= 0 && std::isfinite(duration_seconds);
  switch (outcome) {
    case Outcome::success:
      if (measurable) {
        // The first measurement replaces the default guess: take back the part of
        // the virtual-time advance that the guess over- (or under-) charged, or a
        // peer charged at a 1 s/sample default would sit idle behind peers whose
        // real tasks take milliseconds.
        const bool first = s.decay == 1.0;
        const double guessed = estimate(s);
        observe(s, duration_seconds / cost);
        if (first) {
          s.vtime = std::max(min_key(), s.vtime - cost * (guessed - estimate(s)));
          ++s.version;
          push(slot);
        }
      }
      break;
    case Outcome::timeout:
      // The task took at least this long; counting it keeps a peer that is alive but
      // overloaded from being handed the same share again and again.
      if (measurable && config_.timeout_slows_estimate) observe(s, duration_seconds / cost);
      break;
    case Outcome::error:
      bans_.ban(s.id, s.expires_at);
      remove_peer(slot);
      break;
  }
}

std::optional<double> StochasticWiringRouter::seconds_per_sample(const PeerId& peer) const {
  const int64_t found = index_.find(peer);
  if (found < 0) return std::nullopt;
  return estimate(slots_[found]);
}

std::optional<double> StochasticWiringRouter::virtual_finish_time(const PeerId& peer) const {
  const int64_t found = index_.find(peer);
  if (found < 0) return std::nullopt;
  return key_of(slots_[found]);
}

void StochasticWiringRouter::observe(Slot& s, double seconds_per_sample) {
  const double alpha = config_.ema_alpha;
  s.ema = alpha * seconds_per_sample + (1 - alpha) * s.ema;
  // (1 - alpha)^n would sink into denormals after a few thousand samples, where
  // each multiply costs ~100 cycles; by 1e-12 the correction is nothing anyway.
  s.decay = s.decay < 1e-12 ? 0.0 : s.decay * (1 - alpha);
  s.estimate = s.decay == 0.0 ? s.ema : s.ema / (1 - s.decay);
}

void StochasticWiringRouter::add_peer(const PeerAnnouncement& a, double start_vtime,
                                      uint64_t generation) {
  uint32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slot = static_cast<uint32_t>(slots_.size());
    slots_.emplace_back();
  }
  Slot& s = slots_[slot];
  // The version carries over from the slot's previous occupant, so its heap entries stay stale.
  const uint32_t version = s.version + 1;
  s = Slot{};
  s.id = a.id;
  s.vtime = start_vtime;
  s.expires_at = a.expires_at;
  s.queue_length = a.queue_length;
  s.estimate = config_.default_seconds_per_sample;
  s.penalty = config_.use_queue_length
                  ? static_cast<double>(std::max<int64_t>(0, a.queue_length)) * estimate(s)
                  : 0;
  s.tiebreak = rng_.next();
  s.seen = generation;
  s.version = version;
  s.live = true;
  index_.insert(a.id, slot);
  push(slot);
}

void StochasticWiringRouter::remove_peer(uint32_t slot) {
  Slot& s = slots_[slot];
  index_.erase(s.id);
  s.live = false;
  ++s.version;
  free_slots_.push_back(slot);
}

void StochasticWiringRouter::push(uint32_t slot) {
  const Slot& s = slots_[slot];
  heap_.push_back(Entry{key_of(s), s.tiebreak, slot, s.version});
  sift_up(heap_.size() - 1);
}

void StochasticWiringRouter::drop_stale_top() {
  while (!heap_.empty() && stale(heap_[0])) {
    heap_[0] = heap_.back();
    heap_.pop_back();
    if (!heap_.empty()) sift_down(0);
  }
}

double StochasticWiringRouter::min_key() {
  drop_stale_top();
  return heap_.empty() ? floor_vtime_ : heap_[0].key;
}

void StochasticWiringRouter::rebuild_heap() {
  std::erase_if(heap_, [this](const Entry& e) { return stale(e); });
  for (size_t i = heap_.size() / 2; i-- > 0;) sift_down(i);
}

void StochasticWiringRouter::sift_up(size_t i) {
  Entry e = heap_[i];
  while (i > 0) {
    const size_t parent = (i - 1) / 2;
    if (!before(e, heap_[parent])) break;
    heap_[i] = heap_[parent];
    i = parent;
  }
  heap_[i] = e;
}

void StochasticWiringRouter::sift_down(size_t i) {
  const size_t n = heap_.size();
  Entry e = heap_[i];
  for (;;) {
    size_t child = 2 * i + 1;
    if (child >= n) break;
    if (child + 1 < n && before(heap_[child + 1], heap_[child])) ++child;
    if (!before(heap_[child], e)) break;
    heap_[i] = heap_[child];
    i = child;
  }
  heap_[i] = e;
}

}  // namespace swarm
