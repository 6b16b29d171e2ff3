#include <chrono>
#include <cstdio>
#include <thread>
#include <fmt/format.h>
#include "swarm/registry/dht_registry.h"
using namespace swarm;
int main() {
  auto boot = DhtRegistry::start(0, {});
  std::vector<DhtRegistry> nodes;
  for (int i = 0; i < 5; ++i) nodes.push_back(*DhtRegistry::start(0, {fmt::format("127.0.0.1:{}", boot->port())}));
  std::this_thread::sleep_for(std::chrono::seconds(1));
  for (int round = 0; round < 10; ++round) {
    std::string value = fmt::format("v{}", round);
    auto t0 = std::chrono::steady_clock::now();
    (void)nodes[1].announce("k", "a", value, nodes[1].now() + 10);
    int gets = 0;
    while (true) {
      auto g0 = std::chrono::steady_clock::now();
      auto r = nodes[3].get("k");
      ++gets;
      double gt = std::chrono::duration<double>(std::chrono::steady_clock::now() - g0).count();
      bool seen = false;
      if (r.is_ok()) for (auto& rec : *r) if (rec.value == value) seen = true;
      if (seen || gets > 50) {
        fmt::print("round {}: visible after {:.3f} s, {} gets, last get {:.3f} s\n", round,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), gets, gt);
        break;
      }
    }
  }
}
