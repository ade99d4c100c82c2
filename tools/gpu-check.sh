#!/usr/bin/env bash
# The GPU check: one command on a lent H100 or H200 (docs/cuda.md §8).
#
#   tools/gpu-check.sh [--dry-run] [--build | --carried] [--budget SECONDS]
#                      [--bench-json FILE] [--torch-json FILE] [OUT]
#
# In order, each step with a time limit inside the budget (default 450 s; 7200 for a dry run):
#   1. the GPU and toolchain found (nvidia-smi, nvcc, compute-sanitizer, CMake, torch, NCCL);
#   2. the binaries: the ones tools/gpu-carry.sh built on the CPU machine (packed in
#      .gpu-carry/binaries.tar.gz) while their source digest matches this tree, else (or with
#      --build) built here with the carried doctest and fmt (.gpu-carry/deps) and all cores;
#   3. gradcomp_cuda_tests, every case (what ctest -R '^cuda\.' runs), one process per source
#      file, with --duration=true; compute-sanitizer memcheck and racecheck (then synccheck and
#      initcheck while time is left) on the GPU cases that fit about a minute each, chosen from
#      the native durations (tools/gpu_check.py select); gradcomp-bench-cuda --json at n = 2^28;
#      bench/torch_topk.py; nccl_allreduce; and, where bench builds of other revisions are carried
#      (tools/gpu-carry.sh variant), each timed against the carried bench, alternately;
#   4. a summary table, last: tests passed/failed/skipped, sanitizer errors, each bench target, and
#      the records each variant changed.
# GRADCOMP_REQUIRE_GPU=1 is set throughout, so a GPU case that would skip fails instead.
#
# OUT (default build/gpu-check) receives at most four files: summary.txt, the bench's and
# torch_topk's JSON named after the device, and logs.tar.gz with every log (rewritten after each
# step, so a run cut short still leaves what it did). The exit status is 1 when a test, a
# sanitizer or a required step failed; bench targets are reported, not failed.
#
# --dry-run does everything the CPU machine can: the toolchain report, the binaries (carried ones
# checked with ldd and --list-test-cases, or the build with the carried doctest and fmt only),
# the test cases and sanitizer selections it would run, the summary's self-test, and the summary,
# judging --bench-json / --torch-json files when given.
set -uo pipefail

usage() { sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "$0"; }

dry_run=0 mode=auto budget="" out=build/gpu-check bench_in="" torch_in=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --build) mode=build ;;
    --carried) mode=carried ;;
    --budget) budget="$2"; shift ;;
    --bench-json) bench_in="$(realpath "$2")"; shift ;;
    --torch-json) torch_in="$(realpath "$2")"; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "gpu-check: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) out="$1" ;;
  esac
  shift
done
# The budget is the GPU machine's; a dry run's build on a busy CPU machine may take longer.
[ -n "$budget" ] || budget=$([ $dry_run -eq 1 ] && echo 7200 || echo 450)
out="$(realpath -m "$out")"
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root" || exit 2
# unpack_carried_binaries, find_file
source tools/gpu-common.sh

# GRADCOMP_GOLDEN_FLIP_STRIDE: every N-th bit flip of the golden messages is decoded on the GPU.
# About 120k decodes in all; the native run takes a third of them, memcheck one in 101.
native_stride=3 sanitizer_stride=101
carry="$root/.gpu-carry"
build_dir="$root/build/gpu-check-build"
started=$SECONDS deadline=$((SECONDS + budget))
work="$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")"
logs="$work/logs"
mkdir -p "$logs" "$out"
rm -f "$out/summary.txt" "$out/logs.tar.gz" "$out"/gradcomp-bench-cuda-*.json "$out"/torch-topk-*.json
for d in /usr/local/cuda/bin /usr/local/cuda/compute-sanitizer; do
  [ -d "$d" ] && case ":$PATH:" in *":$d:"*) ;; *) PATH="$PATH:$d" ;; esac
done
export PATH
[ $dry_run -eq 1 ] || export GRADCOMP_REQUIRE_GPU=1
export GRADCOMP_GOLDEN_DIR="$root/tests/golden"

