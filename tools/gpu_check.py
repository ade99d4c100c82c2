#!/usr/bin/env python3
"""The parts of tools/gpu-check.sh that read and judge (standard library only; docs/cuda.md §8).

    gpu_check.py digest ROOT
        the digest of the sources the GPU binaries are built from (.gpu-carry/manifest.txt)
    gpu_check.py select --logs DIR --tool TOOL --budget SECONDS [--factor F] [--strides NATIVE SANITIZER]
        the test cases one compute-sanitizer tool runs, chosen from the native run's durations
        (DIR/tests-*.log): the GPU cases in ascending order of duration while factor x their
        native time fits the budget. Writes DIR/TOOL-cases.txt; prints doctest's -tc= value.
    gpu_check.py summary --logs DIR [--bench JSON] [--torch JSON] [--out FILE]
        the table that ends the check: steps, test counts, sanitizer errors, and every bench target
        of docs/cuda.md §7 judged from the JSON. Exit status 1 when a test, a sanitizer or a
        required step failed (bench targets are reported, as the bench reports them, not failed).
    gpu_check.py compare --main JSON... [--variant NAME JSON...]... [--out FILE]
        bench runs of other builds against the carried bench's, made alternately in one call
        (gpu-check.sh's variants step): each record's ratio to its run's copy, the range over the
        main runs against each variant's; the records whose ranges do not overlap, the rest counted.
    gpu_check.py kernels CSV [--top N]
        ncu's per-launch times (tools/gpu-profile.sh): the kernels by total time, then every launch
        in order, runs of one kernel folded.
"""
import argparse
import csv
import hashlib
import json
import os
import re
import subprocess
import sys

# What the binaries are built from: a change to any of these makes carried binaries stale.
SOURCES = ("CMakeLists.txt", "CMakePresets.json", "cmake", "include", "tests", "bench", "examples")

# compute-sanitizer's slowdown over the native run, per tool (first guesses; the summary prints the
# factor each run measured, to put here), and the fixed start-up cost of one sanitized process.
SLOWDOWN = {"memcheck": 30.0, "racecheck": 60.0, "synccheck": 30.0, "initcheck": 40.0}
SANITIZER_STARTUP_SECONDS = 15.0
# The golden test that decodes every truncation and bit flip; under a sanitizer only memcheck runs
# it (hostile bytes are about out-of-bounds accesses), every GRADCOMP_GOLDEN_FLIP_STRIDE-th flip.
GOLDEN_FLIPS = "truncation and single-bit flip"

N_TARGET = 1 << 28
H100_COPY_GBPS = 1500.0  # the bench's assumed H100 copy, for MPC's target on another card


# ---- sources ------------------------------------------------------------------------------------

def tree_files(root):
    """The files under SOURCES that travel to the GPU machine: all of them, less those git ignores
    (logs of local runs, say), which the device tool does not copy. Without git (or outside a
    checkout) every file counts."""
    files = []
    for top in SOURCES:
        path = os.path.join(root, top)
        if os.path.isfile(path):
            files.append(path)
        else:
            files += [os.path.join(d, f) for d, _, names in os.walk(path) if "__pycache__" not in d for f in names]
    try:
        listed = subprocess.run(["git", "-C", root, "check-ignore", "--no-index", "--stdin", "-z"],
                                input="\0".join(os.path.relpath(f, root) for f in files).encode(),
                                capture_output=True, check=False)
    except OSError:
        return sorted(files)
    if listed.returncode not in (0, 1):  # 1: nothing ignored; anything else: not a checkout
        return sorted(files)
    ignored = {os.path.join(root, f) for f in listed.stdout.decode().split("\0") if f}
    return sorted(f for f in files if f not in ignored)


def tree_digest(root):
    """sha256 over the relative paths and contents of the files tree_files lists (16 hex digits)."""
    h = hashlib.sha256()
    for f in tree_files(root):
        with open(f, "rb") as stream:
            h.update(os.path.relpath(f, root).encode() + b"\0" + hashlib.sha256(stream.read()).digest())
    return h.hexdigest()[:16]


# ---- doctest ------------------------------------------------------------------------------------

