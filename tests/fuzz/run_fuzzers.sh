#!/usr/bin/env bash
# Runs every libFuzzer target for a fixed time, each on a scratch copy of its checked-in corpus,
# and prints executions per target. Exits non-zero on any crash, timeout or leak.
# usage: tests/fuzz/run_fuzzers.sh <fuzz build dir> <seconds per target>
set -euo pipefail
build_dir=$1
seconds=$2
source_dir=$(cd "$(dirname "$0")" && pwd)
scratch=$(mktemp -d)
status=0
for target in envelope topk threshold randomk uniform sign qsgd shared_scale pipeline mpc zfp_fixed_rate count_sketch lhc; do
  mkdir -p "$scratch/$target"
  cp "$source_dir/corpus/$target/"* "$scratch/$target/"
  log="$scratch/$target.log"
  if "$build_dir/tests/fuzz/fuzz_$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
       -print_final_stats=1 -artifact_prefix="$scratch/$target-" "$scratch/$target" >"$log" 2>&1; then
    result=ok
  else
    result=FAILED
    status=1
    tail -40 "$log"
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  echo "fuzz_$target: $result, $runs executions in ${seconds} s"
done
if [ $status -eq 0 ]; then
  rm -rf "$scratch"
else
  echo "crash artifacts and logs kept in $scratch"
fi
exit $status
