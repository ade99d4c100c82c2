#pragma once
/// @file
/// CPU backend of exact top-k (its specification is reference/topk.hpp). Pass 1 histograms the top
/// 11 bits of every |x| key and finds the bucket b holding the k-th key. Pass 2 lists, in ascending
/// order, the indices whose key bucket is at least b (about k plus the bucket's population); radix
/// selection over that list's bucket-b keys finds the exact k-th key, and the message is written
/// from the list. When the list would not fit its workspace (heavy ties, large k), selection
/// descends with further histogram passes over the data and a final pass writes the message.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cpu/detail/radix_select.hpp>
#include <gradcomp/cpu/detail/sparse_coding.hpp>
#include <gradcomp/sparsify/topk.hpp>

namespace gradcomp {

/// Top-k on the CPU.
template <gradient_value T>
struct backend<topk_sparsifier<T>, cpu_executor> {
  using key_type = typename float_traits<T>::bits_type;
  static constexpr int key_bits = float_traits<T>::magnitude_bits;
  static constexpr int first_shift = key_bits - detail::cpu::radix_digit_bits;

  /// Indices the candidate list holds: a sixteenth of n, or all of a small tensor.
  [[nodiscard]] static std::uint64_t list_capacity(std::uint64_t n) noexcept {
    return std::max<std::uint64_t>(n / 16, std::min<std::uint64_t>(n, 65536));
  }

  template <class Index>
  struct scratch {
    std::span<std::uint64_t> histogram;
    std::span<std::uint32_t> sub_histograms;
    std::span<Index> list;
  };

  template <class Index>
  static scratch<Index> carve(workspace_arena& arena, std::uint64_t n) {
    scratch<Index> s;
    s.histogram = arena.take<std::uint64_t>(detail::cpu::radix_buckets);
    s.sub_histograms = arena.take<std::uint32_t>(detail::cpu::histogram_scratch_counters);
    s.list = arena.take<Index>(static_cast<std::size_t>(list_capacity(n)) + detail::cpu::collect_slack);
    return s;
  }

  static std::size_t workspace_bytes(const topk_sparsifier<T>&, const cpu_executor&, std::uint64_t n) {
    workspace_arena arena = workspace_arena::measure();
    if (n <= (std::uint64_t{1} << 32)) carve<std::uint32_t>(arena, n);
    else
      carve<std::uint64_t>(arena, n);
    return arena.bytes_needed();
  }

  static std::size_t encode(const topk_sparsifier<T>& codec, const cpu_executor&, std::span<const T> grad,
                            std::span<std::byte> out, std::span<std::byte> ws, message_key key) {
    if (grad.size() <= (std::uint64_t{1} << 32)) return encode_indexed<std::uint32_t>(codec, grad, out, ws, key);
    return encode_indexed<std::uint64_t>(codec, grad, out, ws, key);
  }

  /// Decodes into `out` of T, or (a 16-bit T) of float32; with `accumulate` adds instead.
  template <gradient_value O>
  static void decode(const topk_sparsifier<T>& codec, const cpu_executor&, std::span<const std::byte> message,
                     std::span<O> out, std::span<std::byte>, const decode_limits& limits, bool accumulate) {
    detail::cpu::decode_sparse_message<T, O>(message, {codec_id::topk, dtype_of<T>, out.size(), codec.params_hash()},
                                             limits, out, accumulate);
  }

 private:
  template <class Index>
  static std::size_t encode_indexed(const topk_sparsifier<T>& codec, std::span<const T> grad, std::span<std::byte> out,
                                    std::span<std::byte> ws, message_key key) {
    const std::uint64_t n = grad.size();
    const std::uint64_t k = codec.k(n);
    const envelope header{codec_id::topk, dtype_of<T>, 0, 0, key, n, 0, codec.params_hash(), 0};
    const bool checksum = codec.wire().payload_checksum;
    if (k == 0) return detail::cpu::write_sparse_message<T>(header, 0, checksum, out, [](auto&) {});

    workspace_arena arena(ws);
    const scratch<Index> s = carve<Index>(arena, n);
    detail::cpu::magnitude_histogram<T>(grad, s.histogram, s.sub_histograms);
    const std::uint64_t non_finite = detail::cpu::non_finite_count<T>(s.histogram);
    detail::require(non_finite == 0, errc::non_finite_input, [&] {
      return std::to_string(non_finite) + " of " + std::to_string(n) + " gradient values are NaN or Inf";
    });

    const detail::cpu::bucket_choice choice = detail::cpu::choose_bucket(s.histogram, k);
    const std::uint64_t rank = k - choice.above;
    const auto bucket = static_cast<key_type>(choice.bucket);
    const T* const g = grad.data();

    if (choice.above + s.histogram[choice.bucket] <= list_capacity(n)) {
      Index* const list = s.list.data();
      const std::size_t count =
          detail::cpu::collect_at_least<T>(grad, static_cast<key_type>(bucket << first_shift), list);
      const detail::cpu::kth_key<key_type> kth = detail::cpu::select_kth_largest<key_type>(
          [&](auto&& visit) {
            for (std::size_t j = 0; j < count; ++j) visit(magnitude_key(g[list[j]]));
          },
          key_bits, rank, bucket, detail::cpu::radix_digit_bits, s.histogram);
      return detail::cpu::write_sparse_message<T>(header, k, checksum, out, [&](auto& sink) {
        std::uint64_t ties = kth.ties;
        for (std::size_t j = 0; j < count; ++j) push_if_kept(sink, list[j], g[list[j]], kth.key, ties);
      });
    }

    const detail::cpu::kth_key<key_type> kth = detail::cpu::select_kth_largest<key_type>(
        [&](auto&& visit) {
          for (const T v : grad) visit(magnitude_key(v));
        },
        key_bits, rank, bucket, detail::cpu::radix_digit_bits, s.histogram);
    return detail::cpu::write_sparse_message<T>(header, k, checksum, out, [&](auto& sink) {
      std::uint64_t ties = kth.ties;
      detail::cpu::for_each_at_least<T>(grad, kth.key,
                                        [&](std::size_t i) { push_if_kept(sink, i, g[i], kth.key, ties); });
    });
  }

  /// Keeps a value above the k-th key, or equal to it while ties remain (lowest indices first).
  template <class Sink>
  static void push_if_kept(Sink& sink, std::uint64_t i, T v, key_type kth_key, std::uint64_t& ties) {
    const key_type key_v = magnitude_key(v);
    if (key_v > kth_key) {
      sink.push(i, v);
    } else if (key_v == kth_key && ties > 0) {
      sink.push(i, v);
      --ties;
    }
  }
};

}  // namespace gradcomp
