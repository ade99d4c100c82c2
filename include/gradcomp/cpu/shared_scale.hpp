#pragma once
/// @file
/// CPU backend of the shared-scale quantizer (its specification is reference/shared_scale.hpp):
/// every check (maxima, this rank's own block maxima, NaN/Inf, the output size) runs before
/// anything is written; then the scales, and the codes of the uniform quantizer's reference
/// arithmetic packed into u64 field words 256 elements at a time, with the stochastic-rounding
/// halves of a chunk drawn together (a bf16 or fp16 chunk widened to float32 first, on the
/// stack). Decoders validate the whole message before writing; a 16-bit output is checked for
/// overflow before its first value is narrowed.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/rounded_product.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cpu/detail/half_conversion.hpp>
#include <gradcomp/cpu/detail/message.hpp>
#include <gradcomp/cpu/detail/philox_simd.hpp>
#include <gradcomp/quantize/shared_scale.hpp>
#include <gradcomp/quantize/sign_math.hpp>
#include <gradcomp/quantize/uniform.hpp>  // and its CPU backend, with detail::cpu::uniform_scalar_codes
#include <gradcomp/reference/shared_scale.hpp>

namespace gradcomp {

/// Shared-scale quantization on the CPU.
template <gradient_value T>
struct backend<shared_scale_quantizer<T>, cpu_executor> {
  using codec_type = shared_scale_quantizer<T>;
  using C = compute_type<T>;  ///< The maxima's, scales' and arithmetic's type: float32 for a 16-bit T.

  /// The single-stage `encode` needs this rank's block maxima; `encode_shared` and the decoders
  /// need nothing.
  static std::size_t workspace_bytes(const codec_type& codec, const cpu_executor&, std::uint64_t n) {
    workspace_arena arena = workspace_arena::measure();
    (void)carve(arena, codec, n);
    return arena.bytes_needed();
  }

  static void block_maxima(const codec_type& codec, const cpu_executor& e, std::span<const T> grad,
                           std::span<C> maxima) {
    const std::uint64_t n = grad.size();
    detail::require(maxima.size() == codec.block_count(n), errc::size_mismatch, [&] {
      return "maxima hold " + std::to_string(maxima.size()) + " values, the gradient has " +
             std::to_string(codec.block_count(n)) + " blocks";
    });
    const std::uint64_t block = codec.params().block;
    try {
      for (std::uint64_t begin = 0, j = 0; begin < n; begin += block, ++j)
        maxima[j] =
            widen(detail::cpu::max_magnitude(grad.data() + begin, grad.data() + std::min(n, begin + block), e.avx2()));
    } catch (const error&) {
      std::fill(maxima.begin(), maxima.end(), std::numeric_limits<C>::infinity());
      throw;
    }
  }

  static std::size_t encode(const codec_type& codec, const cpu_executor& e, std::span<const T> grad,
                            std::span<std::byte> out, std::span<std::byte> ws, message_key key) {
    workspace_arena arena(ws);
    const std::span<C> maxima = carve(arena, codec, grad.size());
    block_maxima(codec, e, grad, maxima);
    codec.validate_agreed_maxima(grad.size(), maxima);
    return write_message(codec, e, grad, maxima, out, key, 0);
  }

  static std::size_t encode_shared(const codec_type& codec, const cpu_executor& e, std::span<const T> grad,
                                   std::span<const C> agreed, std::span<std::byte> out, std::span<std::byte>,
                                   message_key key, std::uint32_t rank) {
    const std::uint64_t n = grad.size();
    codec.validate_agreed_maxima(n, agreed);
    const std::uint64_t block = codec.params().block;
    for (std::uint64_t begin = 0, j = 0; begin < n; begin += block, ++j) {
      const C m =
          widen(detail::cpu::max_magnitude(grad.data() + begin, grad.data() + std::min(n, begin + block), e.avx2()));
      detail::require(m <= agreed[j], errc::parameter_mismatch, [&] {
        return "agreed maximum of block " + std::to_string(j) +
               " is below this rank's own maximum: the maxima were not "
               "MAX-reduced over all ranks";
      });
    }
    return write_message(codec, e, grad, agreed, out, key, rank);
  }

