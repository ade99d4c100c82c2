#pragma once
/// @file
/// Radix selection on the GPU: the k-th largest key of a set of elements, and the k elements
/// with the largest keys (ties to the lower index) as an ascending index list, without a host
/// round trip (CCCL 3.0.1 has no DeviceTopK; this is gradcomp's own, from CUB block primitives).
///
/// Keys are unsigned integers read through a source (the magnitude keys of a gradient, a list of
/// candidates or survivors, a sample). Each pass histograms one 11-bit digit of the keys that
/// share the digits already resolved (2048 bins, counted in shared memory, added into global
/// bins), then one block finds the digit of the k-th key with a block-wide scan and updates the
/// selection's state in device memory; the host only queues the passes. After the last digit
/// the state holds the k-th key exactly, how many elements equal it (E) and how many of those
/// belong to the top k (r). The r lowest indices among the E ties are found the same way, by
/// selecting the r-th smallest index among the elements whose key equals the k-th key. A last
/// pass appends every element above the k-th key, and the ties up to that index, to a list that
/// CUB's radix sort puts in ascending order.

#include <gradcomp/cuda/config.cuh>

#include <cooperative_groups.h>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include <gradcomp/core/error.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cuda/executor.cuh>
#include <gradcomp/cuda/detail/operation.cuh>
#include <gradcomp/cuda/detail/warp.cuh>

namespace gradcomp::detail::cuda {

/// Bits of the digit resolved per pass.
inline constexpr int radix_digit_bits = 11;
/// Bins of a pass's histogram.
inline constexpr unsigned radix_bins = 1u << radix_digit_bits;
/// Threads of the block that picks a digit (each scans radix_bins / radix_pick_threads bins).
inline constexpr unsigned radix_pick_threads = 256;

/// The digit a pass resolves: key bits [shift, shift + width).
struct radix_digit {
  int shift;  ///< Lowest bit of the digit.
  int width;  ///< Bits of the digit (1 … 11).

  /// Bits at and above which the keys must already agree with the resolved prefix.
  [[nodiscard]] __host__ __device__ int above() const { return shift + width; }
};

/// Number of digits of a `bits`-bit key.
[[nodiscard]] inline int radix_digit_count(int bits) noexcept {
  return (bits + radix_digit_bits - 1) / radix_digit_bits;
}

/// Digit d (0 = most significant) of a `bits`-bit key: 11 bits, the last one what is left.
[[nodiscard]] inline radix_digit radix_digit_of(int bits, int d) noexcept {
  const int top = bits - radix_digit_bits * d;
  const int shift = std::max(top - radix_digit_bits, 0);
  return {shift, top - shift};
}

/// Whether a and b agree on every bit at or above bit `from` (always, for from ≥ 64).
__host__ __device__ inline bool same_above(std::uint64_t a, std::uint64_t b, int from) {
  return from >= 64 || ((a ^ b) >> from) == 0;
}

/// Progress of one selection, in device memory.
struct radix_state {
  std::uint64_t prefix;    ///< The target key's digits resolved so far (lower bits zero).
  std::uint64_t rank;      ///< 1-based rank of the target among the keys sharing the resolved digits.
  std::uint64_t matching;  ///< Keys sharing the resolved digits (after the last digit: equal to the target).
};

/// Which way a selection counts ranks.
enum class radix_order { largest_first, smallest_first };

/// A slot in an append-only list for this thread; the threads of a warp that append together
/// take consecutive slots with one atomic.
__device__ inline std::uint64_t append_slot(unsigned long long* counter) {
  namespace cg = cooperative_groups;
  const cg::coalesced_group group = cg::coalesced_threads();
  unsigned long long base = 0;
  if (group.thread_rank() == 0) base = atomicAdd(counter, static_cast<unsigned long long>(group.size()));
  return group.shfl(base, 0) + group.thread_rank();
}

/// Slots in two append-only lists for the threads of a block, claimed with one atomic per list and
/// block (where the block appends to it). Appends of sparse survivors (1% of the elements, say)
/// rarely share a warp, so per-warp claims would cost one atomic per survivor, all on one
/// counter: on an H200 such claims ran at about 0.85 ns each, 8 times a read of the gradient
/// (docs/cuda.md §8.8). Lives in shared memory; every thread of the block calls `claim` the same
/// number of times (it holds two barriers); the block's threads are a multiple of 32, at most 1024.
struct block_append {
  unsigned warp_offset[32];    ///< Per warp: its lanes' requests (packed), then the warp's offset.
  unsigned long long base[2];  ///< The block's first slot in each list.

