#pragma once
/// @file
/// The versioned envelope in front of every encoding (docs/wire-format.md documents every byte):
/// writing it, parsing it from untrusted bytes, and validating it against what a decoder expects.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>

#include <gradcomp/core/config.hpp>
#include <gradcomp/core/half_float.hpp>
#include <gradcomp/core/crc32c.hpp>
#include <gradcomp/core/error.hpp>

namespace gradcomp {

/// Identifies the codec that wrote a message. Values are part of the wire format: never renumber.
enum class codec_id : std::uint16_t {
  topk = 1,             ///< Exact top-k sparsification.
  random_k = 2,         ///< Random-k sparsification (indices implied by the key).
  threshold = 3,        ///< Sampled-threshold (DGC-style) sparsification.
  uniform = 16,         ///< Uniform b-bit quantization with one scale per block.
  qsgd = 17,            ///< QSGD: s levels of |x|/‖x‖ per bucket, stochastic and unbiased.
  sign = 18,            ///< Sign (EF-signSGD / 1-bit): one bit per value, mean magnitude per block.
  uniform_shared = 19,  ///< Uniform b-bit codes with agreed (shared) block scales, summable across ranks.
  count_sketch = 32,    ///< Count sketch (FetchSGD): r rows of c summable cells of hashed, signed values.
  lossless_homomorphic = 33,  ///< LHC: an index and a sketch summed in two collective stages (no message of its own;
                              ///< the compressed all-reduce's agreement record names it).
  mpc = 48,             ///< MPC lossless float32 codec (48 on: the lossless float codecs of the hybrid scheme).
  zfp_fixed_rate = 49,  ///< ZFP fixed-rate lossy float32 codec (libzfp's 1-D fixed-rate bit stream).
  pipeline = 64,        ///< A sparsifier's indices with its kept values encoded by a quantizer.
  powersgd = 80,        ///< PowerSGD: low-rank factors summed by two all-reduces (no message of its own; the
                        ///< agreement record and saved states name it).
};

/// Element type of the values a message carries. Values are part of the wire format.
enum class value_dtype : std::uint8_t {
  float32 = 1,   ///< IEEE-754 binary32.
  float64 = 2,   ///< IEEE-754 binary64.
  bfloat16 = 3,  ///< bfloat16 (`bf16`): the upper half of a binary32.
  float16 = 4,   ///< IEEE-754 binary16 (`fp16`).
};

namespace detail {
/// The `value_dtype` of T, or a compile error naming the types there are.
template <class T>
consteval value_dtype dtype_for() noexcept {
  if constexpr (std::is_same_v<T, float>) return value_dtype::float32;
  else if constexpr (std::is_same_v<T, double>)
    return value_dtype::float64;
  else if constexpr (std::is_same_v<T, bf16>)
    return value_dtype::bfloat16;
  else {
    static_assert(std::is_same_v<T, fp16>, "message values are float, double, bf16 or fp16");
    return value_dtype::float16;
  }
}
}  // namespace detail

/// The `value_dtype` of a C++ value type (`float`, `double`, `bf16`, `fp16`).
template <class T>
inline constexpr value_dtype dtype_of = detail::dtype_for<T>();

/// Size in bytes of one value of a dtype (0 for an unknown dtype).
[[nodiscard]] constexpr std::size_t dtype_size(value_dtype d) noexcept {
  switch (d) {
    case value_dtype::float32: return 4;
    case value_dtype::float64: return 8;
    case value_dtype::bfloat16:
    case value_dtype::float16: return 2;
  }
  return 0;
}

/// Step and tensor a message belongs to; together with a codec's seed they key its randomness.
struct message_key {
  std::uint64_t step = 0;       ///< Training step.
  std::uint32_t tensor_id = 0;  ///< Tensor or bucket within the step.

