#pragma once
/// @file
/// CPU implementation of lossless homomorphic compression (sketch/lossless_homomorphic.hpp). The
/// tensor is walked 64 elements at a time: a word of "non-zero" bits from the gradient, a word of
/// "in the union" bits from the index, and only the set bits are visited, so zero runs cost a
/// word test. A block's three row segments are contiguous runs of B cells. Peeling keeps, per cell,
/// a double accumulator, a counter and the XOR of its elements' indices (which names the element
/// of a pure cell), counts row by row, and visits only a worklist of cells whose counter reached
/// 1, each element's three cells once; the recovered values are then grouped by span of the
/// output, which is written front to back (see `peel`). Every check runs before an output is
/// written.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <type_traits>

#if defined(__SSE2__)
#  include <emmintrin.h>
#endif

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/narrowing.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cpu/detail/staged_writer.hpp>
#include <gradcomp/sketch/lossless_homomorphic.hpp>

namespace gradcomp {

namespace detail {

/// Elements per word of membership bits.
inline constexpr std::uint64_t lhc_word = 64;

/// Membership bits of elements [64w, 64w + 64) ∩ [0, n) from an index coding: bit k set when
/// element 64w + k has a non-zero bit or field.
inline std::uint64_t lhc_member_word(const std::byte* index, lhc_index_coding coding, std::uint64_t w,
                                     std::uint64_t n) noexcept {
  const std::uint64_t first = w * lhc_word;
  const std::uint64_t count = std::min(lhc_word, n - first);
  std::uint64_t bits = 0;
  switch (coding) {
    case lhc_index_coding::bitmap:
      if (count == lhc_word) std::memcpy(&bits, index + first / 8, sizeof bits);  // one load, not a call
      else
        std::memcpy(&bits, index + first / 8, (count + 7) / 8);
      break;
    case lhc_index_coding::sum4: {
      const std::byte* at = index + first / 2;
      for (std::uint64_t k = 0; k < count; k += 2) {
        const auto byte = std::to_integer<std::uint32_t>(at[k / 2]);
        bits |= (std::uint64_t{(byte & 0x0fu) != 0} | std::uint64_t{(byte & 0xf0u) != 0} << 1) << k;
      }
      break;
    }
    case lhc_index_coding::sum8: {
      const std::byte* at = index + first;
      for (std::uint64_t k = 0; k < count; ++k) bits |= std::uint64_t{at[k] != std::byte{0}} << k;
      break;
    }
  }
  return count == lhc_word ? bits : bits & ((std::uint64_t{1} << count) - 1);
}

/// Writes the index coding of membership bits `bits` for elements [64w, 64w + count).
inline void lhc_store_index_word(std::byte* index, lhc_index_coding coding, std::uint64_t w, std::uint64_t count,
                                 std::uint64_t bits) noexcept {
  const std::uint64_t first = w * lhc_word;
  switch (coding) {
    case lhc_index_coding::bitmap: std::memcpy(index + first / 8, &bits, (count + 7) / 8); break;
    case lhc_index_coding::sum4:
      for (std::uint64_t k = 0; k < count; k += 2)
        index[(first + k) / 2] = static_cast<std::byte>(((bits >> k) & 1u) | ((bits >> (k + 1)) & 1u) << 4);
      break;
    case lhc_index_coding::sum8:
      for (std::uint64_t k = 0; k < count; ++k) index[first + k] = static_cast<std::byte>((bits >> k) & 1u);
      break;
  }
}

/// Non-zero bits of `count` ≤ 64 values (−0 counts as zero); sets `finite` false on NaN or ±Inf.
template <gradient_value T>
inline std::uint64_t lhc_nonzero_word(const T* x, std::uint64_t count, bool& finite) noexcept {
#if defined(__SSE2__)
  if constexpr (std::is_same_v<T, float>) {
    if (count == lhc_word) {  // keys have no sign bit, so signed 32-bit comparisons order them
      const __m128i magnitude = _mm_set1_epi32(0x7fffffff);
      const __m128i largest_finite = _mm_set1_epi32(0x7f7fffff);
      const __m128i zero = _mm_setzero_si128();
      __m128i non_finite = zero;
      std::uint64_t zeros = 0;
      for (int q = 0; q < 16; ++q) {
        const __m128i key = _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + 4 * q)), magnitude);
        non_finite = _mm_or_si128(non_finite, _mm_cmpgt_epi32(key, largest_finite));
        zeros |= static_cast<std::uint64_t>(_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(key, zero)))) << (4 * q);
      }
      finite &= _mm_movemask_epi8(non_finite) == 0;
      return ~zeros;
    }
  }