DOCTEST_TOTALS = re.compile(r"^\[doctest\] test cases: *(\d+) \| *(\d+) passed \| *(\d+) failed \| *(\d+) skipped", re.M)
DOCTEST_DURATION = re.compile(r"^(\d+\.\d+) s: (.+)$", re.M)
DOCTEST_CASE = re.compile(r"^TEST CASE:  (.+)$")
DOCTEST_FAILURE = re.compile(r": (ERROR|FATAL ERROR): ")


def parse_doctest(text):
    """A doctest run's output: {'complete', 'run', 'passed', 'failed', 'durations' {name: s}, 'failing'}.

    'run' counts the cases that ran ("skipped" in doctest's totals also counts the cases a filter
    left out, so it is not used); without the totals line (crash, timeout) the run is incomplete
    and the counts come from the per-case duration lines. 'failing' names the cases with a failed
    check, an exception or a crash, in the order they ran."""
    durations = {name: float(s) for s, name in DOCTEST_DURATION.findall(text)}
    failing, case = [], None
    for line in text.splitlines():
        header = DOCTEST_CASE.match(line)
        if header:
            case = header.group(1)
        elif case is not None and DOCTEST_FAILURE.search(line) and case not in failing:
            failing.append(case)
    totals = DOCTEST_TOTALS.findall(text)
    result = {"complete": bool(totals), "durations": durations, "failing": failing}
    if totals:
        run, passed, failed, _ = (int(v) for v in totals[-1])
        result.update(run=run, passed=passed, failed=failed)
    else:
        result.update(run=len(durations), passed=None, failed=None)
    return result


def parse_listing(text):
    """Test case names printed by --list-test-cases."""
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith("[doctest] listing all test case names"))
    except StopIteration:
        return []
    names = []
    for line in lines[start + 1:]:
        if line.startswith("[doctest]"):
            break
        if line and not set(line) <= {"="}:
            names.append(line)
    return names


def doctest_filter(names):
    """doctest's -tc= value naming exactly these cases (commas and backslashes escaped)."""
    return ",".join(n.replace("\\", "\\\\").replace(",", "\\,") for n in names)


# ---- compute-sanitizer ---------------------------------------------------------------------------

SANITIZER_ERRORS = re.compile(r"^========= ERROR SUMMARY: (\d+) errors?", re.M)
RACECHECK = re.compile(r"^========= RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)", re.M)
LEAKS = re.compile(r"^========= LEAK SUMMARY: (\d+) bytes leaked in (\d+) allocations?", re.M)
# Top-level sanitizer lines that are not findings.
SANITIZER_NOT_FINDINGS = ("COMPUTE-SANITIZER", "ERROR SUMMARY", "RACECHECK SUMMARY", "LEAK SUMMARY",
                          "Target application returned", "Error: process didn't terminate", "This tool",
                          "Saved host backtrace", "Host Frame", "Device Frame")


def parse_sanitizer(text):
    """{'complete', 'errors', 'warnings', 'leaks', 'printed'}: errors from the final summary
    (racecheck's hazard summary for racecheck), or None without one; 'printed' counts the findings
    printed so far, for a run stopped before its summary."""
    printed = 0
    for line in text.splitlines():
        if line.startswith("========= ") and not line.startswith("=========  "):
            if not line[10:].startswith(SANITIZER_NOT_FINDINGS):
                printed += 1
    result = {"complete": False, "errors": None, "warnings": 0, "leaks": 0, "printed": printed}
    race = RACECHECK.findall(text)
    summary = SANITIZER_ERRORS.findall(text)
    if race:
        result.update(complete=True, errors=int(race[-1][1]), warnings=int(race[-1][2]))
    elif summary:
        result.update(complete=True, errors=int(summary[-1]))
    leaks = LEAKS.findall(text)
    if leaks:
        result["leaks"] = int(leaks[-1][1])
    return result


def gpu_case(name):
    """Whether a case of gradcomp_cuda_tests touches the GPU ("cpu: " cases are the CPU twins of
    the executor-generic bodies)."""
    return not name.startswith("cpu: ")


