// The connection table decides, without I/O, which accepted connections a server
// keeps: per source at most so many that delivered no request yet, in all what the
// process's descriptor budget allows; and it counts handshakes that timed out.
#include "transports/zmq/connection_table.h"

#include <doctest/doctest.h>

namespace swarm {
namespace {

ConnectionLimits limits(int per_source) {
  ConnectionLimits l;
  l.handshake_timeout_ms = 500;
  l.max_unfinished_per_source = per_source;
  return l;
}

TEST_CASE("one source's unfinished connections are capped; another source and finished ones are not") {
  DescriptorBudget budget(1000);
  ConnectionTable table(limits(3), &budget);
  for (int fd = 10; fd < 13; ++fd) CHECK(table.accepted(fd, "10.0.0.9") == Admission::admitted);
  CHECK(table.accepted(13, "10.0.0.9") == Admission::refused_source);
  CHECK(table.accepted(14, "10.0.0.1") == Admission::admitted);
  CHECK(table.counts().refused_source == 1);
  // A connection that delivered a request is no longer a handshake in the making.
  table.request_arrived(10);
  CHECK(table.unfinished_from("10.0.0.9") == 2);
  CHECK(table.accepted(15, "10.0.0.9") == Admission::admitted);
  CHECK(table.accepted(16, "10.0.0.9") == Admission::refused_source);
  CHECK(table.open_connections() == 5);
  CHECK(budget.used() == 5);
}

TEST_CASE("the descriptor budget is shared by every table and given back on close") {
  DescriptorBudget budget(3);
  ConnectionTable compute(limits(100), &budget), control(limits(100), &budget);
  CHECK(compute.accepted(10, "a") == Admission::admitted);
  CHECK(control.accepted(20, "b") == Admission::admitted);
  CHECK(compute.accepted(11, "c") == Admission::admitted);
  CHECK(control.accepted(21, "d") == Admission::refused_budget);
  CHECK(control.counts().refused_budget == 1);
  compute.closed(10);
  CHECK(control.accepted(21, "d") == Admission::admitted);
  {
    ConnectionTable gone(limits(100), &budget);
    CHECK(gone.accepted(30, "e") == Admission::refused_budget);
  }
  CHECK(budget.used() == 3);
}

TEST_CASE("a connection closed before it delivered a request is counted; a finished one is not") {
  DescriptorBudget budget(100);
  ConnectionTable table(limits(10), &budget);
  table.accepted(10, "a");
  table.accepted(11, "a");
  table.accepted(12, "a");
  table.request_arrived(12);
  table.closed(10);  // the client gave up
  table.closed(11);  // libzmq's handshake interval ended it
  table.closed(12);  // finished: an honest client that left
  CHECK(table.counts().unfinished_closed == 2);
  CHECK(table.open_connections() == 0);
  CHECK(table.unfinished_from("a") == 0);
  CHECK(budget.used() == 0);
  table.closed(99);  // never admitted (a refused one): nothing to undo
  CHECK(budget.used() == 0);
}

TEST_CASE("an accepted descriptor that is still in the table was closed and reused: the old entry is dropped") {
  DescriptorBudget budget(100);
  ConnectionTable table(limits(1), &budget);
  CHECK(table.accepted(10, "a") == Admission::admitted);
  CHECK(table.accepted(10, "a") == Admission::admitted);
  CHECK(table.open_connections() == 1);
  CHECK(budget.used() == 1);
}

}  // namespace
}  // namespace swarm
