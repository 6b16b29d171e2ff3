#include "swarm/core/status.h"

#include <doctest/doctest.h>

namespace swarm {
namespace {

Result<int> parse_positive(int value) {
  if (value <= 0) return invalid_argument("{} is not positive", value);
  return value;
}

Result<int> doubled(int value) {
  SWARM_ASSIGN_OR_RETURN(int parsed, parse_positive(value));
  return parsed * 2;
}

Status check_both(int a, int b) {
  SWARM_RETURN_IF_ERROR(parse_positive(a).status());
  SWARM_RETURN_IF_ERROR(parse_positive(b).status());
  return Status::ok();
}

TEST_CASE("Status carries a code and a formatted message") {
  Status status = not_found("peer {} of stage {}", "abc", 2);
  CHECK_FALSE(status.is_ok());
  CHECK(status.code() == StatusCode::not_found);
  CHECK(status.message() == "peer abc of stage 2");
  CHECK(status.to_string() == "not_found: peer abc of stage 2");
  CHECK(status.with_context("routing").message() == "routing: peer abc of stage 2");
  CHECK(Status::ok().is_ok());
  CHECK(Status::ok().to_string() == "ok");
}

TEST_CASE("Result propagates errors through SWARM_ASSIGN_OR_RETURN") {
  Result<int> good = doubled(21);
  REQUIRE(good.is_ok());
  CHECK(*good == 42);

  Result<int> bad = doubled(-3);
  CHECK_FALSE(bad.is_ok());
  CHECK(bad.status().code() == StatusCode::invalid_argument);
  CHECK(bad.status().message() == "-3 is not positive");
  CHECK(bad.value_or(7) == 7);
}

TEST_CASE("SWARM_RETURN_IF_ERROR stops at the first failure") {
  CHECK(check_both(1, 2).is_ok());
  CHECK(check_both(1, -2).message() == "-2 is not positive");
  CHECK(check_both(-1, -2).message() == "-1 is not positive");
}

TEST_CASE("a Result built from an ok Status is an internal error, not a value") {
  Result<int> odd{Status::ok()};
  CHECK_FALSE(odd.is_ok());
  CHECK(odd.status().code() == StatusCode::internal);
}

TEST_CASE("every code has a distinct name") {
  CHECK(status_code_name(StatusCode::deadline_exceeded) == "deadline_exceeded");
  CHECK(status_code_name(StatusCode::unavailable) == "unavailable");
  CHECK(status_code_name(StatusCode::data_loss) != status_code_name(StatusCode::internal));
}

}  // namespace
}  // namespace swarm
