#pragma once
/// @file
/// CPU backend of the count sketch.
///
/// Encoding, given `workspace_bytes(n)` of workspace, goes row by row. The hashes of a chunk of
/// 2048 elements are computed first, eight keys per AVX2 instruction where the executor allows it
/// (cpu/detail/murmur3_simd.hpp). Then each element's update (column h_j(i), value σ_j(i)·x_i) is appended
/// to the queue of its column range: at most 16 ranges per row, of 2^18 bytes of cells each unless
/// the row is longer. A queue is applied to its cells when the next chunk might not fit in it, and
/// at the end of the row. A queue holds its updates in ascending element order, so every cell still
/// sums its elements in ascending order, and the cells its updates touch stay in the L2 cache and
/// the TLB while it is applied, where updates straight into a table larger than the cache would
/// miss on almost every one. Given less workspace (an empty span, say), encoding updates the cells
/// directly, as the estimate reads them (below): the same bytes, only slower.
///
/// The estimate's walk takes elements in batches of 256: the bucket hashes of a batch are computed
/// first, every row at once, then the cells are read row by row in ascending element order, with
/// the cell a fixed distance further along the row prefetched; the next batch's hashes are ready
/// before the current batch's last cells, so the prefetches run ahead across batch boundaries too.
/// Heavy hitters are chosen by radix selection on the estimates' magnitude keys
/// (cpu/detail/radix_select.hpp), never by sorting. Cells are read and written through memcpy, so a
/// message may start at any address. A 16-bit gradient's values are widened as they are queued (its
/// cells and estimates are float32); a decode into a 16-bit output checks every heavy hitter's
/// result before writing the first.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/murmur3.hpp>
#include <gradcomp/core/narrowing.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cpu/detail/message.hpp>
#include <gradcomp/cpu/detail/murmur3_simd.hpp>
#include <gradcomp/cpu/detail/radix_select.hpp>
#include <gradcomp/sketch/count_sketch.hpp>

namespace gradcomp {

/// The count sketch on the CPU.
template <gradient_value T>
struct backend<count_sketch<T>, cpu_executor> {
  using codec_type = count_sketch<T>;
  using C = compute_type<T>;  ///< The cells' and estimates' type: float32 for a 16-bit T.
  using key_type = typename float_traits<C>::bits_type;

  /// The larger of what encoding uses (its range queues, `encode_scratch`) and what decoding uses
  /// (the n estimates and the radix-selection histograms): both run in the same buffer.
  static std::size_t workspace_bytes(const codec_type& codec, const cpu_executor&, std::uint64_t n) {
    workspace_arena decoding = workspace_arena::measure();
    (void)carve(decoding, n);
    return std::max(decoding.bytes_needed(), encode_workspace_bytes(codec, n));
  }

  /// Encodes through the range queues when `ws` holds `workspace_bytes(n)`, else (slower) by
  /// updating the cells directly; both write the same bytes.
  static std::size_t encode(const codec_type& codec, const cpu_executor& e, std::span<const T> grad,
                            std::span<std::byte> out, std::span<std::byte> ws, message_key key) {
    const std::uint64_t n = grad.size();
    if (n > 0) (void)detail::cpu::max_magnitude(grad.data(), grad.data() + n, e.avx2());  // NaN/Inf: nothing written
    const std::size_t size = codec.max_encoded_bytes(n);
    detail::cpu::begin_message(out, size);
    std::byte* const cells = out.data() + envelope::size;
    std::memset(cells, 0, codec.summable_bytes(n));
    const T* const g = grad.data();
    if (n > 0 && ws.size() >= encode_workspace_bytes(codec, n)) {
      workspace_arena arena(ws);
      encode_queued(codec, e.avx2(), g, n, cells, carve_encode(arena, codec, n));
    } else {
      walk(
          codec, e.avx2(), n, cells,
          [&](std::uint32_t, std::uint64_t i, std::byte* cell, std::uint32_t hash) {
            store(cell, load(cell) + count_sketch_signed(hash, C{widen(g[i])}));
          },
          [](std::uint64_t, std::size_t) {});
    }
    detail::require(all_finite(cells, cell_count(codec)), errc::non_finite_input,
                    "a cell sum overflows the value type (the gradient's magnitudes are too large to sketch)");
    detail::cpu::seal_message(
        out, {codec_id::count_sketch, dtype_of<T>, 0, 0, key, n, size - envelope::size, codec.params_hash(), 0}, false);
    return size;
  }