  /// Decodes into `out` of T, or (a 16-bit T) of float32; with `accumulate` adds instead. A
  /// 16-bit output takes two passes over the fields: the results checked, then narrowed.
  template <gradient_value O>
  static void decode(const codec_type& codec, const cpu_executor&, std::span<const std::byte> message, std::span<O> out,
                     std::span<std::byte>, const decode_limits& limits, bool accumulate) {
    const std::uint64_t contributions = parse_checked(codec, message, out.size(), limits).contributions;
    const std::uint64_t n = out.size();
    const std::uint64_t block = codec.params().block;
    const int bits = codec.bits();
    const std::byte* const words = message.data() + codec.summable_offset(n) + 8;
    O* const dense = out.data();
    detail::cpu::store_values(
        [&](auto&& use) {
          field_reader fields{words, codec.field_bits(), codec.fields_per_word()};
          for (std::uint64_t begin = 0, j = 0; begin < n; begin += block, ++j) {
            const std::uint64_t end = std::min(n, begin + block);
            const C s = scale_at(message.data(), j);
            for (std::uint64_t i = begin; i < end; ++i) {
              const C v = mul_rn(static_cast<C>(shared_scale_level_sum(fields.next(), contributions, bits)), s);
              use(i, accumulate ? widen(dense[i]) + v : v);
            }
          }
        },
        dense);
  }

  /// The reference's sum (reference/shared_scale.hpp): u64 additions, nothing to vectorise.
  static void accumulate_encoded(const codec_type& codec, const cpu_executor&, std::span<std::byte> acc,
                                 std::span<const std::byte> other) {
    backend<codec_type, reference_executor>::accumulate_encoded(codec, reference_executor{}, acc, other);
  }

 private:
  /// Values coded together: the stochastic-rounding halves of a chunk are drawn at once.
  static constexpr std::uint64_t chunk = 256;

  /// A validated message: its envelope and contribution count.
  struct parsed {
    envelope e;
    std::uint64_t contributions;
  };

  /// Appends w-bit fields to consecutive u64 words, least significant field first.
  struct field_writer {
    std::byte* at;
    int width;
    std::uint64_t per_word;
    std::uint64_t word = 0;
    std::uint64_t used = 0;

    void put(std::uint64_t field) noexcept {
      word |= field << (used * static_cast<std::uint64_t>(width));
      if (++used == per_word) flush();
    }
    /// Stores the word being filled, if it holds any field.
    void flush() noexcept {
      if (used == 0) return;
      detail::store_le<std::uint64_t>(at, word);
      at += 8;
      word = 0;
      used = 0;
    }
  };

  /// Reads w-bit fields from consecutive u64 words in the order field_writer wrote them.
  struct field_reader {
    const std::byte* at;
    int width;
    std::uint64_t per_word;
    std::uint64_t word = 0;
    std::uint64_t left = 0;

    std::uint64_t next() noexcept {
      if (left == 0) {
        word = detail::load_le<std::uint64_t>(at);
        at += 8;
        left = per_word;
      }
      const std::uint64_t field = word & ((std::uint64_t{1} << width) - 1);
      word >>= width;
      --left;
      return field;
    }
  };

  /// The single-stage encoder's workspace: this rank's block maxima.
  static std::span<C> carve(workspace_arena& arena, const codec_type& codec, std::uint64_t n) {
    return arena.take<C>(static_cast<std::size_t>(codec.block_count(n)));
  }

  [[nodiscard]] static C scale_at(const std::byte* message, std::uint64_t j) noexcept {
    C s;
    std::memcpy(&s, message + envelope::size + j * sizeof(C), sizeof s);
    return s;
  }

