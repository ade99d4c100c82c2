#pragma once
/// @file
/// Compressed all-reduce over any transport: every rank's gradient goes in, the sum over ranks of
/// what the codec carries comes out, the same bits on every rank. The plan follows the codec's
/// traits (DESIGN.md §2, ALGORITHMS.md):
///
/// - `summed_encodings`, for homomorphic codecs with a summable region (count sketch; the
///   shared-scale quantizer, whose scales are agreed first by a MAX all-reduce of block maxima):
///   the SUM collective adds the encodings themselves and every rank decodes the sum once.
/// - `gather_decode`, for every other codec and for stateful wrappers (error feedback, LoCo):
///   the messages are all-gathered and every rank decodes them in rank order into zeros, so the
///   result is ((D(m_0) + D(m_1)) + …) on every rank.
/// - `ring`, on request: the hybrid scheme's per-hop ring (collective/ring.hpp), for a transport
///   with point-to-point messages.
/// - `two_stage`, for lossless homomorphic compression (its own overload): the ranks' indexes are
///   aggregated (bitwise OR where the transport has it, else summed 4- or 8-bit fields), every rank
///   sizes the sketch from the union alike, the sketches are SUM-reduced and every rank peels the
///   same sum. Every rank holds the same index and sketch, so a stall happens on every rank alike;
///   under the `report` policy the ranks then sum `data` again uncompressed, so the result is never
///   silently wrong.
///
/// Before anything is encoded, the ranks agree (one all-gather of a 40-byte record per call, laid
/// out in docs/wire-format.md §21): the format version, codec id, dtype, plan, parameter hash,
/// element count, step and tensor id must be equal on every rank, and no rank's gradient may hold
/// NaN or ±Inf. Otherwise every rank throws the same named error in the same call, with its
/// gradient and its codec state untouched, so every rank skips the same step.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <gradcomp/collective/compressed_all_gather.hpp>
#include <gradcomp/collective/compressed_frame.hpp>
#include <gradcomp/collective/lhc_stages.hpp>
#include <gradcomp/collective/ring.hpp>
#include <gradcomp/core/concepts.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/feedback/step_rollback.hpp>
#include <gradcomp/sketch/lossless_homomorphic.hpp>
#include <gradcomp/transport/transport.hpp>

namespace gradcomp {

/// How `compressed_all_reduce` aggregates the ranks' encodings.
enum class all_reduce_plan : std::uint8_t {
  automatic = 0,         ///< `summed_encodings` for a codec with a summable encoding, else `gather_decode`.
  gather_decode = 1,     ///< All-gather the messages; every rank decodes them in rank order.
  summed_encodings = 2,  ///< SUM-reduce the summable region of the encodings; decode the sum once.
  ring = 3,              ///< The per-hop ring (decode, add, re-encode); needs point-to-point messages.
  two_stage = 4,         ///< Lossless homomorphic compression: aggregate the indexes, then SUM the sketches.
};

/// Options of `compressed_all_reduce`.
struct all_reduce_options {
  message_key key{};                              ///< Step and tensor: keys the codec and is checked across ranks.
  all_reduce_plan plan = all_reduce_plan::automatic;  ///< How to aggregate.
  /// Decode lossy messages once more to measure their error (`report.max_error`,
  /// `report.error_bound`; `gather_decode` and `ring` only).
  bool measure_error = false;
};

/// A homomorphic codec whose messages end in (or are) a region that a SUM collective adds:
/// bytes [summable_offset(n), summable_offset(n) + summable_bytes(n)).
template <class C>
concept summable_encoding = codec_for<C, cpu_executor> && C::is_homomorphic &&
    requires(const C& c, std::uint64_t n) {
      { c.summable_offset(n) } -> std::same_as<std::size_t>;
      { c.summable_bytes(n) } -> std::same_as<std::size_t>;
    };

/// A summable encoding whose ranks agree their block scales first (the shared-scale quantizer):
/// `block_maxima` → MAX all-reduce → `encode_shared`; its summable region holds uint64 words.
template <class C>
concept agreed_scale_encoding = summable_encoding<C> &&
    requires(const C& c, const cpu_executor& e, std::uint64_t n, std::span<const typename C::value_type> grad,
             std::span<typename C::value_type> maxima, std::span<const typename C::value_type> agreed,
             std::span<std::byte> out, std::span<std::byte> ws, message_key key, std::uint32_t rank) {
      { c.block_count(n) } -> std::same_as<std::uint64_t>;
      c.block_maxima(e, grad, maxima);
      { c.encode_shared(e, grad, agreed, out, ws, key, rank) } -> std::same_as<std::size_t>;
    };

/// Bytes one rank sends in a ring all-reduce of `bytes` bytes over `ranks` ranks: 2(P − 1)/P of
/// them (the dense baseline of a compressed all-reduce).
[[nodiscard]] constexpr std::uint64_t ring_all_reduce_dense_bytes(std::uint64_t bytes, std::uint64_t ranks) noexcept {
  return ranks == 0 ? 0 : 2 * (ranks - 1) * bytes / ranks;
}

namespace detail {

/// The record every rank contributes to the agreement round (docs/wire-format.md §21).
struct agreement_record {
  static constexpr std::size_t size = 40;      ///< Bytes on the wire.
  static constexpr std::uint8_t version = 1;   ///< Layout version of the record.