def select_cases(durations, tool, budget, factor=None, strides=(1, 1)):
    """(chosen, left out) GPU cases for one sanitizer tool: ascending native duration while
    factor x the sum fits budget - start-up. strides = (GRADCOMP_GOLDEN_FLIP_STRIDE of the native
    run, of the sanitizer run) scales the golden flip test's estimate (memcheck only)."""
    factor = SLOWDOWN[tool] if factor is None else factor
    candidates = []
    for name, seconds in durations.items():
        if not gpu_case(name):
            continue
        if GOLDEN_FLIPS in name:
            if tool != "memcheck":
                continue
            seconds *= strides[0] / strides[1]
        candidates.append((seconds, name))
    candidates.sort()
    room = budget - SANITIZER_STARTUP_SECONDS
    chosen, left_out = [], []
    for seconds, name in candidates:
        if factor * seconds <= room:
            room -= factor * seconds
            chosen.append((name, seconds))
        else:
            left_out.append((name, seconds))
    return chosen, left_out


# ---- bench targets (docs/cuda.md §7) --------------------------------------------------------------

def load_records(path):
    """The records of a bench JSON file; none for a missing, empty or unreadable file."""
    try:
        with open(path, encoding="utf-8") as f:
            records = json.load(f)
    except (TypeError, OSError, ValueError):
        return []
    return records if isinstance(records, list) else []


def judge_targets(bench, torch_records):
    """[(verdict, name, text)] for every target at n = 2^28; verdict PASS, FAIL or MISSING."""
    at = {r["name"]: r for r in bench if r.get("n") == N_TARGET}
    rows = []

    def missing(name, why="no record at n = 2^28"):
        rows.append(("MISSING", name, why))

    def verdict(ok):
        return "PASS" if ok else "FAIL"

    for name, low in (("uniform8_rtn/encode", 0.8), ("uniform8_rtn/decode", 0.8), ("uniform8_sr/encode", 0.7),
                      ("ef_uniform8/encode", 0.5), ("loco_uniform4/encode", 0.4), ("threshold/encode", 0.5)):
        r = at.get(name)
        if r is None or r.get("ratio_to_copy") is None:
            missing(name)
        else:
            rows.append((verdict(r["ratio_to_copy"] >= low), name, f"{r['ratio_to_copy']:.3f} of the copy (>= {low})"))
    r = at.get("threshold/encode")
    if r is None or r.get("achieved_density") is None:
        missing("threshold density")
    else:
        d = r["achieved_density"]
        rows.append((verdict(0.008 <= d <= 0.0125), "threshold density", f"{d:.5f} (0.8-1.25 x 0.01)"))
    topk = at.get("topk/encode")
    if topk is None or topk.get("speedup_vs_baseline") is None:
        missing("topk vs radix sort")
    else:
        s = topk["speedup_vs_baseline"]
        rows.append((verdict(s >= 5), "topk vs radix sort", f"{s:.2f}x faster than {topk['baseline']} (>= 5)"))
    torch_at = [t for t in torch_records if t.get("n") == N_TARGET and t.get("seconds_median")]
    if topk is None or not torch_at:
        missing("topk vs torch.topk", "no topk/encode or torch_topk record at n = 2^28")
    else:
        s = torch_at[0]["seconds_median"] / topk["seconds_median"]
        rows.append((verdict(s >= 2), "topk vs torch.topk", f"{s:.2f}x faster (>= 2)"))
    r = at.get("count_sketch/encode")
    if r is None or not r.get("speedup_vs_baseline"):
        missing("count_sketch/encode")
    else:
        t = 1 / r["speedup_vs_baseline"]
        rows.append((verdict(t <= 1.5), "count_sketch/encode", f"{t:.2f}x the time of {r['baseline']} (<= 1.5)"))
    copy = at.get("copy/d2d")
    for name, gbps in (("mpc/encode", 300), ("mpc/decode", 400)):
        r = at.get(name)
        if r is None or copy is None:
            missing(name, "no record (or no copy/d2d) at n = 2^28")
            continue
        h100 = "H100" in r.get("device", "")
        goal = gbps if h100 else gbps * copy["gradient_gbps"] / H100_COPY_GBPS
        how = "H100" if h100 else f"{gbps} x this copy {copy['gradient_gbps']:.0f} / {H100_COPY_GBPS:.0f}"
        rows.append((verdict(r["gradient_gbps"] >= goal), name, f"{r['gradient_gbps']:.0f} GB/s (>= {goal:.0f}: {how})"))
    for name in ("zfp8/encode", "zfp8/decode", "zfp16/encode", "zfp16/decode"):
        r = at.get(name)
        if r is None:
            missing(name)
        else:
            rows.append((verdict(r["gradient_gbps"] >= 300), name, f"{r['gradient_gbps']:.0f} GB/s (>= 300)"))
    return rows


