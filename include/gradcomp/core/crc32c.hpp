#pragma once
/// @file
/// CRC-32C (Castagnoli), the checksum of the wire envelope. It detects every single-bit error and
/// every burst of up to 32 bits.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include <gradcomp/core/config.hpp>

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

/// CRC-32C of the `count` bytes at `bytes`, callable from host and device code.
[[nodiscard]] GRADCOMP_HOST_DEVICE constexpr std::uint32_t crc32c(const std::byte* bytes, std::size_t count) noexcept {
  std::uint32_t crc = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < count; ++i) crc = crc32c_step(crc, bytes[i]);
  return crc ^ 0xFFFFFFFFu;
}

/// CRC-32C of `bytes` (reflected polynomial 0x82F63B78, initial and final XOR 0xFFFFFFFF);
/// CRC-32C("123456789") = 0xE3069283.
[[nodiscard]] constexpr std::uint32_t crc32c(std::span<const std::byte> bytes) noexcept {
  return crc32c(bytes.data(), bytes.size());
}

}  // namespace gradcomp
