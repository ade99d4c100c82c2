#pragma once
/// @file
/// Reference backend of the shared-scale quantizer (docs/quantizers.md §14, docs/wire-format.md
/// §13): the specification the `cpu_executor` and `cuda_executor` backends are checked against,
/// byte for byte; bf16 and fp16 gradients as docs/half-precision.md §2–§3 say.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/core/rounded_product.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/quantize/shared_scale.hpp>
#include <gradcomp/quantize/sign_math.hpp>
#include <gradcomp/quantize/uniform_math.hpp>
#include <gradcomp/reference/uniform.hpp>
#include <gradcomp/reference/values.hpp>

namespace gradcomp {

/// The shared-scale quantizer, written to be read.
template <gradient_value T>
struct backend<shared_scale_quantizer<T>, reference_executor> {
  using codec_type = shared_scale_quantizer<T>;
  using C = compute_type<T>;  ///< The maxima's, scales' and arithmetic's type: float32 for a 16-bit T.

  /// The single-stage `encode` needs this rank's block maxima; the rest needs nothing.
  static std::size_t workspace_bytes(const codec_type& codec, const reference_executor&, std::uint64_t n) {
    workspace_arena arena = workspace_arena::measure();
    (void)arena.take<C>(static_cast<std::size_t>(codec.block_count(n)));
    return arena.bytes_needed();
  }

  /// docs/quantizers.md §14.2 step 1: this rank's largest magnitude of each block (all +Inf when the gradient holds
  /// NaN or ±Inf, which is then rejected).
  static void block_maxima(const codec_type& codec, const reference_executor&, std::span<const T> grad,
                           std::span<C> maxima) {
    namespace ref = detail::reference;
    const std::uint64_t n = grad.size();
    detail::require(maxima.size() == codec.block_count(n), errc::size_mismatch, [&] {
      return "maxima hold " + std::to_string(maxima.size()) + " values, the gradient has " +
             std::to_string(codec.block_count(n)) + " blocks";
    });
    try {
      ref::require_finite(grad);
    } catch (const error&) {
      std::fill(maxima.begin(), maxima.end(), std::numeric_limits<C>::infinity());
      throw;
    }
    const std::uint64_t block = codec.params().block;
    for (std::uint64_t j = 0; j < maxima.size(); ++j)
      maxima[j] = ref::max_magnitude(grad, j * block, std::min(n, (j + 1) * block));
  }

  /// The single-stage encode: this rank's own maxima, rank 0.
  static std::size_t encode(const codec_type& codec, const reference_executor& e, std::span<const T> grad,
                            std::span<std::byte> out, std::span<std::byte> ws, message_key key) {
    workspace_arena arena(ws);
    const std::span<C> maxima = arena.take<C>(static_cast<std::size_t>(codec.block_count(grad.size())));
    block_maxima(codec, e, grad, maxima);
    codec.validate_agreed_maxima(grad.size(), maxima);
    return write_message(codec, grad, maxima, out, key, 0);
  }

  /// docs/quantizers.md §14.2 step 3: encode with the agreed maxima, each at least this rank's own.
  static std::size_t encode_shared(const codec_type& codec, const reference_executor&, std::span<const T> grad,
                                   std::span<const C> agreed, std::span<std::byte> out, std::span<std::byte>,
                                   message_key key, std::uint32_t rank) {
    namespace ref = detail::reference;
    const std::uint64_t n = grad.size();
    codec.validate_agreed_maxima(n, agreed);
    const std::uint64_t block = codec.params().block;
    for (std::uint64_t j = 0; j < agreed.size(); ++j) {
      const std::uint64_t begin = j * block;
      const std::uint64_t end = std::min(n, begin + block);
      ref::require_finite(grad.subspan(begin, end - begin));
      detail::require(ref::max_magnitude(grad, begin, end) <= agreed[j], errc::parameter_mismatch, [&] {
        return "agreed maximum of block " + std::to_string(j) +
               " is below this rank's own maximum: the maxima were not "
               "MAX-reduced over all ranks";
      });
    }
    return write_message(codec, grad, agreed, out, key, rank);
  }

