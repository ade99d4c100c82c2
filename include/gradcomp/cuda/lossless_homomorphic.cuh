#pragma once
/// @file
/// Lossless homomorphic compression on the GPU (sketch/lossless_homomorphic.hpp has the scheme):
/// `encode_index`, `plan` and `encode_sketch` give the CPU backend's bytes, and `decode` its
/// values, `lhc_decode_result` and errors, bit for bit.
///
/// - `encode_index`: one thread per index byte, whose 8, 2 or 1 elements it codes; NaN or ±Inf is
///   recorded, and the index is then rewritten to mark every element before the error is thrown,
///   as on the CPU.
/// - `plan`: the padding byte is checked on the host, every field against the rank limit and the
///   union counted on the device (a warp sum, one atomic per warp); the host applies the sizing
///   rule.
/// - `encode_sketch`: the checks of the CPU (finite, every non-zero element in the index, the
///   union's size) in one pass over 64-element words; then, for a sketched plan, the layout of
///   every block, the 3·G (row, 3·b + j) pairs sorted stably by row (CUB's radix sort), each row's
///   first pair by a scan of the row counts, and one thread per cell adding its contributors in
///   that order with `lhc_cell_from_row`, which is the CPU's ascending element order (checked on
///   the CPU in tests/sketch/test_lossless_homomorphic.cpp); no atomics touch the values. A failed
///   check fills the sketch with quiet NaN, as the CPU does.
/// - `decode`: the CPU's checks (sizes, padding, the plan of the index: the union counted as in
///   `plan`), then peeling in the CPU's order (docs/sketches.md §2.5), round by round: one thread
///   per entry of the round's list of cells recovers its element, CUB's stable radix sort groups the
///   round's subtractions (keyed 3·position + hash) by cell, one thread per cell subtracts them in
///   key order, and the cells left with one element, selected in key order, are the next round's
///   list. Atomics only count (the cells' elements and XORs, integers); no value depends on the
///   order of threads. The steps are host-device functions (`detail::cuda::lhc_peeling`) that
///   tests/cuda/test_lhc_decode_device.cu also replays on the host against the CPU decoder.
///
/// `encode_index`, `plan` and `encode_sketch` take no workspace argument: their scratch comes from
/// the stream-ordered pool (`stream_scratch`), about 40 bytes per block plus 36 per (block, hash)
/// pair for a sketch. Each waits for the device once (the checks decide what is thrown). `decode`
/// takes its workspace from the caller (`workspace_bytes`, also for dense and empty plans: the
/// status and counters) and waits for the device after the validation, after the setup, and once
/// per round, to read the round's counts.

#include <gradcomp/cuda/config.cuh>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <cub/device/device_select.cuh>
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cuda/executor.cuh>
#include <gradcomp/cuda/detail/finite_check.cuh>
#include <gradcomp/cuda/detail/grid.cuh>
#include <gradcomp/cuda/detail/operation.cuh>
#include <gradcomp/cuda/detail/radix_select.cuh>
#include <gradcomp/cuda/detail/warp.cuh>
#include <gradcomp/sketch/lossless_homomorphic.hpp>