  /// Decodes into `out` of T, or (a 16-bit T) of float32; with `accumulate` adds instead. A 16-bit
  /// output's results are all checked to fit before the first is written.
  template <gradient_value O>
  static void decode(const codec_type& codec, const cpu_executor& e, std::span<const std::byte> message,
                     std::span<O> out, std::span<std::byte> ws, const decode_limits& limits, bool accumulate) {
    const std::uint64_t n = out.size();
    (void)detail::count_sketch_checked(codec, message, n, limits);
    workspace_arena arena(ws);
    const scratch s = carve(arena, n);
    if (n == 0) return;
    estimate_into(codec, e.avx2(), message.data() + envelope::size, s.estimates);
    const C* const estimates = s.estimates.data();
    const heavy_hitter_cut cut = select_heavy_hitters(s, codec.heavy_hitter_count(n));
    const auto result = [&](std::size_t i) { return accumulate ? widen(out[i]) + estimates[i] : estimates[i]; };
    if constexpr (half_precision<O>)
      for_each_heavy_hitter(s, cut, [&](std::size_t i) { detail::require_narrows<O>(i, result(i)); });
    if (!accumulate) std::fill(out.begin(), out.end(), O{0});
    for_each_heavy_hitter(s, cut, [&](std::size_t i) {
      if constexpr (half_precision<O>) out[i] = narrow<O>(result(i));
      else
        out[i] = result(i);
    });
  }

  static void estimate(const codec_type& codec, const cpu_executor& e, std::span<const std::byte> message,
                       std::span<C> out, std::span<std::byte>, const decode_limits& limits) {
    (void)detail::count_sketch_checked(codec, message, out.size(), limits);
    estimate_into(codec, e.avx2(), message.data() + envelope::size, out);
  }

  static std::size_t heavy_hitters(const codec_type& codec, const cpu_executor& e, std::span<const std::byte> message,
                                   std::uint64_t n, std::span<std::uint64_t> indices, std::span<std::byte> ws,
                                   const decode_limits& limits) {
    (void)detail::count_sketch_checked(codec, message, n, limits);
    const std::uint64_t k = codec.heavy_hitter_count(n);
    detail::require_heavy_hitter_room(indices, k);
    workspace_arena arena(ws);
    const scratch s = carve(arena, n);
    if (n == 0) return 0;
    estimate_into(codec, e.avx2(), message.data() + envelope::size, s.estimates);
    std::size_t written = 0;
    for_each_heavy_hitter(s, select_heavy_hitters(s, k), [&](std::size_t i) { indices[written++] = i; });
    return written;
  }

  static void accumulate_encoded(const codec_type& codec, const cpu_executor&, std::span<std::byte> acc,
                                 std::span<const std::byte> other) {
    const envelope mine = detail::count_sketch_checked(codec, acc, parse_envelope(acc).elements, {});
    const envelope theirs = detail::count_sketch_checked(codec, other, mine.elements, {});
    detail::require(mine.key == theirs.key, errc::step_mismatch,
                    "messages of different steps or tensors cannot be summed");
    std::byte* const a = acc.data() + envelope::size;
    const std::byte* const b = other.data() + envelope::size;
    const std::size_t cells = cell_count(codec);
    bool finite = true;
    for (std::size_t m = 0; m < cells; ++m) finite &= is_finite(load(a + m * sizeof(C)) + load(b + m * sizeof(C)));
    detail::require(finite, errc::non_finite_input, "a summed cell overflows the value type");
    for (std::size_t m = 0; m < cells; ++m) store(a + m * sizeof(C), load(a + m * sizeof(C)) + load(b + m * sizeof(C)));
  }

 private:
  /// Elements whose hashes are computed together. 2^32 is a multiple, so no batch straddles two
  /// values of the index's high word.
  static constexpr std::size_t batch = 256;
  /// How many elements ahead along a row the cell to come is prefetched.
  static constexpr std::size_t prefetch_ahead = 24;

