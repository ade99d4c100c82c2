#!/usr/bin/env python3
"""Draws, from results.json (summarize.py), docs/figures/lm-ef-gap-vs-traffic.png: the validation-
loss gap to dense training (mean over seeds, error bars: min and max) against the traffic saved
versus a dense ring all-reduce, with gather aggregation at P = 4; and docs/figures/lm-topk-curve.png:
the sparsification curve, top-k's gap against its density (0.1%, 1%, 3%, 10%) without error
feedback, with it, with its residual decayed by 0.9, and with 100 dense warm-up steps.

Needs matplotlib (Debian's python3-matplotlib, or pip install --user matplotlib into a Python
whose numpy matches).
"""

import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FIGURES = os.path.join(HERE, "..", "..", "..", "docs", "figures")
OUT = os.path.join(FIGURES, "lm-ef-gap-vs-traffic.png")
CURVE = os.path.join(FIGURES, "lm-topk-curve.png")
VARIANTS = [("", "no error feedback", "tab:blue", "^"), ("-ef", "error feedback", "tab:red", "o"),
            ("-ef-decay0.9", "error feedback, residual decay 0.9", "tab:orange", "s"),
            ("-ef-warm100", "error feedback, 100 dense warm-up steps", "tab:green", "D")]
DENSITIES = [("0.1", 0.001), ("1", 0.01), ("3", 0.03), ("10", 0.1)]


def family(label):
    if label.startswith(("onebit", "dgc", "frozenv")):
        return "frozen-variance Adam variants", "tab:green", "s"
    if "-ef" in label:
        return "top-k + error feedback", "tab:red", "o"
    if label.startswith("topk"):
        return "top-k, no error feedback", "tab:blue", "^"
    return "quantizers", "tab:purple", "D"


def finish(fig, ax, xlabel, title, legend_at, path):
    """What both figures share: the 0 and 5 % lines, a log x axis, the gap as y, and the file."""
    ax.axhline(0, color="black", lw=0.8)
    ax.axhline(5, color="gray", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("validation-loss gap to dense after 1000 steps (%)")
    ax.set_title(title)
    ax.legend(loc=legend_at, fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)
    print(os.path.normpath(path))


def main():
    rows = [r for r in json.load(open(os.path.join(HERE, "results.json")))["runs"] if r["label"] != "dense" and r["gap_pct_mean"] is not None]
    fig, ax = plt.subplots(figsize=(9, 6))
    seen = set()
    for r in rows:
        name, color, marker = family(r["label"])
        x, y = r["saved_gather"], r["gap_pct_mean"]
        err = [[y - r["gap_pct_min"]], [r["gap_pct_max"] - y]]
        ax.errorbar(x, y, yerr=err, fmt=marker, color=color, capsize=3, label=None if name in seen else name)
        seen.add(name)
        ax.annotate(f"{r['label']} ({len(r['seeds'])})", (x, y), textcoords="offset points", xytext=(5, 3), fontsize=7)
    finish(fig, ax, "traffic saved vs dense ring all-reduce (gather aggregation, P = 4)",
           "Byte-level transformer LM (137k params), Adam 2e-3, P = 4\n(seeds) after each label; bars: min..max over seeds",
           "upper left", OUT)


def curve():
    """The sparsification curve: one line per variant over the densities it was run at."""
    by_label = {r["label"]: r for r in json.load(open(os.path.join(HERE, "results.json")))["runs"]}
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for suffix, name, color, marker in VARIANTS:
        points = [(d, by_label[f"topk{tag}{suffix}"]) for tag, d in DENSITIES if f"topk{tag}{suffix}" in by_label]
        points = [(d, r) for d, r in points if r["gap_pct_mean"] is not None]
        if not points:
            continue
        xs = [100 * d for d, _ in points]
        ys = [r["gap_pct_mean"] for _, r in points]
        err = [[r["gap_pct_mean"] - r["gap_pct_min"] for _, r in points], [r["gap_pct_max"] - r["gap_pct_mean"] for _, r in points]]
        ax.errorbar(xs, ys, yerr=err, fmt=marker + "-", color=color, capsize=3, label=name)
        for (d, r), x, y in zip(points, xs, ys):
            ax.annotate(f"{r['saved_gather']:.0f}x", (x, y), textcoords="offset points", xytext=(5, 3), fontsize=7, color=color)
    finish(fig, ax, "top-k density (%); labels: traffic saved vs dense ring all-reduce (gather, P = 4)",
           "Sparsification curve: byte-level transformer LM, Adam 2e-3, P = 4 (simulate.py)", "upper right", CURVE)


if __name__ == "__main__":
    main()
    curve()
