// The forward ledger binds a backward to a forward this peer served: the same
// caller, microbatch and input, once, while remembered; and stays bounded however
// many forwards a caller sends. Stepped by hand: the time is an argument.
#include "swarm/peer/forward_ledger.h"

#include <doctest/doctest.h>

namespace swarm {
namespace {

TEST_CASE("a backward binds to its caller's forward with the same input, once") {
  ForwardLedger ledger;
  ledger.record("alice", 7, 0xa11ce, 0.0);
  CHECK(ledger.check("alice", 7, 0xa11ce, 1.0).is_ok());
  // Another caller cannot spend alice's forward, nor one never forwarded.
  CHECK(ledger.check("mallory", 7, 0xa11ce, 1.0).code() == StatusCode::permission_denied);
  CHECK(ledger.check("alice", 8, 0xa11ce, 1.0).code() == StatusCode::permission_denied);
  CHECK(ledger.counts().unbound == 2);
  // Other input bytes under the same id.
  CHECK(ledger.check("alice", 7, 0xbad, 1.0).code() == StatusCode::permission_denied);
  CHECK(ledger.counts().other_input == 1);
  ledger.consume("alice", 7);
  CHECK(ledger.check("alice", 7, 0xa11ce, 1.0).code() == StatusCode::permission_denied);
  CHECK(ledger.size() == 0);
}

TEST_CASE("a forward is forgotten after its lifetime; a forward run again binds anew") {
  ForwardLedger ledger(ForwardLedgerLimits{.lifetime_seconds = 10});
  ledger.record("alice", 1, 11, 0.0);
  ledger.record("alice", 2, 22, 5.0);
  CHECK(ledger.check("alice", 1, 11, 9.9).is_ok());
  CHECK_FALSE(ledger.check("alice", 1, 11, 10.0).is_ok());
  CHECK(ledger.check("alice", 2, 22, 10.0).is_ok());
  ledger.record("alice", 2, 23, 12.0);  // run again (a retry): the newest input binds
  CHECK_FALSE(ledger.check("alice", 2, 22, 13.0).is_ok());
  CHECK(ledger.check("alice", 2, 23, 21.0).is_ok());
  CHECK(ledger.size() == 1);
}

TEST_CASE("one caller's flood evicts only its own oldest; all callers together stay under the total") {
  ForwardLedger ledger(ForwardLedgerLimits{.lifetime_seconds = 1e9, .per_caller = 100, .total = 250});
  ledger.record("alice", 1, 1, 0.0);
  for (uint64_t id = 1; id <= 100'000; ++id) ledger.record("mallory", id, id, 1.0);
  CHECK(ledger.size() == 101);
  CHECK(ledger.check("alice", 1, 1, 2.0).is_ok());
  CHECK(ledger.check("mallory", 100'000, 100'000, 2.0).is_ok());
  CHECK_FALSE(ledger.check("mallory", 1, 1, 2.0).is_ok());
  CHECK(ledger.counts().forgotten == 100'000 - 100);
  // Many callers: the total holds, and the caller holding most gives way first.
  for (int caller = 0; caller < 10; ++caller) {
    for (uint64_t id = 1; id <= 30; ++id) ledger.record("c" + std::to_string(caller), id, id, 3.0);
  }
  CHECK(ledger.size() == 250);
  CHECK(ledger.check("alice", 1, 1, 4.0).is_ok());
  CHECK(ledger.check("c9", 30, 30, 4.0).is_ok());
}

TEST_CASE("one id recorded again and again keeps its caller's memory bounded") {
  ForwardLedger ledger(ForwardLedgerLimits{.lifetime_seconds = 1e9, .per_caller = 8, .total = 64});
  for (int i = 0; i < 100'000; ++i) ledger.record("alice", 5, static_cast<uint64_t>(i), static_cast<double>(i));
  CHECK(ledger.size() == 1);
  CHECK(ledger.check("alice", 5, 99'999, 1e5).is_ok());
}

}  // namespace
}  // namespace swarm
