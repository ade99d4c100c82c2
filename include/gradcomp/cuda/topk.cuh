#pragma once
/// @file
/// Exact top-k on the GPU, byte-identical to the CPU backend, with no host synchronisation
/// before the message is sealed (capturable in a CUDA graph with deferred errors).
///
/// Pass 1 histograms the top 11 bits of every magnitude key; one block picks the bin of the k-th
/// key (and counts NaN and Inf, whose keys fill the top bins). Pass 2 reads the gradient again:
/// elements above that bin go straight to the kept list; those in it are histogrammed by the next
/// digit and copied (key and index) to a candidate list of n/16 entries. The remaining digits, and
/// the selection of the lowest indices among the ties of the k-th key, read only the candidates
/// (or the gradient again, when they did not fit). A last pass over the candidates appends the
/// rest of the top k; CUB's radix sort puts the k indices in ascending order, and the message is
/// written from the sorted list (cuda/detail/sparse_coding.cuh). The gradient is read twice.

#include <gradcomp/cuda/config.cuh>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cuda/executor.cuh>
#include <gradcomp/cuda/detail/message.cuh>
#include <gradcomp/cuda/detail/operation.cuh>
#include <gradcomp/cuda/detail/radix_select.cuh>
#include <gradcomp/cuda/detail/sparse_coding.cuh>
#include <gradcomp/sparsify/topk.hpp>

namespace gradcomp {

namespace detail::cuda {

/// The magnitude keys of a gradient, index j at position j.
template <class T>
struct gradient_keys {
  const T* x;
  std::uint64_t n;

  struct view_type {
    const T* x;
    std::uint64_t n;
    __device__ std::uint64_t size() const { return n; }
    __device__ std::uint64_t key(std::uint64_t j) const { return magnitude_key(x[j]); }
    __device__ std::uint64_t index(std::uint64_t j) const { return j; }
  };
  __device__ view_type view() const { return {x, n}; }
};

/// The candidates of pass 2, or the whole gradient again when they did not fit their list.
template <class T>
struct candidates_or_gradient {
  const T* x;
  std::uint64_t n;
  const std::uint64_t* keys;
  const std::uint64_t* indices;
  const unsigned long long* count;
  std::uint64_t capacity;

  struct view_type {
    const T* x;
    std::uint64_t n;
    const std::uint64_t* keys;
    const std::uint64_t* indices;
    std::uint64_t count;
    bool overflow;
    __device__ std::uint64_t size() const { return overflow ? n : count; }
    __device__ std::uint64_t key(std::uint64_t j) const { return overflow ? magnitude_key(x[j]) : keys[j]; }
    __device__ std::uint64_t index(std::uint64_t j) const { return overflow ? j : indices[j]; }
  };
  __device__ view_type view() const {
    const std::uint64_t c = *count;
    return {x, n, keys, indices, c, c > capacity};
  }
};
/// Pass 2 of top-k (see the file comment): elements above the bin of the k-th key go to `kept`,
/// those in it are histogrammed by the next digit and copied to the candidate list. Both lists are
/// claimed a block round at a time (`block_append`).
template <class T>
__global__ void topk_filter_kernel(const T* x, std::uint64_t n, radix_digit top, radix_digit next,
                                   const radix_state* state, unsigned long long* bins, std::uint64_t* kept,
                                   unsigned long long* kept_count, std::uint64_t k, std::uint64_t* candidate_keys,
                                   std::uint64_t* candidate_indices, unsigned long long* candidate_count,
                                   std::uint64_t capacity, device_status* status) {
  __shared__ unsigned int local[radix_bins];
  __shared__ block_append append;
  for (unsigned b = threadIdx.x; b < radix_bins; b += blockDim.x) local[b] = 0;
  __syncthreads();
  const std::uint64_t bin = state->prefix >> top.shift;
  const std::uint64_t mask = (std::uint64_t{1} << next.width) - 1;
  // Block-wide rounds of `batch` elements per thread (the same loop for every thread of a block:
  // `claim` holds barriers), loaded before any is handled, as the histogram kernel.
  constexpr unsigned batch = 8;
  const std::uint64_t tile = std::uint64_t{batch} * blockDim.x;
  for (std::uint64_t first = blockIdx.x * tile; first < n; first += gridDim.x * tile) {
    std::uint64_t keys[batch];
#pragma unroll
    for (unsigned q = 0; q < batch; ++q) {
      const std::uint64_t i = first + q * blockDim.x + threadIdx.x;
      keys[q] = i < n ? magnitude_key(x[i]) : 0;
    }
    unsigned above = 0, in_bin = 0;  // bit q: element q is above the bin, or in it
#pragma unroll
    for (unsigned q = 0; q < batch; ++q) {
      if (first + q * blockDim.x + threadIdx.x >= n) continue;
      const std::uint64_t digit = keys[q] >> top.shift;
      if (digit > bin) {
        above |= 1u << q;
      } else if (digit == bin) {
        in_bin |= 1u << q;
        atomicAdd(&local[(keys[q] >> next.shift) & mask], 1u);
      }
    }
    std::uint64_t kept_slot = 0, candidate_slot = 0;
    append.claim(static_cast<unsigned>(__popc(above)), static_cast<unsigned>(__popc(in_bin)), kept_count,
                 candidate_count, kept_slot, candidate_slot);
#pragma unroll
    for (unsigned q = 0; q < batch; ++q) {
      const std::uint64_t i = first + q * blockDim.x + threadIdx.x;
      if ((above >> q & 1u) != 0) {
        if (kept_slot < k) kept[kept_slot] = i;
        else
          record_failure(status, errc::invalid_argument, kept_slot, 0xFF);
        ++kept_slot;
      } else if ((in_bin >> q & 1u) != 0) {
        if (candidate_slot < capacity) {
          candidate_keys[candidate_slot] = keys[q];
          candidate_indices[candidate_slot] = i;
        }
        ++candidate_slot;
      }
    }
  }
  __syncthreads();
  for (unsigned b = threadIdx.x; b < radix_bins; b += blockDim.x)
    if (local[b] != 0) atomicAdd(&bins[b], static_cast<unsigned long long>(local[b]));
}

/// The indices of the k largest magnitudes of a device array (ties to the lower index), in
/// ascending order: top-k's selection, which the count sketch's heavy hitters reuse.
template <class T>
struct largest_magnitudes {
  static constexpr int key_bits = float_traits<T>::magnitude_bits;