# ---- summary ------------------------------------------------------------------------------------

def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return None


def native_durations(logs):
    """{case: seconds} of the native test runs (tests-*.log)."""
    durations = {}
    for name in sorted(os.listdir(logs)):
        if name.startswith("tests-") and name.endswith(".log"):
            durations.update(parse_doctest(read(os.path.join(logs, name)))["durations"])
    return durations


def read_steps(logs):
    """steps.tsv: name, status, seconds, detail per line, in the order the steps ran."""
    steps = []
    for line in (read(os.path.join(logs, "steps.tsv")) or "").splitlines():
        fields = line.split("\t") + ["", "", ""]
        steps.append({"name": fields[0], "status": fields[1], "seconds": fields[2], "detail": fields[3]})
    return steps


def read_facts(logs):
    facts = {}
    for line in (read(os.path.join(logs, "toolchain.txt")) or "").splitlines():
        key, _, value = line.partition("=")
        facts[key.strip()] = value.strip()
    return facts


# Steps that run only while time is left: their absence fails nothing.
OPTIONAL_STEPS = ("synccheck", "initcheck")
# Steps whose outcome never fails the check: the variants' bench runs (reported, as targets are).
INFORMATIONAL_STEPS = ("variants",)


def ran(step):
    return step["status"] in ("ok", "fail", "timeout")


def some_names(names, shown=2, width=60):
    """'a | b and 3 more', each name cut to width characters."""
    cut = [n if len(n) <= width else n[:width - 3] + "..." for n in names[:shown]]
    return " | ".join(cut) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def test_row(logs, step, dry):
    """(problem, detail, counts) of one tests:FILE step, from its log and its listing. A case that
    skips is a problem on the GPU (GRADCOMP_REQUIRE_GPU=1 should fail it anyway), not in a dry run."""
    file = step["name"].split(":", 1)[1]
    listed = len(parse_listing(read(os.path.join(logs, f"list-{file}.txt")) or ""))
    counts = {"listed": listed, "run": 0, "passed": 0, "failed": 0, "skipped": 0}
    if not ran(step):
        return step["status"] != "dry-run", f"{listed} cases, not run ({step['detail'] or step['status']})", counts
    run = parse_doctest(read(os.path.join(logs, f"tests-{file}.log")) or "")
    counts["run"] = run["run"]
    failing = f"; failing: {some_names(run['failing'])}" if run["failing"] else ""
    if not run["complete"]:
        return True, f"{run['run']} of {listed} cases finished, then {step['status']} ({step['detail']}){failing}", counts
    counts.update(passed=run["passed"], failed=run["failed"], skipped=listed - run["run"])
    detail = f"{run['run']} run: {run['passed']} passed, {run['failed']} failed, {counts['skipped']} skipped{failing}"
    return run["failed"] > 0 or (counts["skipped"] != 0 and not dry) or step["status"] != "ok", detail, counts


