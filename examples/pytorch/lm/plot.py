#!/usr/bin/env python3
"""Draws docs/figures/lm-ef-gap-vs-traffic.png from results.json (summarize.py): the validation-
loss gap to dense training (mean over seeds, error bars: min and max) against the traffic saved
versus a dense ring all-reduce, with gather aggregation at P = 4.

Needs matplotlib (Debian's python3-matplotlib, or pip install --user matplotlib into a Python
whose numpy matches).
"""

import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "..", "..", "docs", "figures", "lm-ef-gap-vs-traffic.png")


def family(label):
    if label.startswith(("onebit", "dgc", "frozenv")):
        return "frozen-variance Adam variants", "tab:green", "s"
    if "-ef" in label:
        return "top-k + error feedback", "tab:red", "o"
    if label.startswith("topk"):
        return "top-k, no error feedback", "tab:blue", "^"
    return "quantizers", "tab:purple", "D"


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
    ax.axhline(0, color="black", lw=0.8)
    ax.axhline(5, color="gray", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_xlabel("traffic saved vs dense ring all-reduce (gather aggregation, P = 4)")
    ax.set_ylabel("validation-loss gap to dense after 1000 steps (%)")
    ax.set_title("Byte-level transformer LM (137k params), Adam 2e-3, P = 4\n(seeds) after each label; bars: min..max over seeds")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    fig.savefig(OUT, dpi=110)
    print(os.path.normpath(OUT))


if __name__ == "__main__":
    main()
