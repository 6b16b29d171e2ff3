#!/usr/bin/env bash
# The compression ablation on the main job's model: bench/compression/ablation.sh OUT_DIR
# (from the repository root). Runs `swarm local` (the main job: 2 stages, 600 steps,
# the same tokens in every run) once per boundary configuration, then ablation.py writes
# OUT_DIR/ablation.md (validation loss, wire bytes per token per boundary, compression
# against fp32, loss penalty), ablation.json and penalty_vs_compression.png.
# SWARM_BIN overrides the binary; ABLATION_CONFIGS="label|codec|boundary[|--flag=value] ..." the list
# (none-seed2, fp32 again under another seed, shows how far runs of the same math spread; a
# LABEL-seedN run is held against none-seedN);
# extra arguments after OUT_DIR go to every `swarm local` (e.g. --steps 100 for a quick look).
set -euo pipefail
out="${1:?usage: bench/compression/ablation.sh OUT_DIR [swarm local flags...]}"
shift
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
swarm="${SWARM_BIN:-$root/bazel-bin/apps/swarm}"
if [[ -z "${SWARM_BIN:-}" ]]; then
  (cd "$root" && ./bazelw build //apps:swarm >/dev/null 2>&1) || { echo "building //apps:swarm failed" >&2; exit 1; }
fi
source "$root/bench/matplotlib_python.sh"

default_configs="none|none|none fp16|fp16|none 8bit|8bit|none 4bit|4bit|none
bottleneck2+8bit|8bit|bottleneck:2 bottleneck4+8bit|8bit|bottleneck:4
maxout2+8bit|8bit|maxout:2 maxout4+8bit|8bit|maxout:4
bottleneck2+4bit|4bit|bottleneck:2 bottleneck4+4bit|4bit|bottleneck:4 none-seed2|none|none|--seed=2
maxout2+4bit|4bit|maxout:2 maxout4+4bit|4bit|maxout:4 maxout4+4bit-seed2|4bit|maxout:4|--seed=2
maxout4+4bit-act+8bit-grad|4bit|maxout:4|--gradient-codec=8bit"
mkdir -p "$out/runs"
for config in ${ABLATION_CONFIGS:-$default_configs}; do
  IFS='|' read -r label codec boundary extra <<<"$config"
  dir="$out/runs/$label"
  if [[ -f "$dir/done" ]]; then echo "ablation: $label already measured" >&2; continue; fi
  rm -rf "$dir"
  echo "ablation: $label: swarm local --codec $codec --boundary $boundary $extra $*" >&2
  start=$(date +%s)
  if ! "$swarm" local --run-dir "$dir" --codec "$codec" --boundary "$boundary" $extra "$@" >"$out/runs/$label.log" 2>&1; then
    echo "ablation: $label failed; the last lines of $out/runs/$label.log:" >&2
    tail -5 "$out/runs/$label.log" >&2
    exit 1
  fi
  touch "$dir/done"
  echo "ablation: $label took $(($(date +%s) - start)) s: $(grep -m1 -o 'validation loss [0-9.]*' "$out/runs/$label.log" || true)" >&2
done
"$python" "$here/ablation.py" "$out"
