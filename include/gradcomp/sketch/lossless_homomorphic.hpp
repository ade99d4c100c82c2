#pragma once
/// @file
/// Lossless homomorphic compression (LHC, Li et al. 2024; docs/sketches.md §2): a sparse gradient
/// travels as an index of its non-zero positions and a count sketch of its values, both of which
/// add up across ranks, and the sum is recovered exactly by peeling.
///
/// Protocol per tensor (two dependent collective stages; docs/sketches.md §2 has the diagram):
///
///     encode_index(grad) → aggregate the index (bitmap: bitwise OR; sum4/sum8: uint8 SUM)
///     plan(global index, n, P)            identical on every rank: depends on the index only
///     encode_sketch(grad, global index)   → SUM-reduce the sketch (all-reduce, or to an owner)
///     decode(global index, summed sketch) → the element-wise sum of the P gradients
///
/// Index codings (`index_bytes(n)` bytes, element i of n):
///   - bitmap: bit i mod 8 of byte ⌊i/8⌋ (least significant first) is [x_i ≠ 0]; bits past n are
///     zero. Aggregated with a bitwise OR (MPI_BOR), for any number of ranks.
///   - sum4: byte ⌊i/2⌋ holds element i in its low nibble (i even) or high nibble (i odd), 0 or 1;
///     a missing last high nibble is zero. Aggregated with a uint8 SUM: exact for P ≤ 15.
///   - sum8: byte i is 0 or 1. Aggregated with a uint8 SUM: exact for P ≤ 255.
/// An element is in the union U when its aggregated bit or field is non-zero.
///
/// Sizing (`plan`): G = ⌈n/B⌉ blocks of B elements (the last may be shorter). Adaptive:
/// rows r = max(3, ⌈cells_per_nonzero·|U| / B⌉); with `fixed_compress_ratio` c > 0 instead
/// r = ⌈G/c⌉ (at least 3 unless `reference_layout`). The sketch has r·B cells of type T, row-major.
/// When r·B ≥ n the plan is dense: the "sketch" is the n values themselves, summed directly (exact
/// transport, no peeling). |U| = 0 gives an empty sketch. Every rank derives the same plan.
///
/// Layout: element i = b·B + t (block b, column t) lands in 3 cells, one per hash j ∈ {0, 1, 2},
/// with hashes h_j = murmur3_32(b, seed + j) and signs σ_j = −1 when bit 31 of h_j is set, else +1.
///   - default: three distinct rows
///         row_0 = h_0 mod r
///         row_1 = (row_0 + 1 + h_1 mod (r − 1)) mod r
///         row_2 = the (h_2 mod (r − 2))-th row, counting from 0 in ascending order, of the rows
///                 other than row_0 and row_1
///     and a column rotation per block and hash, rot_j = murmur3_32(b, seed + 3 + j) mod B:
///         cell_j(i) = row_j·B + (t + rot_j) mod B.
///     The three cells of an element lie in distinct rows and distinct elements of a block never
///     share a cell, so a cell holds at most one element per block. The rotation makes every cell
///     of a row collect a different mix of blocks, so peeling behaves like one random 3-uniform
///     hypergraph over all r·B cells and succeeds once r·B ≥ about 1.23·|U| (docs/sketches.md §2
///     has the measurements); without it (the reference) each column is its own small problem.
///   - reference (`reference_layout`): row_j = h_j mod r and cell_j(i) = row_j·B + t, the layout
///     of the reference CUDA code (seeds 0, 1, 2 when seed = 0). Rows may coincide: the element
///     then enters that cell twice (σ_j·x + σ_j'·x) and counts twice.
/// The sketch of a rank is S[c] = Σ σ_j(i)·x_i over the (i, j) with cell_j(i) = c, accumulated in
/// the cell type C in ascending i (then j) order, starting from +0. C is T for float and double,
/// and float32 for bf16 and fp16, whose values are widened exactly (a dense plan's values too), so a
/// 16-bit sketch is the float32 sketch of the widened values.
///
/// Decoding: cell counters (how many (i ∈ U, j) land in each cell; 16-bit when no cell can exceed
/// 65535, else 32-bit) and an XOR of element indices per cell are derived from the aggregated index
/// on the decoding rank, never communicated. Peeling runs in synchronous rounds: the cells with
/// count 1 at the start of a round are pure; every element of a pure cell is recovered once, from
/// the lowest j whose cell is pure, as σ_j·S[cell_j]; then every recovered element is subtracted
/// from its cells and their counters decremented. Rounds repeat until no cell is pure. The sketch is
/// peeled in `lhc_accumulator_t<T>` (double), so peeling itself adds no rounding for float sketches;
/// where the double rounds, the order of a cell's subtractions is fixed (docs/sketches.md §2.5): a
/// round lists its candidate cells (the first round every cell of count 1 in cell order, later
/// rounds the cells whose counts fell to 1, in that order), an element is recovered at the entry of
/// its lowest pure cell, and each cell's subtractions come in the order of (entry, j). The result
/// is the same on every machine, thread count and backend.
///
/// Exactness: a recovered value is σ_j·S[c] minus the values recovered before it from that cell.
/// When every partial sum (the cell sums of each rank, the SUM reduction, the peeling) is exact, the
/// decoded values are exactly Σ_p x_{p,i}. Otherwise each cell c carries the rounding error e_c of
/// its sums, |e_c| ≤ γ(d_c + P)·W_c, where d_c is the number of elements in c, W_c the sum of the
/// magnitudes of all contributions to c over all ranks, u the unit roundoff of T and
/// γ(m) = m·u / (1 − m·u); a recovered value is off by e_c plus the errors of the values subtracted
/// from c before it (recursively), plus one rounding to C. Decoded zeros are +0. A 16-bit codec
/// decodes into float32 (the exact sum where the cells' sums are exact) or into its own type, the
/// float32 value rounded once to nearest even; a value beyond the 16-bit range is then
/// `narrowing_overflow`, with `out` untouched.
///
/// Stalls: when the cells are too few (the union holds a non-empty 2-core), some elements remain.
/// `lhc_stall_policy::report` throws `errc::peeling_stalled` (the message gives the counts) and
/// leaves `out` untouched; `median_estimate` writes the median of the element's three residual
/// estimates σ_j·S[cell_j] and counts it in `lhc_decode_result::estimated`. Never silent.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/concepts.hpp>
#include <gradcomp/core/config.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/memory_space.hpp>
#include <gradcomp/core/murmur3.hpp>
#include <gradcomp/core/wire_envelope.hpp>

