#pragma once
/// @file
/// CPU backend of the QSGD quantizer (its specification is reference/qsgd.hpp): per bucket, one
/// pass for the maximum magnitude (which also finds NaN and Inf), one for the norm in the
/// documented order, one for the codes.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/bit_packing.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/crc32c.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/cpu/detail/half_conversion.hpp>
#include <gradcomp/cpu/detail/message.hpp>
#include <gradcomp/quantize/qsgd.hpp>

namespace gradcomp {

/// QSGD quantization on the CPU.
template <gradient_value T>
struct backend<qsgd_quantizer<T>, cpu_executor> {
  static std::size_t workspace_bytes(const qsgd_quantizer<T>&, const cpu_executor&, std::uint64_t) noexcept {
    return 0;
  }

  static std::size_t encode(const qsgd_quantizer<T>& codec, const cpu_executor&, std::span<const T> grad,
                            std::span<std::byte> out, std::span<std::byte>, message_key key) {
    const std::uint64_t n = grad.size();
    const std::size_t size = codec.max_encoded_bytes(n);
    detail::cpu::begin_message(out, size);
    const int bits = codec.bits();
    const std::uint32_t levels = codec.levels();
    const std::uint64_t bucket = codec.params().bucket;
    std::byte* const norms = out.data() + envelope::size;
    auto* const codes = reinterpret_cast<std::uint8_t*>(norms + codec.bucket_count(n) * sizeof(C));
    std::memset(codes, 0, static_cast<std::size_t>(packed_bytes(n, bits)));
    const random_stream stream{codec.params().seed, key.step, key.tensor_id, random_purpose::stochastic_rounding};

    for (std::uint64_t begin = 0, j = 0; begin < n; begin += bucket, ++j) {
      const std::uint64_t end = std::min(n, begin + bucket);
      const C m = widen(detail::cpu::max_magnitude(grad.data() + begin, grad.data() + end));
      C norm{};
      detail::require(qsgd_bucket_norm(grad.data() + begin, end - begin, m, norm), errc::non_finite_input,
                      [&] { return "the L2 norm of bucket " + std::to_string(j) + " overflows the value type"; });
      std::memcpy(norms + j * sizeof(C), &norm, sizeof norm);
      if (norm == C{0}) continue;  // a zero bucket keeps its codes 0
      philox_block words{};
      std::uint64_t cached = UINT64_MAX;
      for (std::uint64_t i = begin; i < end; ++i) {
        if (i / 4 != cached) {
          cached = i / 4;
          words = stream.block(cached);
        }
        const C u = static_cast<C>(words.word[i % 4] >> 8) * static_cast<C>(1.0 / 16777216.0);
        const T x = grad[i];
        const int level = qsgd_level(widen(from_bits<T>(magnitude_key(x))), norm, levels, u);
        const std::uint64_t bit = i * static_cast<std::uint64_t>(bits);
        codes[bit / 8] =
            static_cast<std::uint8_t>(codes[bit / 8] | (qsgd_code(level, sign_bit_of(x), bits) << (bit % 8)));
      }
    }

    detail::cpu::seal_message(out,
                              {codec_id::qsgd, dtype_of<T>, 0, 0, key, n, size - envelope::size, codec.params_hash(),
                               0},
                              codec.wire().payload_checksum);
    return size;
  }

  /// Decodes into `out` of T, or (a 16-bit T) of float32; with `accumulate` adds instead.
  template <gradient_value O>
  static void decode(const qsgd_quantizer<T>& codec, const cpu_executor&, std::span<const std::byte> message,
                     std::span<O> out, std::span<std::byte>, const decode_limits& limits, bool accumulate) {
    const envelope e = parse_envelope(message);
    validate_envelope(e, {codec_id::qsgd, dtype_of<T>, out.size(), codec.params_hash()}, limits);
    const int bits = codec.bits();
    const std::uint32_t levels = codec.levels();
    const std::uint64_t n = e.elements;
    codec.validate_payload_size(e);
    const std::byte* const norms = message.data() + envelope::size;
    const auto* const codes = reinterpret_cast<const std::uint8_t*>(norms + codec.bucket_count(n) * sizeof(C));
    const std::uint64_t bucket = codec.params().bucket;
    const auto top = static_cast<int>(levels);
    for (std::uint64_t begin = 0, j = 0; begin < n; begin += bucket, ++j) {
      const std::uint64_t end = std::min(n, begin + bucket);
      const C norm = norm_at(norms, j);
      detail::require(sign_bit_of(norm) == 0 && is_finite(norm), errc::malformed_payload,
                      [&] { return "norm of bucket " + std::to_string(j) + " is negative or not finite"; });
      bool valid = true;
      if (norm == C{0}) {
        for (std::uint64_t i = begin; i < end; ++i) valid &= packed_code(codes, i, bits) == 0;
      } else {
        for (std::uint64_t i = begin; i < end; ++i) {
          const std::uint8_t c = packed_code(codes, i, bits);
          const int level = qsgd_code_level(c, bits);
          valid &= level <= top && (level != 0 || c == 0);
        }
      }
      detail::require(valid, errc::malformed_payload, [&] {
        return "bucket " + std::to_string(j) + " holds a level above s, a signed zero level, or a code under norm 0";
      });
    }
    const std::uint64_t used_bits = n * static_cast<std::uint64_t>(bits);
    if (used_bits % 8 != 0)
      detail::require((codes[used_bits / 8] >> (used_bits % 8)) == 0, errc::malformed_payload,
                      "non-zero padding bits after the last code");

    // ±norm·fl(level/s) in C, written or added; into a 16-bit output narrowed, every result
    // checked to fit first (docs/half-precision.md §3).
    O* const dense = out.data();
    const auto for_each_value = [&](auto&& use) {
      for (std::uint64_t begin = 0, j = 0; begin < n; begin += bucket, ++j) {
        const std::uint64_t end = std::min(n, begin + bucket);
        const C norm = norm_at(norms, j);
        for (std::uint64_t i = begin; i < end; ++i) {
          const C v = qsgd_decoded(packed_code(codes, i, bits), norm, levels, bits);
          use(i, accumulate ? widen(dense[i]) + v : v);
        }
      }
    };
    detail::cpu::store_values(for_each_value, dense);
  }

 private:
  using C = compute_type<T>;  ///< The norms' and the arithmetic's type: float32 for a 16-bit T.

  [[nodiscard]] static C norm_at(const std::byte* norms, std::uint64_t j) noexcept {
    C s;
    std::memcpy(&s, norms + j * sizeof(C), sizeof s);
    return s;
  }
};

}  // namespace gradcomp
