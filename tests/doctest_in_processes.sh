#!/usr/bin/env bash
# Runs a doctest binary's test cases in PROCESSES processes at once, each a
# contiguous share of them (doctest's --first/--last), each with its own
# $TEST_TMPDIR; passes when every process passes. For tests that mostly wait
# (swarms of processes with slept compute), so that running them side by side
# costs little beyond their wall time. Arguments after PROCESSES go to every
# process (a --test-case filter narrows the cases the shares split).
#
#   doctest_in_processes.sh BINARY PROCESSES [doctest args...]
set -uo pipefail
binary=$1
processes=$2
shift 2
if ! [[ "$processes" =~ ^[1-9][0-9]*$ ]]; then
  echo "FAIL: PROCESSES must be a positive integer, not '$processes'"
  exit 2
fi
count=$("$binary" --count "$@" | sed -n 's/.*unskipped test cases passing the current filters: \([0-9]*\).*/\1/p')
if ! [[ "$count" =~ ^[0-9]+$ ]]; then
  echo "FAIL: $binary did not say how many test cases it has"
  exit 2
fi
base="${TEST_TMPDIR:-$(mktemp -d)}"
pids=()
logs=()
for ((k = 0; k < processes; ++k)); do
  first=$((k * count / processes + 1))
  last=$(((k + 1) * count / processes))
  ((first > last)) && continue
  dir="$base/process-$k"
  mkdir -p "$dir"
  logs+=("$dir/log")
  echo "process $k: test cases $first to $last of $count"
  TEST_TMPDIR="$dir" "$binary" --first="$first" --last="$last" --duration=true "$@" > "$dir/log" 2>&1 &
  pids+=($!)
done
failed=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || failed=1
  echo "===== ${logs[$i]}"
  cat "${logs[$i]}"
done
exit $failed
