#include "apps/chaos.h"

#include <doctest/doctest.h>

namespace swarm::apps {
namespace {

TEST_CASE("a chaos spec becomes a time-ordered plan; a stop pairs with its continue") {
  auto plan = parse_chaos("restart-peer:1:40,kill-peer:1:20,stop-peer:0:10:5", 2);
  REQUIRE(plan.is_ok());
  REQUIRE(plan->size() == 4);
  CHECK((*plan)[0].kind == ChaosAction::Kind::stop_peer);
  CHECK((*plan)[0].at_seconds == 10);
  CHECK((*plan)[1].kind == ChaosAction::Kind::continue_peer);
  CHECK((*plan)[1].at_seconds == 15);
  CHECK((*plan)[1].group == (*plan)[0].group);
  CHECK((*plan)[2].kind == ChaosAction::Kind::kill_peer);
  CHECK((*plan)[2].stage == 1);
  CHECK((*plan)[3].kind == ChaosAction::Kind::restart_peer);
  CHECK(parse_chaos("", 2)->empty());
}

TEST_CASE("bad chaos specs say what is wrong") {
  auto unknown = parse_chaos("explode-peer:0:1", 2);
  CHECK(unknown.status().code() == StatusCode::invalid_argument);
  CHECK(unknown.status().message().find("unknown fault") != std::string::npos);
  CHECK(parse_chaos("kill-peer:2:1", 2).status().message().find("does not exist") != std::string::npos);
  CHECK(parse_chaos("kill-peer:0", 2).status().message().find("kill-peer:STAGE:AT_SECONDS") != std::string::npos);
  CHECK(parse_chaos("stop-peer:0:1", 2).status().message().find("FOR_SECONDS") != std::string::npos);
  CHECK_FALSE(parse_chaos("kill-peer:0:-3", 2).is_ok());
  CHECK_FALSE(parse_chaos("kill-peer:x:3", 2).is_ok());
  CHECK_FALSE(parse_chaos("kill-peer:0.5:3", 2).is_ok());
}

}  // namespace
}  // namespace swarm::apps
