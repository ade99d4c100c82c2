#pragma once
/// @file
/// Reference backend of lossless homomorphic compression (sketch/lossless_homomorphic.hpp,
/// docs/sketches.md §2): the specification the `cpu_executor` and `cuda_executor` backends are
/// checked against, bit for bit. The index and the sketch are written element by element in
/// ascending order; the decoder builds every cell's sum, count and XOR of element indices from the
/// aggregated index, then peels in synchronous rounds exactly as the codec's file comment orders
/// them: round 1's candidates are the cells of count 1 in cell order, a later round's the cells
/// whose counts fell to 1 in the round before, in that order; an element is recovered at the entry
/// of its lowest pure cell and subtracted from its three cells in the order of (entry, j). A 16-bit
/// gradient's values are widened into float32 cells; its decoded values are rounded into a 16-bit
/// output after all are checked to fit.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/narrowing.hpp>
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/reference/values.hpp>
#include <gradcomp/sketch/lossless_homomorphic.hpp>

namespace gradcomp {

/// Lossless homomorphic compression, written to be read.
template <gradient_value T>
struct backend<lossless_homomorphic<T>, reference_executor> {
  using codec_type = lossless_homomorphic<T>;
  using C = compute_type<T>;  ///< The sketch's type: float32 for a 16-bit T.
  using accumulator = lhc_accumulator_t<C>;

  static void encode_index(const codec_type& codec, const reference_executor&, std::span<const T> grad,
                           std::span<std::byte> index) {
    const std::uint64_t n = grad.size();
    detail::lhc_require_size(index.size(), codec.index_bytes(n), "index bytes");
    // Element i's bit or field is [x_i ≠ 0] (−0 counts as zero); padding stays zero.
    std::fill(index.begin(), index.end(), std::byte{0});
    bool finite = true;
    for (std::uint64_t i = 0; i < n; ++i) {
      finite = finite && is_finite(grad[i]);
      if (magnitude_key(grad[i]) != 0) mark(codec, index, i);
    }
    if (finite) return;
    // NaN or ±Inf: every element a member, so that the plan is dense everywhere (the file comment).
    for (std::uint64_t i = 0; i < n; ++i) mark(codec, index, i);
    detail::fail(errc::non_finite_input, "the gradient holds NaN or Inf");
  }

  static lhc_plan plan(const codec_type& codec, const reference_executor&, std::span<const std::byte> global_index,
                       std::uint64_t n, std::uint64_t contributors) {
    detail::lhc_require_contributors(contributors, codec.max_contributors());
    detail::lhc_require_size(global_index.size(), codec.index_bytes(n), "index bytes");
    return codec.plan_for(n, count_union(codec, global_index, n, contributors));
  }

  static std::size_t workspace_bytes(const codec_type&, const reference_executor&, const lhc_plan& plan) {
    workspace_arena arena = workspace_arena::measure();
    (void)carve(arena, plan);
    return arena.bytes_needed();
  }

  static void encode_sketch(const codec_type& codec, const reference_executor&, std::span<const T> grad,
                            std::span<const std::byte> global_index, const lhc_plan& plan, std::span<C> sketch) {
    const std::uint64_t n = grad.size();
    detail::lhc_require_size(n, plan.n, "elements");
    detail::lhc_require_size(global_index.size(), codec.index_bytes(n), "index bytes");
    detail::lhc_require_size(sketch.size(), plan.sketch_values(), "sketch values");
    require_padding(codec, global_index, n);
    detail::require(plan == codec.plan_for(n, plan.union_nonzeros), errc::invalid_argument,
                    "the plan does not follow the sizing rule");
    // Dense: the values themselves. Otherwise S[c] = Σ σ_j(i)·x_i over the members i in ascending
    // order (then j), in C from +0 (a 16-bit x_i widened exactly).
    if (!plan.dense) std::fill(sketch.begin(), sketch.end(), C{0});
    const lhc_params& p = codec.params();
    bool finite = true;
    std::uint64_t members = 0;
    std::uint64_t first_outside = n;
    for (std::uint64_t i = 0; i < n; ++i) {
      finite = finite && is_finite(grad[i]);
      const bool member = is_member(codec, global_index, i);
      members += member ? 1u : 0u;
      const bool nonzero = magnitude_key(grad[i]) != 0;
      if (nonzero && !member && first_outside == n) first_outside = i;
      const C x{widen(grad[i])};
      if (plan.dense) {
        sketch[i] = x;
      } else if (nonzero && member) {
        const lhc_cell_triple cells = cells_of(p, plan, i);
        for (int j = 0; j < 3; ++j) sketch[cells.cell[j]] += cells.negative[j] ? -x : x;
      }
    }
    detail::lhc_finish_sketch(sketch, finite, first_outside, n, members, plan);
  }

