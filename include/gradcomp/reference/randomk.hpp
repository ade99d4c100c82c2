#pragma once
/// @file
/// Reference backend of the random-k sparsifier (docs/sparsifiers.md §3): the specification the
/// `cpu_executor` and `cuda_executor` backends are checked against, byte for byte.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/narrowing.hpp>
#include <gradcomp/core/random_permutation.hpp>
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/core/rounded_product.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/reference/values.hpp>
#include <gradcomp/sparsify/randomk.hpp>

namespace gradcomp {

/// Random-k, written to be read.
template <gradient_value T>
struct backend<randomk_sparsifier<T>, reference_executor> {
  using R = compute_type<T>;  ///< The decoder's arithmetic: float32 for a 16-bit gradient.

  static std::size_t workspace_bytes(const randomk_sparsifier<T>&, const reference_executor&, std::uint64_t) noexcept {
    return 0;
  }

  static std::size_t encode(const randomk_sparsifier<T>& codec, const reference_executor&, std::span<const T> grad,
                            std::span<std::byte> out, std::span<std::byte>, message_key key) {
    namespace ref = detail::reference;
    const std::uint64_t n = grad.size();
    const std::uint64_t k = codec.k(n);
    const std::size_t size = codec.max_encoded_bytes(n);
    detail::begin_host_message(out, size);
    std::byte* const values = out.data() + envelope::size;
    // Selection: the kept indices are π(0), …, π(k − 1) for the keyed permutation π.
    // Encode: value j is grad[π(j)], copied bit for bit; only selected values must be finite.
    if (k > 0) {
      const random_permutation pick = codec.permutation(n, key);
      for (std::uint64_t j = 0; j < k; ++j) {
        const std::uint64_t i = pick(j);
        detail::require(is_finite(grad[i]), errc::non_finite_input,
                        [&] { return "gradient value " + std::to_string(i) + " is NaN or Inf"; });
        ref::store_value(values, j, grad[i]);
      }
    }
    seal(codec, out.first(size), n, key);
    return size;
  }

  /// Into `out` of the gradient's type or, for a 16-bit gradient, float32.
  template <gradient_value O>
  static void decode(const randomk_sparsifier<T>& codec, const reference_executor&, std::span<const std::byte> message,
                     std::span<O> out, std::span<std::byte>, const decode_limits& limits, bool accumulate) {
    namespace ref = detail::reference;
    // Decode: validation (docs/wire-format.md §5), including every v_j·s finite (in the compute
    // type R: float32 for a 16-bit gradient).
    const envelope e = checked_envelope(codec, message, out.size(), limits);
    const std::uint64_t n = e.elements;
    const std::uint64_t k = codec.k(n);
    const std::byte* const values = message.data() + envelope::size;
    const R scale =
        k > 0 && codec.params().scaled ? static_cast<R>(static_cast<double>(n) / static_cast<double>(k)) : R{1};
    for (std::uint64_t j = 0; j < k; ++j)
      detail::require(is_finite(widen(ref::load_value<T>(values, j)) * scale), errc::malformed_payload, [&] {
        return "value at position " + std::to_string(j) + " is non-finite or overflows when scaled";
      });
    if (k == 0) {
      if (!accumulate)
        for (O& v : out) v = O{};
      return;
    }
    const random_permutation pick = codec.permutation(n, e.key);
    // Result j: v_j·s, or out[π(j)] + v_j·s, in R.
    const auto result = [&](std::uint64_t j, std::uint64_t i) {
      const R value = mul_rn(widen(ref::load_value<T>(values, j)), scale);
      return accumulate ? static_cast<R>(widen(out[i]) + value) : value;
    };
    // A 16-bit output: every result checked to fit before the first write.
    if constexpr (half_precision<O>) {
      for (std::uint64_t j = 0; j < k; ++j) {
        const std::uint64_t i = pick(j);
        detail::require_narrows<O>(i, result(j, i));
      }
    }
    // Then zeros (unless accumulating) and dense[π(j)] = v_j·s, or += v_j·s.
    if (!accumulate)
      for (O& v : out) v = O{};
    for (std::uint64_t j = 0; j < k; ++j) {
      const std::uint64_t i = pick(j);
      out[i] = ref::to_output<O>(result(j, i));
    }
  }

  /// Homomorphic sum: both messages checked, equal keys, every sum finite (and, for 16-bit values,
  /// finite once rounded to the type); then acc's values are replaced by the sums (rounded to the
  /// type, nearest even) and its envelope rewritten.
  static void accumulate_encoded(const randomk_sparsifier<T>& codec, const reference_executor&,
                                 std::span<std::byte> acc, std::span<const std::byte> other) {
    namespace ref = detail::reference;
    const envelope mine = checked_envelope(codec, acc, parse_envelope(acc).elements, {});
    const envelope theirs = checked_envelope(codec, other, mine.elements, {});
    detail::require(mine.key == theirs.key, errc::step_mismatch,
                    "messages of different steps or tensors cannot be summed");
    const std::uint64_t k = codec.k(mine.elements);
    std::byte* const sums = acc.data() + envelope::size;
    const std::byte* const addends = other.data() + envelope::size;
    const auto sum = [&](std::uint64_t j) {
      return static_cast<R>(widen(ref::load_value<T>(sums, j)) + widen(ref::load_value<T>(addends, j)));
    };
    const auto fits = [&](R v) {
      if constexpr (half_precision<T>) return narrows_finite<T>(v);
      else
        return is_finite(v);
    };
    for (std::uint64_t j = 0; j < k; ++j)
      detail::require(fits(sum(j)), errc::non_finite_input,
                      [&] { return "sum overflows at position " + std::to_string(j); });
    for (std::uint64_t j = 0; j < k; ++j) ref::store_value(sums, j, ref::to_output<T>(sum(j)));
    seal(codec, acc, mine.elements, mine.key);
  }

 private:
  /// Writes the envelope of a message whose k values are in place.
  static void seal(const randomk_sparsifier<T>& codec, std::span<std::byte> message, std::uint64_t n, message_key key) {
    detail::seal_host_message(message,
                              {codec_id::random_k, dtype_of<T>, 0, 0, key, n, message.size() - envelope::size,
                               codec.params_hash(), 0},
                              codec.wire().payload_checksum);
  }

  /// The envelope of a random-k message for `elements` elements, its layout and payload size checked.
  static envelope checked_envelope(const randomk_sparsifier<T>& codec, std::span<const std::byte> message,
                                   std::uint64_t elements, const decode_limits& limits) {
    const envelope e = parse_envelope(message);
    validate_envelope(e, {codec_id::random_k, dtype_of<T>, elements, codec.params_hash()}, limits);
    codec.validate_payload_size(e);
    return e;
  }
};

}  // namespace gradcomp
