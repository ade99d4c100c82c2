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
#include <gradcomp/cpu/uniform_kernels.hpp>

#if defined(__SSE2__)
#include <xmmintrin.h>
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

/// Asks the cache to start loading the bytes of [from, to), one 64-byte line at a time; a hint
/// that changes no result.
inline void prefetch(const void* from, const void* to) noexcept {
#if defined(__SSE2__)
  for (auto* p = static_cast<const char*>(from); p < static_cast<const char*>(to); p += 64) _mm_prefetch(p, _MM_HINT_T0);
#else
  (void)from;
  (void)to;
#endif
}

/// Writes the envelope `e` of a message whose payload (`e.payload_bytes` bytes after the
/// envelope) is in place, with a payload CRC when `checksum` is set.
inline void seal_message(std::span<std::byte> out, envelope e, bool checksum) {
  const std::span<const std::byte> payload(out.data() + envelope::size, static_cast<std::size_t>(e.payload_bytes));
  e.flags = checksum ? flag_payload_checksum : 0;
  e.payload_crc = checksum ? crc32c(payload) : 0;
  write_envelope(e, out);
}

/// max |x| over [first, last) (vectorised for float, with AVX2 when `avx2`); throws
/// `non_finite_input` on NaN or Inf.
template <gradient_value T>
[[nodiscard]] T max_magnitude(const T* first, const T* last, bool avx2 = false) {
  using key_type = typename float_traits<T>::bits_type;
  key_type largest = 0;
  const T* p = first;
  if constexpr (std::is_same_v<T, float>) {
    const auto whole = static_cast<std::uint64_t>(last - first) / kernel_width * kernel_width;
    largest = max_magnitude_key32(first, whole, avx2);
    p += whole;
  }
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
