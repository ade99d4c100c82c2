#pragma once
/// @file
/// Packing of unsigned codes of 1, 2, 4 or 8 bits into bytes. Code j occupies bits
/// [(j·b) mod 8, (j·b) mod 8 + b) of byte ⌊j·b/8⌋, least significant first; unused high bits of
/// the last byte are zero.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <gradcomp/core/config.hpp>
#include <gradcomp/core/error.hpp>

namespace gradcomp {

/// True for the code widths gradcomp packs: 1, 2, 4 and 8 bits.
GRADCOMP_HOST_DEVICE constexpr bool is_packable_width(int bits) noexcept {
  return bits == 1 || bits == 2 || bits == 4 || bits == 8;
}

/// Bytes that `count` packed codes of `bits` bits occupy.
GRADCOMP_HOST_DEVICE constexpr std::uint64_t packed_bytes(std::uint64_t count, int bits) noexcept {
  return (count * static_cast<std::uint64_t>(bits) + 7) / 8;
}

/// Code `j` of a packed array (`bits` must be packable).
GRADCOMP_HOST_DEVICE constexpr std::uint8_t packed_code(const std::uint8_t* packed, std::uint64_t j,
                                                        int bits) noexcept {
  const std::uint64_t bit = j * static_cast<std::uint64_t>(bits);
  const auto mask = static_cast<std::uint8_t>((1u << bits) - 1u);
  return static_cast<std::uint8_t>((packed[bit / 8] >> (bit % 8)) & mask);
}

/// Packs one byte's worth of codes (8/bits of them, each below 2^bits) into a byte.
GRADCOMP_HOST_DEVICE constexpr std::uint8_t pack_byte(const std::uint8_t* codes, int count, int bits) noexcept {
  unsigned byte = 0;
  for (int c = 0; c < count; ++c) byte |= unsigned{codes[c]} << (c * bits);
  return static_cast<std::uint8_t>(byte);
}

/// Packs `codes` (each below 2^bits) into `packed`, which must hold `packed_bytes(codes.size(), bits)`.
/// @throws error `invalid_argument` for another width or a code that does not fit,
///         `buffer_too_small` when `packed` is short.
inline void pack_codes(std::span<const std::uint8_t> codes, int bits, std::span<std::uint8_t> packed) {
  detail::require(is_packable_width(bits), errc::invalid_argument,
                  [&] { return "code width must be 1, 2, 4 or 8 bits, got " + std::to_string(bits); });
  detail::require(packed.size() >= packed_bytes(codes.size(), bits), errc::buffer_too_small, [&] {
    return "packed output holds " + std::to_string(packed.size()) + " bytes, needs " +
           std::to_string(packed_bytes(codes.size(), bits));
  });
  const unsigned limit = 1u << bits;
  for (const std::uint8_t code : codes)
    detail::require(code < limit, errc::invalid_argument, [&] {
      return "code " + std::to_string(code) + " does not fit in " + std::to_string(bits) + " bits";
    });
  const int per_byte = 8 / bits;
  const std::size_t full = codes.size() / static_cast<std::size_t>(per_byte);
  for (std::size_t b = 0; b < full; ++b)
    packed[b] = pack_byte(codes.data() + b * static_cast<std::size_t>(per_byte), per_byte, bits);
  const auto rest = static_cast<int>(codes.size() - full * static_cast<std::size_t>(per_byte));
  if (rest > 0) packed[full] = pack_byte(codes.data() + full * static_cast<std::size_t>(per_byte), rest, bits);
}

/// Unpacks `codes.size()` codes of `bits` bits from `packed`.
/// @throws error `invalid_argument` for another width, `truncated` when `packed` is short.
inline void unpack_codes(std::span<const std::uint8_t> packed, int bits, std::span<std::uint8_t> codes) {
  detail::require(is_packable_width(bits), errc::invalid_argument,
                  [&] { return "code width must be 1, 2, 4 or 8 bits, got " + std::to_string(bits); });
  detail::require(packed.size() >= packed_bytes(codes.size(), bits), errc::truncated, [&] {
    return "packed input holds " + std::to_string(packed.size()) + " bytes, needs " +
           std::to_string(packed_bytes(codes.size(), bits));
  });
  for (std::size_t j = 0; j < codes.size(); ++j) codes[j] = packed_code(packed.data(), j, bits);
}

}  // namespace gradcomp
