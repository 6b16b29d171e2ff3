#include "swarm/sim/oracle.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <utility>

namespace swarm::sim {
namespace {

struct Member {
  double throughput;
  int peer;
  bool operator<(const Member& o) const { return throughput < o.throughput || (throughput == o.throughput && peer < o.peer); }
};

// The peers of each stage sorted by throughput, and the stages' totals.
struct Partition {
  std::vector<std::vector<Member>> members;
  std::vector<double> totals;
  const std::vector<double>& costs;

  double value(size_t s) const { return totals[s] / costs[s]; }
  size_t weakest() const {
    size_t m = 0;
    for (size_t s = 1; s < totals.size(); ++s) {
      if (value(s) < value(m)) m = s;
    }
    return m;
  }
};

// Up to two peers of one stage, by index into its sorted members (-1: none).
struct Group {
  double sum = 0;
  int first = -1;
  int second = -1;
  int size() const { return (first >= 0) + (second >= 0); }
  bool operator<(const Group& o) const { return sum < o.sum; }
};

// A transfer between a stage `from` and a weaker stage: `take` (of from's members)
// goes to the weaker stage, `give` (of its members, possibly none) goes back.
struct Transfer {
  Group take;
  Group give;
  double value = 0;  // min of the two stages' values after it
};

// Pairs are tried only in small stages: in big ones a single peer is a fine enough step,
// and pairs would cost quadratic time.
constexpr size_t kPairsUpTo = 40;

std::vector<Group> groups_of(const std::vector<Member>& members, bool with_empty) {
  std::vector<Group> groups;
  if (with_empty) groups.push_back(Group{});
  const int n = static_cast<int>(members.size());
  for (int i = 0; i < n; ++i) groups.push_back({members[i].throughput, i, -1});
  if (members.size() <= kPairsUpTo) {
    for (int i = 0; i < n; ++i) {
      for (int j = i + 1; j < n; ++j) groups.push_back({members[i].throughput + members[j].throughput, i, j});
    }
  }
  std::stable_sort(groups.begin(), groups.end());
  return groups;
}

void assign_greedily(const std::vector<double>& throughputs, Partition& p) {
  std::vector<int> order(throughputs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return throughputs[a] > throughputs[b]; });
  for (int peer : order) {
    const size_t s = p.weakest();
    p.members[s].push_back({throughputs[peer], peer});
    p.totals[s] += throughputs[peer];
  }
  for (auto& m : p.members) std::sort(m.begin(), m.end());
}

double pair_value(const Partition& p, size_t weak, size_t from, double delta) {
  return std::min((p.totals[weak] + delta) / p.costs[weak], (p.totals[from] - delta) / p.costs[from]);
}

// The best exchange of up to two peers each way between `from` and the weaker stage
// `weak` (value: the pair's new minimum; the old one when nothing helps). The ideal
// transfer equalizes the two stages, and the value is concave in the amount moved, so
// for each group given back only the taken groups nearest the ideal need a look.
Transfer best_transfer(const Partition& p, size_t weak, size_t from) {
  Transfer best{Group{}, Group{}, std::min(p.value(weak), p.value(from))};
  const double cw = p.costs[weak], cf = p.costs[from];
  const double ideal = (p.totals[from] * cw - p.totals[weak] * cf) / (cw + cf);
  if (ideal <= 0) return best;
  const std::vector<Group> takes = groups_of(p.members[from], false);
  const std::vector<Group> gives = groups_of(p.members[weak], true);
  const int from_size = static_cast<int>(p.members[from].size());
  const int weak_size = static_cast<int>(p.members[weak].size());
  for (const Group& give : gives) {
    const auto it = std::lower_bound(takes.begin(), takes.end(), Group{give.sum + ideal});
    const auto at = it - takes.begin();
    for (auto i : {at - 1, at}) {
      if (i < 0 || i >= static_cast<std::ptrdiff_t>(takes.size())) continue;
      const Group& take = takes[i];
      const double delta = take.sum - give.sum;
      // Never empty a stage, and only net transfers toward the weaker one.
      if (delta <= 0 || from_size - take.size() + give.size() < 1 || weak_size - give.size() + take.size() < 1) continue;
      const double v = pair_value(p, weak, from, delta);
      if (v > best.value) best = Transfer{take, give, v};
    }
  }
  return best;
}

std::vector<Member> remove_group(std::vector<Member>& members, const Group& g) {
  std::vector<Member> removed;
  for (int index : {std::max(g.first, g.second), std::min(g.first, g.second)}) {
    if (index < 0) continue;
    removed.push_back(members[index]);
    members.erase(members.begin() + index);
  }
  return removed;
}

void apply(Partition& p, size_t weak, size_t from, const Transfer& t) {
  const std::vector<Member> taken = remove_group(p.members[from], t.take);
  const std::vector<Member> given = remove_group(p.members[weak], t.give);
  for (const Member& m : taken) {
    p.members[weak].insert(std::lower_bound(p.members[weak].begin(), p.members[weak].end(), m), m);
    p.totals[from] -= m.throughput;
    p.totals[weak] += m.throughput;
  }
  for (const Member& m : given) {
    p.members[from].insert(std::lower_bound(p.members[from].begin(), p.members[from].end(), m), m);
    p.totals[weak] -= m.throughput;
    p.totals[from] += m.throughput;
  }
}

// One improving transfer between any two stages, weakest pairs first: raising the
// lower of two stages (the other stays above it) raises the sorted stage values
// lexicographically, so the search ends, and a pair that does not touch the weakest
// stage can still free the way for one that does.
bool improve_once(Partition& p) {
  const size_t n = p.totals.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p.value(a) < p.value(b); });
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = n; j-- > i + 1;) {
      const size_t weak = order[i], from = order[j];
      const double before = p.value(weak);
      const Transfer t = best_transfer(p, weak, from);
      if (t.take.size() > 0 && t.value > before * (1 + 1e-12)) {
        apply(p, weak, from, t);
        return true;
      }
    }
  }
  return false;
}

