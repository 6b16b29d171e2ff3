#!/usr/bin/env bash
# real_move: the rebalancing experiment on a real `swarm local` run, with and without
# rebalancing, at the default in-flight count and at one where peers (not the trainer)
# set the pace. Prints each run's rates around the kills and the move (step_rates.py).
#
#   bench/rebalance/real_move.sh OUT_DIR [TIME_LIMIT_SECONDS]   # IN_FLIGHTS="2 4" by default
set -euo pipefail
out="${1:?usage: real_move.sh OUT_DIR [TIME_LIMIT_SECONDS]}"
limit="${2:-120}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
swarm="${SWARM:-$here/../../bazel-bin/apps/swarm}"
mkdir -p "$out"
common=(--stages 2 --peers-per-stage 3 --emulated-cost 0.02 --chaos kill-peer:1:25,kill-peer:1:30
        --time-limit "$limit")
for in_flight in ${IN_FLIGHTS:-2 4}; do
  for period in 10 0; do
    run="$out/in-flight-$in_flight-period-$period"
    rm -rf "$run"
    echo "== --in-flight $in_flight --rebalance-period $period" >&2
    "$swarm" local "${common[@]}" --in-flight "$in_flight" --rebalance-period "$period" --run-dir "$run" \
      > "$run.out" 2>&1 || { echo "run failed: see $run.out" >&2; tail -3 "$run.out" >&2; }
    echo "== $run"
    python3 "$here/step_rates.py" "$run" --skip 20
    grep -E "^(done|stages|stage [0-9]):" "$run.out" || true
  done
  # Side by side: the same window after the last kill, with and without rebalancing.
  with=$(python3 "$here/step_rates.py" "$out/in-flight-$in_flight-period-10" --skip 20 --json)
  without=$(python3 "$here/step_rates.py" "$out/in-flight-$in_flight-period-0" --skip 20 --json)
  python3 -c 'import json, sys
w, n = (json.loads(a)["after_last_kill"]["samples_per_s"] for a in sys.argv[2:4])
print(f"--in-flight {sys.argv[1]}: after the last kill, {w:.1f} samples/s rebalanced, {n:.1f} not: {w / n:.2f}x")' \
    "$in_flight" "$with" "$without"
done