#endif
  using bits_type = typename float_traits<T>::bits_type;
  std::uint64_t bits = 0;
  bits_type largest = 0;
  for (std::uint64_t k = 0; k < count; ++k) {
    const bits_type key = magnitude_key(x[k]);
    largest = std::max(largest, key);
    bits |= std::uint64_t{key != 0} << k;
  }
  finite &= largest < float_traits<T>::infinity_key;
  return bits;
}

/// Calls `visit(i)` for every element i < n whose bit is set in `words(w)`, in ascending order.
template <class Words, class Visit>
inline void lhc_for_each_set(std::uint64_t n, Words&& words, Visit&& visit) {
  for (std::uint64_t w = 0; w * lhc_word < n; ++w) {
    for (std::uint64_t bits = words(w); bits != 0; bits &= bits - 1)
      visit(w * lhc_word + static_cast<std::uint64_t>(std::countr_zero(bits)));
  }
}

}  // namespace detail

/// Lossless homomorphic compression on the CPU.
template <gradient_value T>
struct backend<lossless_homomorphic<T>, cpu_executor> {
  using codec_type = lossless_homomorphic<T>;
  using C = compute_type<T>;  ///< The sketch's type: float32 for a 16-bit T.
  using accumulator = lhc_accumulator_t<C>;

  static void encode_index(const codec_type& codec, const cpu_executor&, std::span<const T> grad,
                           std::span<std::byte> index) {
    const std::uint64_t n = grad.size();
    require_size(index.size(), codec.index_bytes(n), "index bytes");
    const lhc_index_coding coding = codec.params().index;
    bool finite = true;
    for (std::uint64_t w = 0; w * detail::lhc_word < n; ++w) {
      const std::uint64_t count = std::min(detail::lhc_word, n - w * detail::lhc_word);
      detail::lhc_store_index_word(index.data(), coding, w, count,
                                   detail::lhc_nonzero_word(grad.data() + w * detail::lhc_word, count, finite));
    }
    if (finite) return;
    for (std::uint64_t w = 0; w * detail::lhc_word < n; ++w) {  // poison: every element a member
      const std::uint64_t count = std::min(detail::lhc_word, n - w * detail::lhc_word);
      detail::lhc_store_index_word(index.data(), coding, w, count, ~std::uint64_t{0} >> (detail::lhc_word - count));
    }
    detail::fail(errc::non_finite_input, "the gradient holds NaN or Inf");
  }

  static lhc_plan plan(const codec_type& codec, const cpu_executor&, std::span<const std::byte> global_index,
                       std::uint64_t n, std::uint64_t contributors) {
    detail::lhc_require_contributors(contributors, codec.max_contributors());
    require_size(global_index.size(), codec.index_bytes(n), "index bytes");
    return codec.plan_for(n, count_union(codec, global_index, n, contributors));
  }

  static std::size_t workspace_bytes(const codec_type& codec, const cpu_executor&, const lhc_plan& plan) {
    workspace_arena arena = workspace_arena::measure();
    with_cell_types(codec, plan, [&]<class Cell>() { (void)carve<Cell>(arena, codec, plan); });
    return arena.bytes_needed();
  }

  static void encode_sketch(const codec_type& codec, const cpu_executor&, std::span<const T> grad,
                            std::span<const std::byte> global_index, const lhc_plan& plan, std::span<C> sketch) {
    const std::uint64_t n = grad.size();
    require_size(n, plan.n, "elements");
    require_size(global_index.size(), codec.index_bytes(n), "index bytes");
    require_size(sketch.size(), plan.sketch_values(), "sketch values");
    require_padding(codec, global_index, n);
    detail::require(plan == codec.plan_for(n, plan.union_nonzeros), errc::invalid_argument,
                    "the plan does not follow the sizing rule");
    // One pass: the checks of a word come with its writes, and a failure poisons the sketch.
    if (!plan.dense) std::fill(sketch.begin(), sketch.end(), C{0});
    const lhc_index_coding coding = codec.params().index;
    block_cursor cursor(codec, plan);
    bool finite = true;
    std::uint64_t members = 0;
    std::uint64_t first_outside = n;
    for (std::uint64_t w = 0; w * detail::lhc_word < n; ++w) {
      const std::uint64_t first = w * detail::lhc_word;
      const std::uint64_t count = std::min(detail::lhc_word, n - first);
      const std::uint64_t nonzero = detail::lhc_nonzero_word(grad.data() + first, count, finite);
      const std::uint64_t member = detail::lhc_member_word(global_index.data(), coding, w, n);
      members += static_cast<std::uint64_t>(std::popcount(member));
      if ((nonzero & ~member) != 0 && first_outside == n)
        first_outside = first + static_cast<std::uint64_t>(std::countr_zero(nonzero & ~member));
      if (plan.dense) {
        for (std::uint64_t k = 0; k < count; ++k) sketch[first + k] = C{widen(grad[first + k])};
        continue;
      }
      for (std::uint64_t bits = nonzero & member; bits != 0; bits &= bits - 1) {
        const std::uint64_t i = first + static_cast<std::uint64_t>(std::countr_zero(bits));
        const lhc_cell_triple cells = cursor.cells_of(i);
        const C x{widen(grad[i])};
        for (int j = 0; j < 3; ++j) sketch[cells.cell[j]] += cells.negative[j] ? -x : x;
      }
    }
    detail::lhc_finish_sketch(sketch, finite, first_outside, n, members, plan);
  }

