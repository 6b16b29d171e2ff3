#!/usr/bin/env python3
"""Step rates of a `swarm local` run around its chaos and rebalancing events.

Reads RUN_DIR/metrics.jsonl and prints the rate of completed samples (samples/s, from the
cumulative counts in the step records) in the windows the rebalancing experiment compares: before the first chaos
event, from the last chaos kill to the first peer move, and after that move. With
--skip SECONDS, the first SECONDS after the last kill are left out of the middle window
(calls stuck on a killed peer time out there, whatever the rebalancer does).

  bench/rebalance/step_rates.py swarm-run [--skip 20] [--settle 5] [--json]
"""
import argparse
import json
import sys


def load(run_dir):
    with open(f"{run_dir}/metrics.jsonl") as f:
        return [json.loads(line) for line in f if line.strip()]


def completed_by(steps, t):
    """Samples completed by time t: the last step record at or before t (records come in order)."""
    done = 0
    for s in steps:
        if s["time"] > t:
            break
        done = s["samples_completed"]
    return done


def rate(steps, start, end):
    """Samples per second completed over [start, end]; step records are cumulative."""
    if end is None or start is None or end - start < 1.0:
        return None
    samples = completed_by(steps, end) - completed_by(steps, start)
    return {"from": round(start, 1), "to": round(end, 1), "samples_per_s": samples / (end - start)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--skip", type=float, default=0.0)
    parser.add_argument("--settle", type=float, default=0.0, help="seconds after the move left out")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    records = load(args.run_dir)
    steps = [r for r in records if r["kind"] == "step" and "samples_completed" in r]
    events = [r for r in records if r["kind"] == "event"]
    kills = [e["time"] for e in events if e["event"].startswith("chaos_kill")]
    moves = [e for e in events if e["event"] == "peer_moved"]
    if not steps:
        sys.exit(f"{args.run_dir}: no step records")
    end = steps[-1]["time"]
    first_chaos = kills[0] if kills else end
    last_kill = kills[-1] if kills else None
    moved_at = moves[0]["time"] if moves else None
    out = {
        "kills": kills,
        "moves": [{"time": m["time"], "peer": m["peer"], "from": m["from_stage"], "to": m["to_stage"]} for m in moves],
        "before_chaos": rate(steps, 0, first_chaos),
        "kill_to_move": rate(steps, last_kill + args.skip, moved_at) if last_kill and moved_at else None,
        "after_move": rate(steps, moved_at + args.settle, end) if moved_at else None,
        "after_last_kill": rate(steps, last_kill + args.skip, end) if last_kill else None,
        "abandoned": steps[-1]["microbatches_abandoned"],
    }
    if out["kill_to_move"] and out["after_move"]:
        between = out["kill_to_move"]["samples_per_s"]
        out["after_over_between"] = out["after_move"]["samples_per_s"] / between if between > 0 else float("inf")
    if args.json:
        print(json.dumps(out, indent=1))
        return
    for key in ("before_chaos", "kill_to_move", "after_move", "after_last_kill"):
        r = out[key]
        print(f"{key:>16}: " + ("-" if r is None else
              f"{r['samples_per_s']:.1f} samples/s ({r['from']}-{r['to']} s)"))
    print(f"kills at {kills}; moves {out['moves']}; abandoned {out['abandoned']}")
    if "after_over_between" in out:
        print(f"after the move / between the last kill and the move: {out['after_over_between']:.2f}x")


if __name__ == "__main__":
    main()
