#!/usr/bin/env bash
# Lists the fused multiply-add instructions (x86 vfmadd…, vfmsub…, vfnmadd…, vfnmsub…) that a
# binary's line table attributes to gradcomp's headers, counted per source line, and exits
# non-zero when there is any: a product and its sum that the compiler fused although the headers
# round them apart (docs/design.md §6). The binary needs line tables (-g or -g1); the fma-gcc
# and fma-clang presets build gradcomp_fp_tests with line tables (-g1) and CI runs this on both.
# An FMA the code asks for (std::fma) would be listed too; gradcomp has none. The disassembly
# finds the FMA instructions and addr2line places only those: `objdump -l` would place every
# instruction, which takes minutes on the unity-built tests' large compilation units.
#
# usage: tests/fma_check.sh <binary>
set -euo pipefail
binary=$1
addresses=$(objdump -d --no-show-raw-insn "$binary" |
  awk '/\tvf(n?m(add|sub)|maddsub|msubadd)[0-9]+[ps][sd]/ { sub(":", "", $1); print "0x" $1 }')
found=""
if [ -n "$addresses" ]; then
  found=$(addr2line -e "$binary" <<<"$addresses" | sed 's/ (discriminator [0-9]*)$//' |
    awk '/include\/gradcomp\// { print }' | sed 's|.*/include/gradcomp/|gradcomp/|' | sort | uniq -c)
fi
if [ -n "$found" ]; then
  echo "fused multiply-adds in gradcomp's code (count, source line):"
  echo "$found"
  exit 1
fi
echo "no fused multiply-add in gradcomp's code ($binary; $(grep -c . <<<"$addresses") elsewhere)"
