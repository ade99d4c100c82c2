#pragma once
/// @file
/// The sampled-threshold sparsifier on the GPU, byte-identical to the CPU backend: one thread
/// per sample reads |x| at its Philox position; the radix selection of cuda/detail/radix_select.cuh
/// finds τ among the samples; CUB's stream compaction (`cub::DeviceSelect::FlaggedIf`, one pass
/// over x, decoupled look-back) lists every index whose magnitude is at least τ, in ascending
/// order; the host reads how many survived (the message size depends on it); with refinement,
/// when more than 1.3·k survive, the selection picks the exact top k among the survivors (ties to
/// the lower index) and CUB's radix sort orders them; the message is written from the ordered list.
///
/// The survivors were once appended through one atomic counter, in any order, then sorted: at a
/// density of 1% a warp rarely holds two survivors, so the appends serialised on that counter
/// (2.3 ms for 2^28 floats on an H200, against 0.25 ms to read them; docs/cuda.md §8.8).

#include <gradcomp/cuda/config.cuh>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <string>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cuda/executor.cuh>
#include <gradcomp/cuda/detail/grid.cuh>
#include <gradcomp/cuda/detail/message.cuh>
#include <gradcomp/cuda/detail/operation.cuh>
#include <gradcomp/cuda/detail/radix_select.cuh>
#include <gradcomp/cuda/detail/sparse_coding.cuh>
#include <gradcomp/sparsify/threshold.hpp>

namespace gradcomp {

namespace detail::cuda {

/// Sample j: the magnitude key of x at position ⌊r·n/2^64⌋ for the 64-bit word r made of stream
/// words 2j and 2j + 1 (or of x[j] itself when every element is sampled).
template <class T>
struct threshold_sample {
  const T* x;
  std::uint64_t n;
  bool everything;
  random_stream stream;
  std::uint64_t* keys;

  __device__ void operator()(std::uint64_t j) const {
    if (everything) {
      keys[j] = magnitude_key(x[j]);
      return;
    }
    const philox_block words = stream.block(j / 2);
    const std::uint64_t r = j % 2 == 0 ? (words.word[0] | std::uint64_t{words.word[1]} << 32)
                                       : (words.word[2] | std::uint64_t{words.word[3]} << 32);
    keys[j] = magnitude_key(x[scale_to_range(r, n)]);
  }
};

/// A list of keys (the samples); indices are their positions.
struct key_list {
  const std::uint64_t* keys;
  std::uint64_t count;

  struct view_type {
    const std::uint64_t* keys;
    std::uint64_t count;
    __device__ std::uint64_t size() const { return count; }
    __device__ std::uint64_t key(std::uint64_t j) const { return keys[j]; }
    __device__ std::uint64_t index(std::uint64_t j) const { return j; }
  };
  __device__ view_type view() const { return {keys, count}; }
};

/// A list of indices into a gradient (the survivors), keyed by magnitude.
template <class T>
struct index_list {
  const T* x;
  const std::uint64_t* indices;
  std::uint64_t count;

  struct view_type {
    const T* x;
    const std::uint64_t* indices;
    std::uint64_t count;
    __device__ std::uint64_t size() const { return count; }
    __device__ std::uint64_t key(std::uint64_t j) const { return magnitude_key(x[indices[j]]); }
    __device__ std::uint64_t index(std::uint64_t j) const { return indices[j]; }
  };
  __device__ view_type view() const { return {x, indices, count}; }
};

/// The threshold key: the selected sample key clamped to [1, the key of Inf].
template <class T>
__device__ std::uint64_t threshold_key(const radix_state* state) {
  const std::uint64_t key = state->prefix;
  const std::uint64_t top = float_traits<T>::infinity_key;
  return key < 1 ? 1 : (key > top ? top : key);
}

/// Whether |x_i| ≥ τ, given x_i (the flag of `cub::DeviceSelect::FlaggedIf`; τ's key is read
/// from the selection's state on the device, so the host need not wait for it).
template <class T>
struct threshold_survives {
  const radix_state* state;

