#pragma once
/// @file
/// CRC-32C (Castagnoli), the checksum of the wire envelope. It detects every single-bit error and
/// every burst of up to 32 bits.
///
/// Three ways compute the same value: a byte-wise table (the host reference, and what constant
/// evaluation uses), bit by bit in device code, and on x86-64 hosts whose CPU has SSE4.2 its
/// `crc32` instruction eight bytes at a time, chosen at run time (`cpu_has_sse42()`), as the other
/// SIMD paths are (core/cpu_executor.hpp). The GPU path for long payloads is cuda/detail/crc32c.cuh.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>

#include <gradcomp/core/config.hpp>
#include <gradcomp/core/cpu_executor.hpp>

#if defined(GRADCOMP_HAVE_SSE42)
#  include <nmmintrin.h>
#endif

namespace gradcomp {

namespace detail {
inline constexpr std::array<std::uint32_t, 256> crc32c_table = [] {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t byte = 0; byte < 256; ++byte) {
    std::uint32_t crc = byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
    table[byte] = crc;
  }
  return table;
}();
}  // namespace detail

/// Advances a CRC-32C register (no initial or final XOR applied) over one byte: by table on the
/// host, bit by bit in device code, with the same result.
[[nodiscard]] GRADCOMP_HOST_DEVICE constexpr std::uint32_t crc32c_step(std::uint32_t crc, std::byte b) noexcept {
#if defined(__CUDA_ARCH__)
  crc ^= static_cast<std::uint32_t>(b);
  for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  return crc;
#else
  return (crc >> 8) ^ detail::crc32c_table[(crc ^ static_cast<std::uint32_t>(b)) & 0xFFu];
#endif
}

namespace detail {

/// Advances a CRC-32C register over `count` bytes with `crc32c_step`: the portable path.
[[nodiscard]] GRADCOMP_HOST_DEVICE constexpr std::uint32_t crc32c_update_portable(std::uint32_t crc,
                                                                                  const std::byte* bytes,
                                                                                  std::size_t count) noexcept {
  for (std::size_t i = 0; i < count; ++i) crc = crc32c_step(crc, bytes[i]);
  return crc;
}

#if defined(GRADCOMP_HAVE_SSE42)
/// The same register update with SSE4.2's `crc32` instruction: eight bytes per instruction (any
/// alignment; x86 loads need none), then the last 0-7 bytes one at a time. Callers check
/// `cpu_has_sse42()` first.
GRADCOMP_TARGET_SSE42 inline std::uint32_t crc32c_update_sse42(std::uint32_t crc, const std::byte* bytes,
                                                               std::size_t count) noexcept {
  std::uint64_t wide = crc;
  for (; count >= 8; count -= 8, bytes += 8) {
    std::uint64_t word = 0;
    std::memcpy(&word, bytes, sizeof word);
    wide = _mm_crc32_u64(wide, word);
  }
  crc = static_cast<std::uint32_t>(wide);
  for (; count > 0; --count, ++bytes) crc = _mm_crc32_u8(crc, std::to_integer<std::uint8_t>(*bytes));
  return crc;
}
#endif

}  // namespace detail

/// CRC-32C of the `count` bytes at `bytes`, callable from host and device code and in constant
/// expressions; on the host, with SSE4.2's `crc32` instruction where the CPU has it.
[[nodiscard]] GRADCOMP_HOST_DEVICE constexpr std::uint32_t crc32c(const std::byte* bytes, std::size_t count) noexcept {
#if defined(GRADCOMP_HAVE_SSE42)
  if (!std::is_constant_evaluated() && cpu_has_sse42())
    return detail::crc32c_update_sse42(0xFFFFFFFFu, bytes, count) ^ 0xFFFFFFFFu;
#endif
  return detail::crc32c_update_portable(0xFFFFFFFFu, bytes, count) ^ 0xFFFFFFFFu;
}

/// CRC-32C of `bytes` (reflected polynomial 0x82F63B78, initial and final XOR 0xFFFFFFFF);
/// CRC-32C("123456789") = 0xE3069283.
[[nodiscard]] constexpr std::uint32_t crc32c(std::span<const std::byte> bytes) noexcept {
  return crc32c(bytes.data(), bytes.size());
}

}  // namespace gradcomp
