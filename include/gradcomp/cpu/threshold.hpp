#pragma once
/// @file
/// CPU backend of the sampled-threshold sparsifier (its specification is reference/threshold.hpp):
/// sample, select τ among the sample, one selection pass into an index list, optional exact
/// refinement, then the sparse message.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cpu/detail/radix_select.hpp>
#include <gradcomp/cpu/detail/sparse_coding.hpp>
#include <gradcomp/sparsify/threshold.hpp>

namespace gradcomp {

/// Threshold sparsification on the CPU.
template <gradient_value T>
struct backend<threshold_sparsifier<T>, cpu_executor> {
  using key_type = typename float_traits<T>::bits_type;

  template <class Index>
  struct scratch {
    std::span<key_type> sample;
    std::span<Index> kept;
    std::span<std::uint64_t> histogram;
  };

  template <class Index>
  static scratch<Index> carve(workspace_arena& arena, const threshold_sparsifier<T>& codec, std::uint64_t n) {
    scratch<Index> s;
    s.sample = arena.take<key_type>(static_cast<std::size_t>(codec.sample_count(n)));
    s.kept = arena.take<Index>(static_cast<std::size_t>(n) + detail::cpu::collect_slack);
    s.histogram = arena.take<std::uint64_t>(detail::cpu::radix_buckets);
    return s;
  }

  static std::size_t workspace_bytes(const threshold_sparsifier<T>& codec, const cpu_executor&, std::uint64_t n) {
    workspace_arena arena = workspace_arena::measure();
    if (n <= (std::uint64_t{1} << 32)) carve<std::uint32_t>(arena, codec, n);
    else
      carve<std::uint64_t>(arena, codec, n);
    return arena.bytes_needed();
  }

  static threshold_report<T> encode_with_report(const threshold_sparsifier<T>& codec, const cpu_executor&,
                                                std::span<const T> grad, std::span<std::byte> out,
                                                std::span<std::byte> ws, message_key key) {
    if (grad.size() <= (std::uint64_t{1} << 32)) return encode_indexed<std::uint32_t>(codec, grad, out, ws, key);
    return encode_indexed<std::uint64_t>(codec, grad, out, ws, key);
  }

  /// Decodes into `out` of T, or (a 16-bit T) of float32; with `accumulate` adds instead.
  template <gradient_value O>
  static void decode(const threshold_sparsifier<T>& codec, const cpu_executor&, std::span<const std::byte> message,
                     std::span<O> out, std::span<std::byte>, const decode_limits& limits, bool accumulate) {
    detail::cpu::decode_sparse_message<T, O>(message,
                                             {codec_id::threshold, dtype_of<T>, out.size(), codec.params_hash()},
                                             limits, out, accumulate);
  }

 private:
  /// τ as a magnitude key: the m-th largest sampled key, m = ⌈k·s/n⌉ (at least 1).
  static key_type estimate_threshold(const threshold_sparsifier<T>& codec, std::span<const T> grad, std::uint64_t k,
                                     std::span<key_type> sample, std::span<std::uint64_t> histogram, message_key key) {
    const std::uint64_t n = grad.size();
    const std::uint64_t s = sample.size();
    if (s == n) {
      for (std::uint64_t j = 0; j < n; ++j) sample[j] = magnitude_key(grad[j]);
    } else {
      // Sample j reads x[⌊r·n/2^64⌋] for the 64-bit word r = stream words (2j, 2j+1). Positions are
      // drawn a chunk ahead of the loads so that the cache misses overlap.
      const random_stream stream{codec.params().seed, key.step, key.tensor_id, random_purpose::threshold_sample};
      constexpr std::uint64_t chunk = 256;
      std::uint64_t position[chunk];
      for (std::uint64_t begin = 0; begin < s; begin += chunk) {
        const std::uint64_t end = std::min(s, begin + chunk);
        for (std::uint64_t j = begin; j < end; j += 2) {
          const philox_block words = stream.block(j / 2);
          position[j - begin] = scale_to_range(words.word[0] | std::uint64_t{words.word[1]} << 32, n);
          position[j - begin + 1] = scale_to_range(words.word[2] | std::uint64_t{words.word[3]} << 32, n);
        }
        for (std::uint64_t j = begin; j < end; ++j) sample[j] = magnitude_key(grad[position[j - begin]]);
      }
    }
    // m = ⌈k·s/n⌉ sampled keys lie at or above τ, in exact integer arithmetic.
    __extension__ using wide = unsigned __int128;
    const auto m = static_cast<std::uint64_t>((wide{k} * s + n - 1) / n);
    const detail::cpu::kth_key<key_type> kth = detail::cpu::select_kth_largest<key_type>(
        [&](auto&& visit) {
          for (const key_type sampled : sample) visit(sampled);
        },
        float_traits<T>::magnitude_bits, std::clamp<std::uint64_t>(m, 1, s), key_type{0}, 0, histogram);
    return std::clamp<key_type>(kth.key, 1, float_traits<T>::infinity_key);
  }

