#!/usr/bin/env python3
"""Tests of tools/gpu_check.py (run by tools/gpu-check.sh --dry-run): the parsers on doctest's and
compute-sanitizer's output as they print it, the sanitizer case selection, every bench target's
verdict on records whose verdicts are worked out by hand below, the comparison of variant builds'
bench runs, and the summary command end to end on a logs folder with a failing test and failing
targets.

    test_gpu_check.py                         runs the tests
    test_gpu_check.py --write-fixture FOLDER  writes the made-up bench and torch JSON of the tests
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_check  # noqa: E402

# doctest 2.4.9's console output with --duration=true (a passing, a failing, a throwing case, one
# skipped by its decorator), as printed by a small doctest program.
DOCTEST_RUN = """[doctest] doctest version is "2.4.9"
[doctest] run with "--help" for options
===============================================================================
t.cpp:4:
TEST CASE:  cpu: passes, with a comma

0.000006 s: cpu: passes, with a comma
===============================================================================
t.cpp:5:
TEST CASE:  cuda: passes, with a comma

0.030080 s: cuda: passes, with a comma
===============================================================================
t.cpp:6:
TEST CASE:  cuda: fails

t.cpp:6: ERROR: CHECK( 1 == 2 ) is NOT correct!
  values: CHECK( 1 == 2 )

0.000154 s: cuda: fails
===============================================================================
t.cpp:8:
TEST CASE:  cuda: throws

t.cpp:8: ERROR: test case THREW exception: boom

0.000075 s: cuda: throws
===============================================================================
[doctest] test cases: 4 | 2 passed | 2 failed | 1 skipped
[doctest] assertions: 3 | 2 passed | 1 failed |
[doctest] Status: FAILURE!
"""

DOCTEST_LISTING = """[doctest] doctest version is "2.4.9"
[doctest] run with "--help" for options
===============================================================================
[doctest] listing all test case names
===============================================================================
cpu: passes, with a comma
cuda: passes, with a comma
cuda: fails
cuda: skipped
cuda: throws
===============================================================================
[doctest] unskipped test cases passing the current filters: 5
"""

MEMCHECK_CLEAN = """========= COMPUTE-SANITIZER
0.912000 s: cuda: passes, with a comma
[doctest] test cases: 1 | 1 passed | 0 failed | 4 skipped
========= LEAK SUMMARY: 0 bytes leaked in 0 allocations
========= ERROR SUMMARY: 0 errors
"""

MEMCHECK_ERRORS = """========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 4 bytes
=========     at kernel(const float *)+0x70 in /src/kernel.cu:12
=========     by thread (0,0,0) in block (3,0,0)
=========     Address 0x7f0000000400 is out of bounds
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: main [0x1234] in app
=========
========= Leaked 1024 bytes at 0x7f0000001000
=========     Saved host backtrace up to driver entry point at cudaMalloc time
=========
========= LEAK SUMMARY: 1024 bytes leaked in 1 allocations
========= ERROR SUMMARY: 2 errors
"""

RACECHECK_HAZARD = """========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at histogram(unsigned int *)+0x90 in /src/h.cu:40
=========     and Read access at histogram(unsigned int *)+0xe0 in /src/h.cu:44 [4 hazards]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""

# A memcheck run stopped by the time limit after one finding and one case.
MEMCHECK_CUT = """========= COMPUTE-SANITIZER
0.500000 s: cuda: a
========= Invalid __global__ write of size 8 bytes
=========     at kernel()+0x10 in /src/k.cu:3
"""