  /// Elements whose hashes the queued encoder computes together (8 KiB of hashes). 2^32 is a
  /// multiple, so no chunk straddles two values of the index's high word.
  static constexpr std::size_t encode_chunk = 2048;
  /// Bytes of cells a column range spans unless the row is longer than 2^max_range_bits of them:
  /// small enough to stay in the L2 cache and the TLB while its queue is applied.
  static constexpr std::size_t range_cell_bytes = std::size_t{1} << 18;
  /// A row has at most 2^4 column ranges (longer rows get wider ranges).
  static constexpr unsigned max_range_bits = 4;
  /// Bytes of each range's queue of updates, at most.
  static constexpr std::size_t queue_bytes = std::size_t{1} << 19;

  /// One element's update of a row: S[j][column] += value.
  struct update {
    std::uint32_t column;
    C value;
  };

  /// How the queued encoder splits a row and the input: range r holds the columns
  /// [r·2^shift, (r+1)·2^shift), its queue holds up to `capacity` updates, and `chunk` elements are
  /// hashed at a time.
  struct partitioning {
    unsigned shift;
    std::size_t ranges;
    std::size_t capacity;
    std::size_t chunk;
  };

  /// The partitioning of every row of `codec` for an n-element tensor (n ≥ 1).
  [[nodiscard]] static partitioning partitioning_of(const codec_type& codec, std::uint64_t n) noexcept {
    const std::uint64_t columns = codec.columns();
    const auto widest = static_cast<unsigned>(std::bit_width(columns - 1));  // bits of the last column
    const unsigned shift = std::max(static_cast<unsigned>(std::countr_zero(range_cell_bytes / sizeof(C))),
                                    widest > max_range_bits ? widest - max_range_bits : 0u);
    return {shift, static_cast<std::size_t>(((columns - 1) >> shift) + 1),
            static_cast<std::size_t>(std::min<std::uint64_t>(queue_bytes / sizeof(update), n)),
            static_cast<std::size_t>(std::min<std::uint64_t>(encode_chunk, n))};
  }

  /// Encoding's workspace: the hashes of a chunk, every range's queue, and where each queue ends
  /// (one row's queues at a time).
  struct encode_scratch {
    std::span<std::uint32_t> hashes;
    std::span<update> queues;  // range r's queue starts at r·capacity
    std::span<update*> ends;
  };

  static encode_scratch carve_encode(workspace_arena& arena, const codec_type& codec, std::uint64_t n) {
    if (n == 0) return {};
    const partitioning part = partitioning_of(codec, n);
    encode_scratch s;
    s.hashes = arena.take<std::uint32_t>(part.chunk);
    s.queues = arena.take<update>(part.ranges * part.capacity);
    s.ends = arena.take<update*>(part.ranges);
    return s;
  }

  /// Bytes of workspace the queued encoder needs.
  [[nodiscard]] static std::size_t encode_workspace_bytes(const codec_type& codec, std::uint64_t n) {
    workspace_arena arena = workspace_arena::measure();
    (void)carve_encode(arena, codec, n);
    return arena.bytes_needed();
  }

