// BanPolicy: a gross outlier is banned at once; a member that is the least aligned,
// and negative, in most of a window of rounds is banned; honest members, and
// members whose gradients are pure noise, never are.
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include "swarm/averaging/ban_policy.h"

namespace swarm {
namespace {

using Round = std::vector<std::pair<std::string, ContributionJudgement>>;

ContributionJudgement judged(double spread, double alignment) { return {true, spread, alignment}; }

TEST_CASE("a contribution far outside its radius bans its member at once, and only once") {
  BanPolicy policy;
  auto banned = policy.judge_round({{"alice", judged(0.8, 0.4)}, {"bob", judged(1.2, 0.3)},
                                    {"mallory", judged(47.0, 0.2)}},
                                   "alice");
  REQUIRE(banned.size() == 1);
  CHECK(banned[0].first == "mallory");
  CHECK(banned[0].second.find("47.0 radii") != std::string::npos);
  CHECK(policy.banned("mallory"));
  CHECK_FALSE(policy.banned("bob"));
  CHECK(policy.judge_round({{"alice", judged(0.8, 0.4)}, {"mallory", judged(90.0, 0.2)}}, "alice").empty());
  CHECK(policy.bans().size() == 1);
}

TEST_CASE("a member never bans itself, whatever its own numbers") {
  BanPolicy policy;
  CHECK(policy.judge_round({{"alice", judged(50.0, -0.9)}, {"bob", judged(0.5, 0.3)}}, "alice").empty());
  CHECK_FALSE(policy.banned("alice"));
}

TEST_CASE("the member pointing furthest against the stage in most of a window of rounds is banned") {
  BanRules rules;
  BanPolicy policy(rules);
  size_t rounds = 0;
  std::vector<std::pair<std::string, std::string>> banned;
  // Sign-flipped: the least aligned and negative four rounds in five.
  while (banned.empty() && rounds < 100) {
    const double mallory = rounds % 5 == 0 ? 0.5 : -0.2;
    banned = policy.judge_round({{"alice", judged(0.6, 0.3)}, {"bob", judged(0.7, 0.25)},
                                 {"mallory", judged(0.9, mallory)}},
                                "alice");
    ++rounds;
  }
  REQUIRE(banned.size() == 1);
  CHECK(banned[0].first == "mallory");
  CHECK(rounds <= rules.window + 5);
  CHECK(banned[0].second.find("furthest against") != std::string::npos);
}

TEST_CASE("members whose gradients are pure noise are never banned: each is the least aligned by chance alone") {
  BanPolicy policy;
  std::mt19937 rng(3);
  std::normal_distribution<double> alignment(0.0, 0.3);
  for (int round = 0; round < 100000; ++round) {
    const Round r{{"a", judged(0.7, alignment(rng))}, {"b", judged(0.7, alignment(rng))},
                  {"c", judged(0.7, alignment(rng))}};
    CHECK(policy.judge_round(r, "a").empty());
  }
  CHECK(policy.bans().empty());
}

TEST_CASE("an honest member that is negative now and then is never banned, nor one that is merely the least aligned") {
  // Alignments negative in 6% of rounds (the share seen in a 3-peer stage of swarm
  // local, 204 judgements); and c, always the least aligned but positive.
  BanPolicy policy;
  std::mt19937 rng(5);
  std::bernoulli_distribution against(0.06);
  for (int round = 0; round < 100000; ++round) {
    const Round r{{"a", judged(0.7, 0.4)}, {"b", judged(0.8, against(rng) ? -0.05 : 0.3)}, {"c", judged(0.9, 0.01)}};
    CHECK(policy.judge_round(r, "a").empty());
  }
  CHECK(policy.bans().empty());
}

TEST_CASE("unjudged rounds (fewer than three contributions) count for nothing") {
  BanPolicy policy;
  for (int round = 0; round < 50; ++round) {
    CHECK(policy.judge_round({{"a", ContributionJudgement{}}, {"carol", ContributionJudgement{}}}, "a").empty());
  }
  for (int round = 0; round < 19; ++round) {
    CHECK(policy.judge_round({{"a", judged(0.5, 0.3)}, {"b", judged(0.5, 0.3)}, {"carol", judged(0.5, -0.3)}}, "a")
              .empty());
  }
  CHECK_FALSE(policy.banned("carol"));  // 19 judged rounds: the window is not full
}

}  // namespace
}  // namespace swarm
