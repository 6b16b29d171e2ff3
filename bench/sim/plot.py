#!/usr/bin/env python3
"""Plots and a summary table for bench/sim/experiments.sh: plot.py OUT_DIR.

Reads OUT_DIR/runs/*.jsonl (the simulator's JSON lines) and writes
a_throughput_over_time.png, b_churn_sweep.png, c_routers.png and summary.md."""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    samples, events, summary = [], [], None
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            kind = record["kind"]
            if kind == "sample":
                samples.append(record)
            elif kind == "summary":
                summary = record
            else:
                events.append(record)
    return {"samples": samples, "events": events, "summary": summary}


def plot_over_time(runs, out_dir):
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), sharey=False)
    for ax, case in zip(axes, ("homogeneous", "heterogeneous")):
        on, off = runs[f"a_{case}_rebalance"], runs[f"a_{case}_static"]
        minutes = [s["t"] / 60 for s in on["samples"]]
        ax.plot(minutes, [s["oracle"] for s in on["samples"]], "k--", lw=1, label="oracle (compute bound)")
        ax.plot(minutes, [s["throughput"] for s in on["samples"]], "C0", label="with rebalancing")
        ax.plot([s["t"] / 60 for s in off["samples"]], [s["throughput"] for s in off["samples"]], "C3",
                label="without rebalancing")
        eff_on, eff_off = on["summary"]["efficiency"], off["summary"]["efficiency"]
        ax.set_title(f"{case} peers, 40% leave: efficiency {eff_on:.3f} vs {eff_off:.3f}")
        ax.set_xlabel("simulated minutes")
        ax.set_ylabel("samples/s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower left")
    fig.suptitle("1000 peers, 4 stages, 10 trainers: throughput over time")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "a_throughput_over_time.png"), dpi=110)
    plt.close(fig)


def churn_values(runs):
    values = sorted({float(name[len("b_churn"):].split("_")[0]) for name in runs if name.startswith("b_churn")})
    return values


def churn_name(churn, mode):
    text = f"{churn:g}"
    return f"b_churn{text}_{mode}"


def plot_churn_sweep(runs, out_dir):
    churns = churn_values(runs)
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for mode, color, label in (("rebalance", "C0", "with rebalancing"), ("static", "C3", "without rebalancing")):
        summaries = [runs[churn_name(c, mode)]["summary"] for c in churns]
        axes[0].plot(churns, [s["efficiency"] for s in summaries], "o-", color=color, label=label)
        retained = [s["throughput_end"] / s["throughput_start"] if s["throughput_start"] else 0 for s in summaries]
        axes[1].plot(churns, retained, "o-", color=color, label=label)
    axes[1].plot(churns, [1 - c for c in churns], "k--", lw=1, label="peers retained (1 - churn)")
    axes[0].set_title("efficiency: throughput / oracle, time-averaged")
    axes[1].set_title("throughput at the end / at the start")
    for ax in axes:
        ax.set_xlabel("fraction of peers leaving over the hour")
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower left")
    fig.suptitle("1000 homogeneous peers, 4 stages, 1 simulated hour")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "b_churn_sweep.png"), dpi=110)
    plt.close(fig)


ROUTERS = ("stochastic", "round_robin", "random", "least_loaded")


def plot_routers(runs, out_dir):
    summaries = [runs[f"c_router_{r}"]["summary"] for r in ROUTERS]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    bars = ax.bar(ROUTERS, [s["efficiency"] for s in summaries], color=["C0", "C1", "C2", "C4"])
    for bar, s in zip(bars, summaries):
        ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height() + 0.01,
                f"{s['efficiency']:.3f}\n{s['throughput_mean']:.0f} samples/s", ha="center", va="bottom", fontsize=9)
    ax.set_ylim(0, 1.15)
    ax.set_ylabel("efficiency (throughput / oracle)")
    ax.set_title("routers, 1000 peers of 4, 10 or 25 samples/s, 15 min, no churn")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "c_routers.png"), dpi=110)
    plt.close(fig)


COLUMNS = ("efficiency", "throughput_mean", "oracle_mean", "assignment_mean", "throughput_start", "throughput_end",
           "moves", "departures", "timeouts", "abandoned", "completed")


def write_summary(runs, out_dir):
    lines = ["# Simulator experiments", "",
             "Each row is one `swarm sim` run (runs/NAME.jsonl). efficiency: time-average of throughput / oracle; "
             "oracle: best assignment of the alive peers (LPT greedy + local search), the compute bound; "
             "assignment: the compute bound of the swarm's own assignment; start/end: mean throughput of the first "
             "tenth (after the first window) and the last tenth of the run.", "",
             "| run | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for name in sorted(runs):
        s = runs[name]["summary"]
        cells = [f"{s[c]:.3f}" if isinstance(s[c], float) else str(s[c]) for c in COLUMNS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    with open(os.path.join(out_dir, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    out_dir = sys.argv[1]
    run_dir = os.path.join(out_dir, "runs")
    runs = {name[:-len(".jsonl")]: load(os.path.join(run_dir, name))
            for name in sorted(os.listdir(run_dir)) if name.endswith(".jsonl")}
    plot_over_time(runs, out_dir)
    plot_churn_sweep(runs, out_dir)
    plot_routers(runs, out_dir)
    write_summary(runs, out_dir)


if __name__ == "__main__":
    main()