  std::uint8_t record_version = version;
  bool non_finite = false;
  bool bad_arguments = false;  ///< This rank's arguments failed its own checks (an output size, a plan).
  codec_id codec{};
  value_dtype dtype{};
  all_reduce_plan plan{};
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
    b[5] = std::byte{static_cast<std::uint8_t>(plan)};
    store_le<std::uint16_t>(b.data() + 6, format_version);
    store_le<std::uint64_t>(b.data() + 8, params_hash);
    store_le<std::uint64_t>(b.data() + 16, count);
    store_le<std::uint64_t>(b.data() + 24, key.step);
    store_le<std::uint32_t>(b.data() + 32, key.tensor_id);
    b[36] = std::byte{static_cast<std::uint8_t>(bad_arguments ? 1 : 0)};
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
    r.plan = static_cast<all_reduce_plan>(std::to_integer<std::uint8_t>(b[5]));
    r.format_version = load_le<std::uint16_t>(b.data() + 6);
    r.params_hash = load_le<std::uint64_t>(b.data() + 8);
    r.count = load_le<std::uint64_t>(b.data() + 16);
    r.key.step = load_le<std::uint64_t>(b.data() + 24);
    r.key.tensor_id = load_le<std::uint32_t>(b.data() + 32);
    r.bad_arguments = std::to_integer<std::uint8_t>(b[36]) != 0;
    return r;
  }
};

/// All-gathers `mine` and throws, on every rank alike, the first disagreement (in the order of
/// the record's fields, against rank 0), then `invalid_argument` when a rank's arguments failed
/// its own checks (`problem`, non-empty exactly when `mine.bad_arguments`, is that rank's
/// message), then `non_finite_input` for a rank's non-finite gradient.
template <transport X>
void agree(X& t, const agreement_record& mine, const std::string& problem, const char* where) {
  const auto record = mine.bytes();
  const auto gathered = t.all_gather_bytes(std::span<const std::byte>(record));
  std::vector<agreement_record> r;
  r.reserve(gathered.size());
  for (const auto& g : gathered) r.push_back(agreement_record::read(g));
  const auto disagree = [&](errc code, const char* what, auto field) {
    for (std::size_t p = 1; p < r.size(); ++p) {
      const auto a = field(r[0]), b = field(r[p]);
      if (a != b)
        fail(code, std::string(where) + ": the ranks disagree on the " + what + ": rank 0 has " + std::to_string(a) +
                       ", rank " + std::to_string(p) + " has " + std::to_string(b));
    }
  };
  const auto as_int = [](auto v) { return static_cast<std::uint64_t>(v); };
  disagree(errc::unsupported_version, "agreement record version", [&](const agreement_record& x) { return as_int(x.record_version); });
  disagree(errc::unsupported_version, "wire format version", [&](const agreement_record& x) { return as_int(x.format_version); });
  disagree(errc::codec_mismatch, "codec id", [&](const agreement_record& x) { return as_int(x.codec); });
  disagree(errc::dtype_mismatch, "value dtype", [&](const agreement_record& x) { return as_int(x.dtype); });
  disagree(errc::parameter_mismatch, "plan", [&](const agreement_record& x) { return as_int(x.plan); });
  disagree(errc::parameter_mismatch, "codec parameter hash", [&](const agreement_record& x) { return x.params_hash; });
  disagree(errc::size_mismatch, "element count", [&](const agreement_record& x) { return x.count; });
  disagree(errc::step_mismatch, "step", [&](const agreement_record& x) { return x.key.step; });
  disagree(errc::step_mismatch, "tensor id", [&](const agreement_record& x) { return as_int(x.key.tensor_id); });
  if (mine.bad_arguments) fail(errc::invalid_argument, problem);
  for (std::size_t p = 0; p < r.size(); ++p)
    if (r[p].bad_arguments)
      fail(errc::invalid_argument, std::string(where) + ": rank " + std::to_string(p) +
                                       " passed invalid arguments (its own error says which); every rank stops");
  for (std::size_t p = 0; p < r.size(); ++p)
    if (r[p].non_finite)
      fail(errc::non_finite_input, std::string(where) + ": the gradient of rank " + std::to_string(p) +
                                       " holds NaN or Inf; every rank skips this step");
}

/// The plan `automatic` resolves to for codec `C`.
template <class C>
[[nodiscard]] constexpr all_reduce_plan resolved_plan(all_reduce_plan requested) noexcept {
  if (requested != all_reduce_plan::automatic) return requested;
  return summable_encoding<C> ? all_reduce_plan::summed_encodings : all_reduce_plan::gather_decode;
}

/// Why codec `C` cannot run `plan` over transport `X` (empty: it can).
template <class X, class C>
[[nodiscard]] std::string plan_problem(all_reduce_plan plan, bool stateful_call) {
  const bool ok = plan == all_reduce_plan::gather_decode ||
                  (plan == all_reduce_plan::summed_encodings && summable_encoding<C> && !stateful_call) ||
                  (plan == all_reduce_plan::ring && transport_with_point_to_point<X> && codec_for<C, cpu_executor> &&
                   !stateful_call);
  if (ok) return {};
  return "compressed_all_reduce: plan " + std::to_string(static_cast<int>(plan)) +
         " does not apply to this codec or transport (summed_encodings needs a summable encoding, ring a "
         "transport with point-to-point messages; a stateful wrapper aggregates with gather_decode)";
}

/// Checks the agreement of the ranks on `codec`, n, dtype, plan and key, the verdict of every
/// rank's own argument checks (`problem`: empty, or why this rank's arguments are invalid), and the
/// finiteness of every rank's gradient. Every rank throws the same error, or none does.
template <transport X, class C>
void agree_on(X& t, const C& codec, std::span<const typename C::value_type> data, all_reduce_plan plan, message_key key,
              const std::string& problem) {
  using T = typename C::value_type;
  // The largest magnitude key, without an early exit, so that the loop vectorizes.
  typename float_traits<T>::bits_type largest = 0;
  for (const T v : data) largest = std::max(largest, magnitude_key(v));
  agreement_record mine;
  mine.non_finite = largest >= float_traits<T>::infinity_key;
  mine.codec = C::id;
  mine.dtype = dtype_of<typename C::value_type>;
  mine.plan = plan;
  mine.params_hash = codec.params_hash();
  mine.count = data.size();
  mine.key = key;
  mine.bad_arguments = !problem.empty();
  agree(t, mine, problem, "compressed_all_reduce");
}

/// The `gather_decode` plan: all-gathers `frame` and decodes every rank's frame in rank order into
/// zeros, then into `data`.
template <transport X, class C>
compressed_report gather_decode_all_reduce(X& t, frame_coder<C>& coder, std::span<const std::byte> frame,
                                           std::span<typename C::value_type> data, double max_error) {
  using T = typename C::value_type;
  const auto ranks = static_cast<std::uint64_t>(t.size());
  const auto n = static_cast<std::uint64_t>(data.size());
  compressed_report report;
  report.sent_bytes = frame.size() * (ranks - 1);
  report.dense_bytes = ring_all_reduce_dense_bytes(n * sizeof(T), ranks);
  report.max_error = max_error;
  const double bound = gather_and_decode(
      t, coder, frame, data, [n](int) { return std::pair{std::uint64_t{0}, n}; }, true, "compressed_all_reduce");
  // Each of the P messages adds at most its own error to the sum.
  report.error_bound = bound * static_cast<double>(ranks);
  return report;
}

/// Throws, on every rank alike, the largest error code any rank reports (0: none failed).
template <transport X>
void agree_on_status(X& t, errc mine, const char* where) {
  std::array<double, 1> code{static_cast<double>(static_cast<std::uint8_t>(mine))};
  t.all_reduce_max(std::span<double>(code));
  if (code[0] != 0.0)
    fail(static_cast<errc>(static_cast<std::uint8_t>(code[0])), std::string(where) + ": a rank could not encode its gradient");
}

/// The `summed_encodings` plan: encodes (agreeing the scales first where the codec needs it),
/// SUM-reduces the summable region and decodes the sum into `data`.
template <transport X, summable_encoding C>
compressed_report summed_all_reduce(X& t, const C& codec, std::span<typename C::value_type> data, message_key key) {
  using T = typename C::value_type;
  using word = std::conditional_t<agreed_scale_encoding<C>, std::uint64_t, T>;
  const cpu_executor cpu{};
  const auto n = static_cast<std::uint64_t>(data.size());
  const auto ranks = static_cast<std::uint64_t>(t.size());
  std::vector<std::byte> message(codec.max_encoded_bytes(n));
  std::vector<std::byte> ws(codec.workspace_bytes(cpu, n));
  compressed_report report;
  report.dense_bytes = ring_all_reduce_dense_bytes(n * sizeof(T), ranks);
  errc status{};
  std::size_t bytes = 0;
  if constexpr (agreed_scale_encoding<C>) {
    std::vector<T> maxima(static_cast<std::size_t>(codec.block_count(n)));
    codec.block_maxima(cpu, std::span<const T>(data), std::span<T>(maxima));
    t.all_reduce_max(std::span<T>(maxima));
    report.sent_bytes += ring_all_reduce_dense_bytes(maxima.size() * sizeof(T), ranks);
    try {
      bytes = codec.encode_shared(cpu, std::span<const T>(data), std::span<const T>(maxima), message, ws, key,
                                  static_cast<std::uint32_t>(t.rank()));
    } catch (const gradcomp::error& e) {
      status = e.code();
    }
  } else {
    try {
      bytes = codec.encode(cpu, std::span<const T>(data), message, ws, key);
    } catch (const gradcomp::error& e) {
      status = e.code();
    }
  }
  agree_on_status(t, status, "compressed_all_reduce");
  const std::size_t offset = codec.summable_offset(n), region = codec.summable_bytes(n);
  std::vector<word> words(region / sizeof(word));
  std::memcpy(words.data(), message.data() + offset, words.size() * sizeof(word));
  t.all_reduce_sum(std::span<word>(words));
  std::memcpy(message.data() + offset, words.data(), words.size() * sizeof(word));
  report.sent_bytes += ring_all_reduce_dense_bytes(region, ranks);
  codec.decode(cpu, std::span<const std::byte>(message).first(bytes), data, ws);
  return report;
}

}  // namespace detail

