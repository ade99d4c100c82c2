#pragma once
/// @file
/// Reference backend of the sampled-threshold sparsifier (docs/sparsifiers.md §4): the
/// specification the `cpu_executor` and `cuda_executor` backends are checked against, byte for
/// byte. Where the fast backends select keys by radix passes, the reference partitions a copy of
/// the keys (`std::nth_element`) in its workspace.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/reference/selection.hpp>
#include <gradcomp/reference/sparse_message.hpp>
#include <gradcomp/reference/values.hpp>
#include <gradcomp/sparsify/threshold.hpp>

namespace gradcomp {

/// Threshold sparsification, written to be read.
template <gradient_value T>
struct backend<threshold_sparsifier<T>, reference_executor> {
  using key_type = typename float_traits<T>::bits_type;

  /// Room for n magnitude keys: the sample (s ≤ n), then the survivors' keys.
  static std::size_t workspace_bytes(const threshold_sparsifier<T>&, const reference_executor&, std::uint64_t n) {
    workspace_arena arena = workspace_arena::measure();
    (void)arena.take<key_type>(static_cast<std::size_t>(n));
    return arena.bytes_needed();
  }

  static threshold_report<T> encode_with_report(const threshold_sparsifier<T>& codec, const reference_executor&,
                                                std::span<const T> grad, std::span<std::byte> out,
                                                std::span<std::byte> ws, message_key key) {
    namespace ref = detail::reference;
    __extension__ using wide = unsigned __int128;
    const std::uint64_t n = grad.size();
    const std::uint64_t k = codec.k(n);
    const envelope header{codec_id::threshold, dtype_of<T>, 0, 0, key, n, 0, codec.params_hash(), 0};
    const bool checksum = codec.wire().payload_checksum;
    // docs/sparsifiers.md §4.1 step 1: n = 0 sends the empty message.
    if (n == 0)
      return {ref::write_sparse_message<T>(header, 0, checksum, grad, out, [](auto&&) {}), 0, 0, compute_type<T>{0},
              0.0};

    // docs/sparsifiers.md §4.1 step 6: NaN or ±Inf anywhere is rejected (every one of them would be kept and sent).
    ref::require_finite(grad);

    // docs/sparsifiers.md §4.1 step 2: s sampled keys: all of them in index order when s = n, else positions drawn with
    // replacement, sample j at scale_to_range(word 2j | word 2j+1 << 32, n).
    workspace_arena arena(ws);
    const std::span<key_type> keys = arena.take<key_type>(static_cast<std::size_t>(n));
    const std::uint64_t s = codec.sample_count(n);
    const random_stream stream{codec.params().seed, key.step, key.tensor_id, random_purpose::threshold_sample};
    for (std::uint64_t j = 0; j < s; ++j) {
      const std::uint64_t position =
          s == n ? j : scale_to_range(stream.word(2 * j) | std::uint64_t{stream.word(2 * j + 1)} << 32, n);
      keys[j] = magnitude_key(grad[position]);
    }

    // docs/sparsifiers.md §4.1 step 3: τ, the m-th largest sampled key, m = ⌈k·s/n⌉ clamped to [1, s]; τ clamped to
    // [1, infinity_key], so exact zeros are never kept.
    const auto m = std::clamp<std::uint64_t>(static_cast<std::uint64_t>((wide{k} * s + n - 1) / n), 1, s);
    const key_type tau = std::clamp<key_type>(ref::kth_largest(keys.first(static_cast<std::size_t>(s)), m), 1,
                                              float_traits<T>::infinity_key);

    // docs/sparsifiers.md §4.1 step 4: the survivors, every element with key ≥ τ.
    std::uint64_t survivors = 0;
    for (std::uint64_t i = 0; i < n; ++i)
      if (magnitude_key(grad[i]) >= tau) keys[survivors++] = magnitude_key(grad[i]);

    // docs/sparsifiers.md §4.1 step 5: when more than 1.3·k survive (10·count > 13·k) and `refine` is on, keep the
    // survivors above their k-th largest key K and the first `ties` at K; otherwise all of them.
    const bool refine = codec.params().refine && wide{survivors} * 10 > wide{k} * 13;
    const key_type kth = refine ? ref::kth_largest(keys.first(static_cast<std::size_t>(survivors)), k) : tau;
    const std::uint64_t ties = refine ? k - ref::count_above(grad, kth) : UINT64_MAX;
    const std::uint64_t count = refine ? k : survivors;

    // docs/sparsifiers.md §4.1 step 6: the sparse message of the kept elements, in ascending index order.
    const std::size_t bytes = ref::write_sparse_message<T>(header, count, checksum, grad, out, [&](auto&& visit) {
      ref::for_each_kept(grad, kth, ties, visit);
    });
    return {bytes, count, k, widen(from_bits<T>(tau)), static_cast<double>(count) / static_cast<double>(n)};
  }

  /// Decodes into `out` of T, or (a 16-bit T) of float32; with `accumulate` adds instead.
  template <gradient_value O>
  static void decode(const threshold_sparsifier<T>& codec, const reference_executor&,
                     std::span<const std::byte> message, std::span<O> out, std::span<std::byte>,
                     const decode_limits& limits, bool accumulate) {
    detail::reference::decode_sparse_message<T, O>(message,
                                                   {codec_id::threshold, dtype_of<T>, out.size(), codec.params_hash()},
                                                   limits, out, accumulate);
  }
};

}  // namespace gradcomp
