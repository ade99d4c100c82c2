#!/usr/bin/env python3
"""Checks tools/when_it_pays.py's byte model (docs/when-it-pays.md).

Usage: test_when_it_pays.py PRINT_ALL_REDUCE_COST   (the program tests/tools/print_all_reduce_cost.cpp)

1. The Python mirror prints the same bytes and rounds as the C++ cost model
   (include/gradcomp/collective/all_reduce_cost.hpp with the codecs' own sizes) for every
   (codec, n, P) of the grid.
2. It gives the bytes the collectives reported in docs/transports.md §9's measured table
   (`report.sent_bytes` of rank 0, n = 2^22, in-process transport): an oracle independent of both.
3. At the break-even bandwidth a plan takes as long as the dense ring; below it, less.
4. docs/when-it-pays.md's table is the script's output for bench/results/cpu-2core-vm.json.
"""

import re
import subprocess
import sys
from pathlib import Path

root = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(root / "tools"))
import when_it_pays as w  # noqa: E402

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


cpp = subprocess.run([sys.argv[1]], check=True, capture_output=True, text=True).stdout.split("\n")
cpp = [line for line in cpp if line]
py = w.model_lines()
check(len(cpp) == len(py) and len(py) == 200, f"{len(cpp)} C++ lines, {len(py)} Python lines, 200 expected")
cpp_cases = {" ".join(line.split()[:3]): line for line in cpp}
for line in py:
    case = " ".join(line.split()[:3])
    check(cpp_cases.get(case) == line, f"C++ '{cpp_cases.get(case)}' != Python '{line}'")

n = 1 << 22
uniform4 = w.block_quantizer_bytes(4)
topk1 = w.topk_bytes(0.01)
measured = [  # (encoded, P, gather_decode, scatter_reduce, dense ring)
    (uniform4, 4, 6_488_280, 3_244_464, 25_165_824),
    (uniform4, 16, 32_441_400, 4_057_200, 31_457_280),
    (topk1, 4, 1_006_896, 503_808, 25_165_824),
    (topk1, 16, 5_034_480, 631_680, 31_457_280),
]
for encoded, p, gather, scatter, dense in measured:
    check(w.gather_decode_cost(n, p, encoded)[0] == gather, f"gather_decode P={p}")
    check(w.scatter_reduce_cost(n, p, 0, encoded)[0] == scatter, f"scatter_reduce P={p}")
    check(w.dense_ring_cost(4 * n, p)[0] == dense, f"dense ring P={p}")

alpha = 10e-6
for p in (4, 16, 64):
    dense = w.dense_ring_cost(4 * 25_000_000, p)
    for plan in w.plan_times(w.CODECS[1], 25_000_000, p, 2e-9, 1e-9):
        beta = w.break_even(plan, dense, alpha)
        if not 0 < beta < float("inf"):
            continue
        t_dense = dense[1] * alpha + dense[0] / beta
        check(abs(plan.seconds(alpha, beta) - t_dense) <= 1e-9 * t_dense, f"break-even of {plan.plan} P={p}")
        check(plan.seconds(alpha, beta / 2) < dense[1] * alpha + dense[0] / (beta / 2), f"pays below, {plan.plan} P={p}")

script = [sys.executable, str(root / "tools" / "when_it_pays.py"), str(root / "bench" / "results" / "cpu-2core-vm.json")]
table = subprocess.run(script, check=True, capture_output=True, text=True).stdout.strip()
doc = (root / "docs" / "when-it-pays.md").read_text()
block = re.search(r"<!-- when_it_pays table: begin -->\n(.*)\n<!-- when_it_pays table: end -->", doc, re.S)
check(block is not None and block.group(1).strip() == table, "docs/when-it-pays.md's table differs from the script's output")

for f in failures:
    print("FAIL:", f)
print(f"{len(py)} model lines compared, {len(measured)} measured cases, the doc table; {len(failures)} failures")
sys.exit(1 if failures else 0)
