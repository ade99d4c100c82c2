#!/usr/bin/env bash
# Runs every libFuzzer target, each on a scratch copy of its checked-in corpus, for a fixed time
# (CI's smoke run: `run_fuzzers.sh build/fuzz 10`) or for a fixed number of executions (the deep
# run of docs/hardening.md §4: `run_fuzzers.sh build/fuzz runs=1000000`), and prints a table:
# result, executions, seconds and executions per second per target. Exits non-zero on any crash,
# timeout or leak.
# usage: tests/fuzz/run_fuzzers.sh <fuzz build dir> <seconds per target | runs=<executions per target>>
set -euo pipefail
build_dir=$1
budget=$2
case $budget in
  runs=*) limit=(-runs="${budget#runs=}") ;;
  *) limit=(-max_total_time="$budget") ;;
esac
source_dir=$(cd "$(dirname "$0")" && pwd)
scratch=$(mktemp -d)
status=0
echo "| target | result | executions | seconds | executions/s |"
echo "|---|---|---:|---:|---:|"
for target in envelope topk threshold randomk uniform sign qsgd shared_scale pipeline mpc zfp_fixed_rate count_sketch lhc; do
  mkdir -p "$scratch/$target"
  cp "$source_dir/corpus/$target/"* "$scratch/$target/"
  log="$scratch/$target.log"
  start=$SECONDS
  if "$build_dir/tests/fuzz/fuzz_$target" "${limit[@]}" -timeout=10 -rss_limit_mb=2048 \
       -print_final_stats=1 -artifact_prefix="$scratch/$target-" "$scratch/$target" >"$log" 2>&1; then
    result=ok
  else
    result=FAILED
    status=1
    tail -40 "$log" >&2
  fi
  seconds=$((SECONDS - start))
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  echo "| fuzz_$target | $result | $runs | $seconds | $((runs / (seconds > 0 ? seconds : 1))) |"
done
if [ $status -eq 0 ]; then
  rm -rf "$scratch"
else
  echo "crash artifacts and logs kept in $scratch" >&2
fi
exit $status
