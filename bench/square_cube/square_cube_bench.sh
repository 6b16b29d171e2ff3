#!/usr/bin/env bash
# The square-cube experiment as a benchmark target:
#   ./bazelw test --test_tag_filters=benchmark --test_output=all //bench/square_cube:square_cube_bench
# Runs `swarm bench square-cube` (every width, codec and latency point; about 8 minutes),
# keeps its outputs in the test's undeclared outputs (bazel-testlogs/.../test.outputs),
# and prints the tables and two ratios: each point's measured utilization against the
# prediction, and the 8-bit utilization at the largest width against the 90% target.
set -euo pipefail
swarm="${1:?usage: square_cube_bench.sh SWARM_BINARY [swarm bench square-cube flags]}"
shift
out="${TEST_UNDECLARED_OUTPUTS_DIR:-$(mktemp -d)}/square_cube"
"$swarm" bench square-cube --out "$out" "$@"
cat "$out/square_cube.md"
python3 - "$out/square_cube.json" <<'PY'
import json, sys
points = json.load(open(sys.argv[1]))["points"]
worst = max(points, key=lambda p: abs(p["relative_error"]))
print(f"points: {len(points)}; within 15% of the prediction: "
      f"{sum(abs(p['relative_error']) <= 0.15 for p in points)}")
print(f"worst measured/predicted utilization: {1 + worst['relative_error']:.3f} "
      f"(d={worst['d_model']} {worst['variant']} {worst['latency_ms']} ms {worst['compute']})")
width = [p for p in points if p["sweep"] == "width"]
largest = max(p["d_model"] for p in width)
for p in width:
    if p["d_model"] == largest and p["variant"] == "8bit":
        print(f"8-bit utilization at d={largest}: {100 * p['utilization']:.1f}% "
              f"({p['utilization'] / 0.9:.3f}x the 90% target)")
PY