  /// This thread's first slots in list 0 and list 1, for `first` and `second` slots (the block's
  /// totals below 2^16 each; a list the block takes nothing from may have a null counter).
  __device__ void claim(unsigned first, unsigned second, unsigned long long* counter0, unsigned long long* counter1,
                        std::uint64_t& slot0, std::uint64_t& slot1) {
    const unsigned mine = first | second << 16;  // both counts in one scan
    unsigned inclusive = mine;
    const unsigned lane = threadIdx.x % 32u;
    for (unsigned d = 1; d < 32; d <<= 1) {
      const unsigned below = __shfl_up_sync(0xFFFFFFFFu, inclusive, d);
      if (lane >= d) inclusive += below;
    }
    const unsigned warp = threadIdx.x / 32u;
    if (lane == 31u) warp_offset[warp] = inclusive;
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned running = 0;
      for (unsigned w = 0; w < (blockDim.x + 31u) / 32u; ++w) {
        const unsigned total = warp_offset[w];
        warp_offset[w] = running;
        running += total;
      }
      const unsigned long long total0 = running & 0xFFFFu;
      const unsigned long long total1 = running >> 16;
      base[0] = total0 != 0 ? atomicAdd(counter0, total0) : 0;
      base[1] = total1 != 0 ? atomicAdd(counter1, total1) : 0;
    }
    __syncthreads();
    const unsigned before = warp_offset[warp] + inclusive - mine;
    slot0 = base[0] + (before & 0xFFFFu);
    slot1 = base[1] + (before >> 16);
  }
};

/// Selecting among the elements' own keys: every element takes part.
struct by_key {
  /// Whether the pass has nothing to count (never: the keys are still being selected).
  __device__ bool nothing_to_count() const { return false; }
  template <class View>
  __device__ bool takes_part(const View&, std::uint64_t) const {
    return true;
  }
  template <class View>
  __device__ std::uint64_t key(const View& view, std::uint64_t j) const {
    return view.key(j);
  }
};

/// Selecting among the indices of the elements whose key equals the target of `ties_of` (the r
/// lowest indices of the ties).
struct by_index_among_ties {
  const radix_state* ties_of;

  /// Whether the pass has nothing to count: every tie is kept (the rank is all of them), so the
  /// index passes return at once and the last kept index stays the largest
  /// (radix_begin_ties_kernel).
  __device__ bool nothing_to_count() const { return ties_of->rank == ties_of->matching; }

  template <class View>
  __device__ bool takes_part(const View& view, std::uint64_t j) const {
    return view.key(j) == ties_of->prefix;
  }
  template <class View>
  __device__ std::uint64_t key(const View& view, std::uint64_t j) const {
    return view.index(j);
  }
};

/// One pass: histogram of `digit` over the elements taking part whose selection key shares the
/// resolved digits.
template <class Source, class Selection>
__global__ void radix_histogram_kernel(Source source, Selection selection, const radix_state* state, radix_digit digit,
                                       unsigned long long* bins) {
  if (selection.nothing_to_count()) return;  // the same for every thread: before any barrier
  __shared__ unsigned int local[radix_bins];
  for (unsigned b = threadIdx.x; b < radix_bins; b += blockDim.x) local[b] = 0;
  __syncthreads();
  const auto view = source.view();
  const std::uint64_t size = view.size();
  const std::uint64_t prefix = state->prefix;
  const std::uint64_t mask = (std::uint64_t{1} << digit.width) - 1;
  // Four elements per thread and round, their keys loaded before any is counted, so that each
  // thread keeps several loads in flight.
  constexpr unsigned batch = 4;
  const std::uint64_t stride = thread_count();
  for (std::uint64_t first = thread_id(); first < size; first += batch * stride) {
    bool part[batch];
    std::uint64_t key[batch];
#pragma unroll
    for (unsigned q = 0; q < batch; ++q) {
      const std::uint64_t j = first + q * stride;
      part[q] = j < size && selection.takes_part(view, j);
      key[q] = part[q] ? selection.key(view, j) : 0;
    }
#pragma unroll
    for (unsigned q = 0; q < batch; ++q)
      if (part[q] && same_above(key[q], prefix, digit.above())) atomicAdd(&local[(key[q] >> digit.shift) & mask], 1u);
  }
  __syncthreads();
  for (unsigned b = threadIdx.x; b < radix_bins; b += blockDim.x)
    if (local[b] != 0) atomicAdd(&bins[b], static_cast<unsigned long long>(local[b]));
}

