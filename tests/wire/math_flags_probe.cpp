// Compiled (never linked) by the refused_math_flags.* tests of tests/CMakeLists.txt: with a
// value-changing math flag it must stop at gradcomp's #error (core/config.hpp), without one it
// must compile.
#include <gradcomp/gradcomp.hpp>

int main() { return gradcomp::uniform_levels(8) == 127 ? 0 : 1; }