/// All-reduces `data` (n values on every rank, in place) compressed with `codec`: `data` becomes
/// the sum over ranks of what the codec carries (the sum, not the mean), the same bits on every
/// rank. The plan is `options.plan`, by default chosen from the codec's traits (this file's
/// comment). `report.dense_bytes` is what an uncompressed ring all-reduce sends from this rank,
/// 2(P − 1)/P · n · sizeof(T).
/// @throws error on every rank alike, with `data` unchanged: `codec_mismatch`, `dtype_mismatch`,
/// `parameter_mismatch` (codec parameters or plan), `size_mismatch` (n), `step_mismatch` (step or
/// tensor id) when the ranks disagree; `non_finite_input` when any rank's gradient holds NaN or
/// ±Inf; the code of a rank whose encoding or decoding failed. `invalid_argument` (every rank
/// alike when they agree on the plan) for a plan the codec or transport cannot run.
template <transport X, class C>
  requires codec_for<C, cpu_executor>
compressed_report compressed_all_reduce(X& t, const C& codec, std::span<typename C::value_type> data,
                                        all_reduce_options options = {}) {
  using T = typename C::value_type;
  const all_reduce_plan plan = detail::resolved_plan<C>(options.plan);
  detail::agree_on(t, codec, std::span<const T>(data), plan, options.key, detail::plan_problem<X, C>(plan, false));
  if (plan == all_reduce_plan::summed_encodings) {
    if constexpr (summable_encoding<C>) return detail::summed_all_reduce(t, codec, data, options.key);
  }
  if (plan == all_reduce_plan::ring) {
    if constexpr (transport_with_point_to_point<X>)
      return ring_all_reduce(t, codec, data, options.key, {.measure_error = options.measure_error});
  }
  detail::frame_coder<C> coder(codec, data.size(), options.measure_error);
  double error = 0.0;
  const auto frame = coder.encode(std::span<const T>(data), options.key, 0.0, error);
  return detail::gather_decode_all_reduce(t, coder, frame, data, error);
}

