#pragma once
/// @file
/// Reference backend of the QSGD quantizer (docs/quantizers.md §12): the specification the
/// `cpu_executor` and `cuda_executor` backends are checked against, byte for byte.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/bit_packing.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/quantize/qsgd.hpp>
#include <gradcomp/quantize/qsgd_math.hpp>
#include <gradcomp/quantize/sign_math.hpp>
#include <gradcomp/reference/values.hpp>

namespace gradcomp {

/// QSGD, written to be read.
template <gradient_value T>
struct backend<qsgd_quantizer<T>, reference_executor> {
  static std::size_t workspace_bytes(const qsgd_quantizer<T>&, const reference_executor&, std::uint64_t) noexcept {
    return 0;
  }

  static std::size_t encode(const qsgd_quantizer<T>& codec, const reference_executor&, std::span<const T> grad,
                            std::span<std::byte> out, std::span<std::byte>, message_key key) {
    namespace ref = detail::reference;
    const std::uint64_t n = grad.size();
    const int bits = codec.bits();
    const std::uint32_t levels = codec.levels();
    const std::uint64_t bucket = codec.params().bucket;
    const std::size_t size = codec.max_encoded_bytes(n);
    detail::begin_host_message(out, size);
    std::byte* const norms = out.data() + envelope::size;
    auto* const codes = reinterpret_cast<std::uint8_t*>(norms + codec.bucket_count(n) * sizeof(C));

    // docs/quantizers.md §12.6: a gradient holding NaN or ±Inf is rejected; the envelope stays zero.
    ref::require_finite(grad);

    // docs/quantizers.md §12.3: the norm of each bucket, summed in index order; one that overflows T is rejected.
    for (std::uint64_t j = 0; j < codec.bucket_count(n); ++j) {
      const std::uint64_t begin = j * bucket;
      const std::uint64_t end = std::min(n, begin + bucket);
      C norm{};
      detail::require(qsgd_bucket_norm(grad.data() + begin, end - begin, ref::max_magnitude(grad, begin, end), norm),
                      errc::non_finite_input,
                      [&] { return "the L2 norm of bucket " + std::to_string(j) + " overflows the value type"; });
      ref::store_value(norms, j, norm);
    }

    // docs/quantizers.md §12.4: each value's level from |x_i|/norm and word i of the stream, and its sign; stored as a
    // w-bit code at bit i·w of the code array (docs/quantizers.md §12.5). A bucket of norm 0 keeps codes 0.
    std::memset(codes, 0, static_cast<std::size_t>(packed_bytes(n, bits)));
    const random_stream stream{codec.params().seed, key.step, key.tensor_id, random_purpose::stochastic_rounding};
    for (std::uint64_t i = 0; i < n; ++i) {
      const C norm = ref::load_value<C>(norms, i / bucket);
      if (norm == C{0}) continue;
      const C u = static_cast<C>(stream.word(i) >> 8) * static_cast<C>(1.0 / 16777216.0);
      const int level = qsgd_level(std::fabs(widen(grad[i])), norm, levels, u);
      const std::uint8_t code = qsgd_code(level, sign_bit_of(grad[i]), bits);
      const std::uint64_t bit = i * static_cast<std::uint64_t>(bits);
      codes[bit / 8] = static_cast<std::uint8_t>(codes[bit / 8] | code << (bit % 8));
    }

    // The envelope last (docs/wire-format.md).
    detail::seal_host_message(out,
                              {codec_id::qsgd, dtype_of<T>, 0, 0, key, n, codec.payload_bytes(n), codec.params_hash(),
                               0},
                              codec.wire().payload_checksum);
    return size;
  }

  /// Decodes into `out` of T, or (a 16-bit T) of float32; with `accumulate` adds instead.
  template <gradient_value O>
  static void decode(const qsgd_quantizer<T>& codec, const reference_executor&, std::span<const std::byte> message,
                     std::span<O> out, std::span<std::byte>, const decode_limits& limits, bool accumulate) {
    namespace ref = detail::reference;
    // docs/quantizers.md §12.5: the envelope and the payload size.
    const envelope e = parse_envelope(message);
    validate_envelope(e, {codec_id::qsgd, dtype_of<T>, out.size(), codec.params_hash()}, limits);
    codec.validate_payload_size(e);
    const int bits = codec.bits();
    const std::uint32_t levels = codec.levels();
    const std::uint64_t n = e.elements;
    const std::uint64_t bucket = codec.params().bucket;
    const std::byte* const norms = message.data() + envelope::size;
    const auto* const codes = reinterpret_cast<const std::uint8_t*>(norms + codec.bucket_count(n) * sizeof(C));

    // docs/quantizers.md §12.5: every norm finite with its sign bit clear.
    for (std::uint64_t j = 0; j < codec.bucket_count(n); ++j) {
      const C norm = ref::load_value<C>(norms, j);
      detail::require(sign_bit_of(norm) == 0 && is_finite(norm), errc::malformed_payload,
                      [&] { return "norm of bucket " + std::to_string(j) + " is negative or not finite"; });
    }
    // docs/quantizers.md §12.5: no level above s, level 0 with sign 0, only code 0 under norm 0; padding bits zero.
    for (std::uint64_t i = 0; i < n; ++i) {
      const std::uint8_t code = packed_code(codes, i, bits);
      const int level = qsgd_code_level(code, bits);
      const bool zero_norm = ref::load_value<C>(norms, i / bucket) == C{0};
      detail::require(zero_norm ? code == 0 : level <= static_cast<int>(levels) && (level != 0 || code == 0),
                      errc::malformed_payload, [&] {
                        return "code " + std::to_string(i) +
                               " holds a level above s, a signed zero level, or a code under norm 0";
                      });
    }
    const std::uint64_t used_bits = n * static_cast<std::uint64_t>(bits);
    if (used_bits % 8 != 0)
      detail::require((codes[used_bits / 8] >> (used_bits % 8)) == 0, errc::malformed_payload,
                      "non-zero padding bits after the last code");

    // docs/quantizers.md §12.4 decoding: ±norm·fl(level/s), written or added (in C; a 16-bit
    // output narrowed after every result is checked to fit, docs/half-precision.md §3).
    std::vector<C> results(static_cast<std::size_t>(n));
    for (std::uint64_t i = 0; i < n; ++i) {
      const C value = qsgd_decoded(packed_code(codes, i, bits), ref::load_value<C>(norms, i / bucket), levels, bits);
      results[i] = accumulate ? widen(out[i]) + value : value;
    }
    ref::store_results(results, out);
  }

 private:
  using C = compute_type<T>;  ///< The norms' and the arithmetic's type: float32 for a 16-bit T.
};

}  // namespace gradcomp
