#!/usr/bin/env bash
# Across hosts: a bootstrap node, two peers per stage and a trainer, each in its
# own network namespace, joined by veth pairs to a bridge in one more namespace,
# every link shaped to 200 Mbit/s with tbf. The roles run with --host and
# --secret; one peer is SIGKILLed mid-run. The trainer must finish with its loss
# falling and no microbatch abandoned. Only addresses inside the namespaces made
# here are used, and all of them are removed at the end.
set -uo pipefail

SWARM="$(pwd)/apps/swarm"
[[ -x "$SWARM" ]] || { echo "FAILED: no swarm binary at $SWARM"; exit 1; }
if [[ "$(id -u)" != 0 ]]; then echo "skipped: not root, network namespaces need CAP_SYS_ADMIN"; exit 0; fi
if ! command -v ip >/dev/null || ! command -v tc >/dev/null; then echo "skipped: iproute2 (ip, tc) is missing"; exit 0; fi

TAG="sw$$"
BRIDGE_NS="${TAG}br"
ROLES=(boot p00 p01 p10 p11 trn)
WORK="${TEST_TMPDIR:-/tmp}/multihost-$$"
SECRET="multihost test secret $$"
mkdir -p "$WORK"
declare -A PIDS=()

cleanup() {
  for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  wait 2>/dev/null
  for role in "${ROLES[@]}"; do ip netns del "${TAG}${role}" 2>/dev/null; done
  ip netns del "$BRIDGE_NS" 2>/dev/null
}
trap cleanup EXIT

fail() {
  echo "FAILED: $*"
  for log in "$WORK"/*.log; do echo "--- $log"; tail -n 20 "$log"; done
  exit 1
}

if ! ip netns add "$BRIDGE_NS" 2>"$WORK/netns.err"; then
  echo "skipped: cannot create a network namespace: $(cat "$WORK/netns.err")"
  exit 0
fi
ip -n "$BRIDGE_NS" link add br0 type bridge || fail "bridge"
ip -n "$BRIDGE_NS" link set br0 up
declare -A ADDRESS=()
index=1
for role in "${ROLES[@]}"; do
  ns="${TAG}${role}"
  ip netns add "$ns" || fail "netns $ns"
  # Both ends are made inside namespaces of this test: nothing touches the host's own.
  ip -n "$ns" link add eth0 type veth peer name "v${role}" netns "$BRIDGE_NS" || fail "veth for $role"
  ip -n "$BRIDGE_NS" link set "v${role}" master br0 up
  ip -n "$ns" addr add "10.77.0.${index}/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  # 200 Mbit/s each way: out of the role on eth0, into it on the bridge port.
  ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate 200mbit burst 256kb latency 50ms || fail "tc on $role"
  ip netns exec "$BRIDGE_NS" tc qdisc add dev "v${role}" root tbf rate 200mbit burst 256kb latency 50ms || fail "tc"
  ADDRESS[$role]="10.77.0.${index}"
  index=$((index + 1))
done

run_in() {  # role, log name, then the swarm arguments
  local role="$1" log="$2"
  shift 2
  ip netns exec "${TAG}${role}" env SWARM_SECRET="$SECRET" "$SWARM" "$@" >"$WORK/$log.log" 2>&1 &
  PIDS[$log]=$!
}

# Waits until a file holds a line matching a pattern, or fails at the deadline.
wait_for_line() {  # file, pattern, seconds
  # tail -F wakes on every write (no polling); it ends at the deadline or with this script.
  grep -q -m1 -- "$2" <(timeout "$3" tail --pid=$$ -n +1 -F "$1" 2>/dev/null) || fail "no '$2' in $1 within $3 s"
}

MODEL=(--d-model 32 --layers 2 --heads 2 --seq-len 32)
run_in boot boot bootstrap --host "${ADDRESS[boot]}" --port 7000
wait_for_line "$WORK/boot.log" "listening on ${ADDRESS[boot]}:7000" 20
for role in p00 p01 p10 p11; do
  run_in "$role" "$role" peer --host "${ADDRESS[$role]}" --stage "${role:1:1}" --stages 2 --peer-id "$role" \
    --bootstrap "${ADDRESS[boot]}:7000" --global-batch 16 --lr 1e-2 --warmup 2 --allreduce-part-timeout 1 "${MODEL[@]}"
done
for role in p00 p01 p10 p11; do wait_for_line "$WORK/$role.log" "(CURVE)" 30; done

run_in trn trainer trainer --host "${ADDRESS[trn]}" --bootstrap "${ADDRESS[boot]}:7000" --stages 2 \
  --run-dir "$WORK/run" --microbatch 4 --microbatches-per-step 4 --steps 100000 --time-limit 30 \
  --eval-windows 8 --forward-timeout 3 --backward-timeout 5 "${MODEL[@]}"
# The run's step records (its stdout shows a status line only every 10 s, as logs want).
wait_for_line "$WORK/run/metrics.jsonl" '"kind":"step",.*"step":20,' 60
kill -KILL "${PIDS[p01]}"
echo "SIGKILLed peer p01 (stage 0) at step 20"
wait "${PIDS[trainer]}"
status=$?
unset "PIDS[trainer]"
[[ $status == 0 ]] || fail "trainer exited with $status"
grep -q " 0 abandoned" "$WORK/trainer.log" || fail "microbatches were abandoned"
losses=$(grep -o "train loss [0-9.]* -> [0-9.]*" "$WORK/trainer.log") || fail "no train loss line"
read -r first last < <(echo "$losses" | awk '{print $3, $5}')
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || fail "loss did not fall: $first -> $last"
echo "trainer: $(grep -o 'ledger: .*abandoned' "$WORK/trainer.log")"
echo "loss $first -> $last across 6 namespaces at 200 Mbit/s with CURVE; peer p01 killed mid-run"