# ---- bookkeeping --------------------------------------------------------------------------------

elapsed() { echo "$((SECONDS - started)) s"; }
fact() { echo "$1=$2" >>"$logs/toolchain.txt"; printf '  %-17s %s\n' "$1" "$2"; }
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$logs/steps.tsv"; }
# Replaces the detail of the last step recorded.
note() {
  local name status seconds
  IFS=$'\t' read -r name status seconds _ < <(tail -n 1 "$logs/steps.tsv")
  sed -i '$ d' "$logs/steps.tsv"
  record "$name" "$status" "$seconds" "$1"
}
# The seconds a step may take: at most $1, leaving $2 for the steps after it.
cap_for() { local c=$((deadline - SECONDS - $2)); [ "$c" -lt "$1" ] || c=$1; echo "$c"; }
summary() {
  local args=(summary --logs "$logs" --out "$out/summary.txt")
  local b t
  b="$(ls "$out"/gradcomp-bench-cuda-*.json 2>/dev/null | head -n 1)"
  t="$(ls "$out"/torch-topk-*.json 2>/dev/null | head -n 1)"
  [ -z "$b" ] || args+=(--bench "$b")
  [ -z "$t" ] || args+=(--torch "$t")
  sed -i '/^elapsed=/d' "$logs/toolchain.txt"
  echo "elapsed=$((SECONDS - started))" >>"$logs/toolchain.txt"
  python3 tools/gpu_check.py "${args[@]}"
}
pack() {
  summary >/dev/null 2>&1
  tar -czf "$out/logs.tar.gz.part" -C "$work" logs && mv "$out/logs.tar.gz.part" "$out/logs.tar.gz"
}
# run_logged NAME CAP LOG COMMAND...: the command's output into LOG, stopped after CAP seconds;
# records ok, fail or timeout, shows the log's tail when it did not succeed.
run_logged() {
  local name="$1" cap="$2" log="$3" t0=$SECONDS rc status=ok
  shift 3
  if [ "$cap" -lt 5 ]; then skip "$name" "no time" "$cap s left for it"; return 1; fi
  echo "== [$(elapsed)] $name (at most $cap s)"
  timeout --kill-after=10 "$cap" "$@" >"$log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || status=fail
  [ $rc -ne 124 ] && [ $rc -ne 137 ] || status=timeout
  record "$name" "$status" $((SECONDS - t0)) "exit $rc"
  echo "   $status in $((SECONDS - t0)) s (exit $rc)"
  if [ $status != ok ]; then  # the first failures (doctest's, compute-sanitizer's) and the end
    { grep -E ': (ERROR|FATAL ERROR): |^========= [A-Z]' "$log" |
        grep -vE '^========= (COMPUTE-SANITIZER|ERROR SUMMARY|LEAK SUMMARY|RACECHECK SUMMARY)' | head -n 4
      tail -n 3 "$log"; } | cut -c1-160 | sed 's/^/   | /'
  fi
  pack
  return $rc
}
skip() { record "$1" "$2" 0 "$3"; echo "== [$(elapsed)] $1: $2${3:+ ($3)}"; }
# A device name as a file name: "NVIDIA H200" -> nvidia-h200.
slug() { echo "$1" | tr 'A-Z ' 'a-z-' | tr -cd 'a-z0-9._-'; }

# ---- 1. GPU and toolchain -----------------------------------------------------------------------

echo "== gpu-check in $root -> $out$([ $dry_run -eq 1 ] && echo ' (dry run)')"
echo "budget=$budget" >"$logs/toolchain.txt"
t0=$SECONDS
missing=()
if command -v nvidia-smi >/dev/null 2>&1; then
  IFS=, read -r gpu_name driver memory capability < <(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap \
    --format=csv,noheader 2>>"$logs/toolchain.log" | head -n 1)
  fact gpu "${gpu_name:-none found by nvidia-smi}"
  fact driver "${driver# }"
  fact memory "${memory# }, compute capability ${capability# }"
  fact gpus "$(nvidia-smi -L 2>/dev/null | wc -l)"
  nvidia-smi >>"$logs/toolchain.log" 2>&1
  [ -n "${gpu_name:-}" ] || missing+=("GPU")