  friend constexpr bool operator==(const message_key&, const message_key&) = default;
};

/// Flag bits of the envelope.
enum envelope_flags : std::uint16_t {
  flag_payload_checksum = 1u << 0,  ///< `payload_crc` holds the CRC-32C of the payload.
  known_flags = flag_payload_checksum,
};

/// Decoded contents of a message's envelope.
struct envelope {
  codec_id codec{};              ///< Which codec wrote the message.
  value_dtype dtype{};           ///< Value type of the payload.
  std::uint8_t layout = 0;       ///< Codec-specific payload variant (e.g. index coding).
  std::uint16_t flags = 0;       ///< `envelope_flags`.
  message_key key{};             ///< Step and tensor id.
  std::uint64_t elements = 0;    ///< Element count n of the dense tensor.
  std::uint64_t payload_bytes = 0;  ///< Bytes after the envelope.
  std::uint64_t params_hash = 0;    ///< Hash of the codec's parameters and seed.
  std::uint32_t payload_crc = 0;    ///< CRC-32C of the payload when flagged, else 0.

  /// Size of the envelope on the wire.
  static constexpr std::size_t size = 56;
  /// "GCMP" as a little-endian word.
  static constexpr std::uint32_t magic = 0x504D4347u;
  /// The format version this build writes and reads.
  static constexpr std::uint16_t version = 1;
};

namespace detail {
template <class U>
GRADCOMP_HOST_DEVICE void store_le(std::byte* at, U value) noexcept {
  std::memcpy(at, &value, sizeof value);
}
template <class U>
[[nodiscard]] GRADCOMP_HOST_DEVICE U load_le(const std::byte* at) noexcept {
  U value;
  std::memcpy(&value, at, sizeof value);
  return value;
}

/// Writes `e` with a fresh header CRC into the `envelope::size` bytes at `p`; host and device
/// code write the same bytes.
GRADCOMP_HOST_DEVICE inline void serialize_envelope(const envelope& e, std::byte* p) noexcept {
  store_le<std::uint32_t>(p + 0, envelope::magic);
  store_le<std::uint16_t>(p + 4, envelope::version);
  store_le<std::uint16_t>(p + 6, static_cast<std::uint16_t>(e.codec));
  store_le<std::uint8_t>(p + 8, static_cast<std::uint8_t>(e.dtype));
  store_le<std::uint8_t>(p + 9, e.layout);
  store_le<std::uint16_t>(p + 10, e.flags);
  store_le<std::uint32_t>(p + 12, e.key.tensor_id);
  store_le<std::uint64_t>(p + 16, e.elements);
  store_le<std::uint64_t>(p + 24, e.payload_bytes);
  store_le<std::uint64_t>(p + 32, e.params_hash);
  store_le<std::uint64_t>(p + 40, e.key.step);
  store_le<std::uint32_t>(p + 48, e.payload_crc);
  store_le<std::uint32_t>(p + 52, crc32c(p, 52));
}
}  // namespace detail

/// Writes `e` (with a fresh header CRC) into the first `envelope::size` bytes of `out`.
/// @throws error `buffer_too_small` when `out` is shorter than the envelope.
inline void write_envelope(const envelope& e, std::span<std::byte> out) {
  detail::require(out.size() >= envelope::size, errc::buffer_too_small, "output cannot hold the envelope");
  detail::serialize_envelope(e, out.data());
}

namespace detail {
/// Checks that host memory `out` holds a `size`-byte message and zeroes its envelope, so that
/// until `seal_host_message` runs last no earlier message in `out` can pass for this one.
/// @throws error `buffer_too_small`.
inline void begin_host_message(std::span<std::byte> out, std::size_t size) {
  require(out.size() >= size, errc::buffer_too_small, [&] {
    return "output of " + std::to_string(out.size()) + " bytes cannot hold the " + std::to_string(size) +
           "-byte message";
  });
  std::memset(out.data(), 0, envelope::size);
}

/// Writes the envelope `e` of a host message whose payload (`e.payload_bytes` bytes after the
/// envelope) is in place, with a payload CRC when `checksum` is set.
inline void seal_host_message(std::span<std::byte> out, envelope e, bool checksum) {
  const std::span<const std::byte> payload(out.data() + envelope::size, static_cast<std::size_t>(e.payload_bytes));
  e.flags = checksum ? flag_payload_checksum : 0;
  e.payload_crc = checksum ? crc32c(payload) : 0;
  write_envelope(e, out);
}
}  // namespace detail

/// Reads and checks the envelope at the start of an untrusted message of `message_size` bytes
/// from `header`, its first `envelope::size` bytes (or fewer when the message is shorter):
/// length, magic, version, header CRC, known flags and dtype, declared payload length, and that a
/// payload CRC appears only with its flag. It does not read the payload, so it does not check
/// the payload CRC: `parse_envelope` does, and a backend whose payload lies elsewhere (in device
/// memory) checks it itself. Reads nothing outside `header`.
/// @throws error `truncated`, `trailing_bytes`, `bad_magic`, `unsupported_version`,
///         `header_checksum`, `malformed_envelope` (unknown flag or dtype, stray payload CRC).
[[nodiscard]] inline envelope parse_envelope_header(std::span<const std::byte> header, std::size_t message_size) {
  detail::require(message_size >= envelope::size && header.size() >= envelope::size, errc::truncated, [&] {
    return "message of " + std::to_string(message_size) + " bytes is shorter than the 56-byte envelope";
  });
  const std::byte* p = header.data();
  detail::require(detail::load_le<std::uint32_t>(p) == envelope::magic, errc::bad_magic,
                  "message does not start with \"GCMP\"");
  const auto version = detail::load_le<std::uint16_t>(p + 4);
  detail::require(version == envelope::version, errc::unsupported_version,
                  [&] { return "format version " + std::to_string(version) + ", this build reads version 1"; });
  detail::require(detail::load_le<std::uint32_t>(p + 52) == crc32c({p, 52}), errc::header_checksum,
                  "envelope CRC-32C does not match its contents");
  envelope e;
  e.codec = static_cast<codec_id>(detail::load_le<std::uint16_t>(p + 6));
  e.dtype = static_cast<value_dtype>(detail::load_le<std::uint8_t>(p + 8));
  e.layout = detail::load_le<std::uint8_t>(p + 9);
  e.flags = detail::load_le<std::uint16_t>(p + 10);
  e.key.tensor_id = detail::load_le<std::uint32_t>(p + 12);
  e.elements = detail::load_le<std::uint64_t>(p + 16);
  e.payload_bytes = detail::load_le<std::uint64_t>(p + 24);
  e.params_hash = detail::load_le<std::uint64_t>(p + 32);
  e.key.step = detail::load_le<std::uint64_t>(p + 40);
  e.payload_crc = detail::load_le<std::uint32_t>(p + 48);
  detail::require((e.flags & ~known_flags) == 0, errc::malformed_envelope,
                  [&] { return "unknown envelope flags " + std::to_string(e.flags); });
  detail::require(dtype_size(e.dtype) != 0, errc::malformed_envelope,
                  [&] { return "unknown value dtype " + std::to_string(static_cast<unsigned>(e.dtype)); });
  const std::size_t available = message_size - envelope::size;
  detail::require(e.payload_bytes <= available, errc::truncated, [&] {
    return "envelope declares " + std::to_string(e.payload_bytes) + " payload bytes, message holds " +
           std::to_string(available);
  });
  detail::require(e.payload_bytes == available, errc::trailing_bytes,
                  [&] { return std::to_string(available - e.payload_bytes) + " bytes follow the declared payload"; });
  detail::require((e.flags & flag_payload_checksum) != 0 || e.payload_crc == 0, errc::malformed_envelope,
                  "payload CRC present without its flag");
  return e;
}

/// Reads and checks the envelope of an untrusted message of exactly `message.size()` bytes:
/// everything `parse_envelope_header` checks, then the payload CRC when flagged. Reads nothing
/// outside `message`.
/// @throws error `truncated`, `trailing_bytes`, `bad_magic`, `unsupported_version`,
///         `header_checksum`, `malformed_envelope` (unknown flag or dtype, stray payload CRC),
///         `payload_checksum`.
[[nodiscard]] inline envelope parse_envelope(std::span<const std::byte> message) {
  const envelope e = parse_envelope_header(message.first(std::min(message.size(), envelope::size)), message.size());
  if ((e.flags & flag_payload_checksum) != 0)
    detail::require(crc32c(message.subspan(envelope::size)) == e.payload_crc, errc::payload_checksum,
                    "payload CRC-32C does not match");
  return e;
}

/// Encoder-side choices about the message that do not change its meaning.
struct wire_options {
  bool payload_checksum = false;  ///< Add a CRC-32C of the payload (costs one extra read of it).

