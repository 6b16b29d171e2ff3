// Which types model the Registry concept, and which do not.
#include <doctest/doctest.h>

#include "swarm/api/registry.h"
#include "swarm/registry/dht_registry.h"
#include "swarm/registry/in_process_registry.h"

namespace swarm {
namespace {

// Every member a registry needs, but no opt-in tag: not a registry.
struct LooksLikeARegistry {
  Status announce(const std::string&, const std::string&, std::string, double) { return {}; }
  Result<std::vector<Record>> get(const std::string&) { return std::vector<Record>{}; }
  Status withdraw(const std::string&, const std::string&) { return {}; }
  double now() const { return 0; }
};

// Opted in, but get returns the wrong type.
struct TaggedButWrongGet : LooksLikeARegistry {
  using registry_concept = registry_t;
  std::vector<Record> get(const std::string&) { return {}; }
};

// Opted in, but cannot withdraw.
struct TaggedWithoutWithdraw {
  using registry_concept = registry_t;
  Status announce(const std::string&, const std::string&, std::string, double) { return {}; }
  Result<std::vector<Record>> get(const std::string&) { return std::vector<Record>{}; }
  double now() const { return 0; }
};

struct Tagged : LooksLikeARegistry {
  using registry_concept = registry_t;
};

// Opted in, but its clock cannot be read through a const registry.
struct TaggedWithNonConstNow : Tagged {
  double now() { return 0; }
};

static_assert(Registry<InProcessRegistry>);
static_assert(Registry<DhtRegistry>);
static_assert(Registry<Tagged>);
static_assert(!Registry<LooksLikeARegistry>);
static_assert(!Registry<TaggedButWrongGet>);
static_assert(!Registry<TaggedWithoutWithdraw>);
static_assert(!Registry<TaggedWithNonConstNow>);
static_assert(!Registry<int>);

// Code written once against the concept.
template <Registry R>
Status announce_for(R& registry, double lifetime) {
  return registry.announce("stage/0", "peer", "{}", registry.now() + lifetime);
}

TEST_CASE("generic code announces through any Registry") {
  InProcessRegistry registry;
  REQUIRE(announce_for(registry, 300).is_ok());
  auto records = registry.get("stage/0");
  REQUIRE(records.is_ok());
  CHECK(records->size() == 1);
}

}  // namespace
}  // namespace swarm
