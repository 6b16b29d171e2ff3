#!/usr/bin/env bash
# The simulator's headline scenario, side by side in one run: 1000 peers over 4 stages
# for one simulated hour while 40% of them leave, with and without rebalancing. Prints
# each efficiency (throughput / the oracle's compute bound), their ratio and the wall
# time of each run; fails if rebalancing does not reach 0.9 or does not beat standing still.
set -euo pipefail
sim="$1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(sim --peers 1000 --stages 4 --trainers 10 --hours 1 --churn 0.4 --seed 1)

run() {  # name, extra flags...
  local name="$1"; shift
  local start end
  start=$(date +%s.%N)
  "$sim" "${common[@]}" "$@" --out "$work/$name.jsonl" 2>/dev/null
  end=$(date +%s.%N)
  python3 -c "import sys; print(f'{sys.argv[1]}: {float(sys.argv[3]) - float(sys.argv[2]):.1f} s wall')" "$name" "$start" "$end"
}

run rebalance
run standing --no-rebalance
python3 - "$work/rebalance.jsonl" "$work/standing.jsonl" <<'PY'
import json, sys
def summary(path):
    with open(path) as f:
        return [json.loads(line) for line in f if '"summary"' in line][-1]
on, off = summary(sys.argv[1]), summary(sys.argv[2])
print(f"{'':22}{'rebalancing':>14}{'no rebalancing':>16}")
for key in ("efficiency", "throughput_mean", "oracle_mean", "throughput_start", "throughput_end", "moves", "abandoned"):
    print(f"{key:22}{on[key]:>14}{off[key]:>16}")
ratio = on["efficiency"] / off["efficiency"]
print(f"efficiency ratio, rebalancing vs none: {ratio:.3f} (target > 1, with rebalancing >= 0.9)")
sys.exit(0 if on["efficiency"] >= 0.9 and ratio > 1 else 1)
PY