class Parsers(unittest.TestCase):
    def test_doctest_run(self):
        run = gpu_check.parse_doctest(DOCTEST_RUN)
        self.assertTrue(run["complete"])
        self.assertEqual((run["run"], run["passed"], run["failed"]), (4, 2, 2))
        self.assertEqual(run["durations"], {"cpu: passes, with a comma": 0.000006, "cuda: passes, with a comma": 0.03008,
                                            "cuda: fails": 0.000154, "cuda: throws": 0.000075})
        self.assertEqual(run["failing"], ["cuda: fails", "cuda: throws"])

    def test_doctest_run_cut_short(self):
        cut = DOCTEST_RUN[:DOCTEST_RUN.index("0.000154 s")]
        run = gpu_check.parse_doctest(cut)
        self.assertFalse(run["complete"])
        self.assertEqual(run["run"], 2)
        self.assertIsNone(run["failed"])

    def test_listing(self):
        self.assertEqual(gpu_check.parse_listing(DOCTEST_LISTING),
                         ["cpu: passes, with a comma", "cuda: passes, with a comma", "cuda: fails", "cuda: skipped", "cuda: throws"])
        self.assertEqual(gpu_check.parse_listing("gradcomp_cuda_tests: error while loading shared libraries"), [])

    def test_filter_escapes_commas(self):
        self.assertEqual(gpu_check.doctest_filter(["a, b", "c\\d", "e"]), "a\\, b,c\\\\d,e")

    def test_sanitizer_clean(self):
        self.assertEqual(gpu_check.parse_sanitizer(MEMCHECK_CLEAN),
                         {"complete": True, "errors": 0, "warnings": 0, "leaks": 0, "printed": 0})

    def test_sanitizer_errors_and_leaks(self):
        self.assertEqual(gpu_check.parse_sanitizer(MEMCHECK_ERRORS),
                         {"complete": True, "errors": 2, "warnings": 0, "leaks": 1, "printed": 2})

    def test_racecheck_hazard(self):
        found = gpu_check.parse_sanitizer(RACECHECK_HAZARD)
        self.assertEqual((found["complete"], found["errors"], found["warnings"]), (True, 1, 0))

    def test_sanitizer_cut_short(self):
        found = gpu_check.parse_sanitizer(MEMCHECK_CUT)
        self.assertEqual((found["complete"], found["errors"], found["printed"]), (False, None, 1))


class Selection(unittest.TestCase):
    durations = {"cpu: a": 0.1, "cuda: a": 0.1, "cuda: b": 1.0, "cuda: c": 0.5, "cuda: d": 30.0,
                 "cuda: every truncation and single-bit flip of a golden message decodes": 20.0}

    def test_ascending_while_it_fits(self):
        # 60 s - 15 s start-up = 45 s at 30x: a (3 s), c (15 s), b (30 s) would be 48 s; golden at
        # stride 3 -> 101 is 20 * 3 / 101 = 0.594 s native, 17.8 s sanitized.
        chosen, left_out = gpu_check.select_cases(self.durations, "memcheck", 60, strides=(3, 101))
        self.assertEqual([n for n, _ in chosen], ["cuda: a", "cuda: c", "cuda: every truncation and single-bit flip of a golden message decodes"])
        self.assertEqual([n for n, _ in left_out], ["cuda: b", "cuda: d"])

    def test_golden_flips_only_under_memcheck(self):
        chosen, left_out = gpu_check.select_cases(self.durations, "racecheck", 1000, factor=1)
        self.assertEqual(sorted(n for n, _ in chosen), ["cuda: a", "cuda: b", "cuda: c", "cuda: d"])
        self.assertEqual(left_out, [])


N = 1 << 28


def record(name, gbps, device="NVIDIA H200", copy=2000.0, n=N, **extra):
    """A bench JSON record as gradcomp-bench-cuda writes it, from its throughput."""
    seconds = n * 4 / (gbps * 1e9)
    r = {"name": name, "backend": "cuda", "device": device, "n": n, "seconds_best": seconds * 0.98,
         "seconds_median": seconds, "gradient_gbps": gbps, "copy_gbps": copy, "ratio_to_copy": gbps / copy,
         "compression_ratio": 1.0, "baseline": "", "speedup_vs_baseline": None}
    r.update(extra)
    return r


def h200_records():
    """An H200 run (copy 2000 GB/s) with the verdicts in EXPECTED."""
    return [
        record("copy/d2d", 2000),
        record("radix_sort/sort", 100),
        record("topk/encode", 600, baseline="radix_sort/sort", speedup_vs_baseline=6.0),
        record("threshold/encode", 1200, achieved_density=0.0130),
        record("uniform8_rtn/encode", 1800),          # 0.9
        record("uniform8_rtn/decode", 1580),          # 0.79
        record("uniform8_rtn/encode", 10000, n=1 << 20),  # another n: ignored
        record("uniform8_sr/encode", 1400),           # 0.7 exactly
        record("atomics3/add", 400),
        record("count_sketch/encode", 320, baseline="atomics3/add", speedup_vs_baseline=0.8),  # 1.25x the time
        record("mpc/encode", 350),                    # H200: 300 x 2000 / 1500 = 400
        record("mpc/decode", 600),                    # 400 x 2000 / 1500 = 533
        record("zfp8/encode", 310),
        record("zfp16/encode", 290),
        record("zfp16/decode", 400),
        record("ef_uniform8/encode", 1100),           # 0.55
        record("loco_uniform4/encode", 700),          # 0.35
    ]


