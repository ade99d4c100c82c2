#pragma once
/// @file
/// The frame in which the hybrid scheme's collectives (point-to-point, all-gather, the per-hop
/// ring; ALGORITHMS.md §5) move one codec message between ranks, and the report they return.
///
/// A frame is a 9-byte header followed by the codec message:
///
///     byte 0      status: 0 when a message follows, else the `errc` that stopped the sender
///                 (encoding failed, or an earlier hop failed), and then nothing follows
///     bytes 1..8  float64, little-endian: a bound on |values carried − exact values| accumulated
///                 over the lossy encodings these values went through, this one included
///     bytes 9..   the codec message (envelope and payload, docs/wire-format.md)
///
/// A failure travels as a frame, so that a rank that cannot encode (a NaN under a codec that
/// does not carry it, a sum that overflowed to Inf) never leaves its receivers waiting: every
/// rank that sees a failed frame knows, and the collective reports the same error everywhere.
///
/// The error of one encoding is measured by decoding the message again and taking
/// max |x − decode(encode(x))| (in double; one extra decode per message). Codecs that declare
/// `is_lossless` skip it: their error is 0.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <gradcomp/core/concepts.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/wire_envelope.hpp>

namespace gradcomp {

/// What a compressed collective did on this rank.
struct compressed_report {
  std::uint64_t sent_bytes = 0;   ///< Bytes this rank sent: frames, headers included (an all-gathered frame counts
                                  ///< P − 1 times, as a ring all-gather forwards it over P − 1 links).
  std::uint64_t dense_bytes = 0;  ///< Bytes the same collective sends from this rank uncompressed.
  double max_error = 0.0;         ///< Largest error of one encoding this rank made (0 when lossless or not measured).
  double error_bound = 0.0;       ///< Bound on |result − uncompressed result|, element-wise, the same on every rank
                                  ///< (up to the float rounding of the additions; 0 when lossless or not measured).
};

/// True for a codec that declares `is_lossless = true` (decoding gives back every bit).
template <class C>
inline constexpr bool codec_is_lossless = requires { requires C::is_lossless; };

namespace detail {

/// Bytes before the codec message in a frame.
inline constexpr std::size_t frame_header_bytes = 9;

/// A received frame, read without copying.
struct frame_view {
  std::uint8_t status = 0;               ///< 0, or the `errc` value of the failure.
  double bound = 0.0;                    ///< Accumulated error bound.
  std::span<const std::byte> message;    ///< The codec message (empty in a failed frame).
};

/// Reads a frame's header. @throws error `truncated` for fewer than 9 bytes, `malformed_payload`
/// for a failed frame that carries a message or a status that is no `errc`.
[[nodiscard]] inline frame_view read_frame(std::span<const std::byte> bytes) {
  require(bytes.size() >= frame_header_bytes, errc::truncated, "compressed frame: shorter than its 9-byte header");
  frame_view f;
  f.status = std::to_integer<std::uint8_t>(bytes[0]);
  f.bound = load_le<double>(bytes.data() + 1);
  f.message = bytes.subspan(frame_header_bytes);
  require(f.status == 0 || (f.message.empty() && to_string(static_cast<errc>(f.status)) != "unknown"),
          errc::malformed_payload, "compressed frame: a failed frame with a message or an unknown status");
  return f;
}

/// Throws the error that a failed frame reports.
[[noreturn]] inline void fail_from_frame(std::uint8_t status, const char* where) {
  fail(static_cast<errc>(status), std::string(where) + ": a rank could not encode or decode its part");
}

/// Encodes values into frames and decodes frames, with the buffers reused across calls. `C` is a
/// codec or a stateful wrapper of one (error feedback, LoCo), whose messages decode alike.
template <class C>
  requires codec<C>
class frame_coder {
 public:
  using T = typename C::value_type;

  /// Buffers for messages of up to `max_count` values; measures errors when `measure` is set
  /// and the codec is lossy.
  frame_coder(const C& codec, std::uint64_t max_count, bool measure)
      : codec_(codec),
        workspace_(codec.workspace_bytes(cpu_, max_count)),
        frame_(frame_header_bytes + codec.max_encoded_bytes(max_count)),
        measure_(measure && !codec_is_lossless<C>) {
    if (measure_) decoded_.resize(static_cast<std::size_t>(max_count));
  }

  /// Encodes `values` into the frame buffer, with bound `carried` + this encoding's error; an
  /// encoding that throws an `error` gives a failed frame with its code instead. The span stays
  /// valid until the next call. `error` receives this encoding's measured error.
  [[nodiscard]] std::span<const std::byte> encode(std::span<const T> values, message_key key, double carried,
                                                  double& error)
    requires codec_for<C, cpu_executor>
  {
    error = 0.0;
    double bound = carried;
    return encode_with(bound, [&](std::span<std::byte> out) {
      const std::size_t bytes = codec_.encode(cpu_, values, out, workspace_, key);
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
    requires stateful<C, cpu_executor>
  [[nodiscard]] std::span<const std::byte> encode_stateful(std::span<const T> values, State& state, message_key key) {
    const double bound = 0.0;
    return encode_with(bound, [&](std::span<std::byte> out) { return codec_.encode(cpu_, values, state, out, workspace_, key); });
  }

  /// A failed frame with status `code`.
  [[nodiscard]] std::span<const std::byte> failure(errc code) {
    write_header(static_cast<std::uint8_t>(code), 0.0);
    return std::span<const std::byte>(frame_).first(frame_header_bytes);
  }

  /// Decodes the message of frame `f` into `out` (replacing or, with `accumulate`, adding).
  /// Returns 0, or the code of the `error` decoding threw (then `out` is unchanged).
  [[nodiscard]] std::uint8_t decode(const frame_view& f, std::span<T> out, bool accumulate) {
    try {
      if (accumulate) codec_.decode_accumulate(cpu_, f.message, out, workspace_);
      else codec_.decode(cpu_, f.message, out, workspace_);
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
      bytes = encode_message(std::span(frame_).subspan(frame_header_bytes));
    } catch (const gradcomp::error& e) {
      return failure(e.code());
    }
    write_header(0, bound);
    return std::span<const std::byte>(frame_).first(frame_header_bytes + bytes);
  }

  [[nodiscard]] double measured_error(std::span<const T> values, std::span<const std::byte> message) {
    const std::span<T> decoded = std::span(decoded_).first(values.size());
    codec_.decode(cpu_, message, decoded, workspace_);
    double worst = 0.0;
    for (std::size_t i = 0; i < values.size(); ++i) {
      const double d = std::fabs(static_cast<double>(values[i]) - static_cast<double>(decoded[i]));
      if (!(d <= worst)) worst = d;  // a NaN difference wins, so it is never hidden
    }
    return worst;
  }

  void write_header(std::uint8_t status, double bound) noexcept {
    frame_[0] = std::byte{status};
    store_le<double>(frame_.data() + 1, bound);
  }

  const C& codec_;
  cpu_executor cpu_{};
  std::vector<std::byte> workspace_;
  std::vector<std::byte> frame_;
  std::vector<T> decoded_;
  bool measure_;
};

}  // namespace detail
}  // namespace gradcomp