  /// Decodes into `out` of T, or (a 16-bit T) of float32; a 16-bit output's values are all checked
  /// to fit before the first is written.
  template <gradient_value O>
  static lhc_decode_result decode(const codec_type& codec, const cpu_executor& e,
                                  std::span<const std::byte> global_index, const lhc_plan& plan,
                                  std::span<const C> summed_sketch, std::span<O> out, std::span<std::byte> ws) {
    const std::uint64_t n = out.size();
    require_plan(codec, global_index, plan, n);
    require_size(summed_sketch.size(), plan.sketch_values(), "sketch values");
    if (plan.dense) {
      require_finite(summed_sketch, 0);
      if constexpr (half_precision<O>) {
        for (std::uint64_t i = 0; i < n; ++i) detail::require_narrows<O>(i, summed_sketch[i]);
        for (std::uint64_t i = 0; i < n; ++i) out[i] = narrow<O>(summed_sketch[i] + C{0});
      } else {
        for (std::uint64_t i = 0; i < n; ++i) out[i] = summed_sketch[i] + C{0};
      }
      return {.recovered = plan.union_nonzeros};
    }
    if (plan.cells == 0) {
      std::fill(out.begin(), out.end(), O{0});
      return {};
    }
    lhc_decode_result result;
    with_cell_types(codec, plan, [&]<class Cell>() {
      result = peel<Cell, O>(codec, e, global_index, plan, summed_sketch, out, ws);
    });
    return result;
  }

 private:
  /// Cells of elements visited in ascending order: recomputes the block layout only when the
  /// block changes.
  class block_cursor {
   public:
    block_cursor(const codec_type& codec, const lhc_plan& plan) noexcept
        : rows_(plan.rows),
          block_(codec.params().block),
          seed_(codec.params().seed),
          reference_(codec.params().reference_layout) {}

    [[nodiscard]] lhc_cell_triple cells_of(std::uint64_t i) noexcept {
      if (i >= block_end_) {
        const std::uint64_t b = i / block_;
        layout_ = lhc_layout_of_block(b, rows_, block_, seed_, reference_);
        block_begin_ = b * block_;
        block_end_ = block_begin_ + block_;
      }
      return lhc_cells_in(layout_, i - block_begin_, block_);
    }

   private:
    std::uint64_t rows_;
    std::uint32_t block_;
    std::uint32_t seed_;
    bool reference_;
    lhc_block_layout layout_{};
    std::uint64_t block_begin_ = 0;
    std::uint64_t block_end_ = 0;
  };

  /// What peeling keeps of a cell, in one 16-byte record when `Id` is 32-bit, so that one cache
  /// line holds all of it: `Id` holds element and cell indices, `Counter` the count and, in its
  /// two low bits, when the cell became pure.
  template <class Id, class Counter>
  struct cell_state {
    using id_type = Id;
    accumulator sum;          ///< The summed sketch value less the values recovered from the cell.
    Id id;                    ///< XOR of the indices of the elements left in the cell.
    Counter count_and_pure;   ///< 4 × the elements (with their hash) left in the cell, plus bit r mod 2
                              ///< when the count fell to 1 in round r − 1 (the cell is pure in round r).

    /// Elements (with their hash) left in the cell.
    [[nodiscard]] std::uint64_t count() const noexcept { return count_and_pure >> 2; }
    /// Whether the cell carries the purity bit `bit` (see `pure_bit`).
    [[nodiscard]] bool pure_in(std::uint8_t bit) const noexcept { return (count_and_pure & bit) != 0; }
    /// Counts one more element.
    void add() noexcept { count_and_pure = static_cast<Counter>(count_and_pure + 4); }
    /// Marks the cell with `bit` if it holds exactly one element, without a branch (whether it
    /// does is data); returns whether it does.
    bool mark_if_one(std::uint8_t bit) noexcept {
      const bool one = count() == 1;
      count_and_pure = static_cast<Counter>(count_and_pure | bit * unsigned{one});  // a product, not a jump
      return one;
    }
    /// Counts one element fewer, then `mark_if_one(bit)`.
    bool remove(std::uint8_t bit) noexcept {
      count_and_pure = static_cast<Counter>(count_and_pure - 4);
      return mark_if_one(bit);
    }
  };