namespace gradcomp {

namespace detail::cuda {

/// Sum of a value over the warp (every lane gets it); the whole warp must call it.
__device__ inline unsigned long long warp_sum(unsigned long long value) {
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xFFFFFFFFu, value, offset);
  return value;
}

/// Writes every index byte: an element is a member when non-zero (−0 counts as zero), or always
/// with `all`; NaN or ±Inf is recorded.
template <class T>
__global__ void lhc_index_kernel(const T* x, std::uint64_t n, lhc_index_coding coding, std::uint64_t bytes, bool all,
                                 unsigned char* index, device_status* status) {
  const unsigned per = detail::lhc_elements_per_byte(coding);
  const unsigned width = 8 / per;
  for (std::uint64_t q = thread_id(); q < bytes; q += thread_count()) {
    unsigned byte = 0;
    for (unsigned k = 0; k < per; ++k) {
      const std::uint64_t i = q * per + k;
      if (i >= n) break;
      if (!all && !is_finite(x[i])) record_failure(status, errc::non_finite_input, i);
      const bool member = all || magnitude_key(x[i]) != 0;
      byte |= (member ? 1u : 0u) << (k * width);
    }
    index[q] = static_cast<unsigned char>(byte);
  }
}

/// Counts the union's members of an aggregated index into *members, recording the first byte
/// with a field above `limit` (sum4 and sum8).
template <class = void>
__global__ void lhc_union_kernel(const unsigned char* index, std::uint64_t bytes, lhc_index_coding coding,
                                 std::uint64_t limit, unsigned long long* members, device_status* status) {
  unsigned long long mine = 0;
  const unsigned per = detail::lhc_elements_per_byte(coding);
  const unsigned width = 8 / per;
  const unsigned mask = (1u << width) - 1;
  for (std::uint64_t q = thread_id(); q < bytes; q += thread_count()) {
    const unsigned byte = index[q];
    if (coding == lhc_index_coding::bitmap) {
      mine += static_cast<unsigned>(__popc(byte));
      continue;
    }
    for (unsigned k = 0; k < 8; k += width) {
      const unsigned field = (byte >> k) & mask;
      if (field > limit) record_failure(status, errc::malformed_payload, q);
      mine += field != 0 ? 1u : 0u;
    }
  }
  mine = warp_sum(mine);
  if (lane_id() == 0 && mine != 0) atomicAdd(members, mine);
}

/// Whether element i is in the union of the aggregated index `index` (its bit or field is not 0).
GRADCOMP_HOST_DEVICE inline bool lhc_member(const unsigned char* index, lhc_index_coding coding,
                                            std::uint64_t i) noexcept {
  const unsigned per = detail::lhc_elements_per_byte(coding);
  const unsigned width = 8 / per;
  return ((index[i / per] >> ((i % per) * width)) & ((1u << width) - 1)) != 0;
}

/// What `encode_sketch`'s checks found: NaN or ±Inf, the first non-zero element outside the
/// index (UINT64_MAX: none), and the index's members.
struct lhc_sketch_checks {
  unsigned long long members;
  unsigned long long first_outside;
  unsigned int non_finite;
};

/// The checks of `encode_sketch`, one thread per 64-element word.
template <class T>
__global__ void lhc_sketch_check_kernel(const T* x, std::uint64_t n, const unsigned char* index,
                                        lhc_index_coding coding, lhc_sketch_checks* checks) {
  unsigned long long members = 0;
  for (std::uint64_t w = thread_id(); w * 64 < n; w += thread_count()) {
    const std::uint64_t first = w * 64;
    const std::uint64_t count = n - first < 64 ? n - first : 64;
    bool finite = true;
    for (std::uint64_t k = 0; k < count; ++k) {
      const std::uint64_t i = first + k;
      const bool member = lhc_member(index, coding, i);
      const bool nonzero = magnitude_key(x[i]) != 0;
      finite = finite && is_finite(x[i]);
      members += member ? 1u : 0u;
      if (nonzero && !member) atomicMin(&checks->first_outside, static_cast<unsigned long long>(i));
    }
    if (!finite) atomicOr(&checks->non_finite, 1u);
  }
  members = warp_sum(members);
  if (lane_id() == 0 && members != 0) atomicAdd(&checks->members, members);
}

/// Block b's layout, and its three (row, 3·b + j) pairs counted into their rows.
template <class = void>
__global__ void lhc_layout_kernel(std::uint64_t blocks, std::uint64_t rows, std::uint32_t block, std::uint32_t seed,
                                  bool reference, lhc_block_layout* layouts, std::uint32_t* pair_rows,
                                  std::uint64_t* pairs, unsigned long long* row_counts) {
  for (std::uint64_t b = thread_id(); b < blocks; b += thread_count()) {
    const lhc_block_layout layout = lhc_layout_of_block(b, rows, block, seed, reference);
    layouts[b] = layout;
    for (unsigned j = 0; j < 3; ++j) {
      const auto row = static_cast<std::uint32_t>(layout.row_offset[j] / block);
      pair_rows[3 * b + j] = row;
      pairs[3 * b + j] = 3 * b + j;
      atomicAdd(&row_counts[row], 1ull);
    }
  }
}

/// One cell per thread, from its row's sorted pairs (`lhc_cell_from_row`).
template <class T>
__global__ void lhc_cell_kernel(const T* x, std::uint64_t n, const std::uint64_t* pairs,
                                const unsigned long long* row_begin, const lhc_block_layout* layouts,
                                std::uint32_t block, std::uint64_t cells, T* sketch) {
  for (std::uint64_t c = thread_id(); c < cells; c += thread_count()) {
    const std::uint64_t row = c / block;
    sketch[c] = lhc_cell_from_row<T>(x, n, pairs, row_begin[row], row_begin[row + 1], c % block, layouts, block);
  }
}

/// values[i] = v for every i < count.
template <class T>
struct fill_value {
  T* values;
  T v;

  __device__ void operator()(std::uint64_t i) const { values[i] = v; }
};

/// The scratch of a sketched `encode_sketch`: the layouts, the pairs and their rows (unsorted and
/// sorted), the row counts and first pairs (r + 1 each), and CUB's sort and scan scratch.
struct lhc_sketch_scratch {
  std::span<lhc_block_layout> layouts;
  std::span<std::uint32_t> pair_rows;
  std::span<std::uint32_t> sorted_rows;
  std::span<std::uint64_t> pairs;
  std::span<std::uint64_t> sorted_pairs;
  std::span<unsigned long long> row_counts;
  std::span<unsigned long long> row_begin;
  std::span<std::byte> sort_temp;
  std::span<std::byte> scan_temp;

  static lhc_sketch_scratch carve(workspace_arena& arena, std::uint64_t blocks, std::uint64_t rows) {
    const std::uint64_t count = 3 * blocks;
    std::size_t sort_bytes = 0;
    std::size_t scan_bytes = 0;
    GRADCOMP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<const std::uint32_t*>(nullptr),
                                                        static_cast<std::uint32_t*>(nullptr),
                                                        static_cast<const std::uint64_t*>(nullptr),
                                                        static_cast<std::uint64_t*>(nullptr), count));
    GRADCOMP_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes,
                                                      static_cast<const unsigned long long*>(nullptr),
                                                      static_cast<unsigned long long*>(nullptr), rows + 1));
    lhc_sketch_scratch s;
    s.layouts = arena.take<lhc_block_layout>(static_cast<std::size_t>(blocks));
    s.pair_rows = arena.take<std::uint32_t>(static_cast<std::size_t>(count));
    s.sorted_rows = arena.take<std::uint32_t>(static_cast<std::size_t>(count));
    s.pairs = arena.take<std::uint64_t>(static_cast<std::size_t>(count));
    s.sorted_pairs = arena.take<std::uint64_t>(static_cast<std::size_t>(count));
    s.row_counts = arena.take<unsigned long long>(static_cast<std::size_t>(rows + 1));
    s.row_begin = arena.take<unsigned long long>(static_cast<std::size_t>(rows + 1));
    s.sort_temp = arena.take<std::byte>(sort_bytes);
    s.scan_temp = arena.take<std::byte>(scan_bytes);
    return s;
  }
};