  /// S[j][h_j(i)] += σ_j(i)·g[i] for every row j and element i < n (n ≥ 1) into the zeroed `cells`,
  /// through the range queues (see this file's comment); a 16-bit g[i] widened to float32.
  static void encode_queued(const codec_type& codec, bool avx2, const T* g, std::uint64_t n, std::byte* cells,
                            const encode_scratch& s) {
    const partitioning part = partitioning_of(codec, n);
    const std::uint64_t columns = codec.columns();
    update* const queues = s.queues.data();
    update** const ends = s.ends.data();
    for (std::uint32_t j = 0; j < codec.rows(); ++j) {
      std::byte* const row = cells + j * columns * sizeof(C);
      // Adds range r's queued updates to their cells, in the order queued, and empties the queue.
      const auto apply = [&](std::size_t r) {
        update* const begin = queues + r * part.capacity;
        const update* const end = ends[r];
        for (const update* u = begin; u != end; ++u) {
          std::byte* const cell = row + u->column * sizeof(C);
          store(cell, load(cell) + u->value);
        }
        ends[r] = begin;
      };
      for (std::size_t r = 0; r < part.ranges; ++r) ends[r] = queues + r * part.capacity;
      const std::uint32_t seed = count_sketch_row_seed(codec.params().seed, j);
      for (std::uint64_t first = 0; first < n; first += part.chunk) {
        const auto count = static_cast<std::size_t>(std::min<std::uint64_t>(part.chunk, n - first));
        const std::uint32_t high = murmur3_fmix32(static_cast<std::uint32_t>(first >> 32));
        detail::cpu::murmur3_32_run(static_cast<std::uint32_t>(first), count, seed ^ high, s.hashes.data(), avx2);
        for (std::size_t r = 0; r < part.ranges; ++r)
          if (static_cast<std::size_t>(queues + (r + 1) * part.capacity - ends[r]) < count) apply(r);
        const T* const x = g + first;
        for (std::size_t b = 0; b < count; ++b) {
          const std::uint32_t hash = s.hashes[b];
          const auto column = static_cast<std::uint32_t>(count_sketch_bucket(hash, columns));
          *ends[column >> part.shift]++ = {column, count_sketch_signed(hash, C{widen(x[b])})};
        }
      }
      for (std::size_t r = 0; r < part.ranges; ++r) apply(r);
    }
  }

  /// Decoding's workspace: the estimates, and the histograms of radix selection.
  struct scratch {
    std::span<C> estimates;
    std::span<std::uint64_t> histogram;
    std::span<std::uint32_t> sub_histograms;
  };

  static scratch carve(workspace_arena& arena, std::uint64_t n) {
    if (n == 0) return {};
    scratch s;
    s.estimates = arena.take<C>(static_cast<std::size_t>(n));
    s.histogram = arena.take<std::uint64_t>(detail::cpu::radix_buckets);
    s.sub_histograms = arena.take<std::uint32_t>(detail::cpu::histogram_scratch_counters);
    return s;
  }

  [[nodiscard]] static std::size_t cell_count(const codec_type& codec) noexcept {
    return static_cast<std::size_t>(codec.rows() * codec.columns());
  }
  [[nodiscard]] static C load(const std::byte* at) noexcept {
    C v;
    std::memcpy(&v, at, sizeof v);
    return v;
  }
  static void store(std::byte* at, C v) noexcept { std::memcpy(at, &v, sizeof v); }

  /// Whether every one of the `count` cells at `cells` is finite.
  [[nodiscard]] static bool all_finite(const std::byte* cells, std::size_t count) noexcept {
    key_type largest = 0;
    for (std::size_t m = 0; m < count; ++m) largest = std::max(largest, magnitude_key(load(cells + m * sizeof(C))));
    return largest < float_traits<C>::infinity_key;
  }

