#!/usr/bin/env bash
# A project of its own depends on swarm: the consumer workspace (examples/consumer,
# local_repository + swarm_dependencies()) builds examples/classifier against
# @swarm//:swarm and @swarm//apps/cli, and its program trains the classifier
# through its `local` role (peer processes of the same binary).
# Built in a scratch copy of that workspace with its own Bazel output root, so
# nothing is written into the source tree; --define=dev=1 compiles at -O1.
set -euo pipefail

# The runfile is a link into the source tree; swarm's root is two levels above it.
root="$(cd "$(dirname "$(readlink -f tools/dependencies.bzl)")/.." && pwd)"
work="${TEST_TMPDIR:-$(mktemp -d)}/consumer"
mkdir -p "$work"
sed "s|\"\.\./\.\.\"|\"$root\"|g" "$root/examples/consumer/WORKSPACE" > "$work/WORKSPACE"
cp "$root/examples/consumer/BUILD.bazel" "$work/BUILD.bazel"
if ! grep -q "\"$root\"" "$work/WORKSPACE"; then
  echo "FAIL: examples/consumer/WORKSPACE no longer names swarm as ../.."; exit 1
fi

export HOME="$work/home"
mkdir -p "$HOME"
bazel_cmd=(bazel --output_user_root="$work/bazel-root" --bazelrc=/dev/null)
cd "$work"
started=$(date +%s)
"${bazel_cmd[@]}" build --nosandbox_debug --jobs=2 --define=dev=1 --symlink_prefix=/ //:classifier
echo "the consumer workspace built //:classifier in $(( $(date +%s) - started )) s"
binary="$("${bazel_cmd[@]}" info --define=dev=1 bazel-bin 2>/dev/null)/classifier"
"${bazel_cmd[@]}" shutdown
output="$("$binary" local --run-dir "$work/run" --steps 150 --microbatch 16 --rebalance-period 0 2>&1)"
echo "$output" | tail -4
losses="$(echo "$output" | sed -n 's/.*train loss \([0-9.]*\) -> \([0-9.]*\) |.*/\1 \2/p')"
if [[ -z "$losses" ]] || ! awk -v l="$losses" 'BEGIN { split(l, v, " "); exit !(v[2] < 0.3 * v[1]) }'; then
  echo "FAIL: the loss did not fall to under 0.3 of its start ($losses)"; exit 1
fi
if ! echo "$output" | grep -q " 0 abandoned"; then echo "FAIL: microbatches abandoned"; exit 1; fi
if [[ ! -s "$work/run/report.html" ]]; then echo "FAIL: no report.html"; exit 1; fi
echo "PASS: the consumer's classifier trained through its own program"