  /// A worklist entry: a cell whose count fell to 1, and the element then left in it. While the
  /// cell's count stays 1 that element is its only one, so the entry names the element's three
  /// cells without a read of the cell.
  template <class Id>
  struct pure_entry {
    Id element;
    Id cell;
  };

  /// A recovered element and its value.
  template <class Id>
  struct recovered_value {
    Id element;
    C value;
  };

  /// A (block, hash) pair of a row: where the block's members land in the row, and which they are.
  struct row_pair {
    std::uint64_t shift;  ///< rot_j − b·B (mod 2^64): member i lands in column i + shift, less B if that is B or more.
    std::uint64_t first;  ///< The block's members are members[first .. last).
    std::uint64_t last;
  };

  /// Entries past the last member that `list_members` may write.
  static constexpr std::uint64_t list_slack = 1;

  /// Elements per output span: the logged values are grouped by span, and each span of the output
  /// is assembled in a cache-resident scratch buffer and written once, front to back.
  static constexpr std::uint64_t output_span = std::uint64_t{1} << 14;

  /// Calls `f.template operator()<cell_state<Id, Counter>>()` with the narrowest types the plan
  /// allows: 32-bit `Id` when element and cell indices fit, and a `Counter` that holds 4 × the
  /// most elements a cell can get. A block puts at most one (element, hash) pair in a cell (three
  /// in the reference layout, where rows may coincide).
  template <class F>
  static void with_cell_types(const codec_type& codec, const lhc_plan& plan, F&& f) {
    const std::uint64_t per_block = codec.params().reference_layout ? 3 : 1;
    const std::uint64_t most = std::min(plan.union_nonzeros, codec.block_count(plan.n)) * per_block;
    const bool narrow_ids = plan.n <= (std::uint64_t{1} << 32) && plan.cells <= (std::uint64_t{1} << 32);
    if (narrow_ids && most < (std::uint64_t{1} << 14))
      f.template operator()<cell_state<std::uint32_t, std::uint16_t>>();
    else if (narrow_ids && most < (std::uint64_t{1} << 30))
      f.template operator()<cell_state<std::uint32_t, std::uint32_t>>();
    else
      f.template operator()<cell_state<std::uint64_t, std::uint64_t>>();
  }

  /// The decoder's workspace: block layouts, the union's elements, the (block, hash) pairs grouped
  /// by row, cell states, the worklist of cells, the recovered (element, value) log, the log
  /// grouped by output span, a scratch span, and for `median_estimate` a bitmap of recovered
  /// elements.
  template <class Cell>
  struct peel_state {
    std::span<lhc_block_layout> layouts;
    std::span<typename Cell::id_type> members;  ///< The union's elements, ascending (and `list_slack` more entries).
    std::span<std::uint64_t>
        block_first;  ///< G + 1: block b's members are members[block_first[b] .. block_first[b + 1]).
    std::span<row_pair> row_pairs;  ///< 3·G (block, hash) pairs, grouped by row.
    std::span<std::uint64_t> row_end;  ///< rows + 1: row r's pairs end at row_end[r] (start at row_end[r − 1]).
    std::span<Cell> cells;
    std::span<pure_entry<typename Cell::id_type>> worklist;
    std::span<recovered_value<typename Cell::id_type>> log;  ///< In the order of recovery.
    std::span<recovered_value<typename Cell::id_type>> by_span;  ///< Span k's values from span_first[k] on.
    std::span<std::uint64_t>
        span_first;  ///< ⌈n / output_span⌉ + 1: where span k's values start (its members before it).
    std::span<std::uint64_t> span_end;  ///< ⌈n / output_span⌉: where span k's next value goes.
    std::span<C> scratch;  ///< One output span (of C, or of a 16-bit output's values in its first half).
    std::span<std::uint64_t> recovered;
  };