  /// Candidates pass 2 keeps: a sixteenth of n, or all of a small tensor (as the CPU's list).
  [[nodiscard]] static std::uint64_t candidate_capacity(std::uint64_t n) noexcept {
    return std::max<std::uint64_t>(n / 16, std::min<std::uint64_t>(n, 65536));
  }

  /// Workspace of a selection of k among n.
  struct scratch {
    radix_scratch radix;
    std::span<unsigned long long> counts;   ///< [0] kept, [1] candidates.
    std::span<std::uint64_t> kept;          ///< The top k's indices, unordered.
    std::span<std::uint64_t> candidate_keys;
    std::span<std::uint64_t> candidate_indices;
    index_sort_scratch sort;                ///< `sort.sorted`: the result, ascending.

    static scratch carve(workspace_arena& arena, std::uint64_t k, std::uint64_t n) {
      scratch s;
      s.radix = radix_scratch::carve(arena);
      s.counts = arena.take<unsigned long long>(2);
      s.kept = arena.take<std::uint64_t>(static_cast<std::size_t>(k));
      s.candidate_keys = arena.take<std::uint64_t>(static_cast<std::size_t>(candidate_capacity(n)));
      s.candidate_indices = arena.take<std::uint64_t>(static_cast<std::size_t>(candidate_capacity(n)));
      s.sort = index_sort_scratch::carve(arena, k, n);
      return s;
    }
  };