  /// Decodes into `out` of T, or (a 16-bit T) of float32.
  template <gradient_value O>
  static lhc_decode_result decode(const codec_type& codec, const reference_executor&,
                                  std::span<const std::byte> global_index, const lhc_plan& plan,
                                  std::span<const C> summed_sketch, std::span<O> out, std::span<std::byte> ws) {
    const std::uint64_t n = out.size();
    detail::lhc_require_size(n, plan.n, "elements");
    detail::lhc_require_size(global_index.size(), codec.index_bytes(n), "index bytes");
    detail::lhc_require_plan_of_index(plan,
                                      codec.plan_for(n, count_union(codec, global_index, n, codec.max_contributors())));
    detail::lhc_require_size(summed_sketch.size(), plan.sketch_values(), "sketch values");
    if (plan.dense) {
      require_finite(summed_sketch);
      std::vector<C> sums(static_cast<std::size_t>(n));
      for (std::uint64_t i = 0; i < n; ++i) sums[i] = summed_sketch[i] + C{0};
      detail::reference::store_results(sums, out);
      return {.recovered = plan.union_nonzeros};
    }
    if (plan.cells == 0) {
      std::fill(out.begin(), out.end(), O{0});
      return {};
    }
    workspace_arena arena(ws);
    const peel_state s = carve(arena, plan);
    require_finite(summed_sketch);
    const lhc_params& p = codec.params();

    // Each cell's residual sum, and how many (member, hash) pairs it holds and the XOR of their
    // element indices, from the aggregated index.
    for (std::uint64_t c = 0; c < plan.cells; ++c) s.cells[c] = {summed_sketch[c], 0, 0};
    for (std::uint64_t i = 0; i < n; ++i) {
      s.recovered[i] = 0;
      if (!is_member(codec, global_index, i)) continue;
      const lhc_cell_triple cells = cells_of(p, plan, i);
      for (const std::uint64_t c : cells.cell) {
        ++s.cells[c].count;
        s.cells[c].id ^= i;
      }
    }

    // Round 1's candidates: the cells of count 1, in cell order.
    std::uint64_t queued = 0;
    for (std::uint64_t c = 0; c < plan.cells; ++c)
      if (s.cells[c].count == 1) s.candidates[queued++] = {s.cells[c].id, c};

    lhc_decode_result result;
    std::uint64_t logged = 0;
    for (std::uint64_t begin = 0; begin < queued;) {
      // Pure in this round: count 1 when it begins.
      for (std::uint64_t c = 0; c < plan.cells; ++c) s.pure[c] = s.cells[c].count == 1 ? 1 : 0;
      const std::uint64_t end = queued;
      const std::uint64_t logged_before = logged;
      for (std::uint64_t e = begin; e < end; ++e) {
        const candidate entry = s.candidates[e];
        if (s.cells[entry.cell].count != 1) continue;  // its element was recovered at an earlier entry
        const std::uint64_t i = entry.element;  // the cell's only element since it was queued
        const lhc_cell_triple cells = cells_of(p, plan, i);
        const int j = lhc_recovering_hash(s.pure[cells.cell[0]] != 0, s.pure[cells.cell[1]] != 0);
        if (cells.cell[j] != entry.cell) continue;  // recovered at the entry of its lowest pure cell
        const accumulator v = lhc_signed(cells.negative[j], s.cells[entry.cell].sum);
        detail::require(lhc_fits<C>(v), errc::non_finite_input, [&] { return detail::lhc_range_message("sum", i); });
        s.log[logged++] = {i, static_cast<C>(v) + C{0}};  // + 0: no −0 in the output
        s.recovered[i] = 1;
        // Subtracted from its three cells in the order of j; a cell whose count falls to 1 is a
        // candidate of the next round.
        for (int k = 0; k < 3; ++k) {
          cell_state& cell = s.cells[cells.cell[k]];
          cell.sum -= lhc_signed(cells.negative[k], v);
          cell.id ^= i;
          if (--cell.count == 1) s.candidates[queued++] = {cell.id, cells.cell[k]};
        }
      }
      if (logged > logged_before) ++result.rounds;
      begin = end;
    }
    result.recovered = logged;
    result.unrecovered = plan.union_nonzeros - logged;
    if (result.unrecovered != 0) {
      detail::lhc_require_peeled(p.on_stall, result, plan);
      // The median of the three residual estimates of every member left, in ascending order.
      for (std::uint64_t i = 0; i < n; ++i) {
        if (!is_member(codec, global_index, i) || s.recovered[i] != 0) continue;
        const lhc_cell_triple cells = cells_of(p, plan, i);
        accumulator estimate[3];
        for (int j = 0; j < 3; ++j) estimate[j] = lhc_signed(cells.negative[j], s.cells[cells.cell[j]].sum);
        const accumulator median = lhc_median_of_three(estimate[0], estimate[1], estimate[2]);
        detail::require(lhc_fits<C>(median), errc::non_finite_input,
                        [&] { return detail::lhc_range_message("estimate", i); });
        s.log[logged++] = {i, static_cast<C>(median) + C{0}};
      }
      result.estimated = result.unrecovered;
    }
    // A 16-bit output: every logged value must narrow to a finite one.
    if constexpr (half_precision<O>)
      for (std::uint64_t q = 0; q < logged; ++q) detail::require_narrows<O>(s.log[q].element, s.log[q].value);
    // Everything is checked: zeros, then the logged values.
    std::fill(out.begin(), out.end(), O{0});
    for (std::uint64_t q = 0; q < logged; ++q) out[s.log[q].element] = detail::reference::to_output<O>(s.log[q].value);
    return result;
  }

