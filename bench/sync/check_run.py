#!/usr/bin/env python3
"""Checks a swarm run directory for what a stage that holds together shows.

usage: check_run.py RUN_DIR GLOBAL_BATCH

Prints one line per check and exits 1 if any fails:
  - every peer of a stage that published in the run's last 15 s ends at the same
    global step, give or take one;
  - each stage's global step is within 5% of the samples the trainers completed
    through it / global batch (a killed peer's ledger is lost with it, so the
    stepped count the live peers report can fall short);
  - no (stage, step) with two parameter hashes;
  - no abandoned microbatch;
and reports the peer moves (rebalancing) it saw.
"""
import collections
import json
import sys


def main():
    run_dir, global_batch = sys.argv[1], int(sys.argv[2])
    records = [json.loads(line) for line in open(f"{run_dir}/metrics.jsonl")]
    end = max(r.get("time", 0) for r in records)
    last_step = collections.defaultdict(dict)  # stage -> peer -> (time, step)
    hashes = collections.defaultdict(set)
    for r in records:
        if r["kind"] != "replica":
            continue
        hashes[(r["stage"], r["step"])].add(r["hash"])
        known = last_step[r["stage"]].get(r["peer"])
        if known is None or r["step"] >= known[1]:
            last_step[r["stage"]][r["peer"]] = (r["time"], r["step"])
    failures = 0

    def check(ok, text):
        nonlocal failures
        failures += 0 if ok else 1
        print(("ok   " if ok else "FAIL ") + text)

    for stage, peers in sorted(last_step.items()):
        live = {p: s for p, (t, s) in peers.items() if t >= end - 15}
        spread = max(live.values()) - min(live.values()) if live else -1
        check(0 <= spread <= 1, f"stage {stage}: live peers' final global steps {dict(sorted(live.items()))}")
    stepped = {r["stage"]: r["samples_completed"] for r in records if r["kind"] == "stage_samples"}
    for stage, peers in sorted(last_step.items()):
        final = max(s for _, s in peers.values())
        expected = stepped.get(stage, 0) / global_batch
        ratio = final / expected if expected else float("inf")
        check(abs(ratio - 1) <= 0.05,
              f"stage {stage}: global step {final} for {stepped.get(stage, 0)} completed samples "
              f"/ {global_batch} = {expected:.1f} (ratio {ratio:.3f})")
    differing = sum(1 for h in hashes.values() if len(h) > 1)
    check(differing == 0, f"(stage, step) pairs with differing hashes: {differing} of {len(hashes)}")
    steps = [r for r in records if r["kind"] == "step"]
    abandoned = steps[-1].get("microbatches_abandoned", -1) if steps else -1
    check(abandoned == 0, f"abandoned microbatches: {abandoned}")
    moves = [r for r in records if r["kind"] == "event" and r.get("event") == "peer_moved"]
    print(f"info peer moves: {len(moves)}; events: "
          + ", ".join(sorted({r['event'] for r in records if r['kind'] == 'event'})))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