  /// Writes the message for `grad` with validated maxima; nothing in here can fail but the size
  /// check of `out`, which comes first. Codes come from the uniform quantizer's reference
  /// arithmetic (detail::cpu::uniform_scalar_codes) with the agreed maxima, a chunk at a time.
  static std::size_t write_message(const codec_type& codec, const cpu_executor& e, std::span<const T> grad,
                                   std::span<const C> maxima, std::span<std::byte> out, message_key key,
                                   std::uint32_t rank) {
    const std::uint64_t n = grad.size();
    const std::size_t size = codec.max_encoded_bytes(n);
    detail::cpu::begin_message(out, size);
    const int bits = codec.bits();
    const std::size_t offset = codec.summable_offset(n);
    std::memset(out.data() + envelope::size, 0, offset - envelope::size);
    detail::store_le<std::uint64_t>(out.data() + offset, 1);

    const shared_scale_params& p = codec.params();
    const std::uint64_t block = p.block;
    const random_stream stream{shared_scale_stream_seed(p.seed, rank), key.step, key.tensor_id,
                               random_purpose::stochastic_rounding};
    field_writer fields{out.data() + offset + 8, codec.field_bits(), codec.fields_per_word()};
    std::uint8_t codes[chunk];
    alignas(16) std::uint16_t random_halves[chunk + detail::philox_halves_slack];
    alignas(64) C wide[half_precision<T> ? chunk : 1];
    for (std::uint64_t begin = 0, j = 0; begin < n; begin += block, ++j) {
      const std::uint64_t end = std::min(n, begin + block);
      const C s = uniform_step(maxima[j], bits);
      std::memcpy(out.data() + envelope::size + j * sizeof(C), &s, sizeof s);
      for (std::uint64_t first = begin; first < end; first += chunk) {
        const std::uint64_t count = std::min(chunk, end - first);
        const std::uint16_t* const halves =
            p.round == rounding::stochastic
                ? detail::philox_stream_halves(stream, first, count, random_halves, e.simd())
                : nullptr;
        detail::cpu::uniform_scalar_codes(detail::cpu::widened_run(grad.data() + first, count, wide), count, maxima[j],
                                          s, bits, p.round, halves, codes);
        for (std::uint64_t c = 0; c < count; ++c) fields.put(codes[c]);
      }
    }
    fields.flush();

    detail::cpu::seal_message(out,
                              {codec_id::uniform_shared, dtype_of<T>, 0, 0, key, n, size - envelope::size,
                               codec.params_hash(), 0},
                              false);
    return size;
  }

  /// Parses and validates a whole message for an `elements`-element buffer (wire-format.md §13.2).
  static parsed parse_checked(const codec_type& codec, std::span<const std::byte> message, std::uint64_t elements,
                              const decode_limits& limits) {
    const envelope e = parse_envelope(message);
    validate_envelope(e, {codec_id::uniform_shared, dtype_of<T>, elements, codec.params_hash()}, limits);
    codec.validate_payload_size(e);
    const std::uint64_t n = e.elements;
    const std::size_t offset = codec.summable_offset(n);
    const auto contributions = detail::load_le<std::uint64_t>(message.data() + offset);
    detail::require(contributions >= 1 && contributions <= codec.max_contributions(), errc::malformed_payload, [&] {
      return "contribution count " + std::to_string(contributions) + " is outside [1, " +
             std::to_string(codec.max_contributions()) + "]";
    });
    const C largest = codec.largest_level_sum();
    for (std::uint64_t j = 0; j < codec.block_count(n); ++j) {
      const C s = scale_at(message.data(), j);
      detail::require(sign_bit_of(s) == 0 && is_finite(s * largest), errc::malformed_payload,
                      [&] { return "scale of block " + std::to_string(j) + " is negative or too large"; });
    }
    const std::size_t scales_end = envelope::size + static_cast<std::size_t>(codec.block_count(n)) * sizeof(C);
    detail::require(std::all_of(message.begin() + static_cast<std::ptrdiff_t>(scales_end),
                                message.begin() + static_cast<std::ptrdiff_t>(offset),
                                [](std::byte b) { return b == std::byte{0}; }),
                    errc::malformed_payload, "non-zero padding after the scales");
    validate_fields(codec, message.data() + offset + 8, n, contributions);
    return {e, contributions};
  }

  /// Every field at most P·(largest code), and the bits of each word above its last field zero.
  static void validate_fields(const codec_type& codec, const std::byte* words, std::uint64_t n,
                              std::uint64_t contributions) {
    const int width = codec.field_bits();
    const std::uint64_t per_word = codec.fields_per_word();
    const std::uint64_t mask = (std::uint64_t{1} << width) - 1;
    const std::uint64_t limit = codec.largest_field(contributions);
    for (std::uint64_t w = 0; w < codec.field_words(n); ++w) {
      std::uint64_t word = detail::load_le<std::uint64_t>(words + w * 8);
      const std::uint64_t count = std::min(per_word, n - w * per_word);
      bool valid = true;
      for (std::uint64_t f = 0; f < count; ++f, word >>= width) valid &= (word & mask) <= limit;
      detail::require(valid && word == 0, errc::malformed_payload, [&] {
        return "field word " + std::to_string(w) + " holds a field above " + std::to_string(limit) +
               " or non-zero unused bits";
      });
    }
  }
};

}  // namespace gradcomp