/// One block: finds the bin of the state's rank-th key (counting from the top or the bottom),
/// adds it to the prefix and moves the rank into it. With `infinite_bin` below the bin count,
/// the keys in bins at and above it are NaN or Inf magnitudes: their count is recorded as
/// `non_finite_input` (the first digit of a magnitude selection).
template <radix_order Order>
__global__ void radix_pick_kernel(const unsigned long long* bins, radix_digit digit, radix_state* state,
                                  unsigned infinite_bin, device_status* status) {
  using scan = cub::BlockScan<unsigned long long, radix_pick_threads>;
  __shared__ typename scan::TempStorage temp;
  const unsigned count = 1u << digit.width;
  const unsigned per_thread = (count + radix_pick_threads - 1) / radix_pick_threads;
  const std::uint64_t rank = state->rank;
  const auto bin_at = [&](unsigned position) {
    return Order == radix_order::largest_first ? count - 1 - position : position;
  };
  unsigned long long mine = 0;
  for (unsigned q = 0; q < per_thread; ++q) {
    const unsigned position = threadIdx.x * per_thread + q;
    if (position < count) mine += bins[bin_at(position)];
  }
  unsigned long long before = 0;
  scan(temp).ExclusiveSum(mine, before);
  if (threadIdx.x == 0 && infinite_bin < count) {
    unsigned long long non_finite = 0;
    for (unsigned b = infinite_bin; b < count; ++b) non_finite += bins[b];
    if (non_finite != 0) record_failure(status, errc::non_finite_input, non_finite);
  }
  if (before < rank && rank <= before + mine) {  // exactly one thread holds the rank-th key
    unsigned long long passed = before;
    for (unsigned q = 0; q < per_thread; ++q) {
      const unsigned position = threadIdx.x * per_thread + q;
      if (position >= count) break;
      const unsigned long long in_bin = bins[bin_at(position)];
      if (passed + in_bin >= rank) {
        state->prefix |= std::uint64_t{bin_at(position)} << digit.shift;
        state->rank = rank - passed;
        state->matching = in_bin;
        break;
      }
      passed += in_bin;
    }
  }
}

/// Sets a selection's state.
template <class = void>
__global__ void radix_begin_kernel(radix_state* state, radix_state start) {
  if (blockIdx.x == 0 && threadIdx.x == 0) *state = start;
}

/// Starts the selection of the r lowest indices among the ties of `value_state`'s target. When
/// every tie is kept (r is all of them), the last kept index is the largest there is, and the
/// index passes count nothing (by_index_among_ties::nothing_to_count), so the pick leaves it.
template <class = void>
__global__ void radix_begin_ties_kernel(const radix_state* value_state, radix_state* index_state) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const bool all_kept = value_state->rank == value_state->matching;
    *index_state = radix_state{all_kept ? ~std::uint64_t{0} : 0, value_state->rank, 0};
  }
}

/// Appends the index of every element whose key shares the top bits from `decided_above` with the
/// target and lies above it, or equals it with an index at most `index_state`'s target, to `kept`
/// (at most `capacity` slots; more is an internal error).
template <class Source>
__global__ void radix_collect_kernel(Source source, const radix_state* value_state, const radix_state* index_state,
                                     int decided_above, std::uint64_t* kept, unsigned long long* kept_count,
                                     std::uint64_t capacity, device_status* status) {
  __shared__ block_append append;
  const auto view = source.view();
  const std::uint64_t size = view.size();
  const std::uint64_t target = value_state->prefix;
  const std::uint64_t last_tie = index_state->prefix;
  // Block-wide rounds of `batch` elements per thread (the loop is the same for every thread of a
  // block: `claim` holds barriers), their keys loaded before any is tested.
  constexpr unsigned batch = 4;
  const std::uint64_t tile = std::uint64_t{batch} * blockDim.x;
  for (std::uint64_t first = blockIdx.x * tile; first < size; first += gridDim.x * tile) {
    std::uint64_t key[batch];
#pragma unroll
    for (unsigned q = 0; q < batch; ++q) {
      const std::uint64_t j = first + q * blockDim.x + threadIdx.x;
      key[q] = j < size ? view.key(j) : 0;
    }
    unsigned taken = 0;  // bit q: element q is kept
#pragma unroll
    for (unsigned q = 0; q < batch; ++q) {
      const std::uint64_t j = first + q * blockDim.x + threadIdx.x;
      if (j < size && same_above(key[q], target, decided_above) &&
          (key[q] > target || (key[q] == target && view.index(j) <= last_tie)))
        taken |= 1u << q;
    }
    std::uint64_t slot = 0, unused = 0;
    append.claim(static_cast<unsigned>(__popc(taken)), 0, kept_count, nullptr, slot, unused);
#pragma unroll
    for (unsigned q = 0; q < batch; ++q) {
      if ((taken >> q & 1u) == 0) continue;
      if (slot < capacity) kept[slot] = view.index(first + q * blockDim.x + threadIdx.x);
      else
        record_failure(status, errc::invalid_argument, slot, 0xFF);
      ++slot;
    }
  }
}