void improve_locally(Partition& p, int max_rounds) {
  for (int round = 0; round < max_rounds && improve_once(p); ++round) {
  }
}

}  // namespace

double assignment_throughput(const std::vector<double>& stage_totals, const std::vector<double>& stage_costs) {
  if (stage_totals.empty()) return 0;
  double slowest = std::numeric_limits<double>::infinity();
  for (size_t s = 0; s < stage_totals.size(); ++s) slowest = std::min(slowest, stage_totals[s] / stage_costs[s]);
  return std::max(0.0, slowest);
}

double fluid_bound(const std::vector<double>& throughputs, const std::vector<double>& stage_costs) {
  if (throughputs.size() < stage_costs.size()) return 0;
  const double total = std::accumulate(throughputs.begin(), throughputs.end(), 0.0);
  return total / std::accumulate(stage_costs.begin(), stage_costs.end(), 0.0);
}

Assignment best_assignment(const std::vector<double>& throughputs, const std::vector<double>& stage_costs,
                           int max_rounds) {
  Assignment out;
  out.stage_of.assign(throughputs.size(), 0);
  if (stage_costs.empty()) return out;
  Partition p{std::vector<std::vector<Member>>(stage_costs.size()), std::vector<double>(stage_costs.size(), 0.0),
              stage_costs};
  assign_greedily(throughputs, p);
  improve_locally(p, max_rounds);
  for (size_t s = 0; s < p.members.size(); ++s) {
    for (const Member& m : p.members[s]) out.stage_of[m.peer] = static_cast<int>(s);
  }
  out.throughput = throughputs.size() < stage_costs.size() ? 0 : assignment_throughput(p.totals, stage_costs);
  return out;
}

}  // namespace swarm::sim