  /// Decodes into `out` of T, or (a 16-bit T) of float32; with `accumulate` adds instead.
  template <gradient_value O>
  static void decode(const codec_type& codec, const reference_executor&, std::span<const std::byte> message,
                     std::span<O> out, std::span<std::byte>, const decode_limits& limits, bool accumulate) {
    namespace ref = detail::reference;
    const std::uint64_t contributions = checked_contributions(codec, message, out.size(), limits);
    const std::uint64_t n = out.size();
    const std::byte* const scales = message.data() + envelope::size;
    const std::byte* const words = message.data() + codec.summable_offset(n) + 8;
    // docs/quantizers.md §14.3: element i decodes to Σq·s, Σq the level sum of its field, added to
    // the output's value in C when accumulating; then written, narrowed to a 16-bit output
    // (docs/half-precision.md §3), which must not overflow: every result is checked first.
    std::vector<C> results(static_cast<std::size_t>(n));
    for (std::uint64_t i = 0; i < n; ++i) {
      const auto level_sum = shared_scale_level_sum(field(codec, words, i), contributions, codec.bits());
      const C value = mul_rn(static_cast<C>(level_sum), ref::load_value<C>(scales, i / codec.params().block));
      results[i] = accumulate ? widen(out[i]) + value : value;
    }
    ref::store_results(results, out);
  }

  /// The sum of two messages of the same scales and key: contribution counts and field words
  /// added as u64, as a SUM collective over the summable region does.
  static void accumulate_encoded(const codec_type& codec, const reference_executor&, std::span<std::byte> acc,
                                 std::span<const std::byte> other) {
    const std::uint64_t n = parse_envelope(acc).elements;
    const std::uint64_t mine = checked_contributions(codec, acc, n, {});
    const std::uint64_t theirs = checked_contributions(codec, other, n, {});
    detail::require(parse_envelope(acc).key == parse_envelope(other).key, errc::step_mismatch,
                    "messages of different steps or tensors cannot be summed");
    const std::size_t offset = codec.summable_offset(n);
    detail::require(std::equal(acc.begin() + envelope::size, acc.begin() + static_cast<std::ptrdiff_t>(offset),
                               other.begin() + envelope::size),
                    errc::parameter_mismatch, "the block scales differ: the ranks did not agree the block maxima");
    detail::require(mine + theirs <= codec.max_contributions(), errc::invalid_argument, [&] {
      return "the sum would hold " + std::to_string(mine + theirs) + " contributions, the headroom allows " +
             std::to_string(codec.max_contributions()) + ": raise headroom_bits";
    });
    for (std::size_t at = offset; at < acc.size(); at += 8)
      detail::store_le<std::uint64_t>(acc.data() + at, detail::load_le<std::uint64_t>(acc.data() + at) +
                                                           detail::load_le<std::uint64_t>(other.data() + at));
  }

 private:
  /// Field i of the field words: bits [(i mod F)·w, (i mod F)·w + w) of word ⌊i/F⌋.
  [[nodiscard]] static std::uint64_t field(const codec_type& codec, const std::byte* words, std::uint64_t i) noexcept {
    const std::uint64_t word = detail::load_le<std::uint64_t>(words + 8 * (i / codec.fields_per_word()));
    const auto shift = static_cast<int>(i % codec.fields_per_word()) * codec.field_bits();
    return (word >> shift) & ((std::uint64_t{1} << codec.field_bits()) - 1);
  }