def sanitizer_row(logs, step):
    """(problem, detail) of one compute-sanitizer step: the final summary's errors (racecheck: its
    hazards), leaks for memcheck, and the cases that failed under the tool."""
    tool = step["name"]
    chosen = len((read(os.path.join(logs, f"{tool}-cases.txt")) or "").splitlines())
    if not ran(step):
        fine = step["status"] == "dry-run" or (step["status"] in ("no time", "missing") and tool in OPTIONAL_STEPS)
        return not fine, f"{chosen} cases chosen, not run ({step['detail'] or step['status']})"
    text = read(os.path.join(logs, f"{tool}.log")) or ""
    found, run = parse_sanitizer(text), parse_doctest(text)
    native = native_durations(logs)
    timed = [n for n in run["durations"] if GOLDEN_FLIPS not in n and n in native]
    base, slow = sum(native[n] for n in timed), sum(run["durations"][n] for n in timed)
    factor = f", {slow / base:.0f}x native" if base >= 0.5 else ""
    done = f"{len(run['durations'])} of {chosen} cases done{factor}"
    if not found["complete"]:
        return True, f"{done}; stopped ({step['status']}) before its summary, {found['printed']} findings printed so far"
    detail = f"{done}; {found['errors']} errors"
    if tool == "racecheck":
        detail += f", {found['warnings']} warnings"
    if tool == "memcheck":
        detail += f", {found['leaks']} leaks"
    failed = run["failed"] or 0
    if failed:
        detail += f"; {failed} cases failed under it: {some_names(run['failing'])}"
    return bool(found["errors"] or found["warnings"] or found["leaks"] or failed or step["status"] != "ok"), detail


def summarize(logs, bench_path, torch_path):
    """(lines, failed): the table of steps, the test totals, the bench targets and the verdict."""
    facts, steps = read_facts(logs), read_steps(logs)
    dry = facts.get("mode", "").startswith("dry run")
    lines = [f"== gpu-check summary: {facts.get('gpu', 'no GPU')}, driver {facts.get('driver', '-')}, "
             f"{facts.get('mode', '?')}, {facts.get('elapsed', '?')} s of {facts.get('budget', '?')} s",
             f"{'step':<34} {'status':<8} {'time':>6}  detail"]
    problems = []
    totals = {"listed": 0, "run": 0, "passed": 0, "failed": 0, "skipped": 0}

    def row(name, status, seconds, detail, bad):
        if bad:
            problems.append(name)
        shown = "FAIL" if bad and status == "ok" else status
        lines.append(f"{name:<34} {shown:<8} {seconds:>5}s  {detail}")

    test_steps = [s for s in steps if s["name"].startswith("tests:")]
    for step in steps:
        name, status = step["name"], step["status"]
        if name.startswith("tests:"):
            bad, detail, counts = test_row(logs, step, dry)
            for key in totals:
                totals[key] += counts[key]
            row(name, status, step["seconds"], detail, bad)
            if step is test_steps[-1]:
                listed_all = len(parse_listing(read(os.path.join(logs, "list-all.txt")) or ""))
                outside = listed_all - totals["listed"]
                detail = (f"{totals['listed']} cases in {len(test_steps)} files: {totals['run']} run, "
                          f"{totals['passed']} passed, {totals['failed']} failed, {totals['skipped']} skipped")
                if outside:
                    detail += f"; {outside} listed cases are in no tests/cuda/*.cu file"
                seconds = sum(int(s["seconds"] or 0) for s in test_steps)
                row("tests (all, as ctest -R '^cuda\\.')", "total", seconds, detail, outside != 0)
        elif name in SLOWDOWN:
            bad, detail = sanitizer_row(logs, step)
            row(name, status, step["seconds"], detail, bad)
        else:
            fine = ("ok", "dry-run") + (("no time", "missing") if name in OPTIONAL_STEPS else ())
            row(name, status, step["seconds"], step["detail"], status not in fine and name not in INFORMATIONAL_STEPS)

    bench, torch_records = load_records(bench_path), load_records(torch_path)
    lines.append("")
    if bench:
        copy = next((r for r in bench if r["name"] == "copy/d2d" and r["n"] == N_TARGET), None)
        lines.append(f"targets at n = 2^28 on {bench[0].get('device', '?')}"
                     + (f", copy/d2d {copy['gradient_gbps']:.0f} GB/s" if copy else "") + " (docs/cuda.md §7):")
        targets = judge_targets(bench, torch_records)
        for verdict, name, text in targets:
            lines.append(f"  {verdict:<7} {name:<22} {text}")
        met = f"targets: {sum(1 for v, _, _ in targets if v == 'PASS')} of {len(targets)} met"
    else:
        met = "targets: no bench JSON"
        lines.append(met + (" (dry run: --bench-json FILE judges one)" if dry else ""))
    compared = read(os.path.join(logs, "variants.txt"))
    if compared:
        lines += [""] + compared.rstrip("\n").splitlines()
    lines.append("")
    verdict = "FAIL" if problems else ("dry run passed" if dry else "PASS")
    failing_files = [p for p in problems if p.startswith("tests:")]
    if len(failing_files) > 1:
        problems = [f"tests in {len(failing_files)} files" if p == failing_files[0] else p for p in problems
                    if p == failing_files[0] or p not in failing_files]
    lines.append(f"verdict: {verdict}" + (f" ({', '.join(problems)})" if problems else "") + f"; {met}")
    return lines, verdict == "FAIL"