  __device__ bool operator()(T value) const { return magnitude_key(value) >= threshold_key<T>(state); }
};

/// Queues the listing of every index i < n with |x_i| ≥ τ into `survivors`, in ascending order,
/// and their count into `*count`. `temp` is CUB's temporary storage (its size from
/// `survivor_temp_bytes`).
template <class T>
void list_survivors(const cuda_executor& exec, const T* x, std::uint64_t n, const radix_state* state,
                    std::uint64_t* survivors, unsigned long long* count, std::span<std::byte> temp) {
  std::size_t temp_bytes = temp.size();
  GRADCOMP_CUDA_CHECK(cub::DeviceSelect::FlaggedIf(temp.data(), temp_bytes, thrust::counting_iterator<std::uint64_t>(0),
                                                   x, survivors, count, static_cast<std::int64_t>(n),
                                                   threshold_survives<T>{state}, exec.native_stream()));
}

/// Bytes of CUB's temporary storage for `list_survivors` over n values.
template <class T>
std::size_t survivor_temp_bytes(std::uint64_t n) {
  std::size_t temp_bytes = 0;
  GRADCOMP_CUDA_CHECK(cub::DeviceSelect::FlaggedIf(nullptr, temp_bytes, thrust::counting_iterator<std::uint64_t>(0),
                                                   static_cast<const T*>(nullptr), static_cast<std::uint64_t*>(nullptr),
                                                   static_cast<unsigned long long*>(nullptr),
                                                   static_cast<std::int64_t>(n), threshold_survives<T>{nullptr}));
  return temp_bytes;
}

/// Writes τ's key for the host.
template <class T>
__global__ void threshold_key_kernel(const radix_state* state, std::uint64_t* tau) {
  if (blockIdx.x == 0 && threadIdx.x == 0) *tau = threshold_key<T>(state);
}

}  // namespace detail::cuda

/// Threshold sparsification on the GPU.
template <gradient_value T>
struct backend<threshold_sparsifier<T>, cuda_executor> {
  static constexpr int key_bits = float_traits<T>::magnitude_bits;

  struct scratch {
    detail::cuda::crc_scratch crc;
    detail::cuda::radix_scratch radix;
    std::span<unsigned long long> counts;  ///< [0] survivors, [1] kept after refinement.
    std::span<std::uint64_t> tau;          ///< τ's key, for the report.
    std::span<std::uint64_t> sample;       ///< Sampled magnitude keys.
    std::span<std::uint64_t> survivors;    ///< Indices with |x| ≥ τ, ascending.
    std::span<std::byte> survivor_temp;    ///< CUB's temporary storage for listing them.
    std::span<std::uint64_t> kept;         ///< The refinement's top k, unordered.
    detail::cuda::index_sort_scratch sort;  ///< The refinement's top k, ascending.
  };

  static scratch carve_encode(workspace_arena& arena, const threshold_sparsifier<T>& codec, std::uint64_t n) {
    scratch s;
    s.crc = detail::cuda::carve_seal(arena, codec.wire().payload_checksum);
    s.radix = detail::cuda::radix_scratch::carve(arena);
    s.counts = arena.take<unsigned long long>(2);
    s.tau = arena.take<std::uint64_t>(1);
    s.sample = arena.take<std::uint64_t>(static_cast<std::size_t>(codec.sample_count(n)));
    s.survivors = arena.take<std::uint64_t>(static_cast<std::size_t>(n));
    s.survivor_temp = arena.take<std::byte>(detail::cuda::survivor_temp_bytes<T>(n));
    s.kept = arena.take<std::uint64_t>(static_cast<std::size_t>(codec.k(n)));
    s.sort = detail::cuda::index_sort_scratch::carve(arena, codec.k(n), n);
    return s;
  }

  static std::size_t workspace_bytes(const threshold_sparsifier<T>& codec, const cuda_executor&, std::uint64_t n) {
    const std::size_t encoder =
        detail::cuda::operation::workspace_bytes([&](workspace_arena& arena) { (void)carve_encode(arena, codec, n); });
    return std::max(encoder, detail::cuda::sparse_decoder_bytes(n));
  }

