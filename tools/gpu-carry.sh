#!/usr/bin/env bash
# Prepares .gpu-carry/, what tools/gpu-check.sh needs on a GPU machine that has nvcc, CMake and
# ninja but no Debian packages and no network (docs/cuda.md §8). Run it here, on the CPU machine:
#
#   tools/gpu-carry.sh [deps] [build]      (no argument: both)
#   tools/gpu-carry.sh variant REV [NAME]
#
#   deps     copies doctest and fmt from this machine's packages (headers, CMake package files,
#            libfmt) into .gpu-carry/deps, relocatable: nothing in it names a path of this machine
#   build    compile, then packs the three programs (bin/) and libcudart (lib/) into
#            .gpu-carry/binaries.tar.gz, which gpu-check.sh unpacks, and writes the digest of the
#            sources they were built from into .gpu-carry/manifest.txt (gpu-check.sh uses them only
#            while it matches the tree)
#   variant  gradcomp-bench-cuda built from git revision REV (a commit, branch or tag; its own
#            checkout, so the tree may hold other changes) as .gpu-carry/variants/NAME.gz (NAME: REV's
#            short hash unless given); gpu-check.sh times each variant against the carried bench,
#            alternately, and its summary lists the records that changed (docs/cuda.md §8.10). `build`
#            removes the variants: add them after it
#   compile  configures the gpu-check preset (build/gpu-check-build) with the carried doctest and
#            fmt only and builds gradcomp_cuda_tests, gradcomp-bench-cuda and, where NCCL is found
#            (NCCL_INCLUDE_DIR and NCCL_LIBRARY in the environment name it), nccl_allreduce; what
#            gpu-check.sh --build runs on the GPU machine
#
# .gpu-carry/ is ignored by git; pass it in the device tool's carry list.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
carry="$root/.gpu-carry"
deps="$carry/deps"
# Where Debian 12's doctest-dev and libfmt-dev put their files.
doctest_header=/usr/include/doctest/doctest.h
doctest_cmake=/usr/lib/cmake/doctest
fmt_headers=/usr/include/fmt
fmt_cmake=/usr/lib/x86_64-linux-gnu/cmake/fmt
fmt_library=/usr/lib/x86_64-linux-gnu/libfmt.so.9.1.0

if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

