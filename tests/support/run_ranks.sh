#!/usr/bin/env bash
# Runs P copies of a command as the ranks of one job, for transports that have no launcher (Gloo).
# usage: tests/support/run_ranks.sh P command [args...]
# Rank r runs with GRADCOMP_RANK=r, GRADCOMP_SIZE=P and GRADCOMP_STORE=<a fresh empty directory>
# where the ranks meet (a Gloo FileStore), removed afterwards. Waits for every rank and exits with
# the first failing rank's status, or 0; when a rank fails, or the script is stopped, the other
# ranks are killed, so nothing is left hanging.
set -u
if [ $# -lt 2 ] || ! [[ $1 =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 P command [args...]" >&2
  exit 2
fi
ranks=$1
shift
store=$(mktemp -d)
pids=()
stop() { kill "${pids[@]}" 2>/dev/null; }
trap 'stop; rm -rf "$store"' EXIT
trap 'exit 143' TERM INT
for ((r = 0; r < ranks; ++r)); do
  GRADCOMP_RANK=$r GRADCOMP_SIZE=$ranks GRADCOMP_STORE=$store "$@" &
  pids+=($!)
done
status=0
for ((finished = 0; finished < ranks; ++finished)); do
  wait -n
  rc=$?
  if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then
    status=$rc
    stop
  fi
done
exit "$status"