  /// Calls visit(j, i, cell, H_j(i)) for every element i < n and row j, where `cell` points at
  /// S[j][h_j(i)] in `cells`, batch by batch and, within a batch, row by row in ascending element
  /// order (so each cell sees its elements in ascending order); then after_batch(first, count).
  template <class Byte, class Visit, class AfterBatch>
  static void walk(const codec_type& codec, bool avx2, std::uint64_t n, Byte* cells, Visit&& visit,
                   AfterBatch&& after_batch) {
    const std::uint32_t rows = codec.rows();
    const std::uint64_t columns = codec.columns();
    std::uint32_t row_seeds[count_sketch_max_rows];
    for (std::uint32_t j = 0; j < rows; ++j) row_seeds[j] = count_sketch_row_seed(codec.params().seed, j);
    std::uint32_t hashes[2][count_sketch_max_rows][batch];
    // Hashes of the batch starting at `first` into `into`; returns its element count.
    const auto hash_batch = [&](std::uint64_t first,
                                std::uint32_t(&into)[count_sketch_max_rows][batch]) -> std::size_t {
      if (first >= n) return 0;
      const auto count = static_cast<std::size_t>(std::min<std::uint64_t>(batch, n - first));
      const std::uint32_t high = murmur3_fmix32(static_cast<std::uint32_t>(first >> 32));
      for (std::uint32_t j = 0; j < rows; ++j)
        detail::cpu::murmur3_32_run(static_cast<std::uint32_t>(first), count, row_seeds[j] ^ high, into[j], avx2);
      return count;
    };
    const auto cell_of = [columns](Byte* row, std::uint32_t hash) {
      return row + count_sketch_bucket(hash, columns) * sizeof(C);
    };
    int current = 0;
    std::size_t count = hash_batch(0, hashes[0]);
    for (std::uint64_t first = 0; first < n; first += batch) {
      const std::size_t next_count = hash_batch(first + batch, hashes[current ^ 1]);
      for (std::uint32_t j = 0; j < rows; ++j) {
        Byte* const row = cells + j * columns * sizeof(C);
        const std::uint32_t* const h = hashes[current][j];
        const std::uint32_t* const h_next = hashes[current ^ 1][j];
        for (std::size_t b = 0; b < count; ++b) {
          const std::size_t ahead = b + prefetch_ahead;
          if (ahead < count) detail::cpu::prefetch(cell_of(row, h[ahead]), cell_of(row, h[ahead]) + 1);
          else if (ahead - count < next_count)
            detail::cpu::prefetch(cell_of(row, h_next[ahead - count]), cell_of(row, h_next[ahead - count]) + 1);
          visit(j, first + b, cell_of(row, h[b]), h[b]);
        }
      }
      after_batch(first, count);
      current ^= 1;
      count = next_count;
    }
  }

  /// out[i] = x̂_i for every element of the sketched tensor (out.size() of them), from the cells of a
  /// validated message.
  static void estimate_into(const codec_type& codec, bool avx2, const std::byte* cells, std::span<C> out) {
    const std::uint32_t rows = codec.rows();
    C row_estimates[count_sketch_max_rows][batch];
    walk(
        codec, avx2, out.size(), cells,
        [&](std::uint32_t j, std::uint64_t i, const std::byte* cell, std::uint32_t hash) {
          row_estimates[j][i % batch] = count_sketch_signed(hash, load(cell));
        },
        [&](std::uint64_t first, std::size_t count) {
          for (std::size_t b = 0; b < count; ++b) {
            C column[count_sketch_max_rows] = {};
            for (std::uint32_t j = 0; j < rows; ++j) column[j] = row_estimates[j][b];
            out[first + b] = count_sketch_median(column, rows);
          }
        });
  }

  /// The heavy hitters of k (1 ≤ k ≤ n) as a cut: the k-th largest magnitude key of the estimates,
  /// by radix selection over all of them, and how many estimates equal to it are kept.
  using heavy_hitter_cut = detail::cpu::kth_key<key_type>;

  [[nodiscard]] static heavy_hitter_cut select_heavy_hitters(const scratch& s, std::uint64_t k) {
    const std::span<const C> estimates = s.estimates;
    detail::cpu::magnitude_histogram<C>(estimates, s.histogram, s.sub_histograms);
    const detail::cpu::bucket_choice choice = detail::cpu::choose_bucket(s.histogram, k);
    return detail::cpu::select_kth_largest<key_type>(
        [&](auto&& visit) {
          for (const C v : estimates) visit(magnitude_key(v));
        },
        float_traits<C>::magnitude_bits, k - choice.above, static_cast<key_type>(choice.bucket),
        detail::cpu::radix_digit_bits, s.histogram);
  }

  /// Calls f(i), in ascending order, for the indices of the heavy hitters `kth` (ties to the lower
  /// index): one pass that takes every key above the cut and the first ties equal to it.
  template <class F>
  static void for_each_heavy_hitter(const scratch& s, const heavy_hitter_cut& kth, F&& f) {
    const std::span<const C> estimates = s.estimates;
    std::uint64_t ties = kth.ties;
    detail::cpu::for_each_at_least<C>(estimates, kth.key, [&](std::size_t i) {
      if (magnitude_key(estimates[i]) > kth.key) {
        f(i);
      } else if (ties > 0) {
        --ties;
        f(i);
      }
    });
  }
};

}  // namespace gradcomp
