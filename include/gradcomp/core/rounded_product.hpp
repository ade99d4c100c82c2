#pragma once
/// @file
/// A product that is rounded on its own, so that the CPU reference and the CUDA backend round the
/// same operations. nvcc contracts `a * b + c` into one fused multiply-add by default, which rounds
/// once where the CPU (x86-64 without FMA) rounds twice; a product computed by `mul_rn` is never
/// fused with the addition that consumes it. Shared arithmetic in which a product feeds a sum or
/// a difference uses it (DESIGN.md §4: no contraction on paths that must give identical bits).

#include <gradcomp/core/config.hpp>

namespace gradcomp {

/// a·b rounded to nearest even, never contracted into a fused multiply-add with what uses it.
template <class T>
GRADCOMP_HOST_DEVICE inline T mul_rn(T a, T b) noexcept {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) == 4) return __fmul_rn(a, b);
  else return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

}  // namespace gradcomp
