#pragma once
/// @file
/// The frame in which the compressed collectives move one codec message between ranks (the
/// hybrid scheme's point-to-point, all-gather and per-hop ring, docs/transports.md §5, and the
/// all-gathered or all-to-all plans of the all-reduce and reduce-scatter), and the report they
/// return.
///
/// A frame is a 16-byte header followed by the codec message:
///
///     byte 0      status: 0 when a message follows, else the `errc` that stopped the sender
///                 (encoding failed, or an earlier hop failed), and then nothing follows
///     bytes 1..7  zero
///     bytes 8..15 float64, little-endian: a bound on |values carried − exact values| accumulated
///                 over the lossy encodings these values went through, this one included
///     bytes 16..  the codec message (envelope and payload, docs/wire-format.md)
///
/// Sixteen bytes, so that the message starts on an 8-byte boundary of the frame: a frame that
/// starts on one (every transport's received buffers do) can be decoded on the device in place
/// (docs/cuda.md §1). The frame lives in the executor's memory; only its header is read to the
/// host.
///
/// A failure travels as a frame, so that a rank that cannot encode (a NaN under a codec that
/// does not carry it, a sum that overflowed to Inf) never leaves its receivers waiting: every
/// rank that sees a failed frame knows, and the collective reports the same error everywhere.
///
/// The error of one encoding is measured by decoding the message again and taking
/// max |x − decode(encode(x))| (in double; one extra decode per message). Codecs that declare
/// `is_lossless` skip it: their error is 0.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <gradcomp/collective/collective_memory.hpp>
#include <gradcomp/core/concepts.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/wire_envelope.hpp>

namespace gradcomp {

/// What a compressed collective did on this rank.
struct compressed_report {
  std::uint64_t sent_bytes = 0;   ///< Bytes this rank sent: frames, headers included (an all-gathered frame counts
                                  ///< P − 1 times, as a ring all-gather forwards it over P − 1 links).
  std::uint64_t dense_bytes = 0;  ///< Bytes the same collective sends from this rank uncompressed.
  double max_error = 0.0;  ///< Largest error of one encoding this rank made (0 when lossless or not measured).
  double error_bound = 0.0;  ///< Bound on |result − uncompressed result|, element-wise, the same on every rank
      ///< (up to the float rounding of the additions; 0 when lossless or not measured).
};

/// True for a codec that declares `is_lossless = true` (decoding gives back every bit).
template <class C>
inline constexpr bool codec_is_lossless = requires { requires C::is_lossless; };

namespace detail {

/// Bytes before the codec message in a frame.
inline constexpr std::size_t frame_header_bytes = 16;

/// A frame's header and message.
struct frame_view {
  std::uint8_t status = 0;  ///< 0, or the `errc` value of the failure.
  double bound = 0.0;  ///< Accumulated error bound.
  std::span<const std::byte> message;  ///< The codec message, in the frame's memory (empty in a failed frame).
};

/// Reads a frame whose header (its first 16 bytes, copied to the host) is `header` and which holds
/// `bytes` (in whatever memory). @throws error `truncated` for fewer than 16 bytes,
/// `malformed_payload` for non-zero bytes 1..7, a failed frame that carries a message or a status
/// that is no `errc`.
[[nodiscard]] inline frame_view parse_frame(std::span<const std::byte> header, std::span<const std::byte> bytes) {
  require(bytes.size() >= frame_header_bytes, errc::truncated, "compressed frame: shorter than its 16-byte header");
  frame_view f;
  f.status = std::to_integer<std::uint8_t>(header[0]);
  f.bound = load_le<double>(header.data() + 8);
  f.message = bytes.subspan(frame_header_bytes);
  bool reserved_zero = true;
  for (std::size_t i = 1; i < 8; ++i) reserved_zero = reserved_zero && header[i] == std::byte{0};
  require(reserved_zero, errc::malformed_payload, "compressed frame: bytes 1 to 7 of the header are not zero");
  require(f.status == 0 || (f.message.empty() && to_string(static_cast<errc>(f.status)) != "unknown"),
          errc::malformed_payload, "compressed frame: a failed frame with a message or an unknown status");
  return f;
}

/// Reads a frame in host memory (see `parse_frame`).
[[nodiscard]] inline frame_view read_frame(std::span<const std::byte> bytes) {
  return parse_frame(bytes.first(std::min(bytes.size(), frame_header_bytes)), bytes);
}

/// Reads a frame in executor E's memory: its header is copied to the host (see `parse_frame`).
template <executor E>
[[nodiscard]] frame_view read_frame(const E& e, std::span<const std::byte> bytes) {
  std::array<std::byte, frame_header_bytes> header{};
  if (bytes.size() >= frame_header_bytes) collective_memory<E>::to_host(e, bytes.first(frame_header_bytes), header);
  return parse_frame(header, bytes);
}

/// Throws the error that a failed frame reports.
[[noreturn]] inline void fail_from_frame(std::uint8_t status, const char* where) {
  fail(static_cast<errc>(status), std::string(where) + ": a rank could not encode or decode its part");
}

/// Encodes values into frames and decodes frames on executor E, with the buffers (in E's memory)
/// reused across calls. `C` is a codec or a stateful wrapper of one (error feedback, LoCo), whose
/// messages decode alike.
template <class C, executor E>
  requires codec<C>
class frame_coder {
 public:
  using T = typename C::value_type;
  using memory = collective_memory<E>;