  template <class Cell>
  static peel_state<Cell> carve(workspace_arena& arena, const codec_type& codec, const lhc_plan& plan) {
    if (plan.dense || plan.cells == 0) return {};
    const auto cells = static_cast<std::size_t>(plan.cells);
    const auto members = static_cast<std::size_t>(plan.union_nonzeros);
    const auto blocks = static_cast<std::size_t>(codec.block_count(plan.n));
    peel_state<Cell> s;
    s.layouts = arena.take<lhc_block_layout>(blocks);
    s.members = arena.take<typename Cell::id_type>(members + list_slack);
    s.block_first = arena.take<std::uint64_t>(blocks + 1);
    s.row_pairs = arena.take<row_pair>(3 * blocks);
    s.row_end = arena.take<std::uint64_t>(static_cast<std::size_t>(plan.rows) + 1);
    s.cells = arena.take<Cell>(cells);
    // + 1: the branchless queueing writes one entry past the last.
    s.worklist = arena.take<pure_entry<typename Cell::id_type>>(cells + 1);
    const auto spans = static_cast<std::size_t>((plan.n + output_span - 1) / output_span);
    s.log = arena.take<recovered_value<typename Cell::id_type>>(members);
    s.by_span = arena.take<recovered_value<typename Cell::id_type>>(members);
    s.span_first = arena.take<std::uint64_t>(spans + 1);
    s.span_end = arena.take<std::uint64_t>(spans);
    s.scratch = arena.take<C>(static_cast<std::size_t>(std::min(plan.n, output_span)));
    if (codec.params().on_stall == lhc_stall_policy::median_estimate)
      s.recovered =
          arena.take<std::uint64_t>(static_cast<std::size_t>((plan.n + detail::lhc_word - 1) / detail::lhc_word));
    return s;
  }

  static void require_size(std::uint64_t got, std::uint64_t want, const char* what) {
    detail::lhc_require_size(got, want, what);
  }

  /// Checks that `values`, the summed sketch from value `first` on, hold no NaN or ±Inf.
  static void require_finite(std::span<const C> values, std::uint64_t first) {
    for (std::uint64_t c = 0; c < values.size(); ++c)
      detail::require(is_finite(values[c]), errc::non_finite_input,
                      [&] { return detail::lhc_non_finite_message(first + c); });
  }

  /// Checks that the bits (bitmap) or the nibble (sum4) past the last element are zero.
  static void require_padding(const codec_type& codec, std::span<const std::byte> index, std::uint64_t n) {
    detail::lhc_require_padding(codec.params().index, n, [&] { return std::to_integer<unsigned>(index.back()); });
  }

  /// Elements of the union in an aggregated index, after checking its padding and that no field
  /// exceeds `field_limit`.
  static std::uint64_t count_union(const codec_type& codec, std::span<const std::byte> index, std::uint64_t n,
                                   std::uint64_t field_limit) {
    require_padding(codec, index, n);
    std::uint64_t members = 0;
    if (codec.params().index == lhc_index_coding::bitmap) {
      for (std::uint64_t w = 0; w * detail::lhc_word < n; ++w)
        members += static_cast<std::uint64_t>(
            std::popcount(detail::lhc_member_word(index.data(), lhc_index_coding::bitmap, w, n)));
      return members;
    }
    const std::uint32_t width = codec.params().index == lhc_index_coding::sum4 ? 4 : 8;
    const std::uint32_t mask = (1u << width) - 1;
    for (std::uint64_t q = 0; q < index.size(); ++q) {
      for (std::uint32_t field = std::to_integer<std::uint32_t>(index[q]), k = 0; k < 8; k += width, field >>= width) {
        detail::require((field & mask) <= field_limit, errc::malformed_payload, [&] {
          return "index byte " + std::to_string(q) + " holds a field above " + std::to_string(field_limit) +
                 " contributors";
        });
        members += std::uint64_t{(field & mask) != 0};
      }
    }
    return members;
  }

  /// Checks the index size and that `plan` is the plan of the index for n elements.
  static void require_plan(const codec_type& codec, std::span<const std::byte> index, const lhc_plan& plan,
                           std::uint64_t n) {
    require_size(n, plan.n, "elements");
    require_size(index.size(), codec.index_bytes(n), "index bytes");
    detail::lhc_require_plan_of_index(plan, codec.plan_for(n, count_union(codec, index, n, codec.max_contributors())));
  }

  /// Asks the cache for the line holding `p` (a hint; no effect where the compiler has none).
  static void prefetch(const void* p) noexcept {
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(p, 1);
#else
    (void)p;
#endif
  }

  /// The bit of `cell_state::count_and_pure` that marks a cell pure in round `round` (1, 2, …).
  [[nodiscard]] static constexpr std::uint8_t pure_bit(std::uint64_t round) noexcept {
    return static_cast<std::uint8_t>(1u << (round % 2));
  }

