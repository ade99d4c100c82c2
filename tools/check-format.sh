#!/usr/bin/env bash
# Checks that every tracked C++/CUDA file (.hpp .cuh .cpp .cu .h) is formatted as .clang-format says,
# with clang-format 16 (the version .clang-format is written for: Debian 12's clang-format-16, or
# `pip install clang-format==16.0.6` elsewhere). Lists each file clang-format would change, with the
# first lines it would change (clang-format --dry-run -Werror), and exits 1; exits 0 when all are
# formatted.
#
#   tools/check-format.sh          check (CI's format stage)
#   tools/check-format.sh --fix    reformat the files in place
#
# CLANG_FORMAT=<path> names the binary (it must be version 16); otherwise clang-format-16, then
# clang-format if it is 16.
set -euo pipefail
cd "$(dirname "$0")/.."

fix=0
case "${1:-}" in
  --fix) fix=1 ;;
  "") ;;
  *) echo "usage: tools/check-format.sh [--fix]" >&2; exit 2 ;;
esac

required_major=16
find_clang_format() {
  local candidate
  local candidates=(clang-format-$required_major clang-format)
  [ -z "${CLANG_FORMAT:-}" ] || candidates=("$CLANG_FORMAT")
  for candidate in "${candidates[@]}"; do
    command -v "$candidate" >/dev/null 2>&1 || continue
    if "$candidate" --version | grep -Eq "version $required_major\."; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}
if ! cf="$(find_clang_format)"; then
  echo "tools/check-format.sh needs clang-format $required_major (found: $(clang-format --version 2>/dev/null || echo none))." >&2
  echo "Install it: apt-get install clang-format-$required_major (Debian 12, Ubuntu 24.04)," >&2
  echo "or: python3 -m pip install clang-format==16.0.6 (any system); or set CLANG_FORMAT=<path>." >&2
  exit 1
fi

mapfile -d '' files < <(git ls-files -z -- '*.hpp' '*.cuh' '*.cpp' '*.cu' '*.h')
if [ "$fix" -eq 1 ]; then
  printf '%s\0' "${files[@]}" | xargs -0 -n 50 "$cf" -i --style=file
  echo "formatted ${#files[@]} files with $("$cf" --version)"
  exit 0
fi

# --dry-run -Werror: one "file:line:col: error: code should be clang-formatted" per difference.
report="$(printf '%s\0' "${files[@]}" | xargs -0 -n 50 "$cf" --dry-run -Werror --ferror-limit=3 --style=file 2>&1)" && status=0 || status=$?
if [ "$status" -eq 0 ]; then
  echo "all ${#files[@]} C++/CUDA files are formatted ($("$cf" --version))"
  exit 0
fi
mapfile -t unformatted < <(grep -oE '^[^:]+:[0-9]+:[0-9]+: error' <<<"$report" | cut -d: -f1 | sort -u)
echo "${#unformatted[@]} of ${#files[@]} C++/CUDA files are not formatted as .clang-format says ($("$cf" --version)):"
grep -E ': error: ' <<<"$report" | sed 's/^/  /'
echo "Run tools/check-format.sh --fix to format them."
exit 1