# torch.topk 1.5x slower than topk/encode's median: below the 2x target.
TORCH = [{"name": "torch_topk/select", "backend": "torch", "device": "NVIDIA H200", "n": N,
          "seconds_best": 1.0, "seconds_median": 1.5 * N * 4 / 600e9}]

EXPECTED = {
    "uniform8_rtn/encode": "PASS", "uniform8_rtn/decode": "FAIL", "uniform8_sr/encode": "PASS",
    "ef_uniform8/encode": "PASS", "loco_uniform4/encode": "FAIL", "threshold/encode": "PASS",
    "threshold density": "FAIL", "topk vs radix sort": "PASS", "topk vs torch.topk": "FAIL",
    "count_sketch/encode": "PASS", "mpc/encode": "FAIL", "mpc/decode": "PASS", "zfp8/encode": "PASS",
    "zfp8/decode": "MISSING", "zfp16/encode": "FAIL", "zfp16/decode": "PASS",
}


class Targets(unittest.TestCase):
    def test_every_target_judged(self):
        rows = gpu_check.judge_targets(h200_records(), TORCH)
        self.assertEqual({name: verdict for verdict, name, _ in rows}, EXPECTED)
        self.assertEqual(len(rows), len(EXPECTED))

    def test_mpc_absolute_on_h100(self):
        records = [record("copy/d2d", 1300, device="NVIDIA H100 80GB HBM3", copy=1300),
                   record("mpc/encode", 310, device="NVIDIA H100 80GB HBM3", copy=1300)]
        verdicts = {name: verdict for verdict, name, _ in gpu_check.judge_targets(records, [])}
        self.assertEqual(verdicts["mpc/encode"], "PASS")
        self.assertEqual(verdicts["topk vs torch.topk"], "MISSING")

    def test_unreadable_json_is_no_records(self):
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            self.assertEqual(gpu_check.load_records(f.name), [])  # empty: the bench's probe, then a failure
        self.assertEqual(gpu_check.load_records(None), [])


class Summary(unittest.TestCase):
    def write(self, folder, name, text):
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            f.write(text)

    def run_summary(self, steps, bench, tests_log=DOCTEST_RUN, listing=DOCTEST_LISTING):
        with tempfile.TemporaryDirectory() as folder:
            logs = os.path.join(folder, "logs")
            os.mkdir(logs)
            self.write(logs, "toolchain.txt", "mode=carried\nbudget=450\ngpu=NVIDIA H200\ndriver=580.65\nelapsed=300\n")
            self.write(logs, "steps.tsv", "".join("\t".join(s) + "\n" for s in steps))
            self.write(logs, "list-all.txt", listing)
            self.write(logs, "list-t.cu.txt", listing)
            self.write(logs, "tests-t.cu.log", tests_log)
            self.write(logs, "memcheck-cases.txt", "cuda: passes, with a comma\n")
            self.write(logs, "memcheck.log", MEMCHECK_CLEAN)
            self.write(folder, "bench.json", json.dumps(bench))
            self.write(folder, "torch.json", json.dumps(TORCH))
            out = os.path.join(folder, "summary.txt")
            done = subprocess.run([sys.executable, gpu_check.__file__, "summary", "--logs", logs, "--bench",
                                   os.path.join(folder, "bench.json"), "--torch", os.path.join(folder, "torch.json"),
                                   "--out", out], capture_output=True, text=True, check=False)
            with open(out, encoding="utf-8") as f:
                self.assertEqual(f.read(), done.stdout)
            return done.returncode, done.stdout

    def test_failing_test_and_targets(self):
        steps = [("toolchain", "ok", "2", ""), ("binaries", "ok", "0", "carried"), ("tests:t.cu", "fail", "3", "exit 1"),
                 ("memcheck", "ok", "40", "exit 0"), ("racecheck", "no time", "0", "no case fits 12 s"),
                 ("bench", "ok", "50", "exit 0"), ("synccheck", "no time", "0", "")]
        rc, text = self.run_summary(steps, h200_records())
        self.assertEqual(rc, 1, text)
        self.assertIn("4 run: 2 passed, 2 failed, 1 skipped; failing: cuda: fails | cuda: throws", text)
        self.assertIn("1 of 1 cases done; 0 errors, 0 leaks", text)
        self.assertIn("FAIL    loco_uniform4/encode   0.350 of the copy (>= 0.4)", text)
        self.assertIn("MISSING zfp8/decode", text)
        self.assertTrue(text.rstrip().endswith("verdict: FAIL (tests:t.cu, racecheck); targets: 9 of 16 met"), text)

    def test_a_gpu_case_that_skips_fails(self):
        passed = DOCTEST_RUN.replace("2 passed | 2 failed", "4 passed | 0 failed")
        rc, text = self.run_summary([("tests:t.cu", "ok", "3", "exit 0")], [], tests_log=passed)
        self.assertEqual(rc, 1, text)  # the listing names 5 cases, 4 ran
        self.assertIn("4 run: 4 passed, 0 failed, 1 skipped", text)

    def test_everything_passes(self):
        passed = DOCTEST_RUN.replace("2 passed | 2 failed", "4 passed | 0 failed")
        listing = DOCTEST_LISTING.replace("cuda: skipped\n", "")
        steps = [("toolchain", "ok", "2", ""), ("tests:t.cu", "ok", "3", "exit 0"), ("memcheck", "ok", "40", "exit 0"),
                 ("synccheck", "no time", "0", "")]
        rc, text = self.run_summary(steps, h200_records(), tests_log=passed, listing=listing)
        self.assertEqual(rc, 0, text)
        self.assertTrue(text.rstrip().endswith("verdict: PASS; targets: 9 of 16 met"), text)


