#!/usr/bin/env python3
"""Collects raw/<label>_s<seed>.json (run_study.sh) into results.json, results.csv and
results.md (the table of docs/feedback.md §10.2) and results-diagnostics.md (the seed means of
the diagnostics at steps 100, 200, 500 and 1000, docs/feedback.md §10.3).

For each configuration: the final validation loss of every seed, its gap to dense training of the
same seed (L / L_dense − 1, in %), the mean and sample standard deviation of that gap over seeds,
the traffic saved against a dense ring all-reduce (2(P − 1)/P · 4n bytes per rank and step) with
gather aggregation ((P − 1) messages received per rank) and with a scatter-reduce (2(P − 1)/P of
one message), and the seed-mean of each diagnostic at every evaluation step.
"""

import csv
import glob
import json
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    runs = {}
    for path in sorted(glob.glob(os.path.join(HERE, "raw", "*.json"))):
        r = json.load(open(path))
        runs.setdefault(r["label"], {})[r["args"]["seed"]] = r
    dense = runs.get("dense", {})
    rows = []
    for label, seeds in runs.items():
        common = sorted(s for s in seeds if s in dense)
        gaps = [100 * (seeds[s]["final_val_loss"] / dense[s]["final_val_loss"] - 1) for s in common]
        losses = [seeds[s]["final_val_loss"] for s in sorted(seeds)]
        any_run = next(iter(seeds.values()))
        history = []
        for i, rec in enumerate(any_run["history"]):
            mean = {"step": rec["step"]}
            for key in rec:
                if key != "step":
                    vals = [seeds[s]["history"][i][key] for s in seeds if len(seeds[s]["history"]) > i and key in seeds[s]["history"][i]]
                    mean[key] = statistics.fmean(vals)
            history.append(mean)
        rows.append({
            "label": label,
            "args": {k: v for k, v in any_run["args"].items() if k not in ("seed", "label")},
            "seeds": sorted(seeds),
            "final_val_loss": {str(s): seeds[s]["final_val_loss"] for s in sorted(seeds)},
            "val_loss_mean": statistics.fmean(losses),
            "gap_pct_mean": statistics.fmean(gaps) if gaps else None,
            "gap_pct_std": statistics.stdev(gaps) if len(gaps) > 1 else None,
            "gap_pct_min": min(gaps) if gaps else None,
            "gap_pct_max": max(gaps) if gaps else None,
            # dense training uses the ring all-reduce itself
            "saved_gather": 1.0 if label == "dense" else any_run["saved_gather"],
            "saved_scatter_reduce": 1.0 if label == "dense" else any_run["saved_scatter_reduce"],
            "seconds_mean": statistics.fmean(seeds[s]["seconds"] for s in seeds),
            "history_seed_mean": history,
        })
    rows.sort(key=lambda r: (r["label"] != "dense", r["gap_pct_mean"] if r["gap_pct_mean"] is not None else 1e9))
    json.dump({"task": "docs/lm-task.md", "runs": rows}, open(os.path.join(HERE, "results.json"), "w"), indent=1)
    with open(os.path.join(HERE, "results.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["label", "seeds", "val_loss_mean", "gap_pct_mean", "gap_pct_std", "gap_pct_min", "gap_pct_max", "saved_gather", "saved_scatter_reduce", "seconds_mean"])
        for r in rows:
            fmt = lambda x, d=2: "" if x is None else f"{x:.{d}f}"  # noqa: E731
            w.writerow([r["label"], len(r["seeds"]), fmt(r["val_loss_mean"], 4), fmt(r["gap_pct_mean"]), fmt(r["gap_pct_std"]),
                        fmt(r["gap_pct_min"]), fmt(r["gap_pct_max"]), fmt(r["saved_gather"], 1), fmt(r["saved_scatter_reduce"], 1), fmt(r["seconds_mean"], 0)])
    with open(os.path.join(HERE, "results.md"), "w") as f:
        f.write("| run | seeds | val loss | gap to dense, mean ± sd [min, max] | saved, gather | saved, scatter-reduce |\n|---|---|---|---|---|---|\n")
        for r in rows:
            gap = "—" if r["label"] == "dense" or r["gap_pct_mean"] is None else (
                f"{r['gap_pct_mean']:+.1f}% ± {r['gap_pct_std'] or 0:.1f} [{r['gap_pct_min']:+.1f}, {r['gap_pct_max']:+.1f}]")
            f.write(f"| {r['label']} | {len(r['seeds'])} | {r['val_loss_mean']:.3f} | {gap} | {r['saved_gather']:.1f}× | {r['saved_scatter_reduce']:.1f}× |\n")
    keys = [("val_loss", "val loss", 3), ("update_rms_over_lr", "RMS step / lr", 3), ("moved_frac", "coords moved", 3),
            ("sqrt_vhat_median_nonzero", "median √v̂ (v̂>0)", 6), ("vhat_zero_frac", "v̂ = 0", 3), ("ever_sent", "ever sent", 3),
            ("mean_age_at_send", "age at send", 1), ("residual_over_grad", "‖e‖/‖g‖", 2), ("cos_update_truegrad", "cos(step, ḡ)", 3)]
    with open(os.path.join(HERE, "results-diagnostics.md"), "w") as f:
        f.write("| run | step | " + " | ".join(k[1] for k in keys) + " |\n|---|---|" + "---|" * len(keys) + "\n")
        for r in rows:
            for rec in r["history_seed_mean"]:
                if rec["step"] in (100, 200, 500, 1000):
                    cells = [("—" if k not in rec else f"{rec[k]:.{d}f}") for k, _, d in keys]
                    f.write(f"| {r['label']} ({len(r['seeds'])}) | {rec['step']} | " + " | ".join(cells) + " |\n")
    for r in rows:
        g = "" if r["gap_pct_mean"] is None else f"{r['gap_pct_mean']:+6.2f}% ± {r['gap_pct_std'] or 0:.2f}"
        print(f"{r['label']:28s} n={len(r['seeds'])} L={r['val_loss_mean']:.4f} gap {g:18s} saved {r['saved_gather']:5.1f}x / {r['saved_scatter_reduce']:5.1f}x  {r['seconds_mean']:.0f}s")


if __name__ == "__main__":
    main()
