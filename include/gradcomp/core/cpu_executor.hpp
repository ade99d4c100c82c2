#pragma once
/// @file
/// The host executor: codecs given a `cpu_executor` run their fast host backend (`cpu/`) on the
/// calling thread, in memory the caller owns.
///
/// Kernels are compiled for the target's baseline (SSE2 on x86-64) and, with GCC or Clang on x86,
/// also for AVX2 (and Philox for AVX-512F), chosen at run time when the CPU has it. Every choice writes the same bytes: the
/// wider kernels are twins of the baseline ones, not approximations. CRC-32C (core/crc32c.hpp) uses
/// the SSE4.2 `crc32` instruction on x86-64 CPUs that have it, whatever the executor's `max_simd`.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include <gradcomp/core/memory_space.hpp>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__SSE2__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(__CUDACC__) && !defined(GRADCOMP_NO_AVX2)
/// Defined when the AVX2 kernels are compiled (x86 with SSE2, GCC or Clang, not disabled with
/// GRADCOMP_NO_AVX2).
#  define GRADCOMP_HAVE_AVX2 1
/// Compiles the function it marks for AVX2; callers must check `cpu_has_avx2()` first.
#  define GRADCOMP_TARGET_AVX2 __attribute__((target("avx2")))
/// Compiles the function it marks for AVX-512F; callers must check `cpu_has_avx512()` first.
#  define GRADCOMP_TARGET_AVX512 __attribute__((target("avx512f")))
#endif
#if defined(GRADCOMP_HAVE_AVX2) && defined(__x86_64__)
/// Defined when the SSE4.2 code (CRC-32C's `crc32` loop, x86-64 only) is compiled.
#  define GRADCOMP_HAVE_SSE42 1
/// Compiles the function it marks for SSE4.2; callers must check `cpu_has_sse42()` first.
#  define GRADCOMP_TARGET_SSE42 __attribute__((target("sse4.2")))
#endif

namespace gradcomp {

/// Widest instruction set a `cpu_executor`'s kernels may use.
enum class cpu_simd : std::uint8_t {
  baseline = 0,  ///< What the compiler targets (SSE2 on x86-64), plus scalar code.
  avx2 = 1,  ///< AVX2 where the CPU has it.
  avx512 = 2,  ///< Also AVX-512F where the CPU has it (the default; only Philox uses it).
};

/// Whether this CPU executes AVX2 and gradcomp's AVX2 kernels are compiled in.
[[nodiscard]] inline bool cpu_has_avx2() noexcept {
#if defined(GRADCOMP_HAVE_AVX2)
  static const bool has = __builtin_cpu_supports("avx2") != 0;
  return has;
#else
  return false;
#endif
}

/// Whether this CPU executes SSE4.2 (its `crc32` instruction) and gradcomp's SSE4.2 code is compiled in.
[[nodiscard]] inline bool cpu_has_sse42() noexcept {
#if defined(GRADCOMP_HAVE_SSE42)
  static const bool has = __builtin_cpu_supports("sse4.2") != 0;
  return has;
#else
  return false;
#endif
}

/// Whether this CPU executes AVX-512F (and AVX2) and gradcomp's AVX-512 kernels are compiled in.
[[nodiscard]] inline bool cpu_has_avx512() noexcept {
#if defined(GRADCOMP_HAVE_AVX2)
  static const bool has = __builtin_cpu_supports("avx512f") != 0 && cpu_has_avx2();
  return has;
#else
  return false;
#endif
}

/// Runs codecs on the calling CPU thread. Cheap to copy; every setting gives the same bytes for the
/// same inputs and keys, only the speed differs.
struct cpu_executor {
  /// Backend name used in benchmark records and messages.
  static constexpr std::string_view name = "cpu";
  /// Gradients, messages and workspace are host memory.
  static constexpr memory_space memory = memory_space::host;

  /// Widest instruction set kernels may use (lower it to compare kernels or rule one out).
  cpu_simd max_simd = cpu_simd::avx512;
  /// Outputs (encoded codes, decoded tensors) of at least this many bytes are written with
  /// non-temporal stores, which skip reading the destination into the cache first. Large outputs
  /// would not stay cached anyway; smaller ones are written normally so a consumer that reads
  /// them next finds them in cache. `SIZE_MAX` never streams.
  std::size_t streaming_store_bytes = std::size_t{8} << 20;

  /// The widest instruction set kernels use: `max_simd`, lowered to what the CPU has.
  [[nodiscard]] cpu_simd simd() const noexcept {
    if (max_simd >= cpu_simd::avx512 && cpu_has_avx512()) return cpu_simd::avx512;
    return max_simd >= cpu_simd::avx2 && cpu_has_avx2() ? cpu_simd::avx2 : cpu_simd::baseline;
  }
  /// Whether kernels run their AVX2 twins.
  [[nodiscard]] bool avx2() const noexcept { return simd() >= cpu_simd::avx2; }
  /// Whether an output of `bytes` bytes is written with non-temporal stores.
  [[nodiscard]] bool streams(std::uint64_t bytes) const noexcept { return bytes >= streaming_store_bytes; }
};

}  // namespace gradcomp
