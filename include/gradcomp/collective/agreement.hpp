#pragma once
/// @file
/// How the ranks of a compressed collective agree before anything is encoded, and how they agree
/// on failures later: one protocol for `compressed_all_reduce`, `compressed_reduce_scatter` (TAGC
/// included) and the LHC two-stage all-reduce.
///
/// **The agreement record.** Every rank all-gathers one 40-byte record (docs/wire-format.md §21,
/// through the transport's control plane: host memory whatever the executor): the format version,
/// the codec (or scheme) id, dtype, plan, parameter hash, element count, step and tensor id must
/// be equal on every rank; a rank's own argument problem (an output of another size, a plan that
/// cannot run, a residual of another size) and a non-finite gradient are flags of the record.
/// Every rank sees the same records, so every rank throws the same named error in the same call,
/// or none does, before anything is encoded: every rank skips the same step, with its data and
/// state untouched.
///
/// **Later status.** A failure found after the agreement (an encoding that fails on one rank, the
/// outcomes of TAGC's decoders) is agreed by a MAX all-reduce of a few host doubles over the
/// control plane (`control_all_reduce_max`), or travels in the frames themselves.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <gradcomp/core/error.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/transport/transport.hpp>

namespace gradcomp::detail {

/// The record every rank contributes to the agreement round (docs/wire-format.md §21).
struct agreement_record {
  static constexpr std::size_t size = 40;      ///< Bytes on the wire.
  static constexpr std::uint8_t version = 2;   ///< Layout version of the record.

  std::uint8_t record_version = version;
  bool non_finite = false;  ///< This rank's input holds NaN or ±Inf.
  errc problem{};           ///< What this rank's own argument checks found (0: nothing).
  codec_id codec{};
  value_dtype dtype{};
  std::uint8_t plan = 0;    ///< The collective and its plan (docs/wire-format.md §21).
  std::uint16_t format_version = envelope::version;
  std::uint64_t params_hash = 0;
  std::uint64_t count = 0;
  message_key key{};

  [[nodiscard]] std::array<std::byte, size> bytes() const noexcept {
    std::array<std::byte, size> b{};
    b[0] = std::byte{record_version};
    b[1] = std::byte{static_cast<std::uint8_t>(non_finite ? 1 : 0)};
    store_le<std::uint16_t>(b.data() + 2, static_cast<std::uint16_t>(codec));
    b[4] = std::byte{static_cast<std::uint8_t>(dtype)};
    b[5] = std::byte{plan};
    store_le<std::uint16_t>(b.data() + 6, format_version);
    store_le<std::uint64_t>(b.data() + 8, params_hash);
    store_le<std::uint64_t>(b.data() + 16, count);
    store_le<std::uint64_t>(b.data() + 24, key.step);
    store_le<std::uint32_t>(b.data() + 32, key.tensor_id);
    b[36] = std::byte{static_cast<std::uint8_t>(problem)};
    return b;  // bytes 37..39 are zero
  }

  /// Reads a record; a buffer of another size gives `record_version` 0, which disagrees with every
  /// valid record.
  [[nodiscard]] static agreement_record read(std::span<const std::byte> b) noexcept {
    agreement_record r;
    if (b.size() != size) {
      r.record_version = 0;
      return r;
    }
    r.record_version = std::to_integer<std::uint8_t>(b[0]);
    r.non_finite = std::to_integer<std::uint8_t>(b[1]) != 0;
    r.codec = static_cast<codec_id>(load_le<std::uint16_t>(b.data() + 2));
    r.dtype = static_cast<value_dtype>(std::to_integer<std::uint8_t>(b[4]));
    r.plan = std::to_integer<std::uint8_t>(b[5]);
    r.format_version = load_le<std::uint16_t>(b.data() + 6);
    r.params_hash = load_le<std::uint64_t>(b.data() + 8);
    r.count = load_le<std::uint64_t>(b.data() + 16);
    r.key.step = load_le<std::uint64_t>(b.data() + 24);
    r.key.tensor_id = load_le<std::uint32_t>(b.data() + 32);
    r.problem = static_cast<errc>(std::to_integer<std::uint8_t>(b[36]));
    return r;
  }
};

/// This rank's own argument problem: its `errc` and message (`code` 0: none).
struct local_problem {
  errc code{};        ///< What every rank throws when this is the first rank with a problem.
  std::string text;   ///< This rank's message.