  friend constexpr bool operator==(const wire_options&, const wire_options&) = default;
};

/// What a decoder accepts. Limits are checked before any output is touched.
struct decode_limits {
  std::uint64_t max_elements = UINT64_MAX;  ///< Largest element count the caller accepts.
  bool require_checksum = false;            ///< Reject messages without a payload CRC.
};

/// What a decoder expects of an envelope.
struct envelope_expectation {
  codec_id codec{};              ///< The decoder's codec.
  value_dtype dtype{};           ///< The decoder's value type.
  std::uint64_t elements = 0;    ///< The caller's dense buffer size.
  std::uint64_t params_hash = 0; ///< The decoder's parameter hash.
};

/// Checks a parsed envelope against a decoder's expectation and the caller's limits.
/// @throws error `codec_mismatch`, `dtype_mismatch`, `too_large`, `size_mismatch`,
///         `parameter_mismatch`, `payload_checksum` (missing when required).
inline void validate_envelope(const envelope& e, const envelope_expectation& want, const decode_limits& limits) {
  detail::require(e.codec == want.codec, errc::codec_mismatch, [&] {
    return "message written by codec " + std::to_string(static_cast<unsigned>(e.codec)) + ", decoder is codec " +
           std::to_string(static_cast<unsigned>(want.codec));
  });
  detail::require(e.dtype == want.dtype, errc::dtype_mismatch, "message value type differs from the decoder's");
  detail::require(e.elements <= limits.max_elements, errc::too_large, [&] {
    return "message has " + std::to_string(e.elements) + " elements, the cap is " + std::to_string(limits.max_elements);
  });
  detail::require(e.elements == want.elements, errc::size_mismatch, [&] {
    return "message has " + std::to_string(e.elements) + " elements, the output has " + std::to_string(want.elements);
  });
  detail::require(e.params_hash == want.params_hash, errc::parameter_mismatch,
                  "codec parameters (hash) differ between encoder and decoder");
  detail::require(!limits.require_checksum || (e.flags & flag_payload_checksum) != 0, errc::payload_checksum,
                  "a payload checksum is required and the message has none");
}

/// Checks the layout byte (0) and the payload size of a message of a codec with one fixed layout
/// (every backend's decoder of uniform, sign, QSGD and shared-scale messages): at most
/// `most_elements` elements (what a payload of this size could hold, checked first so that
/// `payload_bytes(n)` cannot overflow), and exactly `payload_bytes(n)` payload bytes. `codec`
/// names the codec in the error. @throws error `malformed_payload`.
template <class PayloadBytes>
void validate_fixed_payload(const envelope& e, const char* codec, std::uint64_t most_elements,
                            PayloadBytes&& payload_bytes) {
  detail::require(e.layout == 0, errc::malformed_payload,
                  [&] { return std::string(codec) + " messages have layout 0"; });
  const std::uint64_t n = e.elements;
  detail::require(n <= most_elements && e.payload_bytes == payload_bytes(n), errc::malformed_payload, [&] {
    return "payload of " + std::to_string(e.payload_bytes) + " bytes does not hold " + std::to_string(n) + " elements";
  });
}

/// Payload bytes of a message whose envelope has been parsed.
[[nodiscard]] inline std::span<const std::byte> payload_of(std::span<const std::byte> message) noexcept {
  return message.subspan(envelope::size);
}

/// Hash of a codec's parameters (FNV-1a, 64 bit, over the little-endian bytes of each field in
/// the order added). Decoders compare it so that differently configured ranks fail loudly.
class params_hasher {
 public:
  /// Adds a field.
  template <class U>
  constexpr params_hasher& add(U value) noexcept {
    std::uint64_t bits = 0;
    if constexpr (sizeof(U) == 8) bits = std::bit_cast<std::uint64_t>(value);
    else if constexpr (sizeof(U) == 4)
      bits = std::bit_cast<std::uint32_t>(value);
    else
      bits = static_cast<std::uint64_t>(value);
    for (std::size_t b = 0; b < sizeof(U); ++b) {
      state_ ^= (bits >> (8 * b)) & 0xFFu;
      state_ *= 0x100000001B3ull;
    }
    return *this;
  }
  /// The hash so far.
  [[nodiscard]] constexpr std::uint64_t value() const noexcept { return state_; }

 private:
  std::uint64_t state_ = 0xCBF29CE484222325ull;
};

}  // namespace gradcomp