  /// Where the cells of a plan's elements lie: the block layouts and the block size.
  struct geometry {
    std::span<const lhc_block_layout> layouts;
    std::uint64_t block;
    bool power_of_two;  ///< B = 2^shift: divisions by B are shifts.
    int shift;

    /// ⌊x / B⌋: the row of cell (or row offset) x, or the block of element x.
    [[nodiscard]] std::uint64_t quotient(std::uint64_t x) const noexcept {
      return power_of_two ? x >> shift : x / block;
    }
    /// The row of the cell `cell` (or of a row offset).
    [[nodiscard]] std::uint64_t row_of(std::uint64_t cell) const noexcept { return quotient(cell); }
    /// The block of element i.
    [[nodiscard]] std::uint64_t block_of(std::uint64_t i) const noexcept { return quotient(i); }
    /// The three cells of element i and their signs (inlined: it is the peeling loop's arithmetic).
    [[nodiscard, gnu::always_inline]] lhc_cell_triple cells_of(std::uint64_t i) const noexcept {
      const std::uint64_t b = block_of(i);
      return lhc_cells_in(layouts[b], i - b * block, block);
    }
  };

  /// Lists the union's elements in ascending order, and records the rank of the first member of
  /// each block and of each output span. A word's members are written eight at a time, the writes
  /// past its last one landing on the entry the next member overwrites (or the slack), so that
  /// only a word, not each member, takes a branch.
  template <class Cell>
  static void list_members(const geometry& where, const peel_state<Cell>& s, std::span<const std::byte> index,
                           lhc_index_coding coding, std::uint64_t n) {
    using id_type = typename Cell::id_type;
    const std::uint64_t blocks = s.block_first.size() - 1;
    const std::uint64_t spans = s.span_end.size();
    std::uint64_t listed = 0;
    for (std::uint64_t w = 0, next_block = 0, next_span = 0; w * detail::lhc_word < n; ++w) {
      const std::uint64_t base = w * detail::lhc_word;
      std::uint64_t bits = detail::lhc_member_word(index.data(), coding, w, n);
      const auto rank_of = [&](std::uint64_t i) {  // i in [base, base + 64): members before it
        return i == base
                   ? listed
                   : listed + static_cast<std::uint64_t>(std::popcount(bits & ((std::uint64_t{1} << (i - base)) - 1)));
      };
      for (; next_block < blocks && next_block * where.block < base + detail::lhc_word; ++next_block)
        s.block_first[next_block] = rank_of(next_block * where.block);
      for (; next_span < spans && next_span * output_span < base + detail::lhc_word; ++next_span)
        s.span_first[next_span] = s.span_end[next_span] = rank_of(next_span * output_span);
      while (bits != 0) {
        for (int q = 0; q < 8; ++q, bits &= bits - 1) {
          s.members[listed] = static_cast<id_type>(base + static_cast<std::uint64_t>(std::countr_zero(bits)));
          listed += bits != 0 ? 1 : 0;
        }
      }
    }
    s.block_first[blocks] = listed;
    s.span_first[spans] = listed;
  }

  /// Sets up the cells row by row, so that its updates stay within one row of B cells: groups the
  /// (block, hash) pairs by row (a counting sort), then per row copies the summed sketch values
  /// (checking that they are finite), counts the members of the blocks that hash into the row and
  /// XORs their indices, and queues the row's cells of count 1, pure in round 1. Returns how many
  /// it queued.
  template <class Cell>
  static std::uint64_t count_rows(const geometry& where, const peel_state<Cell>& s, std::span<const C> summed_sketch) {
    using id_type = typename Cell::id_type;
    constexpr std::uint64_t ahead = 8;  // prefetch distance, in pairs
    const std::uint64_t block = where.block;
    const std::uint64_t rows = s.row_end.size() - 1;
    std::fill(s.row_end.begin(), s.row_end.end(), std::uint64_t{0});
    for (const lhc_block_layout& layout : s.layouts)
      for (const std::uint64_t offset : layout.row_offset) ++s.row_end[where.row_of(offset) + 1];
    for (std::uint64_t r = 0; r < rows; ++r) s.row_end[r + 1] += s.row_end[r];
    for (std::uint64_t b = 0; b < s.layouts.size(); ++b)
      for (std::uint64_t j = 0; j < 3; ++j)
        s.row_pairs[s.row_end[where.row_of(s.layouts[b].row_offset[j])]++] = {s.layouts[b].rotation[j] - b * block,
                                                                              s.block_first[b], s.block_first[b + 1]};
    // row_end[r] is now where row r's pairs end.
    std::uint64_t queued = 0;
    for (std::uint64_t r = 0, pair = 0; r < rows; ++r) {
      Cell* const row = s.cells.data() + r * block;
      const C* const values = summed_sketch.data() + r * block;
      bool finite = true;
      for (std::uint64_t column = 0; column < block; ++column) {
        finite &= is_finite(values[column]);
        row[column] = {values[column], 0, 0};
      }
      if (!finite) require_finite(summed_sketch.subspan(r * block, block), r * block);
      for (; pair < s.row_end[r]; ++pair) {
        if (pair + ahead < s.row_pairs.size()) {  // the members of the block ahead
          const row_pair& later = s.row_pairs[pair + ahead];
          for (std::uint64_t k = later.first; k < later.last; k += 64 / sizeof(id_type)) prefetch(&s.members[k]);
        }
        const row_pair& here = s.row_pairs[pair];
        for (std::uint64_t k = here.first; k < here.last; ++k) {
          std::uint64_t column = s.members[k] + here.shift;
          if (column >= block) column -= block;
          row[column].add();
          row[column].id ^= s.members[k];
        }
      }
      for (std::uint64_t column = 0; column < block; ++column) {  // without branches
        const bool one = row[column].mark_if_one(pure_bit(1));
        s.worklist[queued] = {row[column].id, static_cast<id_type>(r * block + column)};
        queued += one ? 1 : 0;
      }
    }
    return queued;
  }