# ---- variants: other builds' bench against the carried one (gpu-check.sh, docs/cuda.md §8.10) -----

# The smallest change a comparison reports: two runs a side understate the spread (on the H200 of
# docs/cuda.md §8.9 the same build's two runs differed by up to 2.8%, by 0.6% at the median).
MIN_CHANGE = 0.03

def ratio_ranges(runs):
    """{record name: (smallest, largest ratio_to_copy)} over bench runs (lists of records) at n = 2^28."""
    ranges = {}
    for records in runs:
        for r in records:
            if not isinstance(r, dict) or r.get("n") != N_TARGET or not r.get("ratio_to_copy"):
                continue  # not a record, another n, or no ratio (none, or 0 from a failed copy)
            low, high = ranges.get(r["name"], (r["ratio_to_copy"], r["ratio_to_copy"]))
            ranges[r["name"]] = (min(low, r["ratio_to_copy"]), max(high, r["ratio_to_copy"]))
    return ranges


def compare_variants(main_runs, variants):
    """Lines comparing each variant (name, runs) with the main runs: the records whose ranges of
    ratio_to_copy do not overlap and whose midpoints differ by MIN_CHANGE or more (faster or
    slower), then how many do not; records a side lacks are named."""
    main = ratio_ranges(main_runs)
    lines = [f"variants against the carried bench (runs: {sum(1 for r in main_runs if r)}; ratio to each run's "
             f"copy, smallest..largest):"]
    if not main:
        return lines + ["  no main bench record at n = 2^28"]
    for name, runs in variants:
        other = ratio_ranges(runs)
        changed, same = [], 0
        for record in sorted(main.keys() & other.keys()):
            (m_low, m_high), (v_low, v_high) = main[record], other[record]
            change = (v_low + v_high) / (m_low + m_high) - 1
            if abs(change) < MIN_CHANGE or m_low <= v_high and v_low <= m_high:
                same += 1
                continue
            verdict = "faster" if change > 0 else "slower"
            changed.append(f"    {verdict:<7}{record:<26} {m_low:.3f}..{m_high:.3f} -> {v_low:.3f}..{v_high:.3f} "
                           f"({change:+.1%})")
        lines.append(f"  {name} (runs: {sum(1 for r in runs if r)}): {len(changed)} records changed, "
                     f"{same} within the runs' spread or {MIN_CHANGE:.0%}")
        lines += changed
        for side, missing in (("main", sorted(other.keys() - main.keys())), (name, sorted(main.keys() - other.keys()))):
            if missing:
                lines.append(f"    not in {side}: {some_names(missing, 4)}")
    return lines


# ---- kernel times (tools/gpu-profile.sh) --------------------------------------------------------

def short_kernel_name(name):
    """A demangled kernel name without namespaces of gradcomp and CUB, `void` and the parameters."""
    name = re.sub(r"^void ", "", name.strip())
    depth = 0
    for i in range(len(name) - 1, -1, -1):  # drop the trailing parameter list "(...)"
        if name[i] == ")":
            depth += 1
        elif name[i] == "(":
            depth -= 1
            if depth == 0:
                name = name[:i]
                break
    for prefix in ("gradcomp::detail::cuda::", "gradcomp::", "cub::CUB_300001_SM_900_NS::", "cub::", "std::"):
        name = name.replace(prefix, "")
    return re.sub(r"\s+", " ", name)