// ---- decoding: peeling in the CPU's order -------------------------------------------------------
//
// The state lives in one entry per cell (`lhc_peeling`); a round is a list of cells in the order
// docs/sketches.md §2.5 defines. Each step below is the work of one thread on one item, written as
// a host-device function: the kernels call it, and tests/cuda/test_lhc_decode_device.cu replays
// the rounds on the host with the same functions (a loop for each kernel, a stable sort for CUB's).

/// The element of a cell that recovered none.
inline constexpr std::uint64_t lhc_no_element = ~std::uint64_t{0};

/// What one entry of a round's list did.
enum class lhc_recovery : std::uint8_t {
  skipped = 0,       ///< Its cell no longer held one element, or its element is recovered at a lower hash.
  recovered = 1,     ///< Its cell's element was recovered.
  out_of_range = 2,  ///< Recovered, but beyond the range of T (`non_finite_input`).
};

/// The decoder's state, one entry per cell, and the block layouts: device memory in the decoder,
/// host memory in the tests' replay. `Index` holds cell indices and subtraction keys (below 3·cells).
template <class Index>
struct lhc_peeling {
  const lhc_block_layout* layouts;
  std::uint64_t block;               ///< B.
  std::uint64_t cells;               ///< Cells; also the sort key and list value meaning "none".
  double* sums;                      ///< S[c] less the values subtracted from c.
  std::uint64_t* ids;                ///< XOR of the elements left in c.
  std::uint64_t* counts;             ///< (element, hash) pairs left in c.
  std::uint64_t* recovered_element;  ///< The element recovered from c, or `lhc_no_element`.
  double* recovered_value;           ///< Its value, σ_j·S[c] at the start of its round.

  /// The cells and signs of element i.
  [[nodiscard]] GRADCOMP_HOST_DEVICE lhc_cell_triple cells_of(std::uint64_t i) const noexcept {
    const std::uint64_t b = i / block;
    return lhc_cells_in(layouts[b], i - b * block, block);
  }

  /// Sets up cell c from the summed sketch: its value, no elements yet, none recovered. Returns
  /// whether the value is finite.
  template <class T>
  GRADCOMP_HOST_DEVICE bool load(std::uint64_t c, const T* sketch) const noexcept {
    sums[c] = sketch[c];
    ids[c] = 0;
    counts[c] = 0;
    recovered_element[c] = lhc_no_element;
    return is_finite(sketch[c]);
  }

  /// Counts element i, if a member of the aggregated `index`, into its three cells (atomically on
  /// the device: integer sums, in any order).
  GRADCOMP_HOST_DEVICE void count(std::uint64_t i, const unsigned char* index, lhc_index_coding coding) const noexcept {
    if (!lhc_member(index, coding, i)) return;
    const lhc_cell_triple at = cells_of(i);
    for (const std::uint64_t c : at.cell) {
#if defined(__CUDA_ARCH__)
      atomicAdd(reinterpret_cast<unsigned long long*>(&counts[c]), 1ull);
      atomicXor(reinterpret_cast<unsigned long long*>(&ids[c]), static_cast<unsigned long long>(i));
#else
      ++counts[c];
      ids[c] ^= i;
#endif
    }
  }

  /// The first round's candidates: cell c where it holds one element, else `cells` ("none"), at
  /// position c, so that selecting them keeps the cell order.
  GRADCOMP_HOST_DEVICE void queue_if_pure(std::uint64_t c, Index* queued) const noexcept {
    queued[c] = static_cast<Index>(counts[c] == 1 ? c : cells);
  }

  /// Entry e of a round's list `list` (read before any subtraction of the round): if its cell
  /// still holds one element, and that element's lowest pure hash is this cell, the element is
  /// recovered here. Its three subtractions get the keys 3e + k (k = 0, 1, 2, the hash) and their
  /// cells as sort keys; an entry that recovers nothing gets the key "none" for all three. The
  /// next round's candidates at 3e + k are reset to "none".
  template <class T>
  GRADCOMP_HOST_DEVICE lhc_recovery recover(std::uint64_t e, const Index* list, Index* sort_keys, Index* subtractions,
                                            Index* queued) const noexcept {
    const std::uint64_t c = list[e];
    bool here = counts[c] == 1;
    lhc_cell_triple at{};
    int j = 0;
    if (here) {
      at = cells_of(ids[c]);
      j = lhc_recovering_hash(counts[at.cell[0]] == 1, counts[at.cell[1]] == 1);
      here = at.cell[j] == c;
    }
    for (std::uint64_t k = 0; k < 3; ++k) {
      sort_keys[3 * e + k] = static_cast<Index>(here ? at.cell[k] : cells);
      subtractions[3 * e + k] = static_cast<Index>(3 * e + k);
      queued[3 * e + k] = static_cast<Index>(cells);
    }
    if (!here) return lhc_recovery::skipped;
    const double v = lhc_signed(at.negative[j], sums[c]);
    recovered_element[c] = ids[c];
    recovered_value[c] = v;
    return lhc_fits<T>(v) ? lhc_recovery::recovered : lhc_recovery::out_of_range;
  }

