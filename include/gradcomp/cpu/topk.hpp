#pragma once
/// @file
/// CPU reference of exact top-k: one histogram pass over the top 11 bits of |x|'s key, then the
/// bucket holding the k-th key is resolved from a candidate buffer (or, when that bucket is too
/// large for the buffer, by further histogram passes over the data), and one output pass writes the
/// kept elements in ascending index order.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cpu/radix_select.hpp>
#include <gradcomp/cpu/sparse_coding.hpp>
#include <gradcomp/sparsify/topk.hpp>

namespace gradcomp {

/// Top-k on the CPU.
template <gradient_value T>
struct backend<topk_sparsifier<T>, cpu_executor> {
  using key_type = typename float_traits<T>::bits_type;
  static constexpr int key_bits = float_traits<T>::magnitude_bits;
  static constexpr int first_shift = key_bits - cpu::radix_digit_bits;

  /// Candidate keys buffered after the first pass: a sixteenth of n, or all of a small tensor.
  [[nodiscard]] static std::uint64_t candidate_capacity(std::uint64_t n) noexcept {
    return std::max<std::uint64_t>(n / 16, std::min<std::uint64_t>(n, 65536));
  }

  struct scratch {
    std::span<std::uint64_t> histogram;
    std::span<std::uint32_t> sub_histograms;
    std::span<key_type> candidates;
  };

  static scratch carve(workspace_arena& arena, std::uint64_t n) {
    scratch s;
    s.histogram = arena.take<std::uint64_t>(cpu::radix_buckets);
    s.sub_histograms = arena.take<std::uint32_t>(cpu::histogram_scratch_counters);
    s.candidates = arena.take<key_type>(static_cast<std::size_t>(candidate_capacity(n)));
    return s;
  }

  static std::size_t workspace_bytes(const topk_sparsifier<T>&, const cpu_executor&, std::uint64_t n) {
    workspace_arena arena = workspace_arena::measure();
    carve(arena, n);
    return arena.bytes_needed();
  }

  static std::size_t encode(const topk_sparsifier<T>& codec, const cpu_executor&, std::span<const T> grad,
                            std::span<std::byte> out, std::span<std::byte> ws, message_key key) {
    const std::uint64_t n = grad.size();
    const std::uint64_t k = codec.k(n);
    envelope header{codec_id::topk, dtype_of<T>, 0, 0, key, n, 0, codec.params_hash(), 0};
    if (k == 0)
      return cpu::write_sparse_message<T>(header, 0, codec.wire().payload_checksum, out, [](auto&) {});

    workspace_arena arena(ws);
    const scratch s = carve(arena, n);
    cpu::magnitude_histogram<T>(grad, s.histogram, s.sub_histograms);
    std::uint64_t non_finite = 0;
    for (std::size_t b = float_traits<T>::infinity_key >> first_shift; b < cpu::radix_buckets; ++b)
      non_finite += s.histogram[b];
    detail::require(non_finite == 0, errc::non_finite_input,
                    std::to_string(non_finite) + " of " + std::to_string(n) + " gradient values are NaN or Inf");

    const cpu::bucket_choice choice = cpu::choose_bucket(s.histogram, k);
    const std::uint64_t rank = k - choice.above;
    const auto bucket = static_cast<key_type>(choice.bucket);
    cpu::kth_key<key_type> kth;
    if (s.histogram[choice.bucket] <= s.candidates.size()) {
      std::size_t count = 0;
      key_type* const candidates = s.candidates.data();
      for (const T v : grad) {
        const key_type k_v = magnitude_key(v);
        if ((k_v >> first_shift) == bucket) candidates[count++] = k_v;
      }
      kth = cpu::select_kth_largest<key_type>(
          [&](auto&& visit) {
            for (std::size_t j = 0; j < count; ++j) visit(candidates[j]);
          },
          key_bits, rank, bucket, cpu::radix_digit_bits, s.histogram);
    } else {
      kth = cpu::select_kth_largest<key_type>(
          [&](auto&& visit) {
            for (const T v : grad) visit(magnitude_key(v));
          },
          key_bits, rank, bucket, cpu::radix_digit_bits, s.histogram);
    }

    return cpu::write_sparse_message<T>(header, k, codec.wire().payload_checksum, out, [&](auto& sink) {
      std::uint64_t ties = kth.ties;
      const T* const g = grad.data();
      cpu::for_each_at_least<T>(grad, kth.key, [&](std::size_t i) {
        if (magnitude_key(g[i]) > kth.key) {
          sink.push(i, g[i]);
        } else if (ties > 0) {
          sink.push(i, g[i]);
          --ties;
        }
      });
    });
  }

  static void decode(const topk_sparsifier<T>& codec, const cpu_executor&, std::span<const std::byte> message,
                     std::span<T> out, std::span<std::byte>, const decode_limits& limits, bool accumulate) {
    cpu::decode_sparse_message<T>(message, {codec_id::topk, dtype_of<T>, out.size(), codec.params_hash()}, limits,
                                  out, accumulate);
  }
};

}  // namespace gradcomp
