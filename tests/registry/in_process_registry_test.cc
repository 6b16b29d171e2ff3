// The in-process registry: replacement by subkey, expiry on an injected clock,
// withdrawal, and independence of keys.
#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include "swarm/registry/in_process_registry.h"

namespace swarm {
namespace {

struct FakeClock {
  double t = 1000.0;
  InProcessRegistry::ClockFn fn() {
    return [this] { return t; };
  }
};

std::vector<std::string> values_of(const std::vector<Record>& records) {
  std::vector<std::string> out;
  for (const auto& r : records) out.push_back(r.value);
  std::sort(out.begin(), out.end());
  return out;
}

TEST_CASE("announce then get returns the record with its key, subkey and expiry") {
  FakeClock clock;
  InProcessRegistry registry(clock.fn());
  CHECK(registry.now() == 1000.0);
  REQUIRE(registry.announce("stage/0", "peer-a", R"({"port": 7000})", 1300.0).is_ok());
  auto records = registry.get("stage/0");
  REQUIRE(records.is_ok());
  REQUIRE(records->size() == 1);
  CHECK((*records)[0] == Record{"stage/0", "peer-a", R"({"port": 7000})", 1300.0});
}

TEST_CASE("an unknown key has no records, which is not an error") {
  InProcessRegistry registry;
  auto records = registry.get("nobody/here");
  REQUIRE(records.is_ok());
  CHECK(records->empty());
}

TEST_CASE("re-announcing a subkey replaces its record; other subkeys stay") {
  FakeClock clock;
  InProcessRegistry registry(clock.fn());
  REQUIRE(registry.announce("stage/0", "peer-a", "a1", 1300.0).is_ok());
  REQUIRE(registry.announce("stage/0", "peer-b", "b1", 1300.0).is_ok());
  REQUIRE(registry.announce("stage/0", "peer-a", "a2", 1200.0).is_ok());
  auto records = registry.get("stage/0");
  REQUIRE(records.is_ok());
  CHECK(values_of(*records) == std::vector<std::string>{"a2", "b1"});
  CHECK(registry.stored_records() == 2);
}

TEST_CASE("records vanish at their expiry time and are purged lazily") {
  FakeClock clock;
  InProcessRegistry registry(clock.fn());
  REQUIRE(registry.announce("stage/0", "short", "s", 1010.0).is_ok());
  REQUIRE(registry.announce("stage/0", "long", "l", 1300.0).is_ok());

  clock.t = 1009.999;
  CHECK(values_of(*registry.get("stage/0")) == std::vector<std::string>{"l", "s"});

  clock.t = 1010.0;  // expiry is exclusive: at expires_at the record is gone
  CHECK(registry.stored_records() == 2);  // nothing purged until the key is touched
  CHECK(values_of(*registry.get("stage/0")) == std::vector<std::string>{"l"});
  CHECK(registry.stored_records() == 1);

  // A refresh before expiry keeps a record alive past its first deadline.
  REQUIRE(registry.announce("stage/0", "long", "l", 1600.0).is_ok());
  clock.t = 1500.0;
  CHECK(values_of(*registry.get("stage/0")) == std::vector<std::string>{"l"});
  clock.t = 1600.0;
  CHECK(registry.get("stage/0")->empty());
  CHECK(registry.stored_records() == 0);
}

TEST_CASE("a record announced already expired is never visible") {
  FakeClock clock;
  InProcessRegistry registry(clock.fn());
  REQUIRE(registry.announce("stage/0", "late", "x", 999.0).is_ok());
  CHECK(registry.get("stage/0")->empty());
}

TEST_CASE("withdraw removes one subkey; withdrawing what is absent is fine") {
  FakeClock clock;
  InProcessRegistry registry(clock.fn());
  REQUIRE(registry.announce("stage/0", "peer-a", "a", 1300.0).is_ok());
  REQUIRE(registry.announce("stage/0", "peer-b", "b", 1300.0).is_ok());
  REQUIRE(registry.withdraw("stage/0", "peer-a").is_ok());
  CHECK(values_of(*registry.get("stage/0")) == std::vector<std::string>{"b"});
  CHECK(registry.withdraw("stage/0", "peer-a").is_ok());
  CHECK(registry.withdraw("no/such/key", "peer-a").is_ok());
}

TEST_CASE("keys are independent") {
  FakeClock clock;
  InProcessRegistry registry(clock.fn());
  REQUIRE(registry.announce("stage/0", "peer", "zero", 1300.0).is_ok());
  REQUIRE(registry.announce("stage/1", "peer", "one", 1100.0).is_ok());
  REQUIRE(registry.announce("progress/0", "peer", "{\"step\": 3}", 1300.0).is_ok());
  CHECK(values_of(*registry.get("stage/0")) == std::vector<std::string>{"zero"});
  CHECK(values_of(*registry.get("stage/1")) == std::vector<std::string>{"one"});
  REQUIRE(registry.withdraw("stage/0", "peer").is_ok());
  CHECK(registry.get("stage/0")->empty());
  CHECK(values_of(*registry.get("progress/0")) == std::vector<std::string>{"{\"step\": 3}"});
  clock.t = 1100.0;
  CHECK(registry.get("stage/1")->empty());
  CHECK(registry.get("progress/0")->size() == 1);
}

TEST_CASE("the default clock is the steady clock and advances") {
  InProcessRegistry registry;
  double first = registry.now();
  CHECK(first == doctest::Approx(InProcessRegistry::steady_seconds()).epsilon(1e-3));
  CHECK(registry.now() >= first);
}

TEST_CASE("concurrent announcers and readers see whole records") {
  InProcessRegistry registry;
  constexpr int kThreads = 4, kPerThread = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&registry, t] {
      for (int i = 0; i < kPerThread; ++i) {
        std::string subkey = "peer-" + std::to_string(t);
        (void)registry.announce("stage/0", subkey, subkey + ":" + std::to_string(i),
                                registry.now() + 300);
        // CHECK, not REQUIRE: a REQUIRE failing off the main thread would terminate.
        auto records = registry.get("stage/0");
        CHECK(records.is_ok());
        if (!records.is_ok()) return;
        for (const auto& r : *records) CHECK(r.value.rfind(r.subkey + ":", 0) == 0);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  auto records = registry.get("stage/0");
  REQUIRE(records.is_ok());
  REQUIRE(records->size() == kThreads);
  for (const auto& r : *records) CHECK(r.value == r.subkey + ":" + std::to_string(kPerThread - 1));
}

}  // namespace
}  // namespace swarm
