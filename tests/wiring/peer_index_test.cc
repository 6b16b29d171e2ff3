// PeerIndex against std::unordered_map under random inserts, replacements and
// erases (backward-shift deletion is where open addressing goes wrong).
#include <random>
#include <string>
#include <unordered_map>

#include <doctest/doctest.h>

#include "swarm/wiring/peer_index.h"

namespace swarm::wiring {
namespace {

TEST_CASE("PeerIndex agrees with unordered_map through 20000 random operations") {
  PeerIndex index;
  std::unordered_map<std::string, uint32_t> reference;
  std::mt19937 rng(4);
  for (int op = 0; op < 20000; ++op) {
    // Few distinct ids, of lengths across the 8-byte word boundary, so probe runs collide and wrap.
    const std::string id = std::string(1 + rng() % 12, 'p') + std::to_string(rng() % 300);
    switch (rng() % 3) {
      case 0:
      case 1: {
        const uint32_t slot = rng() % 1000;
        index.insert(id, slot);
        reference[id] = slot;
        break;
      }
      case 2:
        index.erase(id);
        reference.erase(id);
        break;
    }
    if (op % 97 == 0) {
      REQUIRE(index.size() == reference.size());
      for (const auto& [key, slot] : reference) REQUIRE(index.find(key) == slot);
    }
    const auto it = reference.find(id);
    CHECK(index.find(id) == (it == reference.end() ? -1 : int64_t{it->second}));
  }
  CHECK(index.find("never-inserted") == -1);
}

TEST_CASE("an empty PeerIndex finds nothing and erases nothing") {
  PeerIndex index;
  CHECK(index.find("a") == -1);
  index.erase("a");
  CHECK(index.size() == 0);
}

}  // namespace
}  // namespace swarm::wiring