  /// Position t of the round's subtractions sorted by cell, each cell's in key order (a stable
  /// sort of the keys 3e + k by cell): the first position of a cell applies all of that cell's
  /// subtractions in key order, and queues the cell for the next round at the key of the
  /// subtraction that leaves it one element.
  GRADCOMP_HOST_DEVICE void subtract(std::uint64_t t, std::uint64_t items, const Index* list, const Index* sorted_keys,
                                     const Index* sorted_subtractions, Index* queued) const noexcept {
    const std::uint64_t c = sorted_keys[t];
    if (c == cells || (t > 0 && sorted_keys[t - 1] == c)) return;
    for (std::uint64_t u = t; u < items && sorted_keys[u] == c; ++u) {
      const std::uint64_t key = sorted_subtractions[u];
      const std::uint64_t from = list[key / 3];  // the cell its element was recovered from
      const std::uint64_t i = recovered_element[from];
      sums[c] -= lhc_signed(layouts[i / block].negative[key % 3], recovered_value[from]);
      ids[c] ^= i;
      if (--counts[c] == 1) queued[key] = static_cast<Index>(c);
    }
  }

  /// Whether member i was recovered (from one of its cells, which names it).
  [[nodiscard]] GRADCOMP_HOST_DEVICE bool recovered(std::uint64_t i) const noexcept {
    const lhc_cell_triple at = cells_of(i);
    return recovered_element[at.cell[0]] == i || recovered_element[at.cell[1]] == i ||
           recovered_element[at.cell[2]] == i;
  }

  /// Element i, if a member of `index` left by peeling: the median of its residual estimates from
  /// the cells as peeling left them, written to out[i] unless `out` is null. Returns false when that
  /// estimate is beyond T's range.
  template <class T>
  GRADCOMP_HOST_DEVICE bool estimate_left(std::uint64_t i, const unsigned char* index, lhc_index_coding coding,
                                          T* out) const noexcept {
    if (!lhc_member(index, coding, i) || recovered(i)) return true;
    const lhc_cell_triple at = cells_of(i);
    const double median =
        lhc_median_of_three(lhc_signed(at.negative[0], sums[at.cell[0]]), lhc_signed(at.negative[1], sums[at.cell[1]]),
                            lhc_signed(at.negative[2], sums[at.cell[2]]));
    if (out != nullptr) out[i] = static_cast<T>(median) + T{0};
    return lhc_fits<T>(median);
  }

  /// Writes the element recovered from cell c, if any, into `out`.
  template <class T>
  GRADCOMP_HOST_DEVICE void write_recovered(std::uint64_t c, T* out) const noexcept {
    const std::uint64_t i = recovered_element[c];
    if (i != lhc_no_element) out[i] = static_cast<T>(recovered_value[c]) + T{0};  // + 0: no −0 in the output
  }
};

/// Block b's layout.
struct lhc_layout_of {
  lhc_block_layout* layouts;
  std::uint64_t rows;
  std::uint32_t block;
  std::uint32_t seed;
  bool reference;

  __device__ void operator()(std::uint64_t b) const {
    layouts[b] = lhc_layout_of_block(b, rows, block, seed, reference);
  }
};

/// Sets up every cell from the summed sketch, recording the first that is NaN or Inf.
template <class T, class Index>
struct lhc_load_cells {
  lhc_peeling<Index> peeling;
  const T* sketch;
  device_status* status;

  __device__ void operator()(std::uint64_t c) const {
    if (!peeling.load(c, sketch)) record_failure(status, errc::non_finite_input, c);
  }
};

/// Counts every member of the union into its cells.
template <class Index>
struct lhc_count_members {
  lhc_peeling<Index> peeling;
  const unsigned char* index;
  lhc_index_coding coding;

  __device__ void operator()(std::uint64_t i) const { peeling.count(i, index, coding); }
};

/// The first round's candidates (`lhc_peeling::queue_if_pure`).
template <class Index>
struct lhc_queue_pure {
  lhc_peeling<Index> peeling;
  Index* queued;

  __device__ void operator()(std::uint64_t c) const { peeling.queue_if_pure(c, queued); }
};

/// One thread per entry of a round's list (`lhc_peeling::recover`): counts the recovered elements
/// into *recovered (one atomic per group of threads that recover together) and records the first
/// entry whose value is beyond T's range.
template <class T, class Index>
__global__ void lhc_recover_kernel(lhc_peeling<Index> peeling, const Index* list, std::uint64_t entries,
                                   Index* sort_keys, Index* subtractions, Index* queued, unsigned long long* recovered,
                                   device_status* status) {
  for (std::uint64_t e = thread_id(); e < entries; e += thread_count()) {
    const lhc_recovery outcome = peeling.template recover<T>(e, list, sort_keys, subtractions, queued);
    if (outcome == lhc_recovery::skipped) continue;
    if (outcome == lhc_recovery::out_of_range) record_failure(status, errc::non_finite_input, e);
    (void)append_slot(recovered);
  }
}

/// One thread per position of a round's sorted subtractions (`lhc_peeling::subtract`).
template <class Index>
struct lhc_subtract {
  lhc_peeling<Index> peeling;
  std::uint64_t items;
  const Index* list;
  const Index* sorted_keys;
  const Index* sorted_subtractions;
  Index* queued;

  __device__ void operator()(std::uint64_t t) const {
    peeling.subtract(t, items, list, sorted_keys, sorted_subtractions, queued);
  }
};

/// Whether a candidate names a cell (not "none").
template <class Index>
struct lhc_names_cell {
  Index none;

  __host__ __device__ bool operator()(Index c) const { return c != none; }
};

