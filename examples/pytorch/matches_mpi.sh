#!/usr/bin/env bash
# Usage: matches_mpi.sh RANKS PYTHON REPLAY_MPI MPIEXEC PORT
# Trains 30 steps over gloo with four codecs, one of them summed by an all-reduce and one given by
# its spec (gradcomp.qsgd(7, seed=5), the preset "QSGD 7 levels"; rank 1's step-12 batch holds a NaN), recording every bucket, then replays each record with replay_mpi over MPI:
# every mean and state must be bit-identical to the hook's.
set -euo pipefail
ranks=$1 python=$2 replay=$3 mpiexec=$4 port=$5
record=$(mktemp -d)
trap 'rm -rf "$record"' EXIT
"$python" "$(dirname "$0")/train_ddp.py" --world "$ranks" --steps 30 --nan-at 12 --port "$port" --watchdog 100 \
  --record "$record" --codec "top-k 1% + EF" --codec "uniform 4-bit + LoCo" --codec "qsgd bucket=256 levels=7 seed=5" \
  --codec "uniform 4-bit shared scale (summed)"
for dir in "$record"/*/; do
  "$mpiexec" -np "$ranks" --oversubscribe "$replay" "$dir" "$(cat "$dir/codec.txt")"
done