  [[nodiscard]] bool empty() const noexcept { return code == errc{}; }
};

/// All-gathers `mine` (with `problem` in it) and throws, on every rank alike: the first
/// disagreement (in the order of the record's fields, against rank 0), then the problem of the
/// lowest rank that found one in its own arguments (its code; its own message on that rank, the
/// others name it), then `non_finite_input` for a rank whose input holds NaN or ±Inf.
template <transport X>
void agree(X& t, agreement_record mine, const local_problem& problem, const char* where) {
  mine.problem = problem.code;
  const auto record = mine.bytes();
  const auto gathered = control_all_gather(t, std::span<const std::byte>(record));
  std::vector<agreement_record> r;
  r.reserve(gathered.size());
  for (std::size_t p = 0; p < gathered.size(); ++p)
    r.push_back(agreement_record::read(std::span<const std::byte>(gathered[p])));
  const auto disagree = [&](errc code, const char* what, auto field) {
    for (std::size_t p = 1; p < r.size(); ++p) {
      const auto a = field(r[0]), b = field(r[p]);
      if (a != b)
        fail(code, std::string(where) + ": the ranks disagree on the " + what + ": rank 0 has " + std::to_string(a) +
                       ", rank " + std::to_string(p) + " has " + std::to_string(b));
    }
  };
  const auto as_int = [](auto v) { return static_cast<std::uint64_t>(v); };
  disagree(errc::unsupported_version, "agreement record version",
           [&](const agreement_record& x) { return as_int(x.record_version); });
  disagree(errc::unsupported_version, "wire format version",
           [&](const agreement_record& x) { return as_int(x.format_version); });
  disagree(errc::codec_mismatch, "codec id", [&](const agreement_record& x) { return as_int(x.codec); });
  disagree(errc::dtype_mismatch, "value dtype", [&](const agreement_record& x) { return as_int(x.dtype); });
  disagree(errc::parameter_mismatch, "plan", [&](const agreement_record& x) { return as_int(x.plan); });
  disagree(errc::parameter_mismatch, "codec parameter hash", [&](const agreement_record& x) { return x.params_hash; });
  disagree(errc::size_mismatch, "element count", [&](const agreement_record& x) { return x.count; });
  disagree(errc::step_mismatch, "step", [&](const agreement_record& x) { return x.key.step; });
  disagree(errc::step_mismatch, "tensor id", [&](const agreement_record& x) { return as_int(x.key.tensor_id); });
  for (std::size_t p = 0; p < r.size(); ++p) {
    if (r[p].problem == errc{}) continue;
    if (p == static_cast<std::size_t>(t.rank())) fail(problem.code, problem.text);
    fail(r[p].problem, std::string(where) + ": rank " + std::to_string(p) +
                           " passed invalid arguments (its own error says which); every rank stops");
  }
  for (std::size_t p = 0; p < r.size(); ++p)
    if (r[p].non_finite)
      fail(errc::non_finite_input, std::string(where) + ": the input of rank " + std::to_string(p) +
                                       " holds NaN or Inf; every rank skips this step");
}

/// The record of a call with `scheme` (a codec, a wrapper, LHC or TAGC: its `id`, `value_type` and
/// `params_hash()`) over `count` elements.
template <class Scheme>
[[nodiscard]] agreement_record record_of(const Scheme& scheme, std::uint64_t count, std::uint8_t plan, message_key key,
                                         bool non_finite) {
  agreement_record r;
  r.non_finite = non_finite;
  r.codec = Scheme::id;
  r.dtype = dtype_of<typename Scheme::value_type>;
  r.plan = plan;
  r.params_hash = scheme.params_hash();
  r.count = count;
  r.key = key;
  return r;
}

/// Throws, on every rank alike, the largest error code any rank reports (0: none failed): a MAX
/// all-reduce of one host double over the control plane.
template <transport X>
void agree_on_status(X& t, errc mine, const char* where) {
  std::array<double, 1> code{static_cast<double>(static_cast<std::uint8_t>(mine))};
  control_all_reduce_max(t, std::span<double>(code));
  if (code[0] != 0.0)
    fail(static_cast<errc>(static_cast<std::uint8_t>(code[0])),
         std::string(where) + ": a rank could not encode its gradient");
}

}  // namespace gradcomp::detail
