#pragma once
/// @file
/// Random-k on the CPU: the reference backend (reference/randomk.hpp). Encoding gathers k values
/// at keyed positions and decoding scatters them; the positions come from a Feistel permutation
/// evaluated one at a time, so the host has nothing faster to offer than the plain loops.

#include <cstddef>
#include <cstdint>
#include <span>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/reference/randomk.hpp>
#include <gradcomp/sparsify/randomk.hpp>

namespace gradcomp {

/// Random-k on the CPU: forwards to the reference backend.
template <gradient_value T>
struct backend<randomk_sparsifier<T>, cpu_executor> {
  using reference = backend<randomk_sparsifier<T>, reference_executor>;

  static std::size_t workspace_bytes(const randomk_sparsifier<T>& codec, const cpu_executor&, std::uint64_t n) {
    return reference::workspace_bytes(codec, reference_executor{}, n);
  }

  static std::size_t encode(const randomk_sparsifier<T>& codec, const cpu_executor&, std::span<const T> grad,
                            std::span<std::byte> out, std::span<std::byte> ws, message_key key) {
    return reference::encode(codec, reference_executor{}, grad, out, ws, key);
  }

  template <gradient_value O>
  static void decode(const randomk_sparsifier<T>& codec, const cpu_executor&, std::span<const std::byte> message,
                     std::span<O> out, std::span<std::byte> ws, const decode_limits& limits, bool accumulate) {
    reference::decode(codec, reference_executor{}, message, out, ws, limits, accumulate);
  }

  static void accumulate_encoded(const randomk_sparsifier<T>& codec, const cpu_executor&, std::span<std::byte> acc,
                                 std::span<const std::byte> other) {
    reference::accumulate_encoded(codec, reference_executor{}, acc, other);
  }
};

}  // namespace gradcomp
