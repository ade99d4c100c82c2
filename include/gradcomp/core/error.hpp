#pragma once
/// @file
/// The error type of gradcomp's host API: every failure carries a named `errc`.

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>

namespace gradcomp {

/// Named error conditions. The numeric values are stable and may be logged or sent between ranks.
enum class errc : std::uint8_t {
  invalid_argument = 1,      ///< A parameter is out of its documented range.
  buffer_too_small = 2,      ///< The output buffer is smaller than `max_encoded_bytes(n)` requires.
  workspace_too_small = 3,   ///< The workspace is smaller than `workspace_bytes(n)`.
  truncated = 4,             ///< The message is shorter than its envelope says.
  trailing_bytes = 5,        ///< The message is longer than its envelope says.
  bad_magic = 6,             ///< The bytes do not start with the gradcomp magic.
  unsupported_version = 7,   ///< The envelope's format version is not one this build reads.
  header_checksum = 8,       ///< The envelope's own CRC-32C does not match (a corrupted header).
  payload_checksum = 9,      ///< The optional payload CRC-32C does not match.
  codec_mismatch = 10,       ///< The message was written by another codec.
  dtype_mismatch = 11,       ///< The message holds another value type than the decoder's.
  size_mismatch = 12,        ///< The message's element count differs from the caller's buffer.
  too_large = 13,            ///< The element count exceeds the caller's cap.
  parameter_mismatch = 14,   ///< The codec-parameter hash differs: the ranks are configured differently.
  malformed_payload = 15,    ///< The payload contradicts its own layout (bad index, count, padding).
  non_finite_input = 16,     ///< The gradient holds NaN or Inf where the codec cannot carry them.
  step_mismatch = 17,        ///< Messages to be combined belong to different steps or tensors.
  malformed_envelope = 18,   ///< The envelope holds an unknown flag or dtype, or a stray payload CRC.
  peeling_stalled = 19,      ///< A sketch could not be peeled completely: some values were not recovered.
  peer_failed = 20,          ///< Another rank of the collective failed or disagreed; this rank stopped too.
  transport_failed = 21,     ///< The communication library (MPI, Gloo) reported an error; the message quotes it.
  device_failed =
      22,  ///< A CUDA runtime call or kernel launch failed; the message names the call, file, line and CUDA error.
  timeout =
      23,  ///< A collective's deadline passed before its peers arrived; the message names the call, its key and, where known, the silent ranks.
  narrowing_overflow =
      24,  ///< A finite float32 result does not fit the 16-bit output (fp16 beyond 65504, or bf16's rounding to Inf); nothing was written.
};

/// Human-readable name of an error condition.
[[nodiscard]] constexpr std::string_view to_string(errc e) noexcept {
  switch (e) {
    case errc::invalid_argument: return "invalid_argument";
    case errc::buffer_too_small: return "buffer_too_small";
    case errc::workspace_too_small: return "workspace_too_small";
    case errc::truncated: return "truncated";
    case errc::trailing_bytes: return "trailing_bytes";
    case errc::bad_magic: return "bad_magic";
    case errc::unsupported_version: return "unsupported_version";
    case errc::header_checksum: return "header_checksum";
    case errc::payload_checksum: return "payload_checksum";
    case errc::codec_mismatch: return "codec_mismatch";
    case errc::dtype_mismatch: return "dtype_mismatch";
    case errc::size_mismatch: return "size_mismatch";
    case errc::too_large: return "too_large";
    case errc::parameter_mismatch: return "parameter_mismatch";
    case errc::malformed_payload: return "malformed_payload";
    case errc::non_finite_input: return "non_finite_input";
    case errc::step_mismatch: return "step_mismatch";
    case errc::malformed_envelope: return "malformed_envelope";
    case errc::peeling_stalled: return "peeling_stalled";
    case errc::peer_failed: return "peer_failed";
    case errc::transport_failed: return "transport_failed";
    case errc::device_failed: return "device_failed";
    case errc::timeout: return "timeout";
    case errc::narrowing_overflow: return "narrowing_overflow";
  }
  return "unknown";
}

/// `std::error_category` of gradcomp, so that an `errc` converts to `std::error_code`.
[[nodiscard]] inline const std::error_category& error_category() noexcept {
  struct category final : std::error_category {
    [[nodiscard]] const char* name() const noexcept override { return "gradcomp"; }
    [[nodiscard]] std::string message(int value) const override {
      return std::string(to_string(static_cast<errc>(value)));
    }
  };
  static const category instance;
  return instance;
}

/// Makes `std::error_code` work with `errc` (found by argument-dependent lookup).
[[nodiscard]] inline std::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), error_category()};
}

/// Exception thrown by gradcomp's host API. `code()` names the condition; `what()` explains it.
class error : public std::runtime_error {
 public:
  /// @param code the condition; @param detail what was wrong, with the offending values.
  error(errc code, const std::string& detail)
      : std::runtime_error(std::string(to_string(code)) + ": " + detail), code_(code) {}

  /// The named condition.
  [[nodiscard]] errc code() const noexcept { return code_; }

  /// What was wrong: `what()` without the leading "<errc name>: ".
  [[nodiscard]] std::string_view detail_text() const noexcept {
    return std::string_view(what()).substr(to_string(code_).size() + 2);
  }

 private:
  errc code_;
};

namespace detail {
/// Throws `error(code, detail)`; `detail` is a string or a callable returning one.
template <class Detail>
[[noreturn]] void fail(errc code, Detail&& detail) {
  if constexpr (std::is_invocable_v<Detail>) throw error(code, std::string(detail()));
  else
    throw error(code, std::string(detail));
}

/// Throws `error(code, detail)` unless `condition` holds. `detail` is a string, or a callable
/// returning one, which is only called on failure, so checks in loops never allocate.
template <class Detail>
inline void require(bool condition, errc code, Detail&& detail) {
  if (!condition) [[unlikely]]
    fail(code, std::forward<Detail>(detail));
}
}  // namespace detail

}  // namespace gradcomp

template <>
struct std::is_error_code_enum<gradcomp::errc> : std::true_type {};
