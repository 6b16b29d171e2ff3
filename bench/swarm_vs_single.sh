#!/usr/bin/env bash
# End-to-end tokens/s of a 2-stage swarm (one peer process per stage, ZeroMQ on
# loopback, OpenDHT registry) beside the same model trained in one process, on
# the same batch (32 sequences of 128 bytes per optimizer step: the swarm's
# global batch), in one run.
set -euo pipefail
swarm="$1"
steps="${2:-40}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

single=$("$swarm" train --steps "$steps" --batch 32 --eval-every 100000 --eval-windows 8 --sample-length 0 --log-every 10)
single_tps=$(grep -oE '[0-9]+ tokens/s' <<<"$single" | tail -1 | grep -oE '^[0-9]+')
echo "one process: $single_tps tokens/s"

swarm_out=$("$swarm" local --run-dir "$work/run" --stages 2 --peers-per-stage 1 --steps "$steps" \
  --microbatch 8 --microbatches-per-step 4 --global-batch 32 --eval-windows 8)
swarm_tps=$(grep -oE '[0-9]+ tokens/s' <<<"$swarm_out" | tail -1 | grep -oE '^[0-9]+')
echo "2-stage swarm: $swarm_tps tokens/s"
python3 -c "import sys; print(f'ratio swarm vs one process, end-to-end tokens/s: {int(sys.argv[1]) / int(sys.argv[2]):.3f} (target >= 0.85)')" \
  "$swarm_tps" "$single_tps"