class Variants(unittest.TestCase):
    """The comparison of variant builds' bench runs with the carried bench's (worked by hand)."""

    @staticmethod
    def runs(decode_gbps, encode_gbps, copy=2000.0):
        return [record("copy/d2d", copy, copy=copy), record("uniform8_rtn/decode", decode_gbps, copy=copy),
                record("uniform8_rtn/encode", encode_gbps, copy=copy)]

    def test_changes_beyond_spread_and_floor(self):
        main = [self.runs(1800, 2300), self.runs(1860, 2340)]  # decode 0.900..0.930, encode 1.150..1.170
        slower = [self.runs(1400, 2320), self.runs(1440, 2280)]  # decode 0.700..0.720: -22.4%; encode overlaps
        lines = gpu_check.compare_variants(main, [("old", slower)])
        self.assertEqual(lines[1], "  old (runs: 2): 1 records changed, 2 within the runs' spread or 3%")
        self.assertEqual(lines[2], "    slower uniform8_rtn/decode        0.900..0.930 -> 0.700..0.720 (-22.4%)")
        self.assertEqual(len(lines), 3)

    def test_small_change_outside_the_spread_is_not_reported(self):
        main = [self.runs(1800, 2300), self.runs(1800, 2300)]
        a_little = [self.runs(1840, 2300), self.runs(1840, 2300)]  # +2.2%: ranges apart, under the 3% floor
        lines = gpu_check.compare_variants(main, [("v", a_little)])
        self.assertEqual(lines[1:], ["  v (runs: 2): 0 records changed, 3 within the runs' spread or 3%"])

    def test_faster_and_missing_records(self):
        main = [self.runs(1400, 2300)]
        new = [self.runs(1900, 2300)[:2] + [record("zfp8/encode", 400)]]
        lines = gpu_check.compare_variants(main, [("new", new)])
        self.assertIn("    faster uniform8_rtn/decode        0.700..0.700 -> 0.950..0.950 (+35.7%)", lines)
        self.assertIn("    not in main: zfp8/encode", lines)
        self.assertIn("    not in new: uniform8_rtn/encode", lines)

    def test_no_main_run(self):
        self.assertEqual(gpu_check.compare_variants([[]], [("v", [self.runs(1, 1)])])[1],
                         "  no main bench record at n = 2^28")

    def test_command_and_summary(self):
        with tempfile.TemporaryDirectory() as folder:
            paths = {}
            for name, runs in (("m", self.runs(1800, 2300)), ("v", self.runs(1400, 2300))):
                paths[name] = os.path.join(folder, name + ".json")
                with open(paths[name], "w", encoding="utf-8") as f:
                    json.dump(runs, f)
            logs = os.path.join(folder, "logs")
            os.mkdir(logs)
            with open(os.path.join(logs, "toolchain.txt"), "w", encoding="utf-8") as f:
                f.write("mode=carried\nbudget=450\ngpu=NVIDIA H200\n")
            with open(os.path.join(logs, "steps.tsv"), "w", encoding="utf-8") as f:
                f.write("variants\ttimeout\t150\texit 124\n")  # informational: never fails the check
            done = subprocess.run([sys.executable, gpu_check.__file__, "compare", "--main", paths["m"], "--variant",
                                   "old", paths["v"], os.path.join(folder, "absent.json"), "--out",
                                   os.path.join(logs, "variants.txt")], capture_output=True, text=True, check=True)
            self.assertIn("old (runs: 1): 1 records changed", done.stdout)  # the absent run counts for nothing
            done = subprocess.run([sys.executable, gpu_check.__file__, "summary", "--logs", logs, "--bench", paths["m"]],
                                  capture_output=True, text=True, check=False)
            self.assertEqual(done.returncode, 0, done.stdout)
            self.assertIn("\nvariants against the carried bench (runs: 1;", done.stdout)
            self.assertIn("slower uniform8_rtn/decode", done.stdout)
            self.assertIn("variants                           timeout", done.stdout)