  /// Writes the message of `grad` under validated maxima (docs/wire-format.md §13.1).
  static std::size_t write_message(const codec_type& codec, std::span<const T> grad, std::span<const C> maxima,
                                   std::span<std::byte> out, message_key key, std::uint32_t rank) {
    namespace ref = detail::reference;
    const std::uint64_t n = grad.size();
    const shared_scale_params& p = codec.params();
    const std::size_t size = codec.max_encoded_bytes(n);
    detail::begin_host_message(out, size);
    std::byte* const scales = out.data() + envelope::size;
    const std::size_t offset = codec.summable_offset(n);
    std::byte* const words = out.data() + offset + 8;

    // The scales s = uniform_step(M_j, b) of the agreed maxima, then zero padding to 8 bytes.
    std::memset(scales, 0, offset - envelope::size);
    for (std::uint64_t j = 0; j < maxima.size(); ++j) ref::store_value(scales, j, uniform_step(maxima[j], p.bits));
    // The contribution count: 1.
    detail::store_le<std::uint64_t>(out.data() + offset, 1);
    // docs/quantizers.md §14.3–§14.4: the uniform quantizer's code of each element (agreed maximum, rank r's stream),
    // in its w-bit field; unused high bits zero.
    std::memset(words, 0, static_cast<std::size_t>(8 * codec.field_words(n)));
    const random_stream stream{shared_scale_stream_seed(p.seed, rank), key.step, key.tensor_id,
                               random_purpose::stochastic_rounding};
    for (std::uint64_t i = 0; i < n; ++i) {
      const std::uint64_t j = i / p.block;
      const std::uint8_t code =
          ref::uniform_value_code(widen(grad[i]), i, maxima[j], ref::load_value<C>(scales, j), p.bits, p.round, stream);
      std::byte* const word = words + 8 * (i / codec.fields_per_word());
      const auto shift = static_cast<int>(i % codec.fields_per_word()) * codec.field_bits();
      detail::store_le<std::uint64_t>(word, detail::load_le<std::uint64_t>(word) | std::uint64_t{code} << shift);
    }

    detail::seal_host_message(out,
                              {codec_id::uniform_shared, dtype_of<T>, 0, 0, key, n, codec.payload_bytes(n),
                               codec.params_hash(), 0},
                              false);
    return size;
  }

  /// Validates a whole message for `elements` elements (docs/wire-format.md §13.2) and returns its
  /// contribution count P. @throws error naming the first check that fails.
  static std::uint64_t checked_contributions(const codec_type& codec, std::span<const std::byte> message,
                                             std::uint64_t elements, const decode_limits& limits) {
    namespace ref = detail::reference;
    const envelope e = parse_envelope(message);
    validate_envelope(e, {codec_id::uniform_shared, dtype_of<T>, elements, codec.params_hash()}, limits);
    codec.validate_payload_size(e);
    const std::uint64_t n = e.elements;
    const std::size_t offset = codec.summable_offset(n);
    // P in [1, 2^k].
    const auto contributions = detail::load_le<std::uint64_t>(message.data() + offset);
    detail::require(contributions >= 1 && contributions <= codec.max_contributions(), errc::malformed_payload, [&] {
      return "contribution count " + std::to_string(contributions) + " is outside [1, " +
             std::to_string(codec.max_contributions()) + "]";
    });
    // Every scale non-negative with 2^k·L·s finite.
    for (std::uint64_t j = 0; j < codec.block_count(n); ++j) {
      const C s = ref::load_value<C>(message.data() + envelope::size, j);
      detail::require(sign_bit_of(s) == 0 && is_finite(s * codec.largest_level_sum()), errc::malformed_payload,
                      [&] { return "scale of block " + std::to_string(j) + " is negative or too large"; });
    }
    // Zero padding after the scales.
    for (std::size_t b = envelope::size + static_cast<std::size_t>(codec.block_count(n)) * sizeof(C); b < offset; ++b)
      detail::require(message[b] == std::byte{0}, errc::malformed_payload, "non-zero padding after the scales");
    // Every field at most P·(largest code).
    const std::byte* const words = message.data() + offset + 8;
    for (std::uint64_t i = 0; i < n; ++i)
      detail::require(field(codec, words, i) <= codec.largest_field(contributions), errc::malformed_payload, [&] {
        return "field " + std::to_string(i) + " is above " + std::to_string(codec.largest_field(contributions));
      });
    // The bits above the last field of each word zero.
    for (std::uint64_t w = 0; w < codec.field_words(n); ++w) {
      const std::uint64_t used = std::min(codec.fields_per_word(), n - w * codec.fields_per_word());
      const auto used_bits = static_cast<int>(used) * codec.field_bits();
      const auto word = detail::load_le<std::uint64_t>(words + 8 * w);
      detail::require(used_bits == 64 || (word >> used_bits) == 0, errc::malformed_payload,
                      [&] { return "field word " + std::to_string(w) + " has non-zero unused bits"; });
    }
    return contributions;
  }
};

}  // namespace gradcomp