  /// Buffers for messages of up to `max_count` values; measures errors when `measure` is set
  /// and the codec is lossy.
  frame_coder(const E& e, const C& codec, std::uint64_t max_count, bool measure)
      : codec_(codec),
        exec_(e),
        workspace_(e, codec.workspace_bytes(e, max_count)),
        frame_(e, frame_header_bytes + codec.max_encoded_bytes(max_count)),
        measure_(measure && !codec_is_lossless<C>) {
    if (measure_) decoded_.resize(e, static_cast<std::size_t>(max_count));
  }

  /// The executor.
  [[nodiscard]] const E& executor() const noexcept { return exec_; }

  /// Encodes `values` into the frame buffer, with bound `carried` + this encoding's error; an
  /// encoding that throws an `error` gives a failed frame with its code instead. The span stays
  /// valid until the next call. `error` receives this encoding's measured error.
  [[nodiscard]] std::span<const std::byte> encode(std::span<const T> values, message_key key, double carried,
                                                  double& error)
    requires codec_for<C, E>
  {
    error = 0.0;
    double bound = carried;
    return encode_with(bound, [&](std::span<std::byte> out) {
      const std::size_t bytes = codec_.encode(exec_, values, out, workspace_.span(), key);
      if (measure_) error = measured_error(values, std::span<const std::byte>(out.first(bytes)));
      bound += error;
      return bytes;
    });
  }

  /// Encodes `values` with a stateful wrapper's `state` (updated on success) into the frame
  /// buffer, with bound 0 (the wrapper carries what it drops into later steps); an encoding that
  /// throws an `error` gives a failed frame with its code instead. The span stays valid until the
  /// next call.
  template <class State>
    requires stateful<C, E>
  [[nodiscard]] std::span<const std::byte> encode_stateful(std::span<const T> values, State& state, message_key key) {
    const double bound = 0.0;
    return encode_with(bound, [&](std::span<std::byte> out) {
      return codec_.encode(exec_, values, state, out, workspace_.span(), key);
    });
  }

  /// A failed frame with status `code`.
  [[nodiscard]] std::span<const std::byte> failure(errc code) {
    write_header(static_cast<std::uint8_t>(code), 0.0);
    return std::span<const std::byte>(frame_.span()).first(frame_header_bytes);
  }

  /// The status of the frame the last call wrote (0 when it carries a message).
  [[nodiscard]] std::uint8_t last_status() const noexcept { return status_; }

  /// Reads a received frame (in E's memory). @throws error as `parse_frame`.
  [[nodiscard]] frame_view read(std::span<const std::byte> bytes) const { return read_frame(exec_, bytes); }

  /// Decodes the message of frame `f` into `out` (replacing or, with `accumulate`, adding), of the
  /// codec's value type or, for a 16-bit codec, float32. Returns 0, or the code of the `error`
  /// decoding threw (then `out` is unchanged).
  template <class O>
  [[nodiscard]] std::uint8_t decode(const frame_view& f, std::span<O> out, bool accumulate) {
    try {
      if (accumulate) codec_.decode_accumulate(exec_, f.message, out, workspace_.span());
      else
        codec_.decode(exec_, f.message, out, workspace_.span());
    } catch (const gradcomp::error& e) {
      return static_cast<std::uint8_t>(e.code());
    }
    return 0;
  }

 private:
  /// Runs `encode_message(out)` (returns the bytes it wrote into `out`) and frames its message
  /// with `bound`, read once the message is written.
  template <class Encode>
  [[nodiscard]] std::span<const std::byte> encode_with(const double& bound, Encode&& encode_message) {
    std::size_t bytes = 0;
    try {
      bytes = encode_message(frame_.span().subspan(frame_header_bytes));
    } catch (const gradcomp::error& e) {
      return failure(e.code());
    }
    write_header(0, bound);
    return std::span<const std::byte>(frame_.span()).first(frame_header_bytes + bytes);
  }

  [[nodiscard]] double measured_error(std::span<const T> values, std::span<const std::byte> message) {
    const std::span<T> decoded = decoded_.span().first(values.size());
    codec_.decode(exec_, message, decoded, workspace_.span());
    return memory::max_abs_difference(exec_, values, std::span<const T>(decoded));
  }

  void write_header(std::uint8_t status, double bound) {
    std::array<std::byte, frame_header_bytes> header{};
    header[0] = std::byte{status};
    store_le<double>(header.data() + 8, bound);
    memory::from_host(exec_, header, frame_.span().first(frame_header_bytes));
    status_ = status;
  }

  const C& codec_;
  E exec_;
  typename memory::template buffer<std::byte> workspace_;
  typename memory::template buffer<std::byte> frame_;
  typename memory::template buffer<T> decoded_;
  bool measure_;
  std::uint8_t status_ = 0;
};

}  // namespace detail
}  // namespace gradcomp