namespace gradcomp {

/// How the index of non-zero positions is coded, which decides its reduction and rank limit.
enum class lhc_index_coding : std::uint8_t {
  bitmap = 0,  ///< 1 bit per element, aggregated with bitwise OR; any number of ranks.
  sum4 = 1,    ///< 4 bits per element (0 or 1), aggregated with uint8 SUM; at most 15 ranks.
  sum8 = 2,    ///< 8 bits per element (0 or 1), aggregated with uint8 SUM; at most 255 ranks.
};

/// What `decode` does when peeling stalls with elements left.
enum class lhc_stall_policy : std::uint8_t {
  report = 0,           ///< Throw `errc::peeling_stalled`; `out` is left untouched.
  median_estimate = 1,  ///< Write the median of the three residual estimates; count them.
};

/// Parameters of lossless homomorphic compression; every rank must use the same.
struct lhc_params {
  std::uint32_t block = 1024;                            ///< B: elements per block, columns per row (≥ 1).
  double cells_per_nonzero = 1.3;                        ///< Adaptive sizing factor (finite, ≥ 1).
  lhc_index_coding index = lhc_index_coding::bitmap;     ///< Index coding and reduction.
  lhc_stall_policy on_stall = lhc_stall_policy::report;  ///< Decode's answer to a stall.
  bool reference_layout = false;                         ///< The reference's hash layout (rows may coincide).
  double fixed_compress_ratio = 0;  ///< c > 0: r = ⌈G/c⌉ rows as the reference (TAGC: 2); 0: adaptive.
  std::uint32_t seed = 0;           ///< Hash seeds seed + 0..2 (rows, signs) and seed + 3..5 (rotations).

