#!/usr/bin/env bash
# Runs every libFuzzer target, each on a scratch copy of its checked-in corpus, for a fixed time
# (CI's smoke run: `run_fuzzers.sh build/fuzz 10`) or for a fixed number of executions (the deep
# run of docs/hardening.md §4: `run_fuzzers.sh build/fuzz runs=1000000`), and prints a table:
# result, executions, seconds and executions per second per target. Exits non-zero on any crash,
# timeout or leak. Targets run side by side, as many at a time as FUZZ_JOBS says (default: the
# number of cores); each libFuzzer run uses one core.
# usage: tests/fuzz/run_fuzzers.sh <fuzz build dir> <seconds per target | runs=<executions per target>>
set -euo pipefail
build_dir=$1
budget=$2
case $budget in
  runs=*) limit=(-runs="${budget#runs=}") ;;
  *) limit=(-max_total_time="$budget") ;;
esac
jobs=${FUZZ_JOBS:-$(nproc)}
source_dir=$(cd "$(dirname "$0")" && pwd)
scratch=$(mktemp -d)
targets=(envelope topk threshold randomk uniform sign qsgd shared_scale pipeline mpc zfp_fixed_rate count_sketch lhc)

# Fuzzes one target; writes its table row to $scratch/<target>.row.
fuzz_one() {
  local target=$1 log="$scratch/$1.log" start=$SECONDS result=ok
  mkdir -p "$scratch/$target"
  cp "$source_dir/corpus/$target/"* "$scratch/$target/"
  "$build_dir/tests/fuzz/fuzz_$target" "${limit[@]}" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$scratch/$target-" "$scratch/$target" >"$log" 2>&1 || result=FAILED
  local seconds=$((SECONDS - start)) runs
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  echo "| fuzz_$target | $result | $runs | $seconds | $((runs / (seconds > 0 ? seconds : 1))) |" >"$scratch/$target.row"
}

running=0
for target in "${targets[@]}"; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n
    running=$((running - 1))
  fi
  fuzz_one "$target" &
  running=$((running + 1))
done
wait

status=0
echo "| target | result | executions | seconds | executions/s |"
echo "|---|---|---:|---:|---:|"
for target in "${targets[@]}"; do
  cat "$scratch/$target.row"
  if grep -q FAILED "$scratch/$target.row"; then
    status=1
    tail -40 "$scratch/$target.log" >&2
  fi
done
if [ $status -eq 0 ]; then
  rm -rf "$scratch"
else
  echo "crash artifacts and logs kept in $scratch" >&2
fi
exit $status
