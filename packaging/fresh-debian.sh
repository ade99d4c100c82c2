#!/usr/bin/env bash
# The README's two commands on a fresh Debian 12 machine, made with debootstrap: a minimal bookworm
# plus `apt-get install git cmake g++` (what apt brings with them, make included, and nothing else:
# no doctest, fmt, CUDA, MPI, ...), into which this checkout's commit HEAD is cloned. As root
# inside it, with the time of every step:
#   1. cmake --workflow --preset demo   must stop at configure and print the packages' install lines
#   2. the Debian line it printed, run exactly as printed (so the line is proved, not just shown)
#   3. cmake --workflow --preset demo   the demo: time to its first line of output, and to the end
#   4. cmake --workflow --preset test   (left out with --demo-only) every test must pass
# A chroot is a fresh machine for these commands: they see only its files and packages (the host's
# CUDA toolkit, MPI and libraries are outside it); /proc, /dev and the host's DNS are all they share.
# Everything runs in a private mount namespace, so no mount outlives the script.
# CMAKE_BUILD_PARALLEL_LEVEL and CTEST_PARALLEL_LEVEL pass into the chroot when set.
#
# usage (as root): packaging/fresh-debian.sh [--demo-only] [--cache DIR]
#   --cache DIR   keep the fresh system as DIR/bookworm-git-cmake-gxx.tar.gz and reuse it (default:
#                 a fresh debootstrap every run, into a temporary folder)
# Needs debootstrap (installed with apt-get when missing) and a Debian mirror ($DEBIAN_MIRROR,
# default http://deb.debian.org/debian). Exit status 77 where it cannot run (not root, no mount
# namespace).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
demo_only=0
cache=""
while [ $# -gt 0 ]; do
  case "$1" in
    --demo-only) demo_only=1 ;;
    --cache) cache="$(realpath "$2")"; shift ;;
    *) echo "usage: $0 [--demo-only] [--cache DIR]" >&2; exit 2 ;;
  esac
  shift
done
if [ "$(id -u)" -ne 0 ] || ! unshare --mount true 2>/dev/null; then
  echo "fresh-debian.sh: needs root and a mount namespace (unshare -m): skipped" >&2
  exit 77
fi
if [ -z "${GRADCOMP_FRESH_DEBIAN_NAMESPACE:-}" ]; then
  args=()
  [ "$demo_only" -eq 0 ] || args+=(--demo-only)
  [ -z "$cache" ] || args+=(--cache "$cache")
  exec env GRADCOMP_FRESH_DEBIAN_NAMESPACE=1 unshare --mount --propagation private "$0" "${args[@]}"
fi
if ! git -C "$repo" diff --quiet HEAD 2>/dev/null; then
  echo "fresh-debian.sh: note: uncommitted changes are not tested (the chroot gets a clone of HEAD)" >&2
fi

start=$SECONDS
say() { echo "== [$((SECONDS - start)) s] $*"; }
work="$(mktemp -d /var/tmp/gradcomp-fresh-debian.XXXXXX)"
root="$work/root"
# The chroot's /dev is the host's, bound: unmount it before removing anything, and never let rm
# cross into a mount.
trap 'umount -R "$root/dev" 2>/dev/null || true; umount "$root/proc" 2>/dev/null || true; rm -rf --one-file-system "$work"' EXIT
mkdir -p "$root"
mount_system() {
  mount -t proc proc "$root/proc"
  mount --rbind /dev "$root/dev"
  cp /etc/resolv.conf "$root/etc/resolv.conf"
}
in_chroot() {
  chroot "$root" env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
    TERM=dumb DEBIAN_FRONTEND=noninteractive \
    ${CMAKE_BUILD_PARALLEL_LEVEL:+CMAKE_BUILD_PARALLEL_LEVEL=$CMAKE_BUILD_PARALLEL_LEVEL} \
    ${CTEST_PARALLEL_LEVEL:+CTEST_PARALLEL_LEVEL=$CTEST_PARALLEL_LEVEL} bash -c "cd /root/gradcomp 2>/dev/null; $1"
}

tarball="${cache:+$cache/bookworm-git-cmake-gxx.tar.gz}"
if [ -n "$tarball" ] && [ -f "$tarball" ]; then
  say "unpacking the cached fresh Debian 12 from $tarball"
  tar -C "$root" -xzf "$tarball"
  mount_system
else
  command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  say "debootstrap: Debian 12 (bookworm), minbase"
  debootstrap --variant=minbase bookworm "$root" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" \
    >"$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log"; exit 1; }
  mount_system
  say "apt-get install git cmake g++"
  in_chroot "apt-get update -qq && apt-get install -y -qq git cmake g++" >"$work/apt.log" 2>&1 ||
    { tail -20 "$work/apt.log"; exit 1; }
  if [ -n "$tarball" ]; then
    mkdir -p "$cache"
    tar -C "$root" --one-file-system -czf "$tarball" .
  fi
fi
say "cloning $(git -C "$repo" rev-parse --short HEAD) into /root/gradcomp"
git clone --quiet --no-local "$repo" "$root/root/gradcomp"
git -C "$root/root/gradcomp" checkout --quiet --detach "$(git -C "$repo" rev-parse HEAD)"
start=$SECONDS

say "1. cmake --workflow --preset demo, before any package is installed: must stop and say what to install"
if in_chroot "cmake --workflow --preset demo" >"$work/step1.log" 2>&1; then
  cat "$work/step1.log"; echo "FAIL: the demo configured without doctest and fmt"; exit 1
fi
sed -n "/gradcomp's tests, benchmark/,/Optional/p" "$work/step1.log"
line="$(sed -n "s/^ *Debian, Ubuntu: *//p" "$work/step1.log")"
[ -n "$line" ] || { cat "$work/step1.log"; echo "FAIL: no Debian install line"; exit 1; }
say "1. stopped at configure"

say "2. the printed line: $line"
in_chroot "$line" >"$work/step2.log" 2>&1 || { tail -20 "$work/step2.log"; echo "FAIL: the printed install line failed"; exit 1; }

say "3. cmake --workflow --preset demo"
demo_start=$SECONDS
first=""
while IFS= read -r text; do
  if [ -z "$first" ] && [[ "$text" == "gradcomp demo:"* ]]; then
    first=$((SECONDS - demo_start))
    say "first line of demo output, ${first} s after the command started"
  fi
  printf "%s\n" "$text"
done < <(in_chroot "cmake --workflow --preset demo" 2>&1)
wait $! || { echo "FAIL: the demo command failed"; exit 1; }
[ -n "$first" ] || { echo "FAIL: the demo printed nothing"; exit 1; }
say "3. the demo command ended, $((SECONDS - demo_start)) s after it started"

if [ "$demo_only" -eq 0 ]; then
  say "4. cmake --workflow --preset test"
  test_start=$SECONDS
  in_chroot "cmake --workflow --preset test" >"$work/step4.log" 2>&1 || true
  grep -E "^-- gradcomp|tests passed|tests failed|\(Failed\)|Not Run" "$work/step4.log" || true
  grep -q "100% tests passed" "$work/step4.log" || { tail -60 "$work/step4.log"; echo "FAIL: the test command"; exit 1; }
  say "4. the test command ended, $((SECONDS - test_start)) s after it started"
fi
say "done"