  /// Peels in synchronous rounds from the `queued` pure cells at the front of the worklist; logs
  /// the recovered elements and their values and returns how many. A round takes the worklist
  /// entries queued before it. An entry whose cell still holds one element names that element,
  /// which is recovered there if this cell is its lowest pure hash (pure: the cell's count was 1
  /// when the round began, which its purity bits record), and is then subtracted from its three cells
  /// at once, queueing those whose count falls to 1. A pure cell holds only the element being
  /// recovered, so no subtraction of the round reaches it first: this is the synchronous round of
  /// the codec's definition, each cell's subtractions in the order of the log, done in one visit
  /// of the element's cells.
  template <class Cell>
  static std::uint64_t peel_rounds(const geometry& where, const peel_state<Cell>& s, std::uint64_t queued,
                                   lhc_decode_result& result) {
    using id_type = typename Cell::id_type;
    constexpr std::uint64_t ahead = 8;  // prefetch distance, in worklist entries
    lhc_cell_triple staged[ahead];
    std::uint64_t logged = 0;
    std::uint64_t tail = queued;
    for (std::uint64_t head = 0, round = 1; head < tail; ++round) {
      const std::uint64_t round_end = tail;
      const std::uint64_t round_log = logged;
      const std::uint8_t pure_now = pure_bit(round);
      const std::uint8_t pure_next = pure_bit(round + 1);
      // The cells of the entries ahead are computed once, into a ring of `ahead`.
      for (std::uint64_t e = head; e < std::min(head + ahead, round_end); ++e)
        staged[e % ahead] = where.cells_of(s.worklist[e].element);
      for (; head < round_end; ++head) {
        // The entries ahead name their elements: ask for the elements' layouts, then their cells.
        if (head + 2 * ahead < round_end)
          prefetch(&where.layouts[where.block_of(s.worklist[head + 2 * ahead].element)]);
        const lhc_cell_triple cells = staged[head % ahead];
        if (head + ahead < round_end) {
          staged[head % ahead] = where.cells_of(s.worklist[head + ahead].element);
          for (const std::uint64_t c : staged[head % ahead].cell) prefetch(&s.cells[c]);
        }
        const std::uint64_t i = s.worklist[head].element;
        const std::uint64_t c = s.worklist[head].cell;
        if (s.cells[c].count() != 1) continue;  // fell to 0 last round, or its element is recovered
        // Its lowest pure hash (c is pure, so there is one), without branches.
        const bool pure0 = s.cells[cells.cell[0]].pure_in(pure_now);
        const bool pure1 = s.cells[cells.cell[1]].pure_in(pure_now);
        const int j = lhc_recovering_hash(pure0, pure1);
        if (cells.cell[j] != c) continue;  // recovered at its lowest pure hash, an entry of this round too
        const accumulator v = lhc_signed(cells.negative[j], s.cells[c].sum);
        detail::require(lhc_fits<C>(v), errc::non_finite_input, [&] { return detail::lhc_range_message("sum", i); });
        s.log[logged++] = {static_cast<id_type>(i), static_cast<C>(v) + C{0}};  // + 0: no −0 in the output
        for (int k = 0; k < 3; ++k) {  // queue the cells whose count falls to 1, without branches
          Cell& cell = s.cells[cells.cell[k]];
          cell.sum -= lhc_signed(cells.negative[k], v);
          cell.id ^= static_cast<id_type>(i);
          const bool one = cell.remove(pure_next);
          s.worklist[tail] = {cell.id, static_cast<id_type>(cells.cell[k])};
          tail += one ? 1 : 0;
        }
        if (!s.recovered.empty()) s.recovered[i / detail::lhc_word] |= std::uint64_t{1} << (i % detail::lhc_word);
      }
      if (logged > round_log) ++result.rounds;
    }
    return logged;
  }

