#pragma once
/// @file
/// Pieces every fixed-layout CPU encoder shares: checking the output and zeroing its envelope
/// before the payload is written, sealing the envelope last, and the per-block maximum magnitude
/// (which is also where NaN and Inf are found).

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

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace gradcomp::cpu {

/// Checks that `out` holds a `size`-byte message and zeroes its envelope, so that until
/// `seal_message` runs last no earlier message in `out` can pass for this one.
/// @throws error `buffer_too_small`.
inline void begin_message(std::span<std::byte> out, std::size_t size) {
  detail::require(out.size() >= size, errc::buffer_too_small, [&] {
    return "output of " + std::to_string(out.size()) + " bytes cannot hold the " + std::to_string(size) +
           "-byte message";
  });
  std::memset(out.data(), 0, envelope::size);
}

/// Writes the envelope `e` of a message whose payload (`e.payload_bytes` bytes after the
/// envelope) is in place, with a payload CRC when `checksum` is set.
inline void seal_message(std::span<std::byte> out, envelope e, bool checksum) {
  const std::span<const std::byte> payload(out.data() + envelope::size, static_cast<std::size_t>(e.payload_bytes));
  e.flags = checksum ? flag_payload_checksum : 0;
  e.payload_crc = checksum ? crc32c(payload) : 0;
  write_envelope(e, out);
}

/// max |x| over [first, last) (SSE2 for float); throws `non_finite_input` on NaN or Inf.
template <gradient_value T>
[[nodiscard]] T max_magnitude(const T* first, const T* last) {
  using key_type = typename float_traits<T>::bits_type;
  key_type largest = 0;
  const T* p = first;
#if defined(__SSE2__)
  if constexpr (std::is_same_v<T, float>) {
    // Magnitude keys are below 2^31, so the signed 32-bit comparison orders them as unsigned.
    const __m128i mask = _mm_set1_epi32(0x7fffffff);
    __m128i acc0 = _mm_setzero_si128(), acc1 = _mm_setzero_si128();
    for (; last - p >= 8; p += 8) {
      const __m128i k0 = _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), mask);
      const __m128i k1 = _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4)), mask);
      const __m128i g0 = _mm_cmpgt_epi32(k0, acc0);
      const __m128i g1 = _mm_cmpgt_epi32(k1, acc1);
      acc0 = _mm_or_si128(_mm_and_si128(g0, k0), _mm_andnot_si128(g0, acc0));
      acc1 = _mm_or_si128(_mm_and_si128(g1, k1), _mm_andnot_si128(g1, acc1));
    }
    alignas(16) std::uint32_t lanes[8];
    _mm_store_si128(reinterpret_cast<__m128i*>(lanes), acc0);
    _mm_store_si128(reinterpret_cast<__m128i*>(lanes + 4), acc1);
    for (const std::uint32_t k : lanes) largest = std::max(largest, k);
  }
#endif
  for (; p != last; ++p) largest = std::max(largest, magnitude_key(*p));
  detail::require(largest < float_traits<T>::infinity_key, errc::non_finite_input, [&] {
    return "gradient value " + std::to_string(static_cast<std::size_t>(std::find_if(first, last, [](T v) {
                                                 return !is_finite(v);
                                               }) - first)) +
           " of a block is NaN or Inf";
  });
  return from_bits<T>(largest);
}

}  // namespace gradcomp::cpu
