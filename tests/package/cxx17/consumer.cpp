// Compiled as C++17 by ctest (package.cxx17_error): must stop at gradcomp's C++20 check first.
#include <gradcomp/gradcomp.hpp>