 private:
  struct cell_state {
    accumulator sum;     ///< The summed sketch value less the values recovered from the cell.
    std::uint64_t count; ///< (Member, hash) pairs left in the cell.
    std::uint64_t id;    ///< XOR of their element indices: the element of a cell of count 1.
  };
  struct candidate {
    std::uint64_t element;  ///< The cell's element when its count fell to 1.
    std::uint64_t cell;
  };
  struct logged_value {
    std::uint64_t element;
    C value;
  };
  /// The decoder's workspace: the cells, their purity in the current round, the candidates of every
  /// round (each cell is queued at most once per fall to 1), the recovered values, and which
  /// elements are recovered.
  struct peel_state {
    std::span<cell_state> cells;
    std::span<std::uint8_t> pure;
    std::span<candidate> candidates;
    std::span<logged_value> log;
    std::span<std::uint8_t> recovered;
  };
  static peel_state carve(workspace_arena& arena, const lhc_plan& plan) {
    if (plan.dense || plan.cells == 0) return {};
    const auto cells = static_cast<std::size_t>(plan.cells);
    peel_state s;
    s.cells = arena.take<cell_state>(cells);
    s.pure = arena.take<std::uint8_t>(cells);
    s.candidates = arena.take<candidate>(cells);
    s.log = arena.take<logged_value>(static_cast<std::size_t>(plan.union_nonzeros));
    s.recovered = arena.take<std::uint8_t>(static_cast<std::size_t>(plan.n));
    return s;
  }

  /// The cells of element i (the file comment's layout).
  static lhc_cell_triple cells_of(const lhc_params& p, const lhc_plan& plan, std::uint64_t i) {
    const std::uint64_t b = i / p.block;
    return lhc_cells_in(lhc_layout_of_block(b, plan.rows, p.block, p.seed, p.reference_layout), i - b * p.block,
                        p.block);
  }

  /// The aggregated bit or field of element i (its byte of the index, shifted).
  static unsigned field_of(const codec_type& codec, std::span<const std::byte> index, std::uint64_t i) {
    const unsigned per = detail::lhc_elements_per_byte(codec.params().index);
    const unsigned width = 8 / per;
    const auto byte = std::to_integer<unsigned>(index[i / per]);
    return (byte >> (static_cast<unsigned>(i % per) * width)) & ((1u << width) - 1);
  }
  static bool is_member(const codec_type& codec, std::span<const std::byte> index, std::uint64_t i) {
    return field_of(codec, index, i) != 0;
  }
  /// Sets element i's bit (bitmap) or field to 1 (sum4, sum8) in a zeroed index.
  static void mark(const codec_type& codec, std::span<std::byte> index, std::uint64_t i) {
    const unsigned per = detail::lhc_elements_per_byte(codec.params().index);
    index[i / per] |= static_cast<std::byte>(1u << (static_cast<unsigned>(i % per) * (8 / per)));
  }

  /// Checks that the summed sketch holds no NaN or ±Inf.
  static void require_finite(std::span<const C> summed_sketch) {
    for (std::uint64_t c = 0; c < summed_sketch.size(); ++c)
      detail::require(is_finite(summed_sketch[c]), errc::non_finite_input,
                      [&] { return detail::lhc_non_finite_message(c); });
  }

  static void require_padding(const codec_type& codec, std::span<const std::byte> index, std::uint64_t n) {
    detail::lhc_require_padding(codec.params().index, n, [&] { return std::to_integer<unsigned>(index.back()); });
  }

  /// |U| of an aggregated index, after checking its padding and that no field exceeds `limit`.
  static std::uint64_t count_union(const codec_type& codec, std::span<const std::byte> index, std::uint64_t n,
                                   std::uint64_t limit) {
    require_padding(codec, index, n);
    if (codec.params().index != lhc_index_coding::bitmap) {
      const unsigned per = detail::lhc_elements_per_byte(codec.params().index);
      for (std::uint64_t slot = 0; slot < index.size() * per; ++slot)  // padding fields included (they are 0)
        detail::require(field_of(codec, index, slot) <= limit, errc::malformed_payload, [&] {
          return "index byte " + std::to_string(slot / per) + " holds a field above " + std::to_string(limit) +
                 " contributors";
        });
    }
    std::uint64_t members = 0;
    for (std::uint64_t i = 0; i < n; ++i) members += is_member(codec, index, i) ? 1u : 0u;
    return members;
  }
};

}  // namespace gradcomp