  /// @throws error `invalid_argument` for an empty block, a sizing factor below 1 or not finite, a
  ///         negative or non-finite compress ratio, or an unknown enumerator.
  void validate() const {
    detail::require(block >= 1, errc::invalid_argument, "block must hold at least one element");
    detail::require(std::isfinite(cells_per_nonzero) && cells_per_nonzero >= 1.0, errc::invalid_argument, [&] {
      return "cells_per_nonzero must be finite and at least 1, got " + std::to_string(cells_per_nonzero);
    });
    detail::require(std::isfinite(fixed_compress_ratio) && fixed_compress_ratio >= 0.0, errc::invalid_argument, [&] {
      return "fixed_compress_ratio must be finite and non-negative, got " + std::to_string(fixed_compress_ratio);
    });
    detail::require(index <= lhc_index_coding::sum8, errc::invalid_argument, "unknown lhc_index_coding");
    detail::require(on_stall <= lhc_stall_policy::median_estimate, errc::invalid_argument, "unknown lhc_stall_policy");
  }

  friend constexpr bool operator==(const lhc_params&, const lhc_params&) = default;
};

/// The sketch geometry of one tensor: derived from the aggregated index only, so identical on
/// every rank.
struct lhc_plan {
  std::uint64_t n = 0;               ///< Elements of the tensor.
  std::uint64_t union_nonzeros = 0;  ///< |U|: elements non-zero on at least one rank.
  std::uint64_t rows = 0;            ///< r: sketch rows (0 when dense or |U| = 0).
  std::uint64_t cells = 0;           ///< r·B sketch cells (0 when dense or |U| = 0).
  bool dense = false;                ///< The n values travel as they are (r·B would be ≥ n).

  /// Values (of the cell type) each rank's sketch holds and the SUM reduction adds: n when dense, else
  /// `cells`.
  [[nodiscard]] constexpr std::uint64_t sketch_values() const noexcept { return dense ? n : cells; }

  friend constexpr bool operator==(const lhc_plan&, const lhc_plan&) = default;
};

/// What `decode` did.
struct lhc_decode_result {
  std::uint64_t recovered = 0;    ///< Elements of U recovered exactly (all of U for a dense plan).
  std::uint64_t unrecovered = 0;  ///< Elements of U left by peeling (then estimated: see `estimated`).
  std::uint64_t estimated = 0;    ///< Elements written as median estimates (`median_estimate` only).
  std::uint64_t rounds = 0;       ///< Synchronous peeling rounds run.

