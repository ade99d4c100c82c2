#pragma once
/// @file
/// Pieces every fixed-layout CPU encoder shares: checking the output and zeroing its envelope
/// before the payload is written, sealing the envelope last, prefetching the blocks ahead, and the
/// per-block maximum magnitude (which is also where NaN and Inf are found).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>

#include <gradcomp/core/crc32c.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/cpu/detail/uniform_kernels.hpp>

#if defined(__SSE2__)
#  include <xmmintrin.h>
#endif

namespace gradcomp::detail::cpu {

/// Checks that `out` holds a `size`-byte message and zeroes its envelope (core/wire_envelope.hpp).
inline constexpr auto& begin_message = detail::begin_host_message;
/// Asks the cache to start loading the bytes of [from, to), one 64-byte line at a time; a hint
/// that changes no result.
inline void prefetch(const void* from, const void* to) noexcept {
#if defined(__SSE2__)
  for (auto* p = static_cast<const char*>(from); p < static_cast<const char*>(to); p += 64)
    _mm_prefetch(p, _MM_HINT_T0);
#else
  (void)from;
  (void)to;
#endif
}

/// Seals a message whose payload is in place (core/wire_envelope.hpp).
inline constexpr auto& seal_message = detail::seal_host_message;

/// max |x| over [first, last) (vectorised for float and bf16, with AVX2 when `avx2`); throws
/// `non_finite_input` on NaN or Inf.
template <gradient_value T>
[[nodiscard]] T max_magnitude(const T* first, const T* last, bool avx2 = false) {
  using key_type = typename float_traits<T>::bits_type;
  key_type largest = 0;
  const T* p = first;
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16>) {
    const auto whole = static_cast<std::uint64_t>(last - first) / kernel_width * kernel_width;
    if constexpr (std::is_same_v<T, float>) largest = max_magnitude_key32(first, whole, avx2);
    else
      largest = max_magnitude_key16(first, whole, avx2);
    p += whole;
  }
  for (; p != last; ++p) largest = std::max(largest, magnitude_key(*p));
  detail::require(largest < float_traits<T>::infinity_key, errc::non_finite_input, [&] {
    return "gradient value " +
           std::to_string(
               static_cast<std::size_t>(std::find_if(first, last, [](T v) { return !is_finite(v); }) - first)) +
           " of a block is NaN or Inf";
  });
  return from_bits<T>(largest);
}

}  // namespace gradcomp::detail::cpu