/// All-reduces `data` with lossless homomorphic compression in its two collective stages (the
/// `two_stage` plan, this file's comment): `data` becomes the sum over ranks, the same bits on
/// every rank; exact when the sums in the sketch cells are (docs/sketches.md §2.3), and the
/// uncompressed rank-order sum after a stall, whatever `lhc`'s stall policy (median estimates
/// would be a silently wrong sum). `report.sent_bytes` counts both stages as ring all-reduces
/// (and the uncompressed sum after a stall).
/// @throws error as the codec overload, on every rank alike, with `data` unchanged: the agreement's
/// errors (LHC's parameters are hashed), `invalid_argument` for a plan other than `automatic` or
/// `two_stage` or for more ranks than the index coding can sum, and LHC's own `too_large` and
/// `non_finite_input` (a sum beyond the value type).
template <transport X, gradient_value T>
compressed_report compressed_all_reduce(X& t, const lossless_homomorphic<T>& lhc, std::type_identity_t<std::span<T>> data,
                                        all_reduce_options options = {}) {
  const all_reduce_plan plan = options.plan == all_reduce_plan::automatic ? all_reduce_plan::two_stage : options.plan;
  std::string problem;
  lhc_index_coding coding = lhc.params().index;
  if (plan != all_reduce_plan::two_stage) {
    problem = "compressed_all_reduce: lossless homomorphic compression runs the two_stage plan only";
  } else {
    try {
      coding = lhc_index_coding_for<X>(lhc.params(), t.size(), "compressed_all_reduce");
    } catch (const error& e) {
      problem = e.what();
    }
  }
  detail::agree_on(t, lhc, std::span<const T>(data), plan, options.key, problem);

  const cpu_executor cpu{};
  lhc_params staged_params = lhc.params();
  staged_params.index = coding;
  staged_params.on_stall = lhc_stall_policy::report;  // a stall is resent uncompressed below
  const lossless_homomorphic<T> staged(staged_params);
  const std::uint64_t n = data.size();
  const auto ranks = static_cast<std::uint64_t>(t.size());
  compressed_report report;
  report.dense_bytes = ring_all_reduce_dense_bytes(n * sizeof(T), ranks);
  // Stage 1: the union of the non-zero positions, on every rank.
  std::vector<std::byte> index(static_cast<std::size_t>(staged.index_bytes(n)));
  staged.encode_index(cpu, std::span<const T>(data), std::span<std::byte>(index));
  aggregate_lhc_index(t, coding, std::span<std::byte>(index));
  report.sent_bytes += ring_all_reduce_dense_bytes(index.size(), ranks);
  // Stage 2: the sketches, sized from the union alike on every rank, summed.
  const lhc_plan sizes = staged.plan(cpu, std::span<const std::byte>(index), n, ranks);
  std::vector<T> sketch(static_cast<std::size_t>(sizes.sketch_values()));
  try {
    staged.encode_sketch(cpu, std::span<const T>(data), std::span<const std::byte>(index), sizes, std::span<T>(sketch));
  } catch (const error&) {
    // Only a transport that corrupted the index gets here. Join the SUM with a poisoned sketch,
    // so that every rank's decode fails alike instead of the others waiting for this one.
    std::fill(sketch.begin(), sketch.end(), from_bits<T>(float_traits<T>::infinity_key | 1));
  }
  t.all_reduce_sum(std::span<T>(sketch));
  report.sent_bytes += ring_all_reduce_dense_bytes(sketch.size() * sizeof(T), ranks);
  std::vector<std::byte> ws(staged.workspace_bytes(cpu, sizes));
  try {
    staged.decode(cpu, std::span<const std::byte>(index), sizes, std::span<const T>(sketch), data, std::span<std::byte>(ws));
  } catch (const error& e) {
    if (e.code() != errc::peeling_stalled) throw;
    t.all_reduce_sum(data);  // every rank stalled alike: the uncompressed sum instead
    report.sent_bytes += report.dense_bytes;
  }
  return report;
}

