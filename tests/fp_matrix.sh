#!/usr/bin/env bash
# The flag matrix of docs/design.md §6.1: builds the golden-file and fingerprint tests
# (gradcomp_fingerprint_tests; FP_MATRIX_TARGET=gradcomp_fp_tests adds the error-feedback, LoCo,
# dynamic, collective and GraVAC tests) with each compiler and flag set below, runs them, and
# compares every fingerprinted output byte for byte with a reference build (g++ -O2
# -ffp-contract=off, no -march: every operation rounded as written). Prints one table row per
# build: test cases passed and failed, outputs and bytes that differ. Exits non-zero when any test
# fails or any byte differs.
#
# usage: tests/fp_matrix.sh [work dir (default build/fp-matrix)] [name filter (grep -E)]
# Not part of CI's time budget (CI builds the bit-exact tests with two of these flag sets, the
# fma-gcc and fma-clang presets); a full run builds 27 configurations (one to two hours on 2 cores).
set -euo pipefail
source_dir=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$source_dir/build/fp-matrix}
filter=${2:-.}
target=${FP_MATRIX_TARGET:-gradcomp_fingerprint_tests}
mkdir -p "$work"
if ! grep -qw fma /proc/cpuinfo; then
  echo "fp_matrix.sh: this CPU has no FMA, so contraction cannot be tested here" >&2
  exit 2
fi

# name|compiler|flags: -march=native (FMA, AVX2, AVX-512 where the CPU has them) at every level
# and contraction mode, -mfma alone, and the baseline target.
configs=("reference|g++|-O2 -ffp-contract=off")
for compiler in g++ clang++; do
  case $compiler in g++) tag=gcc ;; *) tag=clang ;; esac
  for level in -O0 -O1 -O2 -O3; do
    for contract in fast on off; do
      case $level$contract in -O0on | -O0off | -O1on | -O1off) continue ;; esac
      configs+=("$tag$level-native-$contract|$compiler|$level -march=native -ffp-contract=$contract")
    done
  done
  if [ $compiler = g++ ]; then  # g++'s Zen tunings keep accumulation chains unfused; generic fuses them
    configs+=("$tag-O2-native-generic-fast|$compiler|-O2 -march=native -mtune=generic -ffp-contract=fast")
    configs+=("$tag-O3-native-generic-fast|$compiler|-O3 -march=native -mtune=generic -ffp-contract=fast")
  fi
  configs+=("$tag-O2-mfma-fast|$compiler|-O2 -mfma -ffp-contract=fast")
  configs+=("$tag-O3-mfma-fast|$compiler|-O3 -mfma -ffp-contract=fast")
  configs+=("$tag-O3-mfma-on|$compiler|-O3 -mfma -ffp-contract=on")
  configs+=("$tag-O3-default-fast|$compiler|-O3 -ffp-contract=fast")
done

printf '%-30s %-9s %-56s %7s %7s %8s %14s\n' build compiler flags passed failed outputs bytes_differ
status=0
for config in "${configs[@]}"; do
  IFS='|' read -r name compiler flags <<<"$config"
  [ "$name" = reference ] || echo "$name" | grep -Eq "$filter" || continue
  build="$work/$name"
  dump="$work/$name.dump"
  log="$work/$name.log"
  if ! { cmake -S "$source_dir" -B "$build" -DCMAKE_BUILD_TYPE= -DCMAKE_CXX_COMPILER="$compiler" \
           -DCMAKE_CXX_FLAGS="$flags" -DGRADCOMP_FP_TESTS=ON -DGRADCOMP_ENABLE_CUDA=OFF -DGRADCOMP_BUILD_BENCH=OFF \
           -DGRADCOMP_BUILD_EXAMPLES=OFF -DGRADCOMP_HEADER_CHECK=OFF -DGRADCOMP_INSTALL=OFF &&
         cmake --build "$build" --target "$target"; } >"$log" 2>&1; then
    printf '%-30s %-9s %-56s build failed (%s)\n' "$name" "$compiler" "$flags" "$log"
    status=1
    continue
  fi
  rm -rf "$dump"
  GRADCOMP_FINGERPRINT_DUMP="$dump" "$build/tests/$target" >>"$log" 2>&1 || status=1
  summary=$(grep 'test cases:' "$log" | tail -1)  # doctest: "test cases: N | P passed | F failed | S skipped"
  passed=$(echo "$summary" | sed -nE 's/.*\| *([0-9]+) passed.*/\1/p')
  failed=$(echo "$summary" | sed -nE 's/.*\| *([0-9]+) failed.*/\1/p')
  outputs=0
  differ=0
  if [ "$name" != reference ]; then
    for file in "$work/reference.dump"/*.bin; do
      other="$dump/$(basename "$file")"
      if [ ! -f "$other" ]; then
        outputs=$((outputs + 1))
        differ=$((differ + $(stat -c %s "$file")))
        continue
      fi
      # Differing bytes over the common length, plus the difference in length.
      bytes=$(cmp -l "$file" "$other" 2>/dev/null | wc -l || true)
      size_a=$(stat -c %s "$file")
      size_b=$(stat -c %s "$other")
      bytes=$((bytes + (size_a > size_b ? size_a - size_b : size_b - size_a)))
      if [ "$bytes" -ne 0 ]; then
        outputs=$((outputs + 1))
        differ=$((differ + bytes))
      fi
    done
  fi
  [ "$differ" -eq 0 ] || status=1
  printf '%-30s %-9s %-56s %7s %7s %8s %14s\n' "$name" "$compiler" "$flags" "$passed" "$failed" "$outputs" "$differ"
done
exit $status