else
  fact gpu "nvidia-smi missing"
  missing+=(nvidia-smi)
fi
if command -v nvcc >/dev/null 2>&1; then
  fact nvcc "$(nvcc --version | sed -n 's/^Cuda compilation tools, //p') ($(command -v nvcc))"
else
  fact nvcc missing
  missing+=(nvcc)
fi
sanitizer="$(command -v compute-sanitizer || find_file compute-sanitizer)"
if [ -n "$sanitizer" ]; then
  fact compute-sanitizer "$("$sanitizer" --version 2>/dev/null | sed -n 's/^Version //p' | head -n 1) ($sanitizer)"
else
  fact compute-sanitizer missing
  missing+=(compute-sanitizer)
fi
fact cmake "$(cmake --version 2>/dev/null | sed -n 's/^cmake version //p' || true)$(command -v ninja >/dev/null && echo ", ninja $(ninja --version)")"
fact host "$(g++ -dumpfullversion 2>/dev/null | sed 's/^/g++ /'), $(ldd --version 2>/dev/null | awk 'NR == 1 { print "glibc " $NF }'), $(nproc) cores, $(free -g 2>/dev/null | awk '/^Mem:/ { print $2 " GiB" }')"
fact python "$(python3 -c 'import sys; print(sys.version.split()[0])' 2>&1)"
fact torch "$(python3 -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda, "device" if torch.cuda.is_available() else "no device")' 2>/dev/null || echo missing)"
nccl_library="$(find_file libnccl.so.2 /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu)"
nccl_header="$(find_file nccl.h /usr/local/cuda/include /usr/include)"
if [ -n "$nccl_library" ]; then
  fact nccl "$(python3 -c 'import ctypes, sys; v = ctypes.c_int(); ctypes.CDLL(sys.argv[1]).ncclGetVersion(ctypes.byref(v)); v = v.value
print(f"{v // 10000}.{v // 100 % 100}.{v % 100}")' "$nccl_library" 2>/dev/null) ($nccl_library; header ${nccl_header:-missing})"
else
  fact nccl "missing (no libnccl.so.2 in pip's nvidia packages or the CUDA toolkit)"
