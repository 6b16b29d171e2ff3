#!/usr/bin/env bash
# A project of its own depends on swarm: the consumer workspace (examples/consumer,
# local_repository + swarm_dependencies()) builds examples/classifier against
# @swarm//:swarm, and the program trains (it exits 1 unless the loss falls).
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
"$binary"