  friend constexpr bool operator==(const lhc_decode_result&, const lhc_decode_result&) = default;
};

/// Type the decoder peels in: double for float and double sketches.
template <gradient_value T>
using lhc_accumulator_t = double;

/// Where the three cells of every element of one block lie (see the file comment).
struct lhc_block_layout {
  std::uint64_t row_offset[3];  ///< row_j·B: first cell of the row of hash j.
  std::uint32_t rotation[3];    ///< rot_j: column of element t is (t + rot_j) mod B (0 in the reference layout).
  bool negative[3];             ///< σ_j = −1.
};

/// The layout of block `b` in a sketch of `rows` rows (≥ 3 for the default layout, ≥ 1 for the
/// reference) of `block` columns.
GRADCOMP_HOST_DEVICE constexpr lhc_block_layout lhc_layout_of_block(std::uint64_t b, std::uint64_t rows,
                                                                    std::uint32_t block, std::uint32_t seed,
                                                                    bool reference) noexcept {
  lhc_block_layout layout{};
  const auto key = static_cast<std::uint32_t>(b);
  std::uint64_t h[3];
  for (std::uint32_t j = 0; j < 3; ++j) {
    h[j] = murmur3_32(key, seed + j);
    layout.negative[j] = (h[j] >> 31) != 0;
    layout.rotation[j] = reference ? 0u : murmur3_32(key, seed + 3u + j) % block;
  }
  std::uint64_t row[3] = {h[0] % rows, h[1] % rows, h[2] % rows};
  if (!reference) {
    row[1] = (row[0] + 1 + h[1] % (rows - 1)) % rows;
    const std::uint64_t low = row[0] < row[1] ? row[0] : row[1];
    const std::uint64_t high = row[0] < row[1] ? row[1] : row[0];
    row[2] = h[2] % (rows - 2);
    if (row[2] >= low) ++row[2];
    if (row[2] >= high) ++row[2];
  }
  for (int j = 0; j < 3; ++j) layout.row_offset[j] = row[j] * block;
  return layout;
}

/// The three cells of one element and their signs.
struct lhc_cell_triple {
  std::uint64_t cell[3];  ///< cell_j: row_j·B + (t + rot_j) mod B.
  bool negative[3];       ///< σ_j = −1.
};

/// The cells of column t (< `block`) of a block with `layout`.
[[nodiscard]] GRADCOMP_HOST_DEVICE inline lhc_cell_triple lhc_cells_in(const lhc_block_layout& layout, std::uint64_t t,
                                                                       std::uint64_t block) noexcept {
  lhc_cell_triple cells;
  for (int j = 0; j < 3; ++j) {
    std::uint64_t column = t + layout.rotation[j];
    if (column >= block) column -= block;
    cells.cell[j] = layout.row_offset[j] + column;
    cells.negative[j] = layout.negative[j];
  }
  return cells;
}

/// The hash an element of a pure cell is recovered from (a rule of peeling that every backend
/// shares, so that each decides alike): its lowest j whose cell is pure, given
/// whether the cells of hashes 0 and 1 are (one of its cells is pure, so when neither of those is,
/// hash 2's is). Arithmetic rather than a choice, so that no compiler turns it into a jump on data.
[[nodiscard]] GRADCOMP_HOST_DEVICE constexpr int lhc_recovering_hash(bool pure0, bool pure1) noexcept {
  return (pure0 ? 0 : 1) * (pure1 ? 1 : 2);
}

/// σ·v: `v` with its sign bit flipped when `negative` (exact). A hash's sign is data, and GCC turns
/// `negative ? −v : v` into a jump that mispredicts half the time (a third of the CPU rounds' time
/// at 2^20).
[[nodiscard]] GRADCOMP_HOST_DEVICE inline double lhc_signed(bool negative, double v) noexcept {
  std::uint64_t bits;  // memcpy, not to_bits or std::bit_cast: nvcc's front end has rejected their constraints
  std::memcpy(&bits, &v, sizeof bits);
  bits ^= static_cast<std::uint64_t>(negative) << float_traits<double>::magnitude_bits;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

/// Whether a peeled value `v` converts to T without overflow (|v| ≤ the largest finite T; false
/// for NaN). A decoded value outside is refused with `non_finite_input`.
template <gradient_value T>
[[nodiscard]] GRADCOMP_HOST_DEVICE inline bool lhc_fits(double v) noexcept {
  const auto largest = static_cast<double>(from_bits<T>(float_traits<T>::infinity_key - 1));
  return v >= -largest && v <= largest;
}

/// The estimate of an element left by peeling, from its three residual estimates σ_j·S[cell_j]:
/// their median, std::max(std::min(e0, e1), std::min(std::max(e0, e1), e2)), each min and max
/// taking the first of two equal values as std::min and std::max do, so that every backend picks
/// the same one of +0 and −0. (The CPU decoder writes it with std::min and std::max: a call here
/// changes GCC's register allocation of its whole decode function.)
[[nodiscard]] GRADCOMP_HOST_DEVICE constexpr double lhc_median_of_three(double e0, double e1, double e2) noexcept {
  const double low = e1 < e0 ? e1 : e0;
  const double high = e0 < e1 ? e1 : e0;
  const double middle = e2 < high ? e2 : high;
  return low < middle ? middle : low;
}

namespace detail {

/// Elements an index byte of `coding` covers: 8 (bitmap), 2 (sum4) or 1 (sum8).
[[nodiscard]] GRADCOMP_HOST_DEVICE constexpr unsigned lhc_elements_per_byte(lhc_index_coding coding) noexcept {
  return coding == lhc_index_coding::bitmap ? 8u : (coding == lhc_index_coding::sum4 ? 2u : 1u);
}

/// The size checks of every LHC call. @throws error `size_mismatch` naming `what`.
inline void lhc_require_size(std::uint64_t got, std::uint64_t want, const char* what) {
  require(got == want, errc::size_mismatch,
          [&] { return std::string(what) + ": got " + std::to_string(got) + ", expected " + std::to_string(want); });
}

/// Checks that the bits (bitmap) or the nibble (sum4) past element n − 1 of an index are zero,
/// given its last byte `last` (read only when n leaves part of it unused).
/// @throws error `malformed_payload`.
template <class LastByte>
void lhc_require_padding(lhc_index_coding coding, std::uint64_t n, LastByte&& last) {
  const unsigned per = lhc_elements_per_byte(coding);
  if (n % per == 0) return;
  const auto used_bits = static_cast<unsigned>(n % per) * (8 / per);
  require((static_cast<unsigned>(last()) >> used_bits) == 0, errc::malformed_payload,
          "index bits past the last element are not zero");
}

/// Checks the number of ranks `plan` is told contributed to an index coding that aggregates 1 to
/// `most` exactly. @throws error `invalid_argument`.
inline void lhc_require_contributors(std::uint64_t contributors, std::uint64_t most) {
  require(contributors >= 1 && contributors <= most, errc::invalid_argument, [&] {
    return std::to_string(contributors) + " contributors: the index coding aggregates 1 to " + std::to_string(most) +
           " ranks exactly";
  });
}
/// The verdict of `encode_sketch` after its pass over n elements: nothing when the gradient was
/// finite, every non-zero element was in the index (`first_outside` = n) and the index held the
/// plan's `members`; otherwise every sketch value is set to NaN (a rank that joins the SUM anyway
/// poisons it) and the first failure is thrown. @throws error `non_finite_input`, `invalid_argument`.
template <gradient_value T>
void lhc_finish_sketch(std::span<T> sketch, bool finite, std::uint64_t first_outside, std::uint64_t n,
                       std::uint64_t members, const lhc_plan& plan) {
  if (finite && first_outside == n && members == plan.union_nonzeros) return;
  std::fill(sketch.begin(), sketch.end(), std::numeric_limits<T>::quiet_NaN());
  require(finite, errc::non_finite_input, "the gradient holds NaN or Inf");
  require(first_outside == n, errc::invalid_argument, [&] {
    return "element " + std::to_string(first_outside) + " is non-zero but absent from the aggregated index";
  });
  fail(errc::invalid_argument, "the plan is not the plan of this index: it counts " +
                                   std::to_string(plan.union_nonzeros) + " non-zeros, the index " +
                                   std::to_string(members));
}
/// Checks that `plan` is `expected`, the plan of the index a call is given.
/// @throws error `invalid_argument`.
inline void lhc_require_plan_of_index(const lhc_plan& plan, const lhc_plan& expected) {
  require(plan == expected, errc::invalid_argument, [&] {
    return "the plan (" + std::to_string(plan.union_nonzeros) + " non-zeros, " + std::to_string(plan.rows) +
           " rows) is not the plan of this index (" + std::to_string(expected.union_nonzeros) + " non-zeros, " +
           std::to_string(expected.rows) + " rows)";
  });
}

/// Checks that peeling left no element, unless `policy` estimates those it left.
/// @throws error `peeling_stalled`, whose message gives the counts.
inline void lhc_require_peeled(lhc_stall_policy policy, const lhc_decode_result& result, const lhc_plan& plan) {
  require(result.unrecovered == 0 || policy == lhc_stall_policy::median_estimate, errc::peeling_stalled, [&] {
    return std::to_string(result.unrecovered) + " of " + std::to_string(plan.union_nonzeros) +
           " non-zeros were not recovered after " + std::to_string(result.rounds) + " rounds (" +
           std::to_string(plan.cells) + " cells); raise cells_per_nonzero";
  });
}

/// The detail of `non_finite_input` for a peeled value beyond T's range: `what` ("sum" for a
/// recovered element, "estimate" for a median) at element i.
inline std::string lhc_range_message(const char* what, std::uint64_t i) {
  return std::string("the ") + what + " at element " + std::to_string(i) + " exceeds the range of the value type";
}

/// The detail of `non_finite_input` for NaN or Inf at value c of the summed sketch.
inline std::string lhc_non_finite_message(std::uint64_t c) {
  return "summed sketch value " + std::to_string(c) + " is NaN or Inf";
}

}  // namespace detail

/// Cell `column` of a row of one rank's sketch, computed from the row's side: the sum, in T from
/// +0, of σ_j·x[b·B + t] over the row's (block, hash) pairs `pairs[begin, end)`, each the number
/// 3·b + j, in ascending order, where t = (column − rot_j) mod B and elements past n are skipped.
/// With the pairs of every row in ascending order (a stable sort of all 3·G pairs by row), this
/// adds each cell's elements in ascending element order, which is the CPU encoder's order, so it
/// gives the CPU's bits: the GPU computes a cell per thread this way. Zero elements add nothing (a
/// sum that starts at +0 never becomes −0), so they need not be skipped; `layouts[b]` is block
/// b's layout.
template <gradient_value T>
GRADCOMP_HOST_DEVICE inline T lhc_cell_from_row(const T* x, std::uint64_t n, const std::uint64_t* pairs,
                                                std::uint64_t begin, std::uint64_t end, std::uint64_t column,
                                                const lhc_block_layout* layouts, std::uint32_t block) noexcept {
  T sum = T{0};
  for (std::uint64_t p = begin; p < end; ++p) {
    const std::uint64_t b = pairs[p] / 3;
    const auto j = static_cast<unsigned>(pairs[p] % 3);
    const std::uint32_t rotation = layouts[b].rotation[j];
    const std::uint64_t t = column >= rotation ? column - rotation : column + block - rotation;
    const std::uint64_t i = b * block + t;
    if (i >= n) continue;
    sum += layouts[b].negative[j] ? -x[i] : x[i];
  }
  return sum;
}

/// Lossless homomorphic compression of `float`, `double`, `bf16` or `fp16` gradients (the 16-bit
/// ones on host executors): an index and a count sketch whose sums over ranks decode, by peeling,
/// to the exact sum of the gradients.
template <gradient_value T = float>
class lossless_homomorphic {
 public:
  using value_type = T;  ///< Element type of the gradient.
  using cell_type = compute_type<T>;  ///< Element type of the sketch: float32 for bf16 and fp16.
  /// Names the scheme in the compressed all-reduce's agreement (it writes no message of its own).
  static constexpr codec_id id = codec_id::lossless_homomorphic;

  /// @throws error `invalid_argument` for invalid parameters.
  explicit lossless_homomorphic(lhc_params params = {}) : params_(params) { params_.validate(); }

  /// The parameters.
  [[nodiscard]] const lhc_params& params() const noexcept { return params_; }
  /// Hash of the value type and every parameter, which the ranks of a compressed all-reduce
  /// compare before their first stage.
  [[nodiscard]] std::uint64_t params_hash() const noexcept {
    return params_hasher{}
        .add(id)
        .add(dtype_of<T>)
        .add(params_.block)
        .add(params_.cells_per_nonzero)
        .add(params_.index)
        .add(params_.on_stall)
        .add(params_.reference_layout)
        .add(params_.fixed_compress_ratio)
        .add(params_.seed)
        .value();
  }

  /// Bytes of the index of an n-element tensor: ⌈n/8⌉ (bitmap), ⌈n/2⌉ (sum4) or n (sum8).
  [[nodiscard]] std::uint64_t index_bytes(std::uint64_t n) const noexcept {
    switch (params_.index) {
      case lhc_index_coding::bitmap: return n / 8 + (n % 8 != 0 ? 1 : 0);
      case lhc_index_coding::sum4: return n / 2 + n % 2;
      case lhc_index_coding::sum8: return n;
    }
    return n;
  }

  /// Most ranks whose indexes the coding aggregates exactly: UINT64_MAX (bitmap, unlimited), 15
  /// (sum4) or 255 (sum8).
  [[nodiscard]] std::uint64_t max_contributors() const noexcept {
    switch (params_.index) {
      case lhc_index_coding::bitmap: return std::numeric_limits<std::uint64_t>::max();
      case lhc_index_coding::sum4: return 15;
      case lhc_index_coding::sum8: return 255;
    }
    return 0;
  }

  /// G = ⌈n/B⌉: blocks of an n-element tensor.
  [[nodiscard]] std::uint64_t block_count(std::uint64_t n) const noexcept {
    return n / params_.block + (n % params_.block != 0 ? 1 : 0);
  }

  /// The sizing rule alone: the plan of an n-element tensor whose union holds `union_nonzeros`
  /// elements (see the file comment). `plan` is this after validating and counting the index.
  /// @throws error `invalid_argument` when `union_nonzeros` > n; `too_large` when the sketch would
  ///         need 2^32 rows or more (murmur3_32 addresses fewer), or when a sketched tensor has
  ///         more than 2^32 blocks (the hashes are keyed by a 32-bit block index).
  [[nodiscard]] lhc_plan plan_for(std::uint64_t n, std::uint64_t union_nonzeros) const {
    detail::require(union_nonzeros <= n, errc::invalid_argument, [&] {
      return "union of " + std::to_string(union_nonzeros) + " non-zeros in " + std::to_string(n) + " elements";
    });
    lhc_plan plan{.n = n, .union_nonzeros = union_nonzeros};
    if (union_nonzeros == 0) return plan;
    const std::uint64_t blocks = block_count(n);
    const double wanted =
        params_.fixed_compress_ratio > 0
            ? std::ceil(static_cast<double>(blocks) / params_.fixed_compress_ratio)
            : std::ceil(params_.cells_per_nonzero * static_cast<double>(union_nonzeros) / params_.block);
    const double least = params_.reference_layout && params_.fixed_compress_ratio > 0 ? 1.0 : 3.0;
    const double rows = std::max(wanted, least);
    if (rows >= static_cast<double>(blocks)) {  // r·B ≥ G·B ≥ n: dense is no larger
      plan.dense = true;
      return plan;
    }
    detail::require(rows < 0x1p32, errc::too_large, [&] {
      return "a sketch of " + std::to_string(rows) + " rows exceeds the 2^32 rows the hashes address";
    });
    detail::require(blocks <= (std::uint64_t{1} << 32), errc::too_large, [&] {
      return std::to_string(blocks) +
             " blocks exceed the 2^32 block indices the hashes are keyed by; use a larger block";
    });
    plan.rows = static_cast<std::uint64_t>(rows);
    plan.cells = plan.rows * params_.block;
    return plan;
  }

  /// Writes the index of `grad` (`index_bytes(n)` bytes) for the aggregation of the first stage.
  /// @throws error `size_mismatch` (index size; nothing written) or `non_finite_input` (NaN or ±Inf
  ///         in `grad`): the index then marks every element, so the plan is dense everywhere and
  ///         this rank's `encode_sketch` poisons the sum (a rank that joins the collectives anyway
  ///         makes every decoder fail instead of producing a wrong sum).
  template <executor E>
  void encode_index(const E& e, std::span<const T> grad, std::span<std::byte> index) const {
    require_value_type<E>();
    backend<lossless_homomorphic, E>::encode_index(*this, e, grad, index);
  }

  /// Validates the aggregated index of `contributors` ranks and sizes the sketch.
  /// @throws error `size_mismatch` (index size), `invalid_argument` (contributors 0 or above
  ///         `max_contributors()`), `malformed_payload` (a field above `contributors`, non-zero
  ///         padding bits or nibble), `too_large` (see `plan_for`).
  template <executor E>
  [[nodiscard]] lhc_plan plan(const E& e, std::span<const std::byte> global_index, std::uint64_t n,
                              std::uint64_t contributors) const {
    require_value_type<E>();
    return backend<lossless_homomorphic, E>::plan(*this, e, global_index, n, contributors);
  }

  /// Workspace `decode` needs for `plan`: the peeling state (accumulators, counters, index XORs,
  /// worklist, block layouts, the union's elements, recovered values and an output span), or
  /// nothing for a dense or empty plan.
  template <executor E>
  [[nodiscard]] std::size_t workspace_bytes(const E& e, const lhc_plan& plan) const {
    require_value_type<E>();
    return backend<lossless_homomorphic, E>::workspace_bytes(*this, e, plan);
  }

  /// Writes this rank's sketch of `grad` (`plan.sketch_values()` values) for the SUM reduction of
  /// the second stage, in one pass over `grad` and the index.
  /// @throws error `size_mismatch` (grad, index or sketch size), `malformed_payload` (index
  ///         padding) or `invalid_argument` (`plan` breaks the sizing rule), with nothing written;
  ///         `non_finite_input` (NaN or ±Inf in `grad`) or `invalid_argument` (a non-zero element
  ///         of `grad` absent from the index, or `plan` counting another number of non-zeros than
  ///         the index), with every sketch value set to NaN, so that a rank which joins the SUM
  ///         anyway makes every decoder fail with `non_finite_input`.
  template <executor E>
  void encode_sketch(const E& e, std::span<const T> grad, std::span<const std::byte> global_index, const lhc_plan& plan,
                     std::span<cell_type> sketch) const {
    require_value_type<E>();
    backend<lossless_homomorphic, E>::encode_sketch(*this, e, grad, global_index, plan, sketch);
  }

  /// Recovers the sum of the gradients into `out` (n values) from the aggregated index and the
  /// summed sketch. Everything is checked before `out` is written.
  /// @throws error `size_mismatch` (index, sketch or out size), `invalid_argument` (`plan` is not
  ///         the plan of `global_index`), `non_finite_input` (NaN or ±Inf in the sketch, or a sum
  ///         beyond the range of the cell type), `narrowing_overflow` (a 16-bit codec's value beyond
  ///         its type's range), `malformed_payload` (index padding), `workspace_too_small`,
  ///         `peeling_stalled` (policy `report` and elements left; `out` untouched).
  template <executor E>
  lhc_decode_result decode(const E& e, std::span<const std::byte> global_index, const lhc_plan& plan,
                           std::span<const cell_type> summed_sketch, std::span<T> out, std::span<std::byte> ws) const {
    require_value_type<E>();
    return backend<lossless_homomorphic, E>::decode(*this, e, global_index, plan, summed_sketch, out, ws);
  }

  /// A 16-bit codec's `decode` into float32: the sums without narrowing.
  template <executor E>
  lhc_decode_result decode(const E& e, std::span<const std::byte> global_index, const lhc_plan& plan,
                           std::span<const cell_type> summed_sketch, std::span<cell_type> out,
                           std::span<std::byte> ws) const
    requires half_precision<T>
  {
    require_value_type<E>();
    return backend<lossless_homomorphic, E>::decode(*this, e, global_index, plan, summed_sketch, out, ws);
  }

 private:
  /// A compile error, rather than a deep one, for a 16-bit codec on the CUDA backend.
  template <executor E>
  static constexpr void require_value_type() noexcept {
    static_assert(!half_precision<T> || memory_space_of<E> == memory_space::host,
                  "the CUDA backend takes float and double gradients only so far (docs/half-precision.md §5)");
  }

  lhc_params params_;
};

}  // namespace gradcomp

#include <gradcomp/cpu/lossless_homomorphic.hpp>
#include <gradcomp/reference/lossless_homomorphic.hpp>
