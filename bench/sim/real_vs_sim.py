#!/usr/bin/env python3
"""The simulator held against real runs: for each `swarm local` run directory that
bench/rebalance/real_move.sh wrote (in-flight-K-period-P), runs `swarm sim` on the same
scenario (2 stages x 3 peers, one trainer with K in flight, stage 1 loses two peers at
25 s and 30 s, rebalancing every P s or never) and prints both side by side: samples/s
completed before the kills, samples/s from 20 s after the last kill to the end, and the
peers per stage at the end.

Each simulated peer computes at the throughput the real run's peers announced (their mean
over the run, in StageService's forward units; on 2 shared cores it falls as more work runs
at once), and a hop costs 10 ms of latency; nothing is fitted to the rates compared.

  bench/sim/real_vs_sim.py SWARM_BINARY REAL_RUN_DIR... [--markdown]
"""
import collections
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "rebalance"))
import step_rates  # noqa: E402

SKIP_AFTER_KILL = 20.0


def real_numbers(run_dir):
    records = step_rates.load(run_dir)
    steps = [r for r in records if r["kind"] == "step" and "samples_completed" in r]
    kills = [r["time"] for r in records if r["kind"] == "event" and r["event"].startswith("chaos_kill")]
    end = steps[-1]["time"]
    peers = [r for r in records if r["kind"] == "peer"]
    last_poll = max(r["time"] for r in peers)
    last_seen = {}
    for r in peers:
        last_seen[r["peer"]] = r
    per_stage = collections.Counter(r["stage"] for r in last_seen.values() if r["time"] >= last_poll - 3)
    return {
        "throughput": sum(r["throughput"] for r in peers) / len(peers),
        "before": step_rates.rate(steps, 0, kills[0])["samples_per_s"],
        "after": step_rates.rate(steps, kills[-1] + SKIP_AFTER_KILL, end)["samples_per_s"],
        "peers": [per_stage.get(s, 0) for s in range(2)],
        "end": end,
        "kills": kills,
        "moved_at": next((r["time"] for r in records if r["kind"] == "event" and r["event"] == "peer_moved"), None),
    }


def sim_numbers(swarm, in_flight, period, seconds, kills, throughput):
    schedule = ",".join(f"kill:1:{round(k)}" for k in kills)
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as out:
        args = [swarm, "sim", "--peers", "6", "--stages", "2", "--peers-per-stage", "3,3", "--trainers", "1",
                "--in-flight", str(in_flight), "--microbatch", "8", "--throughput", f"const:{throughput:.1f}",
                "--announce-throughput", "runtime", "--latency-ms", "const:10", "--bandwidth-mbps", "const:10000",
                "--seq-len", "128", "--d-model", "128", "--stage-params", "300000", "--timeout", "10",
                "--backward-timeout", "20", "--abandon-after", "60", "--announce-ttl", "4", "--global-batch", "16",
                "--schedule", schedule, "--rebalance-min-gain", "0.1", "--seconds", str(round(seconds)),
                "--sample-every", "1", "--seed", "1", "--out", out.name]
        args += ["--rebalance-period", str(period)] if period > 0 else ["--no-rebalance"]
        subprocess.run(args, check=True, capture_output=True)
        records = [json.loads(line) for line in open(out.name)]
    samples = [r for r in records if r["kind"] == "sample"]

    def mean(start, end):
        values = [r["throughput"] for r in samples if start < r["t"] <= end]
        return sum(values) / len(values)

    moves = [float(r["t"]) for r in records if r["kind"] == "move"]
    return {"before": mean(0, kills[0]), "after": mean(kills[-1] + SKIP_AFTER_KILL, seconds),
            "peers": samples[-1]["peers_per_stage"], "moved_at": moves[0] if moves else None}


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    swarm, runs = sys.argv[1], [a for a in sys.argv[2:] if not a.startswith("--")]
    print("| run | before kills: real / sim | after: real / sim | peers per stage at the end: real / sim "
          "| first move at (s): real / sim |")
    print("|---|---|---|---|---|")
    worst = 0.0
    for run in runs:
        name = os.path.basename(run.rstrip("/"))
        _, _, in_flight, _, period = name.split("-")
        real = real_numbers(run)
        sim = sim_numbers(swarm, int(in_flight), float(period), real["end"], real["kills"], real["throughput"])
        off = [sim[k] / real[k] - 1 for k in ("before", "after")]
        worst = max([worst] + [abs(o) for o in off])
        moved = " / ".join("-" if m["moved_at"] is None else f"{m['moved_at']:.1f}" for m in (real, sim))
        print(f"| {name} (peers at {real['throughput']:.1f}) | {real['before']:.1f} / {sim['before']:.1f} "
              f"({off[0]:+.1%}) | {real['after']:.1f} / {sim['after']:.1f} ({off[1]:+.1%}) | "
              f"{real['peers']} / {sim['peers']} | {moved} |")
    print(f"\nlargest relative difference in throughput: {worst:.1%}")


if __name__ == "__main__":
    main()
