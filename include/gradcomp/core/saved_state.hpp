#pragma once
/// @file
/// The frame shared by every saved state (error feedback, LoCo, the dynamic sparsifier, PowerSGD,
/// GraVAC): u32 magic, u16 version, u16 wrapped codec id, u8 value dtype, u64 element count n
/// (bytes 0..16), then format-specific fields up to `Format::header_crc_offset`, a u32 CRC-32C of
/// all header bytes before it, the payload, and a u32 CRC-32C of the payload.
///
/// A format describes its header once, as a chain of typed fields (`state_field`) that starts
/// after the frame's own (`saved_state_frame`), and its writer and its checker both store and load
/// through those fields, so the two cannot disagree on an offset. `Format` derives from
/// `saved_state_frame` and names `magic`, `version`, `header_crc_offset` (the end of its last
/// field) and `header_bytes` (= offset + 4).

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include <gradcomp/core/crc32c.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/wire_envelope.hpp>

namespace gradcomp::detail {

/// One little-endian field of a saved state: its type V and its offset from the first byte of the
/// record it belongs to (the state's header, or one entry of a state that holds several).
template <class V>
struct state_field {
  std::size_t offset;  ///< Bytes from the start of the record.

  /// The offset just past the field.
  [[nodiscard]] constexpr std::size_t end() const noexcept { return offset + sizeof(V); }
  /// The field of type W that starts where this one ends.
  template <class W>
  [[nodiscard]] constexpr state_field<W> then() const noexcept {
    return {end()};
  }
  /// Writes the field of the record starting at `record`.
  void store(std::byte* record, V value) const noexcept { store_le<V>(record + offset, value); }
  /// Reads the field of the record starting at `record`.
  [[nodiscard]] V load(const std::byte* record) const noexcept { return load_le<V>(record + offset); }
};

/// The fields every saved state starts with (bytes 0..16) and the size of its two CRCs; each
/// format's fields follow `count`.
struct saved_state_frame {
  static constexpr state_field<std::uint32_t> magic_field{0};                         ///< Bytes 0..3.
  static constexpr state_field<std::uint16_t> version_field = magic_field.then<std::uint16_t>();  ///< 4..5.
  static constexpr state_field<std::uint16_t> codec_field = version_field.then<std::uint16_t>();  ///< 6..7.
  static constexpr state_field<std::uint8_t> dtype_field = codec_field.then<std::uint8_t>();      ///< 8.
  static constexpr state_field<std::uint64_t> count = dtype_field.then<std::uint64_t>();         ///< 9..16: n.
  static constexpr std::size_t checksum_bytes = 4;  ///< Each CRC-32C: the header's and the payload's.
};

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
  Format::magic_field.store(p, Format::magic);
  Format::version_field.store(p, Format::version);
  Format::codec_field.store(p, static_cast<std::uint16_t>(codec));
  Format::dtype_field.store(p, static_cast<std::uint8_t>(dtype));
  Format::count.store(p, n);
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
  require(Format::magic_field.load(p) == Format::magic, errc::bad_magic,
          [&] { return "saved state does not start with \"" + std::string(magic_text) + "\""; });
  const auto version = Format::version_field.load(p);
  require(version == Format::version, errc::unsupported_version, [&] {
    return "saved-state version " + std::to_string(version) + ", this build reads version " +
           std::to_string(Format::version);
  });
  require(load_le<std::uint32_t>(p + Format::header_crc_offset) == crc32c({p, Format::header_crc_offset}),
          errc::header_checksum, "saved-state header CRC-32C does not match its contents");
  const auto saved_codec = Format::codec_field.load(p);
  require(saved_codec == static_cast<std::uint16_t>(codec), errc::codec_mismatch, [&] {
    return "state saved around codec " + std::to_string(saved_codec) + ", this one wraps codec " +
           std::to_string(static_cast<unsigned>(codec));
  });
  require(Format::dtype_field.load(p) == static_cast<std::uint8_t>(dtype), errc::dtype_mismatch,
          "saved state's value type differs from the codec's");
  return Format::count.load(p);
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
