#!/bin/bash
# Runs the study's configurations (one per line of $1: "label arguments..."), for the seeds in
# $SEEDS (default "1 2 3"), seed by seed, niced, one thread each, while fewer than $JOBS (default
# 2) simulate.py processes run on the machine. Each run writes raw/<label>_s<seed>.json (the result
# line) and raw/<label>_s<seed>.log (the history); a run whose .log exists is skipped (delete the
# .log to rerun it).
set -eu
cd "$(dirname "$0")"
mkdir -p raw
for seed in ${SEEDS:-1 2 3}; do
  while read -r label args; do
    [ -z "$label" ] && continue
    out=raw/${label}_s${seed}
    [ -e "$out.log" ] && continue
    while [ "$(pgrep -fc 'python3 -s simulate.py' || true)" -ge "${JOBS:-2}" ]; do sleep 5; done
    ( OMP_NUM_THREADS=1 nice -n 10 /usr/bin/python3 -s simulate.py $args --seed "$seed" --label "$label" \
        >"$out.tmp" 2>"$out.log" && mv "$out.tmp" "$out.json" ) &
    sleep 1
  done <"$1"
done
wait
