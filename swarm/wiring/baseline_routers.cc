#include "swarm/wiring/baseline_routers.h"

#include <algorithm>

namespace swarm {
namespace wiring {

void PeerList::update(const std::vector<PeerAnnouncement>& peers, double now) {
  bans_.forget_expired(now);
  std::vector<Peer> next;
  std::unordered_map<PeerId, size_t> next_index;
  next.reserve(peers.size());
  for (const PeerAnnouncement& a : peers) {
    if (a.expires_at <= now) continue;
    if (!bans_.empty() && bans_.still_banned(a)) continue;
    auto [it, inserted] = next_index.emplace(a.id, next.size());
    if (!inserted) {
      next[it->second].expires_at = std::max(next[it->second].expires_at, a.expires_at);
      continue;
    }
    const Peer* old = find(a.id);
    next.push_back(Peer{a.id, a.expires_at, old != nullptr ? old->outstanding : 0});
  }
  peers_ = std::move(next);
  index_ = std::move(next_index);
}

void PeerList::ban(const PeerId& id) {
  auto it = index_.find(id);
  if (it == index_.end()) return;
  bans_.ban(id, peers_[it->second].expires_at);
  peers_.erase(peers_.begin() + static_cast<std::ptrdiff_t>(it->second));
  reindex();
}

PeerList::Peer* PeerList::find(const PeerId& id) {
  auto it = index_.find(id);
  return it == index_.end() ? nullptr : &peers_[it->second];
}

void PeerList::reindex() {
  index_.clear();
  for (size_t i = 0; i < peers_.size(); ++i) index_.emplace(peers_[i].id, i);
}

}  // namespace wiring

std::optional<PeerId> RoundRobinRouter::choose(TaskKind kind, int64_t task_size, double now,
                                               const std::vector<PeerId>& exclude) {
  const auto& peers = list_.peers();
  const size_t n = peers.size();
  for (size_t k = 0; k < n; ++k) {
    const size_t i = (cursor_ + k) % n;
    if (!exclude.empty() && wiring::contains(exclude, peers[i].id)) continue;
    cursor_ = i + 1;
    return peers[i].id;
  }
  return std::nullopt;
}

std::optional<PeerId> UniformRandomRouter::choose(TaskKind kind, int64_t task_size, double now,
                                                  const std::vector<PeerId>& exclude) {
  const auto& peers = list_.peers();
  if (exclude.empty()) {
    if (peers.empty()) return std::nullopt;
    return peers[rng_.below(peers.size())].id;
  }
  size_t candidates = 0;
  for (const auto& p : peers) candidates += wiring::contains(exclude, p.id) ? 0 : 1;
  if (candidates == 0) return std::nullopt;
  size_t pick = rng_.below(candidates);
  for (const auto& p : peers) {
    if (wiring::contains(exclude, p.id)) continue;
    if (pick-- == 0) return p.id;
  }
  return std::nullopt;  // unreachable: pick < candidates
}

std::optional<PeerId> LeastLoadedRouter::choose(TaskKind kind, int64_t task_size, double now,
                                                const std::vector<PeerId>& exclude) {
  auto& peers = list_.peers();
  const size_t n = peers.size();
  size_t best = n;
  for (size_t k = 0; k < n; ++k) {
    const size_t i = (cursor_ + k) % n;
    if (!exclude.empty() && wiring::contains(exclude, peers[i].id)) continue;
    if (best == n || peers[i].outstanding < peers[best].outstanding) best = i;
  }
  if (best == n) return std::nullopt;
  ++peers[best].outstanding;
  cursor_ = best + 1;
  return peers[best].id;
}

void LeastLoadedRouter::report(const PeerId& peer, TaskKind kind, int64_t task_size,
                               Outcome outcome, double duration_seconds, double now) {
  if (outcome == Outcome::error) {
    list_.ban(peer);
    return;
  }
  if (auto* p = list_.find(peer); p != nullptr && p->outstanding > 0) --p->outstanding;
}

int64_t LeastLoadedRouter::outstanding(const PeerId& peer) const {
  for (const auto& p : list_.peers()) {
    if (p.id == peer) return p.outstanding;
  }
  return 0;
}

}  // namespace swarm