/// All-reduces `data` with a stateful wrapper (`error_feedback`, `loco`): each rank encodes its
/// gradient with its own `state`, and every rank decodes every message in rank order
/// (`gather_decode`). `data` becomes the sum of the decoded messages on every rank.
/// @throws error as the stateless overload, on every rank alike. `data` and `state` are unchanged
/// when the ranks disagree or a gradient is not finite (checked before encoding); when a rank's
/// encoding or any decoding fails, `data` is unchanged and `state` is restored to what it was.
template <transport X, class C>
  requires stateful<C, cpu_executor> && codec<C>
compressed_report compressed_all_reduce(X& t, const C& codec, typename C::state_type& state,
                                        std::span<typename C::value_type> data, all_reduce_options options = {}) {
  using T = typename C::value_type;
  const all_reduce_plan plan = detail::resolved_plan<C>(options.plan);
  detail::agree_on(t, codec, std::span<const T>(data), plan, options.key, detail::plan_problem<X, C>(plan, true));
  detail::frame_coder<C> coder(codec, data.size(), false);
  step_rollback<typename C::state_type> before(state);
  const auto frame = coder.encode_stateful(std::span<const T>(data), state, options.key);
  try {
    return detail::gather_decode_all_reduce(t, coder, frame, data, 0.0);
  } catch (...) {
    before.restore(state);
    throw;
  }
}

}  // namespace gradcomp
