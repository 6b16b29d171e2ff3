#!/usr/bin/env bash
# Fidelity at equal tokens: the default main job (2 peers per stage) against one
# peer per stage, seeds 1-3, runs alternated so machine load falls on both alike.
# Prints every run's validation loss and wall time, then the means, spreads and ratios.
# Arguments after OUT_DIR go to every run (both setups alike), e.g. --global-batch 32.
#
#   ./bazelw build //apps:swarm && bench/sync/fidelity.sh OUT_DIR [SWARM_LOCAL_ARGS...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out=${1:?usage: fidelity.sh OUT_DIR [SWARM_LOCAL_ARGS...]}
shift
swarm=${SWARM:-bazel-bin/apps/swarm}
mkdir -p "$out"
results="$out/results.tsv"
: >"$results"
for seed in 1 2 3; do
  for pps in 1 2; do
    run="$out/seed$seed-pps$pps"
    rm -rf "$run"
    start=$(date +%s.%N)
    "$swarm" local --run-dir "$run" --seed "$seed" --peers-per-stage "$pps" "$@" >"$run.log" 2>&1
    wall=$(echo "$(date +%s.%N) - $start" | bc)
    loss=$(grep -oP 'validation loss \K[0-9.]+' "$run.log" | tail -1)
    steps=$(grep -oP '^stages: global steps \K[0-9,]+' "$run.log")
    printf '%s\t%s\t%s\t%.1f\t%s\n' "$seed" "$pps" "$loss" "$wall" "$steps" | tee -a "$results"
  done
done
python3 - "$results" <<'PY'
import statistics, sys
rows = [line.split("\t") for line in open(sys.argv[1]) if line.strip()]
for pps in ("1", "2"):
    losses = [float(r[2]) for r in rows if r[1] == pps]
    walls = [float(r[3]) for r in rows if r[1] == pps]
    print(f"peers/stage {pps}: validation loss mean {statistics.mean(losses):.4f} "
          f"(spread {min(losses):.4f}-{max(losses):.4f}); wall mean {statistics.mean(walls):.1f} s "
          f"(spread {min(walls):.1f}-{max(walls):.1f})")
l1 = statistics.mean(float(r[2]) for r in rows if r[1] == "1")
l2 = statistics.mean(float(r[2]) for r in rows if r[1] == "2")
w1 = statistics.mean(float(r[3]) for r in rows if r[1] == "1")
w2 = statistics.mean(float(r[3]) for r in rows if r[1] == "2")
print(f"2 peers/stage against 1: validation loss {100 * (l2 / l1 - 1):+.2f}% (target within 1%), "
      f"wall time {w2 / w1:.3f}x (target at most 1.25x)")
PY
