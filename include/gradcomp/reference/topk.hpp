#pragma once
/// @file
/// Reference backend of exact top-k (docs/sparsifiers.md §2): the specification the
/// `cpu_executor` and `cuda_executor` backends are checked against, byte for byte. Where the fast
/// backends select the k-th largest key by radix passes, the reference partitions a copy of the
/// keys (`std::nth_element`) in its workspace.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/reference/selection.hpp>
#include <gradcomp/reference/sparse_message.hpp>
#include <gradcomp/reference/values.hpp>
#include <gradcomp/sparsify/topk.hpp>

namespace gradcomp {

/// Top-k, written to be read.
template <gradient_value T>
struct backend<topk_sparsifier<T>, reference_executor> {
  using key_type = typename float_traits<T>::bits_type;

  /// A copy of the n magnitude keys.
  static std::size_t workspace_bytes(const topk_sparsifier<T>&, const reference_executor&, std::uint64_t n) {
    workspace_arena arena = workspace_arena::measure();
    (void)arena.take<key_type>(static_cast<std::size_t>(n));
    return arena.bytes_needed();
  }

  static std::size_t encode(const topk_sparsifier<T>& codec, const reference_executor&, std::span<const T> grad,
                            std::span<std::byte> out, std::span<std::byte> ws, message_key key) {
    namespace ref = detail::reference;
    const std::uint64_t n = grad.size();
    const std::uint64_t k = codec.k(n);
    const envelope header{codec_id::topk, dtype_of<T>, 0, 0, key, n, 0, codec.params_hash(), 0};
    const bool checksum = codec.wire().payload_checksum;
    // docs/sparsifiers.md §2.2 step 1: n = 0 (k = 0) sends the empty message.
    if (k == 0) return ref::write_sparse_message<T>(header, 0, checksum, grad, out, [](auto&&) {});

    // docs/sparsifiers.md §2.2 step 3: NaN or ±Inf anywhere is rejected before anything is written.
    ref::require_finite(grad);

    // docs/sparsifiers.md §2.1, §2.2 steps 2–6: K, the k-th largest magnitude key, and `ties`, how many elements of
    // key K are kept (k less those above K).
    workspace_arena arena(ws);
    const std::span<key_type> keys = arena.take<key_type>(static_cast<std::size_t>(n));
    for (std::uint64_t i = 0; i < n; ++i) keys[i] = magnitude_key(grad[i]);
    const key_type kth = ref::kth_largest(keys, k);
    const std::uint64_t ties = k - ref::count_above(grad, kth);

    // docs/sparsifiers.md §2.2 step 7: every element above K and the first `ties` elements equal to K, in ascending
    // index order (ties go to the lower index).
    return ref::write_sparse_message<T>(header, k, checksum, grad, out,
                                        [&](auto&& visit) { ref::for_each_kept(grad, kth, ties, visit); });
  }

  /// Decodes into `out` of T, or (a 16-bit T) of float32; with `accumulate` adds instead.
  template <gradient_value O>
  static void decode(const topk_sparsifier<T>& codec, const reference_executor&, std::span<const std::byte> message,
                     std::span<O> out, std::span<std::byte>, const decode_limits& limits, bool accumulate) {
    detail::reference::decode_sparse_message<T, O>(message,
                                                   {codec_id::topk, dtype_of<T>, out.size(), codec.params_hash()},
                                                   limits, out, accumulate);
  }
};

}  // namespace gradcomp
