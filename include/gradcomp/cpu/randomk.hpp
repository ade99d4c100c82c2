#pragma once
/// @file
/// CPU reference of random-k: gather the values at π(0..k−1), scatter them back on decode.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/crc32c.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/rounded_product.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/cpu/message.hpp>
#include <gradcomp/sparsify/randomk.hpp>

namespace gradcomp {

/// Random-k on the CPU.
template <gradient_value T>
struct backend<randomk_sparsifier<T>, cpu_executor> {
  static std::size_t workspace_bytes(const randomk_sparsifier<T>&, const cpu_executor&, std::uint64_t) noexcept {
    return 0;
  }

  static std::size_t encode(const randomk_sparsifier<T>& codec, const cpu_executor&, std::span<const T> grad,
                            std::span<std::byte> out, std::span<std::byte>, message_key key) {
    const std::uint64_t n = grad.size();
    const std::uint64_t k = codec.k(n);
    const std::size_t size = codec.max_encoded_bytes(n);
    cpu::begin_message(out, size);
    std::byte* const values = out.data() + envelope::size;
    if (k > 0) {
      const random_permutation pick = codec.permutation(n, key);
      for (std::uint64_t j = 0; j < k; ++j) {
        const std::uint64_t i = pick(j);
        detail::require(is_finite(grad[i]), errc::non_finite_input,
                        [&] { return "gradient value " + std::to_string(i) + " is NaN or Inf"; });
        std::memcpy(values + j * sizeof(T), &grad[i], sizeof(T));
      }
    }
    seal(codec, out.first(size), n, key);
    return size;
  }

  static void decode(const randomk_sparsifier<T>& codec, const cpu_executor&, std::span<const std::byte> message,
                     std::span<T> out, std::span<std::byte>, const decode_limits& limits, bool accumulate) {
    const envelope e = parse_checked(codec, message, out.size(), limits);
    const std::uint64_t n = e.elements;
    const std::uint64_t k = codec.k(n);
    const std::byte* const values = message.data() + envelope::size;
    const T scale = k == 0 || !codec.params().scaled ? T{1} : static_cast<T>(static_cast<double>(n) / static_cast<double>(k));
    for (std::uint64_t j = 0; j < k; ++j)
      detail::require(is_finite(value_at(values, j) * scale), errc::malformed_payload,
                      [&] { return "value at position " + std::to_string(j) + " is non-finite or overflows when scaled"; });
    if (!accumulate) std::fill(out.begin(), out.end(), T{0});
    if (k == 0) return;
    const random_permutation pick = codec.permutation(n, e.key);
    T* const dense = out.data();
    for (std::uint64_t j = 0; j < k; ++j) {
      const T v = mul_rn(value_at(values, j), scale);
      if (accumulate) dense[pick(j)] += v;
      else dense[pick(j)] = v;
    }
  }

  static void accumulate_encoded(const randomk_sparsifier<T>& codec, const cpu_executor&, std::span<std::byte> acc,
                                 std::span<const std::byte> other) {
    const envelope mine = parse_checked(codec, acc, parse_envelope(acc).elements, {});
    const envelope theirs = parse_checked(codec, other, mine.elements, {});
    detail::require(mine.key == theirs.key, errc::step_mismatch,
                    "messages of different steps or tensors cannot be summed");
    const std::uint64_t k = codec.k(mine.elements);
    std::byte* const sum = acc.data() + envelope::size;
    const std::byte* const add = other.data() + envelope::size;
    for (std::uint64_t j = 0; j < k; ++j)
      detail::require(is_finite(value_at(sum, j) + value_at(add, j)), errc::non_finite_input,
                      [&] { return "sum overflows at position " + std::to_string(j); });
    for (std::uint64_t j = 0; j < k; ++j) {
      const T v = value_at(sum, j) + value_at(add, j);
      std::memcpy(sum + j * sizeof(T), &v, sizeof v);
    }
    seal(codec, acc, mine.elements, mine.key);
  }

 private:
  [[nodiscard]] static T value_at(const std::byte* values, std::uint64_t j) noexcept {
    T v;
    std::memcpy(&v, values + j * sizeof(T), sizeof v);
    return v;
  }

  /// Writes the envelope of a message whose values are already in place.
  static void seal(const randomk_sparsifier<T>& codec, std::span<std::byte> message, std::uint64_t n, message_key key) {
    cpu::seal_message(message, {codec_id::random_k, dtype_of<T>, 0, 0, key, n, message.size() - envelope::size, codec.params_hash(), 0},
                      codec.wire().payload_checksum);
  }


  /// Parses and validates a random-k message for an `elements`-element buffer.
  static envelope parse_checked(const randomk_sparsifier<T>& codec, std::span<const std::byte> message,
                                std::uint64_t elements, const decode_limits& limits) {
    const envelope e = parse_envelope(message);
    validate_envelope(e, {codec_id::random_k, dtype_of<T>, elements, codec.params_hash()}, limits);
    codec.validate_payload_size(e);
    return e;
  }
};

}  // namespace gradcomp