def kernel_launches(text):
    """(short name, nanoseconds) of each launch in ncu's --csv --print-units base output."""
    rows = csv.DictReader(line for line in text.splitlines() if line.startswith('"'))
    launches = []
    for r in rows:
        if r.get("Metric Name") == "gpu__time_duration.sum":
            launches.append((short_kernel_name(r["Kernel Name"]), float(r["Metric Value"].replace(",", ""))))
    return launches


def kernel_report(launches, top=40):
    """Lines: the kernels by total time, then the launches in order, runs of one kernel folded."""
    total = sum(ns for _, ns in launches)
    by_name = {}
    for name, ns in launches:
        count, sum_ns = by_name.get(name, (0, 0.0))
        by_name[name] = (count + 1, sum_ns + ns)
    lines = [f"{len(launches)} launches, {total / 1e6:.3f} ms in all; the {top} largest totals:",
             f"{'total ms':>9} {'launches':>8} {'mean us':>9}  kernel"]
    for name, (count, sum_ns) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]:
        lines.append(f"{sum_ns / 1e6:9.3f} {count:8d} {sum_ns / count / 1e3:9.1f}  {name[:150]}")
    lines += ["", "in launch order (consecutive launches of one kernel folded):"]
    i = 0
    while i < len(launches):
        j = i
        while j < len(launches) and launches[j][0] == launches[i][0]:
            j += 1
        ns = sum(t for _, t in launches[i:j])
        lines.append(f"{i:6d} {j - i:5d}x {ns / 1e3:10.1f} us  {launches[i][0][:150]}")
        i = j
    return lines


# ---- command line -------------------------------------------------------------------------------

def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("digest")
    p.add_argument("root")
    p = sub.add_parser("select")
    p.add_argument("--logs", required=True)
    p.add_argument("--tool", required=True, choices=sorted(SLOWDOWN))
    p.add_argument("--budget", type=float, required=True)
    p.add_argument("--factor", type=float)
    p.add_argument("--strides", type=int, nargs=2, default=(1, 1), metavar=("NATIVE", "SANITIZER"))
    p.add_argument("--listing", help="without native durations (dry run): every case this listing names, as 0 s")
    p = sub.add_parser("summary")
    p.add_argument("--logs", required=True)
    p.add_argument("--bench")
    p.add_argument("--torch")
    p.add_argument("--out")
    p = sub.add_parser("compare")
    p.add_argument("--main", nargs="+", required=True)
    p.add_argument("--variant", nargs="+", action="append", default=[], metavar=("NAME", "JSON"))
    p.add_argument("--out")
    p = sub.add_parser("kernels")
    p.add_argument("csv", help="ncu --csv --print-units base --metrics gpu__time_duration.sum output")
    p.add_argument("--top", type=int, default=40)
    args = parser.parse_args(argv)

    if args.command == "digest":
        print(tree_digest(args.root))
        return 0
    if args.command == "kernels":
        print("\n".join(kernel_report(kernel_launches(read(args.csv) or ""), args.top)))
        return 0
    if args.command == "compare":
        variants = [(v[0], [load_records(path) for path in v[1:]]) for v in args.variant]
        text = "\n".join(compare_variants([load_records(path) for path in args.main], variants)) + "\n"
        sys.stdout.write(text)
        if args.out:
            with open(args.out, "w", encoding="utf-8") as f:
                f.write(text)
        return 0
    if args.command == "select":
        if args.listing:
            durations = dict.fromkeys(parse_listing(read(args.listing) or ""), 0.0)
        else:
            durations = native_durations(args.logs)
        chosen, left_out = select_cases(durations, args.tool, args.budget, args.factor, tuple(args.strides))
        with open(os.path.join(args.logs, f"{args.tool}-cases.txt"), "w", encoding="utf-8") as f:
            f.writelines(f"{name}\n" for name, _ in chosen)
        with open(os.path.join(args.logs, f"{args.tool}-left-out.txt"), "w", encoding="utf-8") as f:
            f.writelines(f"{seconds:.3f} s native: {name}\n" for name, seconds in left_out)
        print(doctest_filter([name for name, _ in chosen]))
        return 0
    lines, failed = summarize(args.logs, args.bench, args.torch)
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
