// The server's queue by caller: each caller's requests in its order, the callers
// in turn, and nothing kept for a caller with none waiting.
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "transports/zmq/fair_queue.h"

namespace swarm {
namespace {

std::vector<std::string> drain(FairQueue<std::string>& queue) {
  std::vector<std::string> out;
  while (!queue.empty()) out.push_back(queue.pop());
  return out;
}

TEST_CASE("callers take turns, each caller's requests in the order it sent them") {
  FairQueue<std::string> queue;
  for (int i = 0; i < 4; ++i) queue.push("flooder", "f" + std::to_string(i));
  queue.push("trainer", "t0");
  queue.push("trainer", "t1");
  queue.push("third", "x0");
  CHECK(queue.size() == 7);
  CHECK(drain(queue) == std::vector<std::string>{"f0", "t0", "x0", "f1", "t1", "f2", "f3"});
  CHECK(queue.size() == 0);
}

TEST_CASE("a caller that comes back after its line emptied waits for its turn again") {
  FairQueue<std::string> queue;
  queue.push("a", "a0");
  queue.push("b", "b0");
  CHECK(queue.pop() == "a0");
  queue.push("a", "a1");  // a's line had emptied: it goes behind b
  queue.push("b", "b1");
  CHECK(drain(queue) == std::vector<std::string>{"b0", "a1", "b1"});
}

}  // namespace
}  // namespace swarm
