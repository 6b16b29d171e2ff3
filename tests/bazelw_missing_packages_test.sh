#!/usr/bin/env bash
# Without apt-get, or without root, ./bazelw must name the missing packages and
# the command to install them, and must not start Bazel.
set -uo pipefail

bazelw="$(pwd)/bazelw"
fake_bin="$(mktemp -d)"
trap 'rm -rf "$fake_bin"' EXIT

# Every package looks missing; Bazel, if reached, leaves a trace.
cat > "$fake_bin/dpkg-query" <<'SH'
#!/bin/sh
exit 1
SH
cat > "$fake_bin/bazel" <<'SH'
#!/bin/sh
echo "BAZEL WAS STARTED"
SH
cat > "$fake_bin/id" <<'SH'
#!/bin/sh
case "$1" in -u) echo 1000 ;; -un) echo alice ;; *) echo "uid=1000(alice)" ;; esac
SH
chmod +x "$fake_bin"/*

failures=0
expect() {
  local what="$1" output="$2" pattern="$3"
  if ! grep -qE -- "$pattern" <<<"$output"; then
    echo "FAIL ($what): expected /$pattern/ in:"; echo "$output"; failures=$((failures + 1))
  fi
}
refute() {
  local what="$1" output="$2" pattern="$3"
  if grep -qE -- "$pattern" <<<"$output"; then
    echo "FAIL ($what): did not expect /$pattern/ in:"; echo "$output"; failures=$((failures + 1))
  fi
}

# 1. No apt-get on the machine (the user is root).
output=$(PATH="$fake_bin:$PATH" SWARM_APT_GET=/nonexistent/apt-get "$bazelw" version 2>&1)
code=$?
[ "$code" -eq 1 ] || { echo "FAIL (no apt): exit code $code, want 1"; failures=$((failures + 1)); }
expect "no apt" "$output" "apt-get is not available"
expect "no apt" "$output" "libzmq3-dev"
expect "no apt" "$output" "bazel-bootstrap"
expect "no apt" "$output" "apt-get install -y .*libeigen3-dev"
refute "no apt" "$output" "BAZEL WAS STARTED"

# 2. apt-get exists but the user is not root.
cat > "$fake_bin/apt-get" <<'SH'
#!/bin/sh
echo "APT WAS RUN"
SH
chmod +x "$fake_bin/apt-get"
output=$(PATH="$fake_bin:$PATH" SWARM_APT_GET="$fake_bin/apt-get" "$bazelw" version 2>&1)
code=$?
[ "$code" -eq 1 ] || { echo "FAIL (not root): exit code $code, want 1"; failures=$((failures + 1)); }
expect "not root" "$output" "needs root and this is user alice"
expect "not root" "$output" "fortunes"
refute "not root" "$output" "APT WAS RUN"
refute "not root" "$output" "BAZEL WAS STARTED"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "bazelw explains missing packages: ok"
