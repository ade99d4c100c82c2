#pragma once
/// @file
/// The frame shared by every saved state (error feedback, LoCo): u32 magic, u16 version, u16
/// wrapped codec id, u8 value dtype, u64 element count n (bytes 0..16), then format-specific
/// fields up to `Format::header_crc_offset`, a u32 CRC-32C of all header bytes before it, the
/// payload, and a u32 CRC-32C of the payload. `Format` names `magic`, `version`,
/// `header_crc_offset`, `header_bytes` (= offset + 4) and `checksum_bytes` (= 4).

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include <gradcomp/core/crc32c.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/wire_envelope.hpp>

namespace gradcomp::detail {

/// Checks that `bytes` can hold a saved state of `size` bytes.
inline void require_state_room(std::span<std::byte> bytes, std::size_t size) {
  require(bytes.size() >= size, errc::buffer_too_small, [&] {
    return "buffer of " + std::to_string(bytes.size()) + " bytes cannot hold the " + std::to_string(size) +
           "-byte saved state";
  });
}

/// Writes the common head (bytes 0..16) of a saved state.
template <class Format>
void write_state_head(std::byte* p, codec_id codec, value_dtype dtype, std::uint64_t n) noexcept {
  store_le<std::uint32_t>(p + 0, Format::magic);
  store_le<std::uint16_t>(p + 4, Format::version);
  store_le<std::uint16_t>(p + 6, static_cast<std::uint16_t>(codec));
  store_le<std::uint8_t>(p + 8, static_cast<std::uint8_t>(dtype));
  store_le<std::uint64_t>(p + 9, n);
}

/// Writes both CRCs once the header fields and the `payload_bytes` of payload are in place.
template <class Format>
void seal_state(std::byte* p, std::size_t payload_bytes) noexcept {
  store_le<std::uint32_t>(p + Format::header_crc_offset, crc32c({p, Format::header_crc_offset}));
  const std::span<const std::byte> payload(p + Format::header_bytes, payload_bytes);
  store_le<std::uint32_t>(p + Format::header_bytes + payload_bytes, crc32c(payload));
}

/// Checks the head of untrusted saved-state bytes, in order: length of the header, magic,
/// version, header CRC, wrapped codec, dtype. Returns the saved element count.
/// @throws error `truncated`, `bad_magic`, `unsupported_version`, `header_checksum`,
///         `codec_mismatch`, `dtype_mismatch`.
template <class Format>
[[nodiscard]] std::uint64_t check_state_head(std::span<const std::byte> bytes, codec_id codec, value_dtype dtype,
                                             std::string_view magic_text) {
  require(bytes.size() >= Format::header_bytes, errc::truncated, [&] {
    return "saved state of " + std::to_string(bytes.size()) + " bytes is shorter than its " +
           std::to_string(Format::header_bytes) + "-byte header";
  });
  const std::byte* const p = bytes.data();
  require(load_le<std::uint32_t>(p) == Format::magic, errc::bad_magic,
          [&] { return "saved state does not start with \"" + std::string(magic_text) + "\""; });
  const auto version = load_le<std::uint16_t>(p + 4);
  require(version == Format::version, errc::unsupported_version, [&] {
    return "saved-state version " + std::to_string(version) + ", this build reads version " +
           std::to_string(Format::version);
  });
  require(load_le<std::uint32_t>(p + Format::header_crc_offset) == crc32c({p, Format::header_crc_offset}),
          errc::header_checksum, "saved-state header CRC-32C does not match its contents");
  const auto saved_codec = load_le<std::uint16_t>(p + 6);
  require(saved_codec == static_cast<std::uint16_t>(codec), errc::codec_mismatch, [&] {
    return "state saved around codec " + std::to_string(saved_codec) + ", this one wraps codec " +
           std::to_string(static_cast<unsigned>(codec));
  });
  require(load_le<std::uint8_t>(p + 8) == static_cast<std::uint8_t>(dtype), errc::dtype_mismatch,
          "saved state's value type differs from the codec's");
  return load_le<std::uint64_t>(p + 9);
}

/// Checks the total length (`payload_bytes` of payload expected) and the payload CRC; returns the
/// payload. @throws error `truncated`, `trailing_bytes`, `payload_checksum`.
template <class Format>
[[nodiscard]] std::span<const std::byte> check_state_body(std::span<const std::byte> bytes, std::size_t payload_bytes) {
  const std::size_t size = Format::header_bytes + payload_bytes + Format::checksum_bytes;
  require(bytes.size() >= size, errc::truncated, [&] {
    return "saved state of " + std::to_string(bytes.size()) + " bytes, its header declares " + std::to_string(size);
  });
  require(bytes.size() == size, errc::trailing_bytes,
          [&] { return std::to_string(bytes.size() - size) + " bytes follow the saved state"; });
  const std::span<const std::byte> payload = bytes.subspan(Format::header_bytes, payload_bytes);
  require(load_le<std::uint32_t>(payload.data() + payload.size()) == crc32c(payload), errc::payload_checksum,
          "saved-state payload CRC-32C does not match");
  return payload;
}

}  // namespace gradcomp::detail
