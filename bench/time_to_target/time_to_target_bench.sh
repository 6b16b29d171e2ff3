#!/usr/bin/env bash
# Time to target as a benchmark target:
#   ./bazelw test --test_tag_filters=benchmark --test_output=all //bench/time_to_target:time_to_target_bench
# Runs `swarm bench time-to-target` into the test's undeclared outputs
# (bazel-testlogs/.../test.outputs), prints its tables and four ratios measured in
# the same run: the best time to target against uncompressed hub mode, its steps
# penalty, peer-to-peer tokens/s against hub with the same codec, and the simulator's
# step against each timed run's.
set -euo pipefail
swarm="${1:?usage: time_to_target_bench.sh SWARM_BINARY [swarm bench time-to-target flags]}"
shift
out="${TEST_UNDECLARED_OUTPUTS_DIR:-$(mktemp -d)}/time_to_target"
"$swarm" bench time-to-target --out "$out" "$@"
cat "$out/time_to_target.md"
python3 - "$out/time_to_target.json" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
scores = report["scores"]
base = scores[0]
base_hub = next(t for t in base["timed"] if t["mode"] == "hub")["seconds_to_target"]
best = None
for s in scores:
    for t in s["timed"]:
        if t["seconds_to_target"] is not None and (best is None or t["seconds_to_target"] < best[1]["seconds_to_target"]):
            best = (s, t)
if base_hub and best:
    s, t = best
    print(f"best: {s['label']} {t['mode']}: {base_hub / t['seconds_to_target']:.2f}x faster to the target than "
          f"{base['label']} hub ({t['seconds_to_target']:.1f} s against {base_hub:.1f} s); steps penalty "
          f"{s['steps_to_target_mean'] / base['steps_to_target_mean']:.2f}x")
for s in scores:
    rate = {t["mode"]: t["tokens_per_second"] for t in s["timed"]}
    if rate.get("hub") and rate.get("p2p"):
        print(f"{s['label']}: p2p/hub tokens/s {rate['p2p'] / rate['hub']:.2f}x ({rate['p2p']:.0f} against {rate['hub']:.0f})")
PY
python3 - "$out/time_to_target.json" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
ratios = [(s["label"], t["mode"], t["simulated_step_seconds"] / t["step_seconds"])
          for s in report["scores"] for t in s["timed"]
          if t.get("simulated_step_seconds") and t.get("step_seconds")]
if ratios:
    label, mode, worst = max(ratios, key=lambda r: abs(r[2] - 1))
    within = sum(abs(r[2] - 1) <= 0.15 for r in ratios)
    print(f"simulator/real step: {within} of {len(ratios)} timed runs within 15%; worst {label} {mode} {worst:.2f}")
PY
