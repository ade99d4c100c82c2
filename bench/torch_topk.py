#!/usr/bin/env python3
"""torch.topk(x.abs(), k, sorted=False) on the GPU: the second baseline of gradcomp-bench-cuda's
exact top-k (the first, CUB's radix sort, runs inside the bench).

Times torch.topk with CUDA events on a float32 gradient of n values drawn from N(0, 1e-3) with
torch's generator (the bench's distribution, not its values), k = ceil(0.01 n), after warm-up
runs; prints best and median. With --gradcomp-json FILE (gradcomp-bench-cuda --json FILE from
the same machine), prints topk/encode's speedup over torch.topk at the same n and whether it
reaches the target (2x). With --json FILE, writes the record in the bench's JSON fields.

    gradcomp-bench-cuda --json gradcomp.json
    python3 bench/torch_topk.py --gradcomp-json gradcomp.json --json torch.json
"""
import argparse
import json
import math
import statistics
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1 << 28, help="elements (default 2^28)")
    parser.add_argument("--density", type=float, default=0.01, help="k / n (default 0.01)")
    parser.add_argument("--reps", type=int, default=20, help="timed runs (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs first (default 3)")
    parser.add_argument("--gradcomp-json", help="gradcomp-bench-cuda's JSON, for the comparison")
    parser.add_argument("--json", help="write the torch.topk record to this file")
    args = parser.parse_args()

    try:
        import torch
    except ImportError:
        print("torch_topk.py: torch is not installed; nothing measured")
        return 77
    if not torch.cuda.is_available():
        print("torch_topk.py: no CUDA device; nothing measured")
        return 77

    n, k = args.n, math.ceil(args.density * args.n)
    generator = torch.Generator(device="cuda").manual_seed(0x9E3779B9)
    x = torch.randn(n, device="cuda", dtype=torch.float32, generator=generator) * 1e-3
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(args.warmup):
        torch.topk(x.abs(), k, sorted=False)
    torch.cuda.synchronize()
    seconds = []
    for _ in range(args.reps):
        start.record()
        values, indices = torch.topk(x.abs(), k, sorted=False)
        stop.record()
        stop.synchronize()
        seconds.append(start.elapsed_time(stop) * 1e-3)
    best, median = min(seconds), statistics.median(seconds)
    device = torch.cuda.get_device_name()
    print(f"torch.topk(x.abs(), k, sorted=False) on {device}, torch {torch.__version__}: n={n} k={k} "
          f"best {best * 1e3:.3f} ms, median {median * 1e3:.3f} ms")

    record = {"name": "torch_topk/select", "backend": "torch", "device": device, "n": n,
              "seconds_best": best, "seconds_median": median,
              "gradient_gbps": n * 4 / median / 1e9}
    if args.gradcomp_json:
        with open(args.gradcomp_json, encoding="utf-8") as f:
            records = json.load(f)
        ours = [r for r in records if r["name"] == "topk/encode" and r["n"] == n]
        if not ours:
            print(f"torch_topk.py: {args.gradcomp_json} has no topk/encode record at n={n}")
            return 1
        speedup = median / ours[0]["seconds_median"]
        record["gradcomp_topk_speedup"] = speedup
        print(f"{'PASS' if speedup >= 2.0 else 'FAIL'}  topk/encode n={n}: {speedup:.2f}x faster than torch.topk (>= 2)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump([record], f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