copy_deps() {
  local f
  for f in "$doctest_header" "$doctest_cmake/doctestConfig.cmake" "$doctest_cmake/doctestTargets.cmake" \
           "$doctest_cmake/doctest.cmake" "$fmt_headers/core.h" "$fmt_cmake/fmt-config.cmake" "$fmt_library"; do
    [ -e "$f" ] || { echo "gpu-carry: $f is missing (Debian: apt-get install doctest-dev libfmt-dev)" >&2; exit 1; }
  done
  rm -rf "$deps"
  mkdir -p "$deps/include" "$deps/lib/cmake/doctest" "$deps/lib/x86_64-linux-gnu/cmake/fmt"
  cp -r "$(dirname "$doctest_header")" "$fmt_headers" "$deps/include/"
  # doctest's targets file names the prefix /usr outright: make it the folder three levels up.
  cp "$doctest_cmake"/*.cmake "$deps/lib/cmake/doctest/"
  sed -i 's|^set(_IMPORT_PREFIX "/usr")$|get_filename_component(_IMPORT_PREFIX "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)|' \
    "$deps/lib/cmake/doctest/doctestTargets.cmake"
  grep -q 'CMAKE_CURRENT_LIST_DIR}/../../..' "$deps/lib/cmake/doctest/doctestTargets.cmake" ||
    { echo "gpu-carry: doctestTargets.cmake has no 'set(_IMPORT_PREFIX \"/usr\")' line to relocate" >&2; exit 1; }
  # fmt's package files find their prefix four levels up already: keep Debian's layout. The
  # library goes under its real name (CMake links it) and its soname (the loader finds it), as two
  # files: a carry may not keep symbolic links.
  cp "$fmt_cmake"/*.cmake "$deps/lib/x86_64-linux-gnu/cmake/fmt/"
  cp "$fmt_library" "$deps/lib/x86_64-linux-gnu/"
  cp "$fmt_library" "$deps/lib/x86_64-linux-gnu/libfmt.so.9"
  echo "gpu-carry: doctest and fmt copied into $deps ($(du -sh "$deps" | cut -f1))"
}

build_dir="$root/build/gpu-check-build"

compile() {
  [ -f "$deps/include/doctest/doctest.h" ] || { echo "gpu-carry: no $deps: run 'tools/gpu-carry.sh deps' first" >&2; exit 1; }
  local nccl=() targets=(gradcomp_cuda_tests gradcomp-bench-cuda)
  [ -z "${NCCL_INCLUDE_DIR:-}" ] || nccl+=(-DNCCL_INCLUDE_DIR="$NCCL_INCLUDE_DIR")
  [ -z "${NCCL_LIBRARY:-}" ] || nccl+=(-DNCCL_LIBRARY="$NCCL_LIBRARY")
  cmake --preset gpu-check -Ddoctest_DIR="$deps/lib/cmake/doctest" -Dfmt_DIR="$deps/lib/x86_64-linux-gnu/cmake/fmt" "${nccl[@]}"
  # The build must compile against the carried headers and link the carried libfmt (a package file
  # that still named /usr would leave no -I at all: the compiler's default search finds /usr/include).
  grep -q -- "-isystem $deps/include" "$build_dir/build.ninja" && grep -q "$deps/lib/x86_64-linux-gnu/libfmt.so" "$build_dir/build.ninja" ||
    { echo "gpu-carry: $build_dir/build.ninja does not use the carried doctest and fmt" >&2; exit 1; }
  grep -q "^NCCL_LIBRARY:FILEPATH=/" "$build_dir/CMakeCache.txt" && targets+=(nccl_allreduce)
  nice -n 10 cmake --build "$build_dir" -j "$(nproc)" --target "${targets[@]}"
}

build_binaries() {
  local started=$SECONDS
  compile
  rm -rf "$carry/bin" "$carry/lib" "$carry/variants"
  mkdir -p "$carry/bin" "$carry/lib"
  cp "$build_dir/tests/gradcomp_cuda_tests" "$build_dir/bench/gradcomp-bench-cuda" "$carry/bin/"
  [ ! -x "$build_dir/examples/nccl_allreduce" ] || cp "$build_dir/examples/nccl_allreduce" "$carry/bin/"
  # libcudart of the toolkit that built them; libfmt.so.9 is in deps. libnccl.so.2 (over 200 MB)
  # does not travel: gpu-check.sh finds the GPU machine's own.
  local cudart
  cudart="$(ldd "$carry/bin/gradcomp_cuda_tests" | awk '$1 == "libcudart.so.13" { print $3 }')"
  [ -f "$cudart" ] || { echo "gpu-carry: gradcomp_cuda_tests does not load libcudart.so.13" >&2; exit 1; }
  cp "$cudart" "$carry/lib/libcudart.so.13"
  {
    echo "tree $(python3 tools/gpu_check.py digest "$root")"
    echo "built $(date -u +%Y-%m-%dT%H:%MZ) in $((SECONDS - started)) s on $(nproc) cores"
    echo "nvcc $(nvcc --version | sed -n 's/^Cuda compilation tools, //p')"
    echo "g++ $(g++ -dumpfullversion), $(ldd --version | head -n 1)"
    echo "git $(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)"
  } >"$carry/manifest.txt"
  echo "gpu-carry: built in $((SECONDS - started)) s:"
  du -h "$carry"/bin/* "$carry"/lib/* | sed 's/^/  /'
  # bin/ and lib/ travel as one gzip'd tar, about a quarter of their size (the device tool copies
  # at most 64 MiB, the tree included); gpu-check.sh and gpu-profile.sh unpack it there.
  tar -czf "$carry/binaries.tar.gz" -C "$carry" bin lib
  rm -rf "$carry/bin" "$carry/lib"
  echo "gpu-carry: packed into $carry/binaries.tar.gz; .gpu-carry holds $(du -sh "$carry" | cut -f1)"
}

# The bench of revision $1, built in a checkout of its own (a temporary git worktree, removed
# whatever happens), as .gpu-carry/variants/$2.gz.
build_variant() {
  local rev="$1" sha name started=$SECONDS
  sha="$(git -C "$root" rev-parse --short "$rev^{commit}")" || exit 2
  name="${2:-$sha}"
  [[ "$name" =~ ^[A-Za-z0-9._-]+$ ]] && [ "$name" != carried ] ||
    { echo "gpu-carry: a variant's name takes letters, digits, '.', '_', '-', and is not 'carried'" >&2; exit 2; }
  [ -f "$deps/include/doctest/doctest.h" ] || { echo "gpu-carry: no $deps: run 'tools/gpu-carry.sh deps' first" >&2; exit 1; }
  rm -f "$carry/variants/$name.gz" "$carry/variants/$name.txt"
  scratch="$(mktemp -d "${TMPDIR:-/tmp}/gpu-variant.XXXXXX")"
  trap 'git -C "$root" worktree remove --force "$scratch/src" 2>/dev/null; rm -rf "$scratch"; git -C "$root" worktree prune' EXIT
  git -C "$root" worktree add --detach "$scratch/src" "$sha" >/dev/null
  if ! (cd "$scratch/src" && cmake --preset gpu-check -Ddoctest_DIR="$deps/lib/cmake/doctest" \
          -Dfmt_DIR="$deps/lib/x86_64-linux-gnu/cmake/fmt" >"$scratch/configure.log" &&
        nice -n 10 cmake --build build/gpu-check-build -j "$(nproc)" --target gradcomp-bench-cuda); then
    cat "$scratch/configure.log" >&2
    echo "gpu-carry: the bench of $rev did not build (a revision before the gpu-check preset?)" >&2
    exit 1
  fi
  mkdir -p "$carry/variants"
  gzip -c "$scratch/src/build/gpu-check-build/bench/gradcomp-bench-cuda" >"$carry/variants/$name.gz.part"
  mv "$carry/variants/$name.gz.part" "$carry/variants/$name.gz"
  echo "$name: $(git -C "$root" describe --always "$sha"), built $(date -u +%Y-%m-%dT%H:%MZ) in $((SECONDS - started)) s" \
    >"$carry/variants/$name.txt"
  echo "gpu-carry: variant $name ($sha) in $carry/variants/$name.gz"
}

[ $# -gt 0 ] || set -- deps build
if [ "$1" = variant ]; then
  [ $# -ge 2 ] && [ $# -le 3 ] || { echo "usage: tools/gpu-carry.sh variant REV [NAME]" >&2; exit 2; }
  build_variant "$2" "${3:-}"
  exit
fi
for what in "$@"; do
  case "$what" in
    deps) copy_deps ;;
    build) build_binaries ;;
    compile) compile ;;
    *) echo "usage: tools/gpu-carry.sh [deps] [build] [compile] | variant REV [NAME]" >&2; exit 2 ;;
  esac
done
