#pragma once
/// @file
/// Reference backend of the uniform quantizer (docs/quantizers.md §2–§5): the specification the
/// `cpu_executor` and `cuda_executor` backends are checked against, byte for byte; bf16 and fp16
/// gradients as docs/half-precision.md §2–§3 say.

#include <algorithm>
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
#include <gradcomp/core/rounded_product.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/quantize/uniform.hpp>
#include <gradcomp/quantize/sign_math.hpp>
#include <gradcomp/quantize/uniform_math.hpp>
#include <gradcomp/reference/values.hpp>

namespace gradcomp {

namespace detail::reference {

/// The code of element i, of value h, in a block of largest magnitude m and step s
/// (docs/quantizers.md §2.3–§2.5); `stream` gives stochastic rounding's numbers.
template <gradient_value T>
[[nodiscard]] std::uint8_t uniform_value_code(T h, std::uint64_t i, T m, T s, int bits, rounding mode,
                                              const random_stream& stream) noexcept {
  // docs/quantizers.md §2.3 scaling: t = h·inv with inv = L/m, or h/s when inv overflows, or 0 when s = 0.
  const T inv = m > T{0} ? static_cast<T>(uniform_levels(bits)) / m : T{0};
  T t = T{0};
  if (s != T{0}) t = m > T{0} && is_finite(inv) ? mul_rn(h, inv) : h / s;
  // docs/quantizers.md §2.4: u = h·2^-16, h the 16-bit half i mod 2 (low half first) of word ⌊i/2⌋ of the stream.
  T u = T{0};
  if (mode == rounding::stochastic)
    u = static_cast<T>(static_cast<std::uint16_t>(stream.word(i / 2) >> (16 * (i % 2)))) *
        static_cast<T>(1.0 / 65536.0);
  // docs/quantizers.md §2.3 rounding to a level q, docs/quantizers.md §2.5 its code.
  return uniform_code(uniform_level(t, bits, mode, u), bits);
}

}  // namespace detail::reference

/// The uniform quantizer, written to be read.
template <gradient_value T>
struct backend<uniform_quantizer<T>, reference_executor> {
  static std::size_t workspace_bytes(const uniform_quantizer<T>&, const reference_executor&, std::uint64_t) noexcept {
    return 0;
  }

  static std::size_t encode(const uniform_quantizer<T>& codec, const reference_executor&, std::span<const T> grad,
                            std::span<std::byte> out, std::span<std::byte>, message_key key) {
    namespace ref = detail::reference;
    const std::uint64_t n = grad.size();
    const int bits = codec.bits();
    const std::uint64_t block = codec.params().block;
    const rounding mode = codec.params().round;
    const std::size_t size = codec.max_encoded_bytes(n);
    detail::begin_host_message(out, size);
    std::byte* const scales = out.data() + envelope::size;
    auto* const codes = reinterpret_cast<std::uint8_t*>(scales + codec.block_count(n) * sizeof(C));

    // docs/quantizers.md §5: a gradient holding NaN or ±Inf is rejected; the envelope stays zero.
    ref::require_finite(grad);

    // Block by block: docs/quantizers.md §2.2 the step s from the largest magnitude m, stored as the scale; then
    // docs/quantizers.md §2.3–§2.5 each value's level, stored as a b-bit code at bit i·b of the code array (docs/quantizers.md §4).
    // A bf16 or fp16 value is widened to float32 first, exactly (docs/half-precision.md §2).
    std::memset(codes, 0, static_cast<std::size_t>(packed_bytes(n, bits)));
    const random_stream stream{codec.params().seed, key.step, key.tensor_id, random_purpose::stochastic_rounding};
    for (std::uint64_t j = 0; j < codec.block_count(n); ++j) {
      const std::uint64_t begin = j * block;
      const std::uint64_t end = std::min(n, begin + block);
      const C m = ref::max_magnitude(grad, begin, end);
      const C s = uniform_step(m, bits);
      ref::store_value(scales, j, s);
      for (std::uint64_t i = begin; i < end; ++i) {
        const std::uint8_t code = ref::uniform_value_code(widen(grad[i]), i, m, s, bits, mode, stream);
        const std::uint64_t bit = i * static_cast<std::uint64_t>(bits);
        codes[bit / 8] = static_cast<std::uint8_t>(codes[bit / 8] | code << (bit % 8));
      }
    }

    // The envelope last (docs/wire-format.md).
    detail::seal_host_message(out,
                              {codec_id::uniform, dtype_of<T>, 0, 0, key, n, codec.payload_bytes(n),
                               codec.params_hash(), 0},
                              codec.wire().payload_checksum);
    return size;
  }

  /// Decodes into `out` of T, or (a 16-bit T) of float32; with `accumulate` adds instead.
  template <gradient_value O>
  static void decode(const uniform_quantizer<T>& codec, const reference_executor&, std::span<const std::byte> message,
                     std::span<O> out, std::span<std::byte>, const decode_limits& limits, bool accumulate) {
    namespace ref = detail::reference;
    // docs/quantizers.md §4: the envelope and the payload size.
    const envelope e = parse_envelope(message);
    validate_envelope(e, {codec_id::uniform, dtype_of<T>, out.size(), codec.params_hash()}, limits);
    codec.validate_payload_size(e);
    const int bits = codec.bits();
    const std::uint64_t n = e.elements;
    const std::uint64_t block = codec.params().block;
    const std::byte* const scales = message.data() + envelope::size;
    const auto* const codes = reinterpret_cast<const std::uint8_t*>(scales + codec.block_count(n) * sizeof(C));
    const int levels = uniform_levels(bits);

    // docs/quantizers.md §4: every scale non-negative (sign bit clear) with L·s finite.
    for (std::uint64_t j = 0; j < codec.block_count(n); ++j) {
      const C s = ref::load_value<C>(scales, j);
      detail::require(sign_bit_of(s) == 0 && is_finite(s * static_cast<C>(levels)), errc::malformed_payload,
                      [&] { return "scale of block " + std::to_string(j) + " is negative or too large"; });
    }
    // docs/quantizers.md §4: every code at most 2L (b ≥ 2), and the padding bits after the last code zero.
    for (std::uint64_t i = 0; i < n; ++i)
      detail::require(bits == 1 || packed_code(codes, i, bits) <= 2 * levels, errc::malformed_payload,
                      "a code exceeds the largest level");
    const std::uint64_t used_bits = n * static_cast<std::uint64_t>(bits);
    if (used_bits % 8 != 0)
      detail::require((codes[used_bits / 8] >> (used_bits % 8)) == 0, errc::malformed_payload,
                      "non-zero padding bits after the last code");

    // docs/quantizers.md §2.5: the decoded value q·s, added to the output's value in C when
    // accumulating; then written, narrowed to a 16-bit output (docs/half-precision.md §3), which
    // must not overflow: every result is checked before the first is written.
    std::vector<C> results(static_cast<std::size_t>(n));
    for (std::uint64_t i = 0; i < n; ++i) {
      const C s = ref::load_value<C>(scales, i / block);
      const C value = mul_rn(static_cast<C>(uniform_code_level(packed_code(codes, i, bits), bits)), s);
      results[i] = accumulate ? widen(out[i]) + value : value;
    }
    ref::store_results(results, out);
  }

 private:
  using C = compute_type<T>;  ///< The arithmetic's type: float32 for a 16-bit T.
};

}  // namespace gradcomp