  static threshold_report<T> encode_with_report(const threshold_sparsifier<T>& codec, const cuda_executor& exec,
                                                std::span<const T> grad, std::span<std::byte> out,
                                                std::span<std::byte> ws, message_key key) {
    namespace cd = detail::cuda;
    const std::uint64_t n = grad.size();
    const std::uint64_t k = codec.k(n);
    workspace_arena arena(ws);
    const cd::operation op(exec, arena);
    const scratch s = carve_encode(arena, codec, n);
    std::uint64_t kept = 0;
    std::uint64_t tau = 0;
    const std::uint64_t* list = s.survivors.data();
    if (n > 0) {
      // τ: the m-th largest sampled key, m = ⌈k·s/n⌉ (at least 1), in exact integer arithmetic.
      const std::uint64_t samples = codec.sample_count(n);
      __extension__ using wide = unsigned __int128;
      const auto m = std::clamp<std::uint64_t>(static_cast<std::uint64_t>((wide{k} * samples + n - 1) / n), 1, samples);
      cd::for_each_item(exec, samples,
                        cd::threshold_sample<T>{grad.data(), n, samples == n,
                                                random_stream{codec.params().seed, key.step, key.tensor_id,
                                                              random_purpose::threshold_sample},
                                                s.sample.data()});
      cd::radix_begin(exec, s.radix, m);
      const cd::key_list sampled{s.sample.data(), samples};
      for (int d = 0; d < cd::radix_digit_count(key_bits); ++d)
        cd::radix_pass<cd::radix_order::largest_first>(exec, s.radix, sampled, cd::by_key{}, s.radix.value_state(),
                                                       cd::radix_digit_of(key_bits, d), samples);
      GRADCOMP_CUDA_CHECK(cudaMemsetAsync(s.counts.data(), 0, s.counts.size_bytes(), exec.native_stream()));
      cd::launch(exec, 1, 32, cd::threshold_key_kernel<T>, static_cast<const cd::radix_state*>(s.radix.value_state()),
                 s.tau.data());
      cd::list_survivors(exec, grad.data(), n, s.radix.value_state(), s.survivors.data(), s.counts.data(),
                         s.survivor_temp);
      unsigned long long survivors = 0;
      GRADCOMP_CUDA_CHECK(
          cudaMemcpyAsync(&survivors, s.counts.data(), sizeof survivors, cudaMemcpyDeviceToHost, exec.native_stream()));
      GRADCOMP_CUDA_CHECK(
          cudaMemcpyAsync(&tau, s.tau.data(), sizeof tau, cudaMemcpyDeviceToHost, exec.native_stream()));
      exec.synchronize();
      kept = survivors;
      if (codec.params().refine && wide{survivors} * 10 > wide{k} * 13) {
        // DGC's second stage: the exact top k among the survivors, ties to the lower index.
        const cd::index_list<T> candidates{grad.data(), s.survivors.data(), survivors};
        cd::radix_begin(exec, s.radix, k);
        for (int d = 0; d < cd::radix_digit_count(key_bits); ++d)
          cd::radix_pass<cd::radix_order::largest_first>(exec, s.radix, candidates, cd::by_key{}, s.radix.value_state(),
                                                         cd::radix_digit_of(key_bits, d), survivors);
        cd::radix_select_ties(exec, s.radix, candidates, cd::index_bits_for(n), survivors);
        GRADCOMP_CUDA_CHECK(cudaMemsetAsync(s.kept.data(), 0xFF, s.kept.size_bytes(), exec.native_stream()));
        cd::launch(exec, cd::streaming_grid_for(survivors), cd::block_threads,
                   cd::radix_collect_kernel<cd::index_list<T>>, candidates,
                   static_cast<const cd::radix_state*>(s.radix.value_state()),
                   static_cast<const cd::radix_state*>(s.radix.index_state()), 64, s.kept.data(), s.counts.data() + 1,
                   k, op.status());
        kept = k;
        cd::sort_indices(exec, s.sort, s.kept.data(), kept, n);
        list = s.sort.sorted.data();
      }
    }
    const index_coding coding = choose_index_coding(n, kept);
    const std::uint64_t payload_bytes = sparse_payload_bytes(coding, n, kept, sizeof(T));
    const std::size_t size = static_cast<std::size_t>(envelope::size + payload_bytes);
    cd::begin_message(exec, out, size);
    cd::write_sparse_payload(exec, out.data() + envelope::size, n, kept, grad.data(), list, true, op.status());
    cd::seal_message(exec, out.data(),
                     {codec_id::threshold, dtype_of<T>, static_cast<std::uint8_t>(coding), 0, key, n, payload_bytes,
                      codec.params_hash(), 0},
                     s.crc, op);
    op.finish([](errc code, std::uint64_t position, std::uint32_t) {
      if (code == errc::non_finite_input) return "gradient value " + std::to_string(position) + " is NaN or Inf";
      return std::string("internal error: the refinement kept more than k elements");
    });
    return {size, kept, k, from_bits<T>(static_cast<typename float_traits<T>::bits_type>(tau)),
            n == 0 ? 0.0 : static_cast<double>(kept) / static_cast<double>(n)};
  }

  static void decode(const threshold_sparsifier<T>& codec, const cuda_executor& exec,
                     std::span<const std::byte> message, std::span<T> out, std::span<std::byte> ws,
                     const decode_limits& limits, bool accumulate) {
    detail::cuda::decode_sparse_codec(codec, exec, message, out, ws, limits, accumulate);
  }
};

}  // namespace gradcomp