/// The median estimate of every member left by peeling (`lhc_peeling::estimate_left`): checked
/// against T's range (the first failure recorded) when `out` is null, else written.
template <class T, class Index>
struct lhc_estimate_left {
  lhc_peeling<Index> peeling;
  const unsigned char* index;
  lhc_index_coding coding;
  T* out;
  device_status* status;

  __device__ void operator()(std::uint64_t i) const {
    if (!peeling.estimate_left(i, index, coding, out)) record_failure(status, errc::non_finite_input, i);
  }
};

/// The recovered elements into the output (`lhc_peeling::write_recovered`).
template <class T, class Index>
struct lhc_write_recovered {
  lhc_peeling<Index> peeling;
  T* out;

  __device__ void operator()(std::uint64_t c) const { peeling.write_recovered(c, out); }
};

/// out[i] = sketch[i] + 0 (a dense plan: the summed values are the sum; + 0 turns −0 into +0).
template <class T>
struct lhc_dense_values {
  const T* sketch;
  T* out;

  __device__ void operator()(std::uint64_t i) const { out[i] = sketch[i] + T{0}; }
};

/// The words `decode` reads back: the union's members (validation), then per round the elements
/// recovered and the next round's cells.
struct lhc_decode_counters {
  unsigned long long members;
  unsigned long long recovered;
  unsigned long long next;
};

/// The decoder's workspace for a sketched plan, after its status and counters: the block layouts,
/// the cell state (`lhc_peeling`: 40 bytes per cell), two lists of a round's cells (the round's,
/// the next's), the round's subtractions (keys and sort keys, both double-buffered for CUB's
/// sort) and next candidates (3 per cell each), and CUB's scratch for the sort and the selection.
template <class Index>
struct lhc_decode_scratch {
  std::span<lhc_block_layout> layouts;
  std::span<double> sums;
  std::span<std::uint64_t> ids;
  std::span<std::uint64_t> counts;
  std::span<std::uint64_t> recovered_element;
  std::span<double> recovered_value;
  std::span<Index> lists[2];
  std::span<Index> sort_keys[2];
  std::span<Index> subtractions[2];
  std::span<Index> queued;
  std::span<std::byte> cub_temp;

  static lhc_decode_scratch carve(workspace_arena& arena, std::uint64_t blocks, std::uint64_t cells) {
    const auto count = static_cast<std::size_t>(cells);
    const std::size_t items = 3 * count;
    std::size_t sort_bytes = 0;
    std::size_t select_bytes = 0;
    cub::DoubleBuffer<Index> keys(nullptr, nullptr);
    cub::DoubleBuffer<Index> values(nullptr, nullptr);
    GRADCOMP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys, values, items));
    GRADCOMP_CUDA_CHECK(cub::DeviceSelect::If(nullptr, select_bytes, static_cast<const Index*>(nullptr),
                                              static_cast<Index*>(nullptr), static_cast<unsigned long long*>(nullptr),
                                              static_cast<std::int64_t>(items),
                                              lhc_names_cell<Index>{static_cast<Index>(cells)}));
    lhc_decode_scratch s;
    s.layouts = arena.take<lhc_block_layout>(static_cast<std::size_t>(blocks));
    s.sums = arena.take<double>(count);
    s.ids = arena.take<std::uint64_t>(count);
    s.counts = arena.take<std::uint64_t>(count);
    s.recovered_element = arena.take<std::uint64_t>(count);
    s.recovered_value = arena.take<double>(count);
    for (std::span<Index>& list : s.lists) list = arena.take<Index>(count);
    for (int b = 0; b < 2; ++b) {
      s.sort_keys[b] = arena.take<Index>(items);
      s.subtractions[b] = arena.take<Index>(items);
    }
    s.queued = arena.take<Index>(items);
    s.cub_temp = arena.take<std::byte>(std::max(sort_bytes, select_bytes));
    return s;
  }

  /// The state's pointers, for a plan of `block` columns.
  [[nodiscard]] lhc_peeling<Index> peeling(std::uint64_t block) const noexcept {
    return {layouts.data(),        block, sums.size(), sums.data(), ids.data(), counts.data(), recovered_element.data(),
            recovered_value.data()};
  }
};

}  // namespace detail::cuda

/// Lossless homomorphic compression on the GPU.
template <gradient_value T>
struct backend<lossless_homomorphic<T>, cuda_executor> {
  using codec_type = lossless_homomorphic<T>;

  static void encode_index(const codec_type& codec, const cuda_executor& exec, std::span<const T> grad,
                           std::span<std::byte> index) {
    namespace cd = detail::cuda;
    const std::uint64_t n = grad.size();
    require_size(index.size(), codec.index_bytes(n), "index bytes");
    const cd::stream_scratch scratch(exec, cd::operation::workspace_bytes([](workspace_arena&) {}));
    workspace_arena arena(scratch.span());
    const cd::operation op(exec, arena);
    const std::uint64_t bytes = index.size();
    auto* const out = reinterpret_cast<unsigned char*>(index.data());
    const lhc_index_coding coding = codec.params().index;
    if (bytes == 0) return;
    cd::launch(exec, cd::grid_for(bytes), cd::block_threads, cd::lhc_index_kernel<T>, grad.data(), n, coding, bytes,
               false, out, op.status());
    try {
      op.finish([](errc, std::uint64_t, std::uint32_t) { return std::string("the gradient holds NaN or Inf"); });
    } catch (const error&) {  // poison: every element a member, then the error
      cd::launch(exec, cd::grid_for(bytes), cd::block_threads, cd::lhc_index_kernel<T>, grad.data(), n, coding, bytes,
                 true, out, op.status());
      exec.synchronize();
      throw;
    }
  }

