#!/usr/bin/env bash
# The simulator's experiments: bench/sim/experiments.sh OUT_DIR (from the repository root).
#   (a) throughput over time with and without rebalancing while 40% of 1000 peers leave,
#       homogeneous and heterogeneous peers (the paper's experiment);
#   (b) efficiency and throughput retained against the churn fraction, with and without;
#   (c) the four routers on heterogeneous peers.
# Writes OUT_DIR/runs/*.jsonl, the PNG plots and summary.md. Every run is seeded: the same
# command gives the same files. SWARM_SIM overrides the simulator binary.
set -euo pipefail
out="${1:?usage: bench/sim/experiments.sh OUT_DIR}"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
sim="${SWARM_SIM:-$root/bazel-bin/apps/sim/swarm_sim}"

if [[ -z "${SWARM_SIM:-}" ]]; then
  (cd "$root" && ./bazelw build //apps/sim:swarm_sim >/dev/null 2>&1) || { echo "building //apps/sim:swarm_sim failed" >&2; exit 1; }
fi
source "$root/bench/matplotlib_python.sh"

mkdir -p "$out/runs"
base=(--peers 1000 --stages 4 --trainers 10 --hours 1 --seed 1)
hetero=(--throughput choice:4,10,25)

run() {  # name, flags...
  local name="$1"; shift
  echo "run $name: swarm sim $*" >&2
  "$sim" sim "$@" --out "$out/runs/$name.jsonl" 2>/dev/null >/dev/null
}

# (a) 40% of the peers leave over the hour.
run a_homogeneous_rebalance "${base[@]}" --churn 0.4
run a_homogeneous_static "${base[@]}" --churn 0.4 --no-rebalance
run a_heterogeneous_rebalance "${base[@]}" "${hetero[@]}" --churn 0.4
run a_heterogeneous_static "${base[@]}" "${hetero[@]}" --churn 0.4 --no-rebalance

# (b) churn sweep, homogeneous peers.
for churn in 0 0.1 0.2 0.3 0.4 0.5 0.6; do
  run "b_churn${churn}_rebalance" "${base[@]}" --churn "$churn"
  run "b_churn${churn}_static" "${base[@]}" --churn "$churn" --no-rebalance
done

# (c) routers on heterogeneous peers, 15 simulated minutes, no churn, no rebalancing, so
# only the routing differs.
for router in stochastic round_robin random least_loaded; do
  run "c_router_${router}" --peers 1000 --stages 4 --trainers 10 --seconds 900 --seed 1 "${hetero[@]}" \
    --no-rebalance --router "$router"
done

"$python" "$here/plot.py" "$out"
echo "plots and summary.md in $out" >&2
