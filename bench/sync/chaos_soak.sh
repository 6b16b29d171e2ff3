#!/usr/bin/env bash
# The issue-25 soak: 2 stages x 3 peers for SECONDS (300) with a peer killed,
# restarted and stopped, and rebalancing on, then bench/sync/check_run.py on the run.
#
#   ./bazelw build //apps:swarm && bench/sync/chaos_soak.sh OUT_DIR [SECONDS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out=${1:?usage: chaos_soak.sh OUT_DIR [SECONDS]}
seconds=${2:-300}
swarm=${SWARM:-bazel-bin/apps/swarm}
rm -rf "$out"
start=$(date +%s)
"$swarm" local --run-dir "$out" --stages 2 --peers-per-stage 3 --steps 1000000 --time-limit "$seconds" \
  --global-batch 16 --rebalance-period 10 \
  --chaos kill-peer:1:40,restart-peer:1:60,stop-peer:0:90:8 >"$out.log" 2>&1 || true
echo "ran $(( $(date +%s) - start )) s; log: $out.log"
grep -E "^done:|^stages:|^ledger:|^stage [0-9]:" "$out.log" || true
python3 bench/sync/check_run.py "$out" 16
