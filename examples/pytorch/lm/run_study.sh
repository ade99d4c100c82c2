#!/bin/bash
# Runs the study's configurations (one per line of $1: "label arguments..."), for the seeds in
# $SEEDS (default "1 2 3"), two at a time, niced, one thread each. Each run writes
# raw/<label>_s<seed>.json (the result line) and raw/<label>_s<seed>.log (the history); a run
# whose .json exists is skipped.
set -eu
cd "$(dirname "$0")"
mkdir -p raw
running=0
for seed in ${SEEDS:-1 2 3}; do
  while read -r label args; do
    [ -z "$label" ] && continue
    out=raw/${label}_s${seed}
    [ -s "$out.json" ] && continue
    if [ "$running" -ge 2 ]; then wait -n || true; running=$((running - 1)); fi
    ( OMP_NUM_THREADS=1 nice -n 10 /usr/bin/python3 -s simulate.py $args --seed "$seed" --label "$label" \
        >"$out.tmp" 2>"$out.log" && mv "$out.tmp" "$out.json" ) &
    running=$((running + 1))
  done <"$1"
done
wait