/// Scratch of a selection: the bins and the two states.
struct radix_scratch {
  std::span<unsigned long long> bins;  ///< radix_bins counters.
  std::span<radix_state> states;       ///< [0] the key selection, [1] the tie (index) selection.

  static radix_scratch carve(workspace_arena& arena) {
    radix_scratch s;
    s.bins = arena.take<unsigned long long>(radix_bins);
    s.states = arena.take<radix_state>(2);
    return s;
  }
  [[nodiscard]] radix_state* value_state() const noexcept { return states.data(); }
  [[nodiscard]] radix_state* index_state() const noexcept { return states.data() + 1; }
};

/// Queues the start of a selection of the `rank`-th largest key.
inline void radix_begin(const cuda_executor& exec, const radix_scratch& s, std::uint64_t rank) {
  const radix_state start{0, rank, 0};
  launch(exec, 1, 32, radix_begin_kernel<>, s.value_state(), start);
}

/// Queues one histogram-and-pick pass of `digit` for `selection` over `source`.
template <radix_order Order, class Source, class Selection>
void radix_pass(const cuda_executor& exec, const radix_scratch& s, const Source& source, const Selection& selection,
                radix_state* state, radix_digit digit, std::uint64_t max_size, unsigned infinite_bin = radix_bins,
                device_status* status = nullptr) {
  GRADCOMP_CUDA_CHECK(cudaMemsetAsync(s.bins.data(), 0, s.bins.size_bytes(), exec.native_stream()));
  if (max_size > 0)
    launch(exec, streaming_grid_for(max_size), block_threads, radix_histogram_kernel<Source, Selection>, source,
           selection, static_cast<const radix_state*>(state), digit, s.bins.data());
  launch(exec, 1, radix_pick_threads, radix_pick_kernel<Order>, static_cast<const unsigned long long*>(s.bins.data()),
         digit, state, infinite_bin, status);
}

/// Queues the selection of the r lowest indices among the ties (`index_bits` bits per index),
/// after the key selection's last digit.
template <class Source>
void radix_select_ties(const cuda_executor& exec, const radix_scratch& s, const Source& source, int index_bits,
                       std::uint64_t max_size) {
  launch(exec, 1, 32, radix_begin_ties_kernel<>, static_cast<const radix_state*>(s.value_state()), s.index_state());
  const by_index_among_ties ties{s.value_state()};
  for (int d = 0; d < radix_digit_count(index_bits); ++d)
    radix_pass<radix_order::smallest_first>(exec, s, source, ties, s.index_state(), radix_digit_of(index_bits, d),
                                            max_size);
}

/// Bits needed for indices below n (at least 1).
[[nodiscard]] inline int index_bits_for(std::uint64_t n) noexcept {
  int bits = 1;
  while (bits < 64 && (n - 1) >> bits != 0) ++bits;
  return bits;
}

/// Scratch that puts a list of up to `count` indices below n in ascending order (CUB's radix
/// sort, on the index bits only).
struct index_sort_scratch {
  std::span<std::uint64_t> sorted;  ///< The sorted list.
  std::span<std::byte> temp;        ///< CUB's temporary storage.

  static index_sort_scratch carve(workspace_arena& arena, std::uint64_t count, std::uint64_t n) {
    std::size_t temp_bytes = 0;
    GRADCOMP_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(nullptr, temp_bytes, static_cast<const std::uint64_t*>(nullptr),
                                                       static_cast<std::uint64_t*>(nullptr), count, 0,
                                                       index_bits_for(n)));
    index_sort_scratch s;
    s.sorted = arena.take<std::uint64_t>(static_cast<std::size_t>(count));
    s.temp = arena.take<std::byte>(temp_bytes);
    return s;
  }
};

/// Queues the sort of the `count` indices below n at `list` into `s.sorted`.
inline void sort_indices(const cuda_executor& exec, const index_sort_scratch& s, const std::uint64_t* list,
                         std::uint64_t count, std::uint64_t n) {
  if (count == 0) return;
  std::size_t temp_bytes = s.temp.size();
  GRADCOMP_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(s.temp.data(), temp_bytes, list, s.sorted.data(), count, 0,
                                                     index_bits_for(n), exec.native_stream()));
}

}  // namespace gradcomp::detail::cuda