# ncu 2025.3's --csv --print-units base output of gpu__time_duration.sum, abridged to three launches.
NCU_CSV = """==PROF== Connected to process 4242 (/work/main/.gpu-carry/bin/gradcomp-bench-cuda)
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC",\
"Section Name","Metric Name","Metric Unit","Metric Value"
"0","4242","gradcomp-bench-cuda","127.0.0.1","void gradcomp::detail::cuda::thread_per_item_kernel<gradcomp::detail::cuda::\
decode_words<float, gradcomp::detail::cuda::uniform_rule<float>>>(T1, unsigned long)","1","7","(256, 1, 1)","(1048576, 1, 1)",\
"0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","1,125,000"
"1","4242","gradcomp-bench-cuda","127.0.0.1","void cub::CUB_300001_SM_900_NS::DeviceRadixSortOnesweepKernel<int, \
unsigned int>(int *, unsigned int)","1","7","(384, 1, 1)","(2048, 1, 1)","0","9.0","Command line profiler metrics",\
"gpu__time_duration.sum","ns","2,000"
"2","4242","gradcomp-bench-cuda","127.0.0.1","void cub::CUB_300001_SM_900_NS::DeviceRadixSortOnesweepKernel<int, \
unsigned int>(int *, unsigned int)","1","7","(384, 1, 1)","(2048, 1, 1)","0","9.0","Command line profiler metrics",\
"gpu__time_duration.sum","ns","3,000"
==PROF== Disconnected from process 4242
"""


class Kernels(unittest.TestCase):
    def test_launches_named_and_timed(self):
        self.assertEqual(gpu_check.kernel_launches(NCU_CSV), [
            ("thread_per_item_kernel<decode_words<float, uniform_rule<float>>>", 1125000.0),
            ("DeviceRadixSortOnesweepKernel<int, unsigned int>", 2000.0),
            ("DeviceRadixSortOnesweepKernel<int, unsigned int>", 3000.0)])

    def test_report_totals_then_folded_order(self):
        lines = gpu_check.kernel_report(gpu_check.kernel_launches(NCU_CSV))
        self.assertEqual(lines[0], "3 launches, 1.130 ms in all; the 40 largest totals:")
        self.assertEqual(lines[2].split(), ["1.125", "1", "1125.0", "thread_per_item_kernel<decode_words<float,",
                                            "uniform_rule<float>>>"])
        self.assertEqual(lines[3].split()[:3], ["0.005", "2", "2.5"])
        self.assertEqual(lines[-1].split()[:4], ["1", "2x", "5.0", "us"])


def write_fixture(folder):
    """The made-up H200 records above as bench.json and torch.json, for a dry run to judge
    (tools/gpu-check.sh --dry-run --bench-json FOLDER/bench.json --torch-json FOLDER/torch.json)."""
    os.makedirs(folder, exist_ok=True)
    for name, records in (("bench.json", h200_records()), ("torch.json", TORCH)):
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write-fixture"]:
        write_fixture(sys.argv[2])
    else:
        unittest.main(verbosity=1)
