#!/usr/bin/env bash
# Proves on the CPU machine that the GPU check needs nothing of this machine but what .gpu-carry
# holds (docs/cuda.md §8). From a fresh clone of the committed tree:
#   1. tools/gpu-carry.sh deps copies doctest and fmt (the system's packages still visible);
#   2. in a private mount namespace, empty folders and /dev/null hide the system's doctest and fmt
#      (headers, CMake package files, libfmt.so*), and there:
#      - gpu-check.sh --dry-run --build configures and builds the three programs with the carried
#        copies and runs the test binary's CPU cases;
#      - gpu-carry.sh build copies them into .gpu-carry; the clone is then moved, so that no path
#        compiled into them exists any more, and gpu-check.sh --dry-run runs the carried binaries
#        (libfmt and libcudart from .gpu-carry, the golden files through GRADCOMP_GOLDEN_DIR) and
#        judges the made-up bench JSON of tools/test_gpu_check.py;
#      - without GRADCOMP_GOLDEN_DIR the moved binary's golden test fails (the variable is what
#        finds them).
# Needs root (unshare -m), nvcc and the packages gpu-carry.sh copies (exit status 77, nothing
# proved, without the first two). About 4 minutes on 2 cores.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
if ! unshare --mount true 2>/dev/null; then
  echo "gpu-check-proof: cannot make a mount namespace here (needs root): nothing proved" >&2
  exit 77
fi
if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "gpu-check-proof: no nvcc: nothing proved" >&2
  exit 77
fi
tmp="$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-proof.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
git clone -q "$root" "$tmp/a"
"$tmp/a/tools/gpu-carry.sh" deps
python3 "$tmp/a/tools/test_gpu_check.py" --write-fixture "$tmp/fixture"

TMP="$tmp" unshare --mount --propagation private bash -euo pipefail -c '
  empty="$(mktemp -d)"
  for d in /usr/include/doctest /usr/include/fmt /usr/lib/cmake/doctest /usr/lib/x86_64-linux-gnu/cmake/doctest \
           /usr/lib/x86_64-linux-gnu/cmake/fmt; do
    [ ! -d "$d" ] || mount --bind "$empty" "$d"
  done
  for f in /usr/lib/x86_64-linux-gnu/libfmt.so*; do mount --bind /dev/null "$f"; done
  [ ! -e /usr/include/doctest/doctest.h ] && [ ! -e /usr/include/fmt/core.h ] && [ ! -s /usr/lib/x86_64-linux-gnu/libfmt.so.9 ]
  echo "gpu-check-proof: the system doctest and fmt are hidden"

  "$TMP/a/tools/gpu-check.sh" --dry-run --build "$TMP/out-build" | tee "$TMP/build.txt"
  grep -q "^verdict: dry run passed" "$TMP/build.txt"

  "$TMP/a/tools/gpu-carry.sh" build
  mv "$TMP/a" "$TMP/b"
  "$TMP/b/tools/gpu-check.sh" --dry-run --bench-json "$TMP/fixture/bench.json" --torch-json "$TMP/fixture/torch.json" \
    "$TMP/out-carried" | tee "$TMP/carried.txt"
  grep -q "^verdict: dry run passed" "$TMP/carried.txt"
  grep -q "dry run, carried binaries" "$TMP/carried.txt"
  grep -q "libfmt.so.9 => $TMP/b/.gpu-carry/deps/" "$TMP/carried.txt"
  grep -q "libcudart.so.13 => $TMP/b/.gpu-carry/lib/" "$TMP/carried.txt"
  grep -q "MISSING zfp8/decode" "$TMP/carried.txt"

  if env LD_LIBRARY_PATH="$TMP/b/.gpu-carry/lib" "$TMP/b/.gpu-carry/bin/gradcomp_cuda_tests" \
       "-tc=cpu: encoders with a CUDA backend reproduce their golden files*" >"$TMP/no-golden-dir.txt" 2>&1; then
    echo "gpu-check-proof: the moved test binary found the golden files without GRADCOMP_GOLDEN_DIR" >&2
    exit 1
  fi
'
echo "gpu-check-proof: passed (carried doctest and fmt only, binaries moved away from their build paths)"
