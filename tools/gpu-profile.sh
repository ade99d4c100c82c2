#!/usr/bin/env bash
# Per-kernel times of the GPU bench on a lent H100 or H200 (docs/cuda.md §8.7): Nsight Compute
# reads one metric of each launch (gpu__time_duration.sum, the clocks left as they are) while
# gradcomp-bench-cuda times every record once.
#
#   tools/gpu-profile.sh [OUT [BENCH OPTIONS...]]      (OUT defaults to build/gpu-profile)
#
# Runs the carried bench (.gpu-carry/binaries.tar.gz, from tools/gpu-carry.sh) or else the one of a build
# there (build/gpu-check-build), with --warmup 0 --reps 1 --no-check and the options given. Writes
# OUT/kernels.csv (ncu's output), OUT/kernels.txt (tools/gpu_check.py kernels: the kernels by
# total time, then every launch in order) and OUT/bench.log, and prints the head of kernels.txt.
# About a minute on an H200 at n = 2^28, most of it ncu's per-launch overhead.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root" || exit 2
out="$(realpath -m "${1:-build/gpu-profile}")"
[ $# -eq 0 ] || shift
mkdir -p "$out"
# unpack_carried_binaries, find_file
source tools/gpu-common.sh
unpack_carried_binaries .gpu-carry
bench=.gpu-carry/bin/gradcomp-bench-cuda
[ -x "$bench" ] || chmod +x "$bench" 2>/dev/null
[ -x "$bench" ] || bench=build/gpu-check-build/bench/gradcomp-bench-cuda
[ -x "$bench" ] || { echo "gpu-profile: no gradcomp-bench-cuda (run tools/gpu-carry.sh and carry .gpu-carry)" >&2; exit 2; }
ncu="$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)"
[ -n "$ncu" ] || { echo "gpu-profile: no ncu (Nsight Compute) on this machine" >&2; exit 2; }
# The carried libraries, and NCCL from pip's nvidia packages (the bench's nccl/allreduce records).
nccl="$(find_file libnccl.so.2 /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu)"
export LD_LIBRARY_PATH="$root/.gpu-carry/lib:$root/.gpu-carry/deps/lib/x86_64-linux-gnu${nccl:+:$(dirname "$nccl")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
timeout --kill-after=10 "${GPU_PROFILE_SECONDS:-240}" "$ncu" --clock-control none --metrics gpu__time_duration.sum \
  --csv --print-units base --log-file "$out/kernels.csv" "$bench" --warmup 0 --reps 1 --no-check "$@" \
  >"$out/bench.log" 2>&1
rc=$?
python3 tools/gpu_check.py kernels "$out/kernels.csv" >"$out/kernels.txt"
head -n 45 "$out/kernels.txt"
[ $rc -eq 0 ] || echo "gpu-profile: ncu exited with $rc (bench.log and kernels.csv hold what it did)"
exit $rc