  /// Queues the selection of the k (1 ≤ k ≤ n) largest magnitudes of `g`, leaving their indices in
  /// ascending order in `s.sort.sorted`; NaN or Inf in `g` is recorded as `non_finite_input` (with
  /// their count as its position).
  static void select(const cuda_executor& exec, const T* g, std::uint64_t n, std::uint64_t k, const scratch& s,
                     device_status* status) {
    GRADCOMP_CUDA_CHECK(cudaMemsetAsync(s.counts.data(), 0, s.counts.size_bytes(), exec.native_stream()));
    GRADCOMP_CUDA_CHECK(cudaMemsetAsync(s.kept.data(), 0xFF, s.kept.size_bytes(), exec.native_stream()));
    radix_begin(exec, s.radix, k);
    const radix_digit top = radix_digit_of(key_bits, 0);
    const radix_digit next = radix_digit_of(key_bits, 1);
    const auto infinite_bin = static_cast<unsigned>(float_traits<T>::infinity_key >> top.shift);
    radix_pass<radix_order::largest_first>(exec, s.radix, gradient_keys<T>{g, n}, by_key{}, s.radix.value_state(), top,
                                           n, infinite_bin, status);
    GRADCOMP_CUDA_CHECK(cudaMemsetAsync(s.radix.bins.data(), 0, s.radix.bins.size_bytes(), exec.native_stream()));
    const std::uint64_t capacity = candidate_capacity(n);
    launch(exec, streaming_grid_for(n), block_threads, topk_filter_kernel<T>, g, n, top, next,
           static_cast<const radix_state*>(s.radix.value_state()), s.radix.bins.data(), s.kept.data(), s.counts.data(),
           k, s.candidate_keys.data(), s.candidate_indices.data(), s.counts.data() + 1, capacity, status);
    launch(exec, 1, radix_pick_threads, radix_pick_kernel<radix_order::largest_first>,
           static_cast<const unsigned long long*>(s.radix.bins.data()), next, s.radix.value_state(), radix_bins,
           status);
    const candidates_or_gradient<T> rest{
        g, n, s.candidate_keys.data(), s.candidate_indices.data(), s.counts.data() + 1, capacity};
    for (int d = 2; d < radix_digit_count(key_bits); ++d)
      radix_pass<radix_order::largest_first>(exec, s.radix, rest, by_key{}, s.radix.value_state(),
                                             radix_digit_of(key_bits, d), n);
    radix_select_ties(exec, s.radix, rest, index_bits_for(n), n);
    launch(exec, streaming_grid_for(n), block_threads, radix_collect_kernel<candidates_or_gradient<T>>, rest,
           static_cast<const radix_state*>(s.radix.value_state()),
           static_cast<const radix_state*>(s.radix.index_state()), top.shift, s.kept.data(), s.counts.data(), k,
           status);
    sort_indices(exec, s.sort, s.kept.data(), k, n);
  }
};

}  // namespace detail::cuda

/// Top-k on the GPU.
template <gradient_value T>
struct backend<topk_sparsifier<T>, cuda_executor> {
  using selection = detail::cuda::largest_magnitudes<T>;

  struct scratch {
    detail::cuda::crc_scratch crc;
    typename selection::scratch select;
  };

  static scratch carve_encode(workspace_arena& arena, const topk_sparsifier<T>& codec, std::uint64_t n) {
    scratch s;
    s.crc = detail::cuda::carve_seal(arena, codec.wire().payload_checksum);
    s.select = selection::scratch::carve(arena, codec.k(n), n);
    return s;
  }

  static std::size_t workspace_bytes(const topk_sparsifier<T>& codec, const cuda_executor&, std::uint64_t n) {
    const std::size_t encoder =
        detail::cuda::operation::workspace_bytes([&](workspace_arena& arena) { (void)carve_encode(arena, codec, n); });
    return std::max(encoder, detail::cuda::sparse_decoder_bytes(n));
  }

  static std::size_t encode(const topk_sparsifier<T>& codec, const cuda_executor& exec, std::span<const T> grad,
                            std::span<std::byte> out, std::span<std::byte> ws, message_key key) {
    const std::uint64_t n = grad.size();
    const std::uint64_t k = codec.k(n);
    const std::uint64_t payload_bytes = sparse_payload_bytes(choose_index_coding(n, k), n, k, sizeof(T));
    const std::size_t size = static_cast<std::size_t>(envelope::size + payload_bytes);
    workspace_arena arena(ws);
    const detail::cuda::operation op(exec, arena);
    const scratch s = carve_encode(arena, codec, n);
    detail::cuda::begin_message(exec, out, size);  // after the workspace is carved: a refused call writes nothing
    if (k > 0) selection::select(exec, grad.data(), n, k, s.select, op.status());
    // Pass 1 counted the NaN and Inf values already: the writer need not look again.
    detail::cuda::write_sparse_payload(exec, out.data() + envelope::size, n, k, grad.data(),
                                       static_cast<const std::uint64_t*>(s.select.sort.sorted.data()), false,
                                       op.status());
    detail::cuda::seal_message(exec, out.data(),
                               {codec_id::topk, dtype_of<T>, static_cast<std::uint8_t>(choose_index_coding(n, k)), 0,
                                key, n, payload_bytes, codec.params_hash(), 0},
                               s.crc, op);
    op.finish_encode([n](errc code, std::uint64_t position, std::uint32_t) {
      if (code == errc::non_finite_input)
        return std::to_string(position) + " of " + std::to_string(n) + " gradient values are NaN or Inf";
      return std::string("internal error: the selection kept more than k elements");
    });
    return size;
  }

  static void decode(const topk_sparsifier<T>& codec, const cuda_executor& exec, std::span<const std::byte> message,
                     std::span<T> out, std::span<std::byte> ws, const decode_limits& limits, bool accumulate) {
    detail::cuda::decode_sparse_codec(codec, exec, message, out, ws, limits, accumulate);
  }
};

}  // namespace gradcomp
