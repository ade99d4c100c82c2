#pragma once
/// @file
/// Products that are rounded on their own, whatever the compiler's flags, so that every build of
/// the reference, CPU and CUDA backends rounds the same operations.
///
/// Compilers contract a product and the sum or difference that uses it into one fused
/// multiply-add (FMA), which rounds once where the source rounds twice: g++ wherever the target has
/// FMA (`-march=native`, `-mfma`, aarch64; GNU mode's default is `-ffp-contract=fast`, across
/// statements and through SSE/AVX intrinsics), clang within an expression (`-ffp-contract=on`, its
/// default) or everywhere (`=fast`), and nvcc by default (`--fmad=true`). Pragmas do not hold
/// against all of them: g++ ignores `#pragma STDC FP_CONTRACT OFF`, and clang's `-ffp-contract=fast`
/// overrides `#pragma clang fp contract(off)`. So every product whose result feeds a sum or a
/// difference on a path whose bits are documented is made opaque to the optimizer: `mul_rn` for
/// scalars (host and device), `rounded` for the CPU kernels' SIMD vectors. An empty `asm`
/// statement that takes the value in a register and gives it back costs no instruction, and no
/// compiler can fuse across it. Where a fused multiply-add is meant, the code calls `std::fma`
/// (`fmaf`, `__fmaf_rn` on the device) explicitly. docs/design.md §6 lists what this guarantees.

#include <gradcomp/core/config.hpp>
#include <gradcomp/core/cpu_executor.hpp>

#if defined(GRADCOMP_HAVE_AVX2)
#  include <immintrin.h>
#endif

namespace gradcomp {

/// `value` unchanged, but opaque to the optimizer: the operation that computed it cannot be fused
/// with the one that uses it (host code: a scalar `float` or `double`, or an SSE vector).
template <class V>
[[gnu::always_inline]] inline V rounded(V value) noexcept {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__SSE2__)
  __asm__("" : "+x"(value));  // any SSE/AVX register: scalars and vectors stay where they are
#elif defined(__aarch64__)
  __asm__("" : "+w"(value));  // any FP/SIMD register
#else
  __asm__("" : "+m"(value));  // elsewhere through memory: slower, as opaque
#endif
  return value;
}

#if defined(GRADCOMP_HAVE_AVX2)
/// `rounded` of an AVX vector, for the AVX2 kernels.
[[gnu::always_inline]] GRADCOMP_TARGET_AVX2 inline __m256 rounded(__m256 value) noexcept {
  __asm__("" : "+x"(value));
  return value;
}
#endif

/// a·b rounded to nearest even, never contracted into a fused multiply-add with what uses it.
template <class T>
GRADCOMP_HOST_DEVICE inline T mul_rn(T a, T b) noexcept {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) == 4) return __fmul_rn(a, b);
  else
    return __dmul_rn(a, b);
#else
  return rounded(a * b);
#endif
}

}  // namespace gradcomp
