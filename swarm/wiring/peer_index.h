// peer_index: peer id -> slot, the lookup every report() of a router makes.
//
// Open addressing with linear probing and backward-shift deletion over a table at
// most half full, keyed by a short multiply-xorshift hash of the id's bytes. Peer
// ids are short strings, so one hash and usually one probe, with the id compared
// only on a full 64-bit hash match, beats std::unordered_map's node chase.
//
//   swarm::wiring::PeerIndex index;
//   index.insert("peer-7", 3);
//   int64_t slot = index.find("peer-7");  // 3; -1 when absent
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace swarm::wiring {

inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline uint64_t hash_peer_id(std::string_view id) {
  uint64_t h = 0x9e3779b97f4a7c15ull ^ id.size();
  size_t i = 0;
  for (; i + 8 <= id.size(); i += 8) {
    uint64_t word;
    std::memcpy(&word, id.data() + i, 8);
    h = mix64(h ^ word);
  }
  uint64_t tail = 0;
  std::memcpy(&tail, id.data() + i, id.size() - i);
  return mix64(h ^ tail);
}

class PeerIndex {
 public:
  int64_t find(std::string_view id) const {
    if (size_ == 0) return -1;
    const uint64_t h = hash_peer_id(id);
    for (size_t b = h & mask_;; b = (b + 1) & mask_) {
      const Bucket& bucket = buckets_[b];
      if (!bucket.used) return -1;
      if (bucket.hash == h && bucket.id == id) return bucket.slot;
    }
  }

  // Inserts or replaces.
  void insert(const std::string& id, uint32_t slot) {
    if (2 * (size_ + 1) > buckets_.size()) grow();
    const uint64_t h = hash_peer_id(id);
    for (size_t b = h & mask_;; b = (b + 1) & mask_) {
      Bucket& bucket = buckets_[b];
      if (!bucket.used) {
        bucket = Bucket{h, slot, true, id};
        ++size_;
        return;
      }
      if (bucket.hash == h && bucket.id == id) {
        bucket.slot = slot;
        return;
      }
    }
  }

  void erase(std::string_view id) {
    if (size_ == 0) return;
    const uint64_t h = hash_peer_id(id);
    size_t b = h & mask_;
    for (;; b = (b + 1) & mask_) {
      if (!buckets_[b].used) return;
      if (buckets_[b].hash == h && buckets_[b].id == id) break;
    }
    // Backward shift: pull later entries of the probe run into the hole, so lookups
    // never need tombstones.
    for (size_t next = (b + 1) & mask_;; next = (next + 1) & mask_) {
      Bucket& candidate = buckets_[next];
      if (!candidate.used) break;
      const size_t home = candidate.hash & mask_;
      // Movable when its home is not in (b, next] (cyclically).
      const bool stays = b <= next ? (home > b && home <= next) : (home > b || home <= next);
      if (stays) continue;
      buckets_[b] = std::move(candidate);
      candidate.used = false;
      b = next;
    }
    buckets_[b].used = false;
    buckets_[b].id.clear();
    --size_;
  }

  size_t size() const { return size_; }

 private:
  struct Bucket {
    uint64_t hash = 0;
    uint32_t slot = 0;
    bool used = false;
    std::string id;
  };

  void grow() {
    std::vector<Bucket> old = std::move(buckets_);
    buckets_.assign(old.empty() ? 16 : old.size() * 2, Bucket{});
    mask_ = buckets_.size() - 1;
    size_ = 0;
    for (Bucket& bucket : old) {
      if (bucket.used) insert(bucket.id, bucket.slot);
    }
  }

  std::vector<Bucket> buckets_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace swarm::wiring