  static lhc_plan plan(const codec_type& codec, const cuda_executor& exec, std::span<const std::byte> global_index,
                       std::uint64_t n, std::uint64_t contributors) {
    namespace cd = detail::cuda;
    detail::lhc_require_contributors(contributors, codec.max_contributors());
    require_size(global_index.size(), codec.index_bytes(n), "index bytes");
    require_padding(codec, exec, global_index, n);
    const cd::stream_scratch scratch(exec, cd::operation::workspace_bytes([](workspace_arena& arena) {
                                       (void)arena.take<unsigned long long>(1);
                                     }));
    workspace_arena arena(scratch.span());
    const cd::operation op(exec, arena);
    return codec.plan_for(n, count_union(codec, exec, global_index, contributors, op,
                                         arena.take<unsigned long long>(1).data()));
  }

  static void encode_sketch(const codec_type& codec, const cuda_executor& exec, std::span<const T> grad,
                            std::span<const std::byte> global_index, const lhc_plan& plan, std::span<T> sketch) {
    namespace cd = detail::cuda;
    const std::uint64_t n = grad.size();
    require_size(n, plan.n, "elements");
    require_size(global_index.size(), codec.index_bytes(n), "index bytes");
    require_size(sketch.size(), plan.sketch_values(), "sketch values");
    require_padding(codec, exec, global_index, n);
    detail::require(plan == codec.plan_for(n, plan.union_nonzeros), errc::invalid_argument,
                    "the plan does not follow the sizing rule");
    const std::uint32_t block = codec.params().block;
    const std::uint64_t blocks = codec.block_count(n);
    const bool sketched = !plan.dense && plan.cells > 0;
    const auto carve = [&](workspace_arena& arena) {
      (void)arena.take<cd::lhc_sketch_checks>(1);
      if (sketched) (void)cd::lhc_sketch_scratch::carve(arena, blocks, plan.rows);
    };
    workspace_arena measure = workspace_arena::measure();
    carve(measure);
    const cd::stream_scratch scratch(exec, measure.bytes_needed());
    workspace_arena arena(scratch.span());
    cd::lhc_sketch_checks* const checks = arena.take<cd::lhc_sketch_checks>(1).data();
    const cd::lhc_sketch_checks start{0, std::numeric_limits<unsigned long long>::max(), 0};
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(checks, &start, sizeof start, cudaMemcpyHostToDevice, exec.native_stream()));
    const auto* const index = reinterpret_cast<const unsigned char*>(global_index.data());
    if (n > 0)
      cd::launch(exec, cd::streaming_grid_for((n + 63) / 64), cd::block_threads, cd::lhc_sketch_check_kernel<T>,
                 grad.data(), n, index, codec.params().index, checks);
    if (plan.dense && n > 0) {
      GRADCOMP_CUDA_CHECK(
          cudaMemcpyAsync(sketch.data(), grad.data(), n * sizeof(T), cudaMemcpyDeviceToDevice, exec.native_stream()));
    } else if (sketched) {
      const cd::lhc_sketch_scratch s = cd::lhc_sketch_scratch::carve(arena, blocks, plan.rows);
      GRADCOMP_CUDA_CHECK(cudaMemsetAsync(s.row_counts.data(), 0, s.row_counts.size_bytes(), exec.native_stream()));
      cd::launch(exec, cd::grid_for(blocks), cd::block_threads, cd::lhc_layout_kernel<>, blocks, plan.rows, block,
                 codec.params().seed, codec.params().reference_layout, s.layouts.data(), s.pair_rows.data(),
                 s.pairs.data(), s.row_counts.data());
      std::size_t sort_bytes = s.sort_temp.size();
      const int row_bits = std::max(1, static_cast<int>(std::bit_width(plan.rows - 1)));  // rows < 2^32
      GRADCOMP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(s.sort_temp.data(), sort_bytes, s.pair_rows.data(),
                                                          s.sorted_rows.data(), s.pairs.data(), s.sorted_pairs.data(),
                                                          3 * blocks, 0, row_bits, exec.native_stream()));
      std::size_t scan_bytes = s.scan_temp.size();
      GRADCOMP_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(s.scan_temp.data(), scan_bytes, s.row_counts.data(),
                                                        s.row_begin.data(), plan.rows + 1, exec.native_stream()));
      cd::launch(exec, cd::grid_for(plan.cells), cd::block_threads, cd::lhc_cell_kernel<T>, grad.data(), n,
                 static_cast<const std::uint64_t*>(s.sorted_pairs.data()),
                 static_cast<const unsigned long long*>(s.row_begin.data()),
                 static_cast<const lhc_block_layout*>(s.layouts.data()), block, plan.cells, sketch.data());
    }
    cd::lhc_sketch_checks found{};
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(&found, checks, sizeof found, cudaMemcpyDeviceToHost, exec.native_stream()));
    exec.synchronize();
    if (found.non_finite == 0 && found.first_outside >= n && found.members == plan.union_nonzeros) return;
    cd::for_each_item(exec, sketch.size(), cd::fill_value<T>{sketch.data(), std::numeric_limits<T>::quiet_NaN()});
    exec.synchronize();
    detail::require(found.non_finite == 0, errc::non_finite_input, "the gradient holds NaN or Inf");
    detail::require(found.first_outside >= n, errc::invalid_argument, [&] {
      return "element " + std::to_string(found.first_outside) + " is non-zero but absent from the aggregated index";
    });
    detail::fail(errc::invalid_argument, "the plan is not the plan of this index: it counts " +
                                             std::to_string(plan.union_nonzeros) + " non-zeros, the index " +
                                             std::to_string(found.members));
  }


  /// The decoder's workspace: its status and counters, and for a sketched plan the peeling state
  /// (`detail::cuda::lhc_decode_scratch`).
  static std::size_t workspace_bytes(const codec_type& codec, const cuda_executor&, const lhc_plan& plan) {
    return detail::cuda::operation::workspace_bytes([&](workspace_arena& arena) {
      (void)arena.take<detail::cuda::lhc_decode_counters>(1);
      if (!plan.dense && plan.cells > 0)
        with_index_type(plan, [&]<class Index>() {
          (void)detail::cuda::lhc_decode_scratch<Index>::carve(arena, codec.block_count(plan.n), plan.cells);
        });
    });
  }

  static lhc_decode_result decode(const codec_type& codec, const cuda_executor& exec,
                                  std::span<const std::byte> global_index, const lhc_plan& plan,
                                  std::span<const T> summed_sketch, std::span<T> out, std::span<std::byte> ws) {
    namespace cd = detail::cuda;
    const std::uint64_t n = out.size();
    require_size(n, plan.n, "elements");
    require_size(global_index.size(), codec.index_bytes(n), "index bytes");
    require_padding(codec, exec, global_index, n);
    workspace_arena arena(ws);
    const cd::operation op(exec, arena);
    cd::lhc_decode_counters* const counters = arena.take<cd::lhc_decode_counters>(1).data();
    detail::lhc_require_plan_of_index(plan,
                                      codec.plan_for(n, count_union(codec, exec, global_index, codec.max_contributors(),
                                                                    op, &counters->members)));
    require_size(summed_sketch.size(), plan.sketch_values(), "sketch values");
    if (plan.dense) {
      cd::for_each_item(exec, n, cd::find_non_finite<T>{summed_sketch.data(), op.status()});
      op.finish([](errc, std::uint64_t c, std::uint32_t) { return detail::lhc_non_finite_message(c); });
      cd::for_each_item(exec, n, cd::lhc_dense_values<T>{summed_sketch.data(), out.data()});
      return {.recovered = plan.union_nonzeros};
    }
    if (plan.cells == 0) {
      if (n > 0) GRADCOMP_CUDA_CHECK(cudaMemsetAsync(out.data(), 0, n * sizeof(T), exec.native_stream()));
      return {};
    }
    lhc_decode_result result;
    with_index_type(plan, [&]<class Index>() {
      result = peel<Index>(codec, exec, global_index, plan, summed_sketch, out, arena, op, counters);
    });
    return result;
  }

 private:
  static void require_size(std::uint64_t got, std::uint64_t want, const char* what) {
    detail::lhc_require_size(got, want, what);
  }

  /// Queues the count of the union's members of the aggregated `index` into *members, recording a
  /// field above `contributors` (sum4, sum8) in `op`'s status; waits, and returns the count.
  /// @throws error `malformed_payload` (such a field), `device_failed`.
  static std::uint64_t count_union(const codec_type& codec, const cuda_executor& exec, std::span<const std::byte> index,
                                   std::uint64_t contributors, const detail::cuda::operation& op,
                                   unsigned long long* members) {
    namespace cd = detail::cuda;
    GRADCOMP_CUDA_CHECK(cudaMemsetAsync(members, 0, sizeof *members, exec.native_stream()));
    const std::uint64_t bytes = index.size();
    if (bytes > 0)
      cd::launch(exec, cd::streaming_grid_for(bytes), cd::block_threads, cd::lhc_union_kernel<>,
                 reinterpret_cast<const unsigned char*>(index.data()), bytes, codec.params().index, contributors,
                 members, op.status());
    unsigned long long count = 0;
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(&count, members, sizeof count, cudaMemcpyDeviceToHost, exec.native_stream()));
    op.finish([contributors](errc, std::uint64_t q, std::uint32_t) {
      return "index byte " + std::to_string(q) + " holds a field above " + std::to_string(contributors) +
             " contributors";
    });
    return count;
  }

  /// Calls `f.template operator()<Index>()` with the cell and key type of a sketched plan: 32-bit
  /// when the round's 3·cells subtraction keys fit, else 64-bit.
  template <class F>
  static void with_index_type(const lhc_plan& plan, F&& f) {
    if (3 * plan.cells < (std::uint64_t{1} << 32)) f.template operator()<std::uint32_t>();
    else
      f.template operator()<std::uint64_t>();
  }

  /// Copies a device word to the host (after the work queued before it).
  template <class Word>
  static Word read_word(const cuda_executor& exec, const Word* word) {
    Word host{};
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(&host, word, sizeof host, cudaMemcpyDeviceToHost, exec.native_stream()));
    exec.synchronize();
    return host;
  }

  /// Peels a sparse plan in the CPU's order (docs/sketches.md §2.5): the cells set up from the
  /// summed sketch and the union (the first round's list: the cells holding one element, in cell
  /// order), then per round one thread per entry of the list recovering its element, CUB's stable
  /// radix sort of the round's subtractions by cell (their keys 3e + k in order within each cell),
  /// one thread per cell applying its subtractions in key order, and the cells left with one
  /// element selected in key order as the next round's list. The host reads each round's counts.
  /// Then the stall policy, the median estimates' range, and the output: zeros, the recovered
  /// values, the estimates.
  template <class Index>
  static lhc_decode_result peel(const codec_type& codec, const cuda_executor& exec,
                                std::span<const std::byte> global_index, const lhc_plan& plan,
                                std::span<const T> summed_sketch, std::span<T> out, workspace_arena& arena,
                                const detail::cuda::operation& op, detail::cuda::lhc_decode_counters* counters) {
    namespace cd = detail::cuda;
    const lhc_params& p = codec.params();
    const std::uint64_t n = plan.n;
    const std::uint64_t blocks = codec.block_count(n);
    const cd::lhc_decode_scratch<Index> s = cd::lhc_decode_scratch<Index>::carve(arena, blocks, plan.cells);
    const cd::lhc_peeling<Index> peeling = s.peeling(p.block);
    const auto* const index = reinterpret_cast<const unsigned char*>(global_index.data());
    const cudaStream_t stream = exec.native_stream();
    const cd::lhc_names_cell<Index> names_cell{static_cast<Index>(plan.cells)};
    std::size_t temp_bytes = s.cub_temp.size();

    cd::for_each_item(exec, blocks,
                      cd::lhc_layout_of{s.layouts.data(), plan.rows, p.block, p.seed, p.reference_layout});
    cd::for_each_item(exec, plan.cells, cd::lhc_load_cells<T, Index>{peeling, summed_sketch.data(), op.status()});
    cd::for_each_item(exec, n, cd::lhc_count_members<Index>{peeling, index, p.index});
    cd::for_each_item(exec, plan.cells, cd::lhc_queue_pure<Index>{peeling, s.queued.data()});
    const Index* const queued = s.queued.data();
    GRADCOMP_CUDA_CHECK(cub::DeviceSelect::If(s.cub_temp.data(), temp_bytes, queued, s.lists[0].data(), &counters->next,
                                              static_cast<std::int64_t>(plan.cells), names_cell, stream));
    std::uint64_t entries = 0;
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(&entries, &counters->next, sizeof entries, cudaMemcpyDeviceToHost, stream));
    op.finish([](errc, std::uint64_t c, std::uint32_t) { return detail::lhc_non_finite_message(c); });

    const int key_bits = std::bit_width(plan.cells);  // the key "none" is `cells`
    lhc_decode_result result;
    std::uint64_t recovered = 0;
    for (int list = 0; entries > 0; list ^= 1) {
      const Index* const here = s.lists[list].data();
      const std::uint64_t items = 3 * entries;
      GRADCOMP_CUDA_CHECK(cudaMemsetAsync(&counters->recovered, 0, sizeof counters->recovered, stream));
      cd::launch(exec, cd::grid_for(entries), cd::block_threads, cd::lhc_recover_kernel<T, Index>, peeling, here,
                 entries, s.sort_keys[0].data(), s.subtractions[0].data(), s.queued.data(), &counters->recovered,
                 op.status());
      cub::DoubleBuffer<Index> keys(s.sort_keys[0].data(), s.sort_keys[1].data());
      cub::DoubleBuffer<Index> subtractions(s.subtractions[0].data(), s.subtractions[1].data());
      temp_bytes = s.cub_temp.size();
      GRADCOMP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(s.cub_temp.data(), temp_bytes, keys, subtractions, items, 0,
                                                          key_bits, stream));
      cd::for_each_item(exec, items,
                        cd::lhc_subtract<Index>{peeling, items, here, keys.Current(), subtractions.Current(),
                                                s.queued.data()});
      temp_bytes = s.cub_temp.size();
      GRADCOMP_CUDA_CHECK(cub::DeviceSelect::If(s.cub_temp.data(), temp_bytes, queued, s.lists[list ^ 1].data(),
                                                &counters->next, static_cast<std::int64_t>(items), names_cell, stream));
      cd::lhc_decode_counters round{};
      GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(&round, counters, sizeof round, cudaMemcpyDeviceToHost, stream));
      op.finish([&](errc, std::uint64_t e, std::uint32_t) {
        const auto from = read_word(exec, here + e);
        return detail::lhc_range_message("sum", read_word(exec, s.recovered_element.data() + from));
      });
      recovered += round.recovered;
      result.rounds += std::uint64_t{round.recovered != 0};
      entries = round.next;
    }
    result.recovered = recovered;
    result.unrecovered = plan.union_nonzeros - recovered;
    detail::lhc_require_peeled(p.on_stall, result, plan);
    if (result.unrecovered != 0) {
      cd::for_each_item(exec, n, cd::lhc_estimate_left<T, Index>{peeling, index, p.index, nullptr, op.status()});
      op.finish([](errc, std::uint64_t i, std::uint32_t) { return detail::lhc_range_message("estimate", i); });
      result.estimated = result.unrecovered;
    }
    GRADCOMP_CUDA_CHECK(cudaMemsetAsync(out.data(), 0, n * sizeof(T), stream));
    cd::for_each_item(exec, plan.cells, cd::lhc_write_recovered<T, Index>{peeling, out.data()});
    if (result.unrecovered != 0)
      cd::for_each_item(exec, n, cd::lhc_estimate_left<T, Index>{peeling, index, p.index, out.data(), op.status()});
    return result;
  }

  /// The CPU's padding check, on the index's last byte copied to the host.
  static void require_padding(const codec_type& codec, const cuda_executor& exec, std::span<const std::byte> index,
                              std::uint64_t n) {
    detail::lhc_require_padding(codec.params().index, n, [&] {
      unsigned char last = 0;
      GRADCOMP_CUDA_CHECK(
          cudaMemcpyAsync(&last, index.data() + index.size() - 1, 1, cudaMemcpyDeviceToHost, exec.native_stream()));
      exec.synchronize();
      return last;
    });
  }
};

}  // namespace gradcomp