  /// Peels a sparse plan with cell states of type `Cell` (see the file comment of the codec):
  /// `list_members`, `count_rows`, then `peel_rounds`, then the median estimates the stall policy
  /// asks for, then (a 16-bit O: after checking that every value narrows) `out`, front to back.
  template <class Cell, gradient_value O>
  static lhc_decode_result peel(const codec_type& codec, const cpu_executor& e, std::span<const std::byte> index,
                                const lhc_plan& plan, std::span<const C> summed_sketch, std::span<O> out,
                                std::span<std::byte> ws) {
    workspace_arena arena(ws);
    const peel_state<Cell> s = carve<Cell>(arena, codec, plan);
    const lhc_params& p = codec.params();
    const std::uint64_t n = plan.n;
    for (std::uint64_t b = 0; b < s.layouts.size(); ++b)
      s.layouts[b] = lhc_layout_of_block(b, plan.rows, p.block, p.seed, p.reference_layout);
    const geometry where{s.layouts, p.block, std::has_single_bit(p.block), std::countr_zero(p.block)};

    list_members(where, s, index, p.index, n);
    const std::uint64_t pure = count_rows(where, s, summed_sketch);
    if (!s.recovered.empty()) std::fill(s.recovered.begin(), s.recovered.end(), std::uint64_t{0});
    lhc_decode_result result;
    std::uint64_t logged = peel_rounds(where, s, pure, result);
    result.recovered = logged;
    result.unrecovered = plan.union_nonzeros - logged;
    if (result.unrecovered != 0) {
      detail::lhc_require_peeled(p.on_stall, result, plan);
      // Median of the three residual estimates of every element left, logged.
      detail::lhc_for_each_set(
          n, [&](std::uint64_t w) { return detail::lhc_member_word(index.data(), p.index, w, n) & ~s.recovered[w]; },
          [&](std::uint64_t i) {
            const lhc_cell_triple cells = where.cells_of(i);
            accumulator estimate[3];
            for (int j = 0; j < 3; ++j) estimate[j] = lhc_signed(cells.negative[j], s.cells[cells.cell[j]].sum);
            // lhc_median_of_three, written out: GCC allocates this whole function differently around the call
            const accumulator median =
                std::max(std::min(estimate[0], estimate[1]), std::min(std::max(estimate[0], estimate[1]), estimate[2]));
            detail::require(lhc_fits<C>(median), errc::non_finite_input,
                            [&] { return detail::lhc_range_message("estimate", i); });
            s.log[logged++] = {static_cast<typename Cell::id_type>(i), static_cast<C>(median) + C{0}};
          });
      result.estimated = result.unrecovered;
    }
    if constexpr (half_precision<O>)
      for (std::uint64_t q = 0; q < logged; ++q) detail::require_narrows<O>(s.log[q].element, s.log[q].value);
    // The output span by span: the log grouped by span, then zeros and the span's values (rounded
    // to a 16-bit O) in the scratch span, written out.
    for (std::uint64_t q = 0; q < logged; ++q) s.by_span[s.span_end[s.log[q].element / output_span]++] = s.log[q];
    detail::cpu::staged_writer writer(reinterpret_cast<std::byte*>(out.data()), e.streams(n * sizeof(O)));
    O* const scratch = reinterpret_cast<O*>(s.scratch.data());  // sizeof(O) ≤ sizeof(C)
    for (std::uint64_t k = 0; k < s.span_end.size(); ++k) {
      const std::uint64_t first = k * output_span;
      const std::uint64_t count = std::min(output_span, n - first);
      std::fill(scratch, scratch + count, O{0});
      for (std::uint64_t q = s.span_first[k]; q < s.span_end[k]; ++q) {
        if constexpr (half_precision<O>) scratch[s.by_span[q].element - first] = narrow<O>(s.by_span[q].value);
        else
          scratch[s.by_span[q].element - first] = s.by_span[q].value;
      }
      writer.write(reinterpret_cast<const std::byte*>(scratch), count * sizeof(O));
    }
    writer.finish();
    return result;
  }
};

}  // namespace gradcomp
