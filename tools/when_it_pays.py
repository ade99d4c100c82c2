#!/usr/bin/env python3
"""When does compression pay: step communication time of a compressed all-reduce against a dense
ring all-reduce, from a gradcomp-bench JSON file and the cost model of
include/gradcomp/collective/all_reduce_cost.hpp (docs/when-it-pays.md, docs/transports.md §9).

Usage:
  when_it_pays.py BENCH.json [--n N] [--alpha SECONDS] [--ranks 4,16,64]
                  [--bandwidths 1,400] [--figure docs/figures/when-it-pays.png] [--table FILE]

BENCH.json is any file `gradcomp-bench --json` or `gradcomp-bench-cuda --json` wrote: each codec's
encode and decode time per element is its record's median seconds over the record's n. A codec
whose records the file lacks is listed in the table as "no record" and drawn as no line.

The model, for a gradient of n float32 values on P ranks over a link of latency α and bandwidth β
(one rank's send rate), with compute on the critical path (no overlap):

  dense ring       t = 2(P − 1)·α + ⌊2(P − 1)·4n/P⌋ / β                          (no compute)
  gather_decode    t = e·n + P·d·n                 + (P − 1)·α  + (P − 1)·F(n) / β
  scatter_reduce   t = e·n·(1 + 1/P) + 2·d·n       + 2(P − 1)·α + Σ_{j≠0} (F(c_j) + F(c_0)) / β
  summed_encodings t = e·n + d·n                   + 2(P − 1)·α + ⌊2(P − 1)·S(n)/P⌋ / β

with e and d the encode and decode seconds per element, F(m) = 16 + B(m) a frame of m values,
c_j = ring_chunk_of(n, P, j) and S the summable bytes; the bytes are rank 0's (it holds the
largest chunk). A codec's time is its best plan's. It pays where dense / codec > 1; the
break-even bandwidth is β* = (D − C) / (compute + (R − R_dense)·α), above which it no longer pays.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

# ---- the byte model: a mirror of include/gradcomp/collective/all_reduce_cost.hpp and the codecs'
# ---- modelled_encoded_bytes (checked against the C++ by tests/tools/test_when_it_pays.py) -----

ENVELOPE_BYTES = 56  # gradcomp::envelope::size
FRAME_OVERHEAD_BYTES = 16  # gradcomp::frame_overhead_bytes
FLOAT_BYTES = 4


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up8(b: int) -> int:
    return ceil_div(b, 8) * 8


def ring_chunk_count(n: int, ranks: int, j: int) -> int:
    """ring_chunk_of(n, P, j).count: the first n mod P chunks hold one value more."""
    return n // ranks + (1 if j < n % ranks else 0)


def dense_ring_cost(nbytes: int, ranks: int) -> tuple[int, int]:
    """(bytes, rounds) of one rank in a ring all-reduce of `nbytes` bytes."""
    return (2 * (ranks - 1) * nbytes // ranks, 2 * (ranks - 1) if ranks > 1 else 0)


def gather_decode_cost(n: int, ranks: int, encoded: Callable[[int], int]) -> tuple[int, int]:
    others = ranks - 1 if ranks > 1 else 0
    return (others * (FRAME_OVERHEAD_BYTES + encoded(n)), others)


def scatter_reduce_cost(n: int, ranks: int, rank: int, encoded: Callable[[int], int]) -> tuple[int, int]:
    def frame(j: int) -> int:
        return FRAME_OVERHEAD_BYTES + encoded(ring_chunk_count(n, ranks, j))

    sent = sum(frame(j) + frame(rank) for j in range(ranks) if j != rank)
    return (sent, 2 * (ranks - 1) if ranks > 1 else 0)


def summed_encodings_cost(summable: int, ranks: int) -> tuple[int, int]:
    return dense_ring_cost(summable, ranks)


def block_quantizer_bytes(bits: int, block: int = 256) -> Callable[[int], int]:
    """uniform_quantizer, sign_quantizer (bits 1) and qsgd_quantizer: scales, then packed codes."""
    return lambda m: ENVELOPE_BYTES + ceil_div(m, block) * FLOAT_BYTES + ceil_div(m * bits, 8)


def qsgd_code_bits(levels: int) -> int:
    needed = 1 + levels.bit_length()
    return 2 if needed <= 2 else (4 if needed <= 4 else 8)


def topk_kept(m: int, density: float) -> int:
    """sparsity{.density}.count(m)."""
    if m == 0:
        return 0
    wanted = math.ceil(density * m)
    if not wanted >= 1:
        return 1
    return m if wanted >= m else int(wanted)


def topk_bytes(density: float) -> Callable[[int], int]:
    """A top-k message of k(m) values: count, the smaller index section (list32 on ties), values."""

    def size(m: int) -> int:
        k = topk_kept(m, density)
        list_bytes = round_up8(4 * k) if m <= 1 << 32 else 8 * k
        bitmap_bytes = round_up8(ceil_div(m, 8))
        return ENVELOPE_BYTES + 8 + min(list_bytes, bitmap_bytes) + k * FLOAT_BYTES

    return size


def count_sketch_summable(rows: int, columns: int) -> Callable[[int], int]:
    return lambda m: rows * columns * FLOAT_BYTES


def shared_scale_summable(bits: int, headroom_bits: int = 3) -> Callable[[int], int]:
    fields = 64 // (bits + headroom_bits)
    return lambda m: 8 * (1 + ceil_div(m, fields))


def shared_scale_bytes(bits: int, block: int = 256) -> Callable[[int], int]:
    summable = shared_scale_summable(bits)
    return lambda m: ENVELOPE_BYTES + round_up8(ceil_div(m, block) * FLOAT_BYTES) + summable(m)


@dataclass(frozen=True)
class Codec:
    key: str  # the name tests/tools/print_all_reduce_cost.cpp prints
    label: str
    encoded: Callable[[int], int]  # B(m)
    summable: Optional[Callable[[int], int]]  # S(m) for a summable encoding (summed_encodings)
    encode_record: str  # gradcomp-bench record of one encode (the wrapper's for EF and LoCo)
    decode_record: str
    extra_dense_bytes: Callable[[int], int] = lambda n: 0  # bytes of an extra dense ring collective


SKETCH_ROWS, SKETCH_COLUMNS = 3, 1 << 20  # gradcomp-bench's count sketch

CODECS = [
    Codec("uniform8", "uniform 8-bit", block_quantizer_bytes(8), None, "uniform8_rtn/encode", "uniform8_rtn/decode"),
    Codec("uniform4", "uniform 4-bit", block_quantizer_bytes(4), None, "uniform4_rtn/encode", "uniform4_rtn/decode"),
    Codec("uniform2", "uniform 2-bit", block_quantizer_bytes(2), None, "uniform2_rtn/encode", "uniform2_rtn/decode"),
    Codec("uniform4", "LoCo 4-bit", block_quantizer_bytes(4), None, "loco_uniform4/encode", "uniform4_rtn/decode"),
    Codec("topk1", "top-k 1%", topk_bytes(0.01), None, "topk/encode", "topk/decode"),
    Codec("topk1", "top-k 1% + EF", topk_bytes(0.01), None, "ef_topk/encode", "topk/decode"),
    Codec("sign", "sign", block_quantizer_bytes(1), None, "sign/encode", "sign/decode"),
    Codec("qsgd15", "QSGD 15 levels", block_quantizer_bytes(qsgd_code_bits(15)), None, "qsgd/encode", "qsgd/decode"),
    Codec("count_sketch", "count sketch 3×2^20", lambda m: ENVELOPE_BYTES + SKETCH_ROWS * SKETCH_COLUMNS * FLOAT_BYTES,
          count_sketch_summable(SKETCH_ROWS, SKETCH_COLUMNS), "count_sketch/encode", "count_sketch/decode"),
    # The shared-scale quantizer also all-reduces (MAX) its block maxima before encoding.
    Codec("shared_scale4", "shared-scale 4-bit", shared_scale_bytes(4), shared_scale_summable(4),
          "shared_scale4/encode", "shared_scale4/decode", lambda n: ceil_div(n, 256) * FLOAT_BYTES),
]


def model_lines() -> list[str]:
    """The lines tests/tools/print_all_reduce_cost.cpp prints, from this mirror."""
    lines = []
    seen = set()
    for codec in CODECS:
        if codec.key in seen:
            continue
        seen.add(codec.key)
        for n in (1, 1000, 1 << 22, 25_000_000, 25_000_003):
            for p in (2, 3, 4, 16, 64):
                dense = dense_ring_cost(n * FLOAT_BYTES, p)
                cells = [codec.key, str(n), str(p), f"{dense[0]}/{dense[1]}"]
                if codec.summable is None:
                    for cost in (gather_decode_cost(n, p, codec.encoded), scatter_reduce_cost(n, p, 0, codec.encoded)):
                        cells.append(f"{cost[0]}/{cost[1]}")
                    cells.append("-")
                else:
                    summed = summed_encodings_cost(codec.summable(n), p)
                    cells += ["-", "-", f"{summed[0]}/{summed[1]}"]
                lines.append(" ".join(cells))
    return lines


# ---- time: compute from the bench, transfer from the α–β model --------------------------------


@dataclass(frozen=True)
class PlanTime:
    plan: str
    compute: float  # seconds of encode and decode on the critical path
    sent_bytes: int
    rounds: int

    def seconds(self, alpha: float, bytes_per_second: float) -> float:
        return self.compute + self.rounds * alpha + self.sent_bytes / bytes_per_second


def plan_times(codec: Codec, n: int, ranks: int, enc: float, dec: float) -> list[PlanTime]:
    """Every plan the codec can run, with e = enc and d = dec seconds per element."""
    if codec.summable is not None:
        sent, rounds = summed_encodings_cost(codec.summable(n), ranks)
        if extra_bytes := codec.extra_dense_bytes(n):
            extra, extra_rounds = dense_ring_cost(extra_bytes, ranks)
            sent, rounds = sent + extra, rounds + extra_rounds
        return [PlanTime("summed_encodings", enc * n + dec * n, sent, rounds)]
    gather = gather_decode_cost(n, ranks, codec.encoded)
    scatter = scatter_reduce_cost(n, ranks, 0, codec.encoded)
    return [
        PlanTime("gather_decode", enc * n + ranks * dec * n, *gather),
        PlanTime("scatter_reduce", enc * n * (1 + 1 / ranks) + 2 * dec * n, *scatter),
    ]


def break_even(plan: PlanTime, dense: tuple[int, int], alpha: float) -> float:
    """Bytes per second below which `plan` beats the dense ring (inf: at every bandwidth; 0: at none
    where bandwidth, not latency, decides: it sends no fewer bytes)."""
    saved = dense[0] - plan.sent_bytes
    if saved <= 0:
        return 0.0
    cost = plan.compute + (plan.rounds - dense[1]) * alpha
    return math.inf if cost <= 0 else saved / cost


def compute_budget(plan: PlanTime, dense: tuple[int, int], alpha: float, bytes_per_second: float) -> float:
    """Seconds of encode and decode `plan` can spend at `bytes_per_second` and still tie the dense ring."""
    return (dense[0] - plan.sent_bytes) / bytes_per_second + (dense[1] - plan.rounds) * alpha


def load_bench(path: Path) -> tuple[dict[str, float], dict]:
    """Seconds per element of each record (median seconds / n, largest n in the file), and the run."""
    records = json.loads(path.read_text())
    per_element: dict[str, tuple[int, float]] = {}
    for r in records:
        if r.get("seconds_median") is None:
            continue
        if r["name"] not in per_element or r["n"] > per_element[r["name"]][0]:
            per_element[r["name"]] = (r["n"], r["seconds_median"] / r["n"])
    run = dict(records[0].get("run", {})) if records else {}
    run["device"] = records[0].get("device", "") if records else ""
    run["bench_n"] = max((n for n, _ in per_element.values()), default=0)
    return {name: s for name, (_, s) in per_element.items()}, run


def gbps(bytes_per_second: float) -> float:
    return bytes_per_second * 8 / 1e9


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bench", nargs="?", type=Path, help="a gradcomp-bench(-cuda) --json file")
    ap.add_argument("--n", type=int, default=25_000_000, help="gradient values (float32), default 25,000,000")
    ap.add_argument("--alpha", type=float, default=10e-6, help="link latency α per round in seconds, default 10e-6")
    ap.add_argument("--ranks", default="4,16,64", help="comma-separated P, default 4,16,64")
    ap.add_argument("--bandwidths", default="1,400", help="the figure's bandwidth range LO,HI in Gb/s, default 1,400")
    ap.add_argument("--figure", type=Path, help="write the figure (PNG) here")
    ap.add_argument("--table", type=Path, help="write the break-even table (markdown) here")
    args = ap.parse_args(argv)
    if args.bench is None:
        ap.error("a bench JSON file is needed")

    seconds, run = load_bench(args.bench)
    ranks = [int(p) for p in args.ranks.split(",")]
    n = args.n
    machine = run.get("device") or f"{run.get('cpu', 'unknown')}, {run.get('logical_cpus', '?')} logical CPUs"
    lo, hi = (float(g) for g in args.bandwidths.split(","))  # Gb/s
    grid = [lo * (hi / lo) ** (i / 199) for i in range(200)]

    budget_gbps = 100.0  # the bandwidth of the table's compute-budget column
    rows = []  # (P, measured, cells)
    curves: dict[int, list[tuple[str, list[float], float]]] = {p: [] for p in ranks}  # label, speedups, β* (Gb/s)
    for p in ranks:
        dense = dense_ring_cost(n * FLOAT_BYTES, p)
        for codec in CODECS:
            enc, dec = seconds.get(codec.encode_record), seconds.get(codec.decode_record)
            measured = enc is not None and dec is not None
            plans = plan_times(codec, n, p, enc or 0.0, dec or 0.0)
            fewest = min(plans, key=lambda t: t.sent_bytes)
            # The plan that pays up to the highest bandwidth; by bytes where the compute is unknown.
            chosen = max(plans, key=lambda t: break_even(t, dense, args.alpha)) if measured else fewest
            budget = compute_budget(chosen, dense, args.alpha, budget_gbps * 1e9 / 8)
            cells = [codec.label, str(p), f"`{chosen.plan}`", f"{dense[0] / chosen.sent_bytes:.1f}×", f"{budget * 1e3:.1f}"]
            if measured:
                beta = break_even(chosen, dense, args.alpha)
                be_text = "never" if beta == 0 else ("always" if math.isinf(beta) else f"{gbps(beta):.3g}" if gbps(beta) < 1000 else f"{gbps(beta):,.0f}")
                cells += [f"{chosen.compute * 1e3:.1f}", be_text]
                speedups = []
                for g in grid:
                    bw = g * 1e9 / 8
                    t_dense = dense[1] * args.alpha + dense[0] / bw
                    speedups.append(t_dense / min(t.seconds(args.alpha, bw) for t in plans))
                curves[p].append((codec.label, speedups, gbps(beta)))
            else:
                missing = [r for r, v in ((codec.encode_record, enc), (codec.decode_record, dec)) if v is None]
                cells += ["no record: " + ", ".join(f"`{r}`" for r in missing), "—"]
            rows.append((not measured, p, "| " + " | ".join(cells) + " |"))

    table = [f"n = {n:,} float32 values ({n * FLOAT_BYTES / 1e6:.0f} MB), α = {args.alpha * 1e6:g} µs, "
             f"compute from {args.bench.name} ({machine}; bench n = {run.get('bench_n')})", "",
             f"| codec | P | plan | bytes saved by the plan | compute budget at {budget_gbps:g} Gb/s (ms) "
             "| encode + decode (ms) | pays below (Gb/s) |",
             "|---|---:|---|---:|---:|---:|---:|"]
    table += [row for _, _, row in sorted(rows, key=lambda r: (r[0], r[1]))]
    text = "\n".join(table)
    print(text)
    if args.table:
        args.table.write_text(text + "\n")

    if args.figure:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(ranks), figsize=(5 * len(ranks), 4.6), sharey=True)
        axes = axes if len(ranks) > 1 else [axes]
        styles = ["-", "--", "-.", ":"]
        for ax, p in zip(axes, ranks):
            for i, (label, speedups, beta) in enumerate(curves[p]):
                (line,) = ax.plot(grid, speedups, styles[i // 10 % 4], label=label)
                if lo <= beta <= hi:  # the break-even point
                    ax.plot([beta], [1.0], "o", color=line.get_color(), markersize=5)
            ax.axhline(1.0, color="black", linewidth=0.8)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlim(lo, hi)
            ax.set_title(f"P = {p}")
            ax.set_xlabel("link bandwidth per rank (Gb/s)")
            ax.grid(True, which="both", alpha=0.3)
        axes[0].set_ylabel("speedup of the all-reduce step over a dense ring")
        axes[-1].legend(fontsize=8, loc="upper right")
        fig.suptitle(f"n = {n / 1e6:g}M float32, α = {args.alpha * 1e6:g} µs, encode/decode on {machine} "
                     f"(compute measured by {args.bench.name}, no overlap)", fontsize=10)
        fig.tight_layout()
        args.figure.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.figure, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