fi
status=ok
[ ${#missing[@]} -eq 0 ] || status=missing
[ $dry_run -eq 0 ] || status=ok
record toolchain "$status" $((SECONDS - t0)) "${missing[*]:+missing: ${missing[*]}}"

# ---- 2. binaries --------------------------------------------------------------------------------

test_bin="" bench_bin="" nccl_bin="" run_libs=""
unpack_carried_binaries "$carry"
# A copy to the GPU machine may not keep the execute bits.
[ ! -d "$carry/bin" ] || chmod +x "$carry"/bin/* 2>/dev/null
digest="$(python3 tools/gpu_check.py digest "$root")"
carried_digest="$(sed -n 's/^tree //p' "$carry/manifest.txt" 2>/dev/null)"
why_build="--build"
if [ "$mode" = auto ]; then
  if [ ! -x "$carry/bin/gradcomp_cuda_tests" ]; then
    mode=build why_build="no carried binaries"
  elif [ "$carried_digest" != "$digest" ]; then
    mode=build why_build="carried binaries are stale (built from tree $carried_digest, this tree is $digest)"
  else
    mode=carried
  fi
fi
if [ "$mode" = carried ]; then
  if [ ! -x "$carry/bin/gradcomp_cuda_tests" ]; then
    record binaries missing 0 "no carried binaries: run tools/gpu-carry.sh on the CPU machine and carry .gpu-carry"
  else
    detail="carried, built from tree $carried_digest ($(sed -n 's/^built //p' "$carry/manifest.txt"))"
    [ "$carried_digest" = "$digest" ] || detail="STALE: $detail, this tree is $digest"
    record binaries ok 0 "$detail"
    test_bin="$carry/bin/gradcomp_cuda_tests" bench_bin="$carry/bin/gradcomp-bench-cuda" nccl_bin="$carry/bin/nccl_allreduce"
    run_libs="$carry/lib:$carry/deps/lib/x86_64-linux-gnu"
  fi
  echo "== [$(elapsed)] binaries: $(tail -n 1 "$logs/steps.tsv" | cut -f2,4 | tr '\t' ' ')"
else
  if [ ! -f "$carry/deps/include/doctest/doctest.h" ]; then
    skip binaries missing "no .gpu-carry/deps (doctest, fmt): run tools/gpu-carry.sh deps on the CPU machine and carry .gpu-carry"
  else
    nccl_env=()
    [ -z "$nccl_header" ] || [ -z "$nccl_library" ] || nccl_env=("NCCL_INCLUDE_DIR=$(dirname "$nccl_header")" "NCCL_LIBRARY=$nccl_library")
    # 16 cores build in about 90 s; a dry run's build on this machine's 2 may take many minutes.
    if run_logged binaries "$(cap_for $((dry_run == 1 ? 7200 : 300)) 200)" "$logs/build.log" env "${nccl_env[@]}" \
         bash tools/gpu-carry.sh compile; then
      test_bin="$build_dir/tests/gradcomp_cuda_tests" bench_bin="$build_dir/bench/gradcomp-bench-cuda"
      nccl_bin="$build_dir/examples/nccl_allreduce"
      note "built here with the carried doctest and fmt, $(nproc) jobs: $why_build"
    fi
  fi
fi
echo "mode=$([ $dry_run -eq 1 ] && echo 'dry run, ')$([ "$mode" = carried ] && echo 'carried binaries' || echo 'built here')" >>"$logs/toolchain.txt"
[ -z "$nccl_library" ] || run_libs="${run_libs:+$run_libs:}$(dirname "$nccl_library")"
# Our binaries get the carried libraries; torch keeps its own.
on_path=(env "LD_LIBRARY_PATH=$run_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
for b in test_bin bench_bin nccl_bin; do
  [ -z "${!b}" ] || [ -x "${!b}" ] || printf -v "$b" '%s' ""
done
if [ -n "$test_bin" ]; then
  for b in "$test_bin" "$bench_bin" "$nccl_bin"; do
    [ -n "$b" ] || continue
    echo "$ ldd $b" >>"$logs/libraries.log"
    "${on_path[@]}" ldd "$b" >>"$logs/libraries.log" 2>&1
  done
  # Where the carried libraries resolve (the proof that the carried ones are used), and anything
  # the loader cannot find.
  grep -E "libfmt|libcudart|libnccl|not found" "$logs/libraries.log" | sed 's/^[[:space:]]*/   /; s/ (0x[0-9a-f]*)$//' | sort -u
fi

# ---- 3. tests, sanitizers, bench ---------------------------------------------------------------

sources=()
for f in tests/cuda/*.cu; do sources+=("$(basename "$f")"); done
if [ -n "$test_bin" ]; then
  # Listed without GRADCOMP_REQUIRE_GPU and with --no-skip: every case, GPU or not.
  env -u GRADCOMP_REQUIRE_GPU "${on_path[@]}" "$test_bin" --list-test-cases --no-skip >"$logs/list-all.txt" 2>&1
  for f in "${sources[@]}"; do
    env -u GRADCOMP_REQUIRE_GPU "${on_path[@]}" "$test_bin" --list-test-cases --no-skip "-sf=*/tests/cuda/$f" >"$logs/list-$f.txt" 2>&1
  done
  echo "   $(sed -n 's/^\[doctest\] unskipped test cases passing the current filters: //p' "$logs/list-all.txt") test cases in ${#sources[@]} files"
  # Without a GPU the loop below runs the CPU cases, and the GPU ones skip.
  [ $dry_run -eq 0 ] || sed -n '/^\[doctest\] listing all/,/^\[doctest\] unskipped/{/^\[doctest\]/d;/^=/d;s/^/     /;p}' "$logs/list-all.txt"
fi

# Minimum seconds of the later steps: each sanitizer 30, bench 45, torch 20, nccl 10, summary 10 (on
# the H200 of docs/cuda.md §8.7 they took 1-17, 16, 4, 2 and under 1).
tests_cap=$(cap_for 240 145)
tests_end=$((SECONDS + tests_cap))
for f in "${sources[@]}"; do
  if [ -z "$test_bin" ]; then
    skip "tests:$f" missing "no test binary"
  elif [ $((tests_end - SECONDS)) -lt 5 ]; then
    skip "tests:$f" "no time" ""
  else
    run_logged "tests:$f" $((tests_end - SECONDS)) "$logs/tests-$f.log" env GRADCOMP_GOLDEN_FLIP_STRIDE=$native_stride \
      "${on_path[@]}" "$test_bin" "-sf=*/tests/cuda/$f" --duration=true
  fi
done

sanitize() {
  local tool="$1" cap="$2" filter options=()
  if [ -z "$test_bin" ]; then skip "$tool" missing "no test binary"; return; fi
  if [ -z "$sanitizer" ] && [ $dry_run -eq 0 ]; then skip "$tool" missing "no compute-sanitizer"; return; fi
  if [ "$cap" -lt 30 ]; then skip "$tool" "no time" "$cap s left for it"; return; fi
  if [ $dry_run -eq 1 ]; then
    # No native durations here: every GPU case is a candidate, in listing order.
    filter="$(python3 tools/gpu_check.py select --logs "$logs" --tool "$tool" --budget "$cap" --listing "$logs/list-all.txt")"
    skip "$tool" dry-run "$(grep -c '' "$logs/$tool-cases.txt") candidate cases; on the GPU chosen by native duration"
    return
  fi
  # Chosen to fill three quarters of the limit: the slowdowns are estimates.
  filter="$(python3 tools/gpu_check.py select --logs "$logs" --tool "$tool" --budget $((cap * 3 / 4)) \
    --strides $native_stride $sanitizer_stride)"
  if [ -z "$filter" ]; then skip "$tool" "no time" "no case fits $cap s"; return; fi
  [ "$tool" != memcheck ] || options=(--leak-check full)
  run_logged "$tool" "$cap" "$logs/$tool.log" env GRADCOMP_GOLDEN_FLIP_STRIDE=$sanitizer_stride "${on_path[@]}" \
    "$sanitizer" --tool "$tool" "${options[@]}" --print-limit 100 --error-exitcode 86 "$test_bin" "-tc=$filter" --duration=true
}
sanitize memcheck "$(cap_for 75 115)"
sanitize racecheck "$(cap_for 75 85)"

if [ -z "$bench_bin" ]; then
  skip bench missing "no gradcomp-bench-cuda"
elif [ $dry_run -eq 1 ]; then
  "${on_path[@]}" "$bench_bin" --help >"$logs/bench.log" 2>&1
  if [ -n "$bench_in" ]; then
    device="$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[0].get("device", "unknown"))' "$bench_in")"
    cp "$bench_in" "$out/gradcomp-bench-cuda-$(slug "$device").json"
    skip bench dry-run "judging $bench_in"
  else
    skip bench dry-run "--help runs; no --bench-json given"
  fi
else
  bench_json="$out/gradcomp-bench-cuda-$(slug "${gpu_name:-unknown}").json"
  run_logged bench "$(cap_for 150 40)" "$logs/bench.log" "${on_path[@]}" "$bench_bin" --json "$bench_json"
  [ -s "$bench_json" ] || rm -f "$bench_json"
fi

torch_args=()
bench_json="$(ls "$out"/gradcomp-bench-cuda-*.json 2>/dev/null | head -n 1)"
[ -z "$bench_json" ] || torch_args=(--gradcomp-json "$bench_json")
if [ $dry_run -eq 1 ]; then
  if [ -n "$torch_in" ]; then
    cp "$torch_in" "$out/torch-topk-$(basename "${bench_json:-x-unknown.json}" | sed 's/^gradcomp-bench-cuda-//')"
    skip torch_topk dry-run "judging $torch_in"
  else
    skip torch_topk dry-run "no --torch-json given"
  fi
elif python3 -c 'import torch' >/dev/null 2>&1; then
  run_logged torch_topk "$(cap_for 60 20)" "$logs/torch_topk.log" python3 bench/torch_topk.py "${torch_args[@]}" \
    --json "$out/torch-topk-$(slug "${gpu_name:-unknown}").json"
else
  skip torch_topk missing "python3 cannot import torch"
fi

if [ -z "$test_bin" ]; then
  skip nccl_allreduce missing "no binaries"
elif [ -z "$nccl_bin" ]; then
  skip nccl_allreduce missing "not built (no NCCL found at build time)"
elif [ $dry_run -eq 1 ]; then
  skip nccl_allreduce dry-run "$(grep -c 'libnccl.so.2 => /' "$logs/libraries.log") libnccl.so.2 found by the loader"
else
  run_logged nccl_allreduce "$(cap_for 45 10)" "$logs/nccl_allreduce.log" "${on_path[@]}" "$nccl_bin"
fi

# ---- variants: the bench of other revisions (tools/gpu-carry.sh variant), run alternately with the
# carried one: the bench step's run, each variant, the carried bench again, each variant again. One
# run took 16 s on an H200. Informational, as the targets are (docs/cuda.md §8.10).
variant_names=() unpacked=()
for v in "$carry"/variants/*.gz; do
  [ -f "$v" ] || continue
  name="$(basename "$v" .gz)"
  if gunzip -c "$v" >"$work/bench-$name" && chmod +x "$work/bench-$name"; then variant_names+=("$name")
  else unpacked+=("$name"); fi
done
if [ ${#unpacked[@]} -gt 0 ]; then
  record variants fail 0 "cannot unpack: ${unpacked[*]}"
elif [ ${#variant_names[@]} -eq 0 ]; then
  :
elif [ -z "$bench_bin" ]; then
  skip variants missing "no carried bench to time them against"
elif [ $dry_run -eq 1 ]; then
  broken=()
  for name in "${variant_names[@]}"; do
    "${on_path[@]}" "$work/bench-$name" --help >>"$logs/variants.log" 2>&1 || broken+=("$name")
  done
  if [ ${#broken[@]} -eq 0 ]; then skip variants dry-run "${#variant_names[@]} carried: ${variant_names[*]} (--help runs)"
  else record variants fail 0 "--help fails: ${broken[*]} (logs/variants.log)"; fi
else
  # logs/variants/NAME/run-K.json; `carried` is no variant's name (gpu-carry.sh refuses it).
  mkdir -p "$logs/variants/carried"
  for name in "${variant_names[@]}"; do mkdir -p "$logs/variants/$name"; done
  run_logged variants "$(cap_for 150 10)" "$logs/variants.log" "${on_path[@]}" bash -c '
    work="$1" results="$2" carried="$3" failed=0
    shift 3
    for round in 1 2; do
      for name in "$@"; do
        echo "== $name, run $round"
        "$work/bench-$name" --json "$results/$name/run-$round.json" || failed=1
      done
      [ $round -eq 2 ] || { echo "== carried, run 2"; "$carried" --json "$results/carried/run-2.json" || failed=1; }
    done
    exit $failed' _ "$work" "$logs/variants" "$bench_bin" "${variant_names[@]}"
  compare=(--main "$bench_json" "$logs/variants/carried/run-2.json")
  for name in "${variant_names[@]}"; do
    compare+=(--variant "$name" "$logs/variants/$name/run-1.json" "$logs/variants/$name/run-2.json")
  done
  python3 tools/gpu_check.py compare "${compare[@]}" --out "$logs/variants.txt" >"$logs/compare.log" 2>&1 ||
    echo "the comparison failed: logs/compare.log" >"$logs/variants.txt"
  pack
fi

sanitize synccheck "$(cap_for 60 10)"
sanitize initcheck "$(cap_for 60 10)"

if [ $dry_run -eq 1 ]; then
  t0=$SECONDS
  if python3 tools/test_gpu_check.py >"$logs/self-test.log" 2>&1; then status=ok; else status=fail; fi
  record "summary self-test" $status $((SECONDS - t0)) "tools/test_gpu_check.py: $(tail -n 1 "$logs/self-test.log")"
fi

# ---- 4. summary ---------------------------------------------------------------------------------

pack
echo
summary
rc=$?
rm -rf "$work"
exit $rc
