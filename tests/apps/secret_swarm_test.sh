#!/usr/bin/env bash
# CURVE end to end with the manual roles of docs/RUNNING.md: a bootstrap node and a peer
# per stage started with a secret train a 2-stage swarm through a trainer with
# the same secret. A trainer with a wrong secret, and one with none, fail fast
# with a message that names the secret and a non-zero exit.
set -uo pipefail

SWARM="$(pwd)/apps/swarm"
WORK="${TEST_TMPDIR:-/tmp}/secret-swarm-$$"
mkdir -p "$WORK"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  wait 2>/dev/null
}
trap cleanup EXIT
fail() {
  echo "FAILED: $*"
  for log in "$WORK"/*.log; do echo "--- $log"; tail -n 20 "$log"; done
  exit 1
}
wait_for_line() {  # file, pattern, seconds
  # tail -F wakes on every write (no polling); it ends at the deadline or with this script.
  grep -q -m1 -- "$2" <(timeout "$3" tail --pid=$$ -n +1 -F "$1" 2>/dev/null) || fail "no '$2' in $1 within $3 s"
}

export SWARM_SECRET="the right secret"
MODEL=(--d-model 32 --layers 2 --heads 2 --seq-len 32)
"$SWARM" bootstrap --port 0 >"$WORK/boot.log" 2>&1 &
PIDS+=($!)
wait_for_line "$WORK/boot.log" "listening on 127.0.0.1:[0-9]* (sealed records)" 20
PORT=$(grep -o "127.0.0.1:[0-9]*" "$WORK/boot.log" | head -n 1 | cut -d: -f2)
for stage in 0 1; do
  "$SWARM" peer --stage "$stage" --stages 2 --bootstrap "127.0.0.1:$PORT" "${MODEL[@]}" >"$WORK/peer$stage.log" 2>&1 &
  PIDS+=($!)
done
for stage in 0 1; do wait_for_line "$WORK/peer$stage.log" "(CURVE)" 30; done

TRAINER=(trainer --bootstrap "127.0.0.1:$PORT" --stages 2 --microbatch 4 --microbatches-per-step 2 --steps 40
         --eval-windows 8 "${MODEL[@]}")
"$SWARM" "${TRAINER[@]}" --run-dir "$WORK/run" >"$WORK/trainer.log" 2>&1 || fail "the trainer with the secret failed"
grep -q " 0 abandoned" "$WORK/trainer.log" || fail "microbatches were abandoned"
read -r first last < <(grep -o "train loss [0-9.]* -> [0-9.]*" "$WORK/trainer.log" | awk '{print $3, $5}')
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || fail "loss did not fall: $first -> $last"
echo "with the secret: train loss $first -> $last, 0 abandoned"

start=$SECONDS
if SWARM_SECRET="a wrong secret" "$SWARM" "${TRAINER[@]}" --run-dir "$WORK/wrong" >"$WORK/wrong.log" 2>&1; then
  fail "a trainer with a wrong secret succeeded"
fi
grep -q -- "--secret" "$WORK/wrong.log" || fail "the wrong-secret error does not name --secret"
((SECONDS - start < 30)) || fail "the wrong-secret trainer took $((SECONDS - start)) s to fail"
echo "wrong secret: failed in $((SECONDS - start)) s: $(grep -o 'permission_denied.*' "$WORK/wrong.log" | head -n 1)"

start=$SECONDS
if env -u SWARM_SECRET "$SWARM" "${TRAINER[@]}" --run-dir "$WORK/none" >"$WORK/none.log" 2>&1; then
  fail "a trainer without the secret succeeded"
fi
grep -q "sealed" "$WORK/none.log" || fail "the no-secret error does not say the records are sealed"
((SECONDS - start < 30)) || fail "the no-secret trainer took $((SECONDS - start)) s to fail"
echo "no secret: failed in $((SECONDS - start)) s"