  template <class Index>
  static threshold_report<T> encode_indexed(const threshold_sparsifier<T>& codec, std::span<const T> grad,
                                            std::span<std::byte> out, std::span<std::byte> ws, message_key key) {
    const std::uint64_t n = grad.size();
    const std::uint64_t k = codec.k(n);
    const envelope header{codec_id::threshold, dtype_of<T>, 0, 0, key, n, 0, codec.params_hash(), 0};
    const bool checksum = codec.wire().payload_checksum;
    if (n == 0)
      return {detail::cpu::write_sparse_message<T>(header, 0, checksum, out, [](auto&) {}), 0, 0, compute_type<T>{0},
              0.0};

    workspace_arena arena(ws);
    const scratch<Index> s = carve<Index>(arena, codec, n);
    const key_type tau = estimate_threshold(codec, grad, k, s.sample, s.histogram, key);

    const T* const g = grad.data();
    Index* const kept = s.kept.data();
    std::uint64_t count = detail::cpu::collect_at_least<T>(grad, tau, kept);

    __extension__ using wide = unsigned __int128;
    if (codec.params().refine && wide{count} * 10 > wide{k} * 13) {
      const detail::cpu::kth_key<key_type> kth = detail::cpu::select_kth_largest<key_type>(
          [&](auto&& visit) {
            for (std::uint64_t j = 0; j < count; ++j) visit(magnitude_key(g[kept[j]]));
          },
          float_traits<T>::magnitude_bits, k, key_type{0}, 0, s.histogram);
      std::uint64_t ties = kth.ties;
      std::uint64_t kept_count = 0;
      for (std::uint64_t j = 0; j < count; ++j) {
        const key_type kj = magnitude_key(g[kept[j]]);
        if (kj > kth.key || (kj == kth.key && ties > 0)) {
          if (kj == kth.key) --ties;
          kept[kept_count++] = kept[j];
        }
      }
      count = kept_count;
    }

    // Non-finite magnitudes are at least τ (which is clamped to Inf's key), so every one of them is
    // in the kept list (refinement keeps the largest keys) and is caught while the message is written.
    const std::size_t bytes = detail::cpu::write_sparse_message<T>(header, count, checksum, out, [&](auto& sink) {
      constexpr std::uint64_t ahead = 16;  // prefetch distance of the gather (5% of the encode)
      for (std::uint64_t j = 0; j < count; ++j) {
#if defined(__GNUC__)
        if (j + ahead < count) __builtin_prefetch(g + kept[j + ahead]);
#endif
        const T v = g[kept[j]];
        detail::require(is_finite(v), errc::non_finite_input,
                        [&] { return "gradient value " + std::to_string(kept[j]) + " is NaN or Inf"; });
        sink.push(kept[j], v);
      }
    });
    return {bytes, count, k, widen(from_bits<T>(tau)), static_cast<double>(count) / static_cast<double>(n)};
  }
};

}  // namespace gradcomp
