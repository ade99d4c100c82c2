#pragma once
/// @file
/// The count sketch (docs/sketches.md §1, as in FetchSGD): r rows of c cells of the cell type (the
/// value type; float32 for a bf16 or fp16 gradient), into which element i adds σ_j(i)·x_i at cell
/// h_j(i) of every row j. It is linear, so the cell-wise sum of the ranks' sketches is the sketch of
/// the summed gradient: a plain float SUM collective aggregates the messages (`is_homomorphic`).
///
/// Hashing (computed on the fly, never stored). With `murmur3_32` (MurmurHash3_x86_32 of a 4-byte
/// key, core/murmur3.hpp), lo32/hi32 the low and high 32 bits of a 64-bit value:
///
///     row seed   s_j     = murmur3_32(hi32(seed) XOR j, lo32(seed))
///     hash       H_j(i)  = murmur3_32(lo32(i), s_j XOR murmur3_fmix32(hi32(i)))
///     bucket     h_j(i)  = ((H_j(i) AND 0x7FFFFFFF) · c) >> 31           in [0, c)
///     sign       σ_j(i)  = +1 when bit 31 of H_j(i) is 0, −1 when it is 1
///
/// murmur3_32 is a bijection of its key for a fixed seed, so the rows of one seed get distinct
/// row seeds. murmur3_fmix32(0) = 0, so for i < 2^32 the hash is murmur3_32(i, s_j); above, the
/// high word changes the seed. Bucket (bits 0..30, by multiply-shift) and sign (bit 31) use
/// disjoint bits. σ·x is x with its sign bit flipped when σ = −1: exact.
///
/// Encoding: S[j][h_j(i)] += σ_j(i)·x_i in the cell type, each cell summing its elements in
/// ascending index order (deterministic, so equal inputs give equal bytes). A 16-bit gradient's
/// values are widened to float32 exactly first, so its cells are byte for byte those of the float32
/// sketch of the widened values (docs/half-precision.md §2): only the envelope's dtype and the
/// parameter hash differ. The CUDA backend sums
/// with atomic adds in no fixed order (float ones flush subnormals): its cells match these within
/// rounding (docs/cuda.md §4).
///
/// Payload layout after the envelope (layout byte 0), the whole of it summable:
///
///     r·c cells (float64 for a float64 gradient, else float32), row-major: cell b of row j at
///     payload offset (j·c + b)·sizeof(cell)
///
/// Workspace (CPU executor): `workspace_bytes(n)` is the larger of what encoding and decoding use.
/// Encoding queues each row's updates by column range (cpu/count_sketch.hpp): the hashes of 2048
/// elements (8 KiB), then for each of the row's ranges (at most 16; ranges of 2^16 columns for
/// float, 2^15 for double, wider when c > 2^20 or 2^19) a queue of min(n, 2^16) updates of 8 bytes
/// for float32 cells, or min(n, 2^15) of 16 bytes for double: at most 8 MiB and a few KiB. Given
/// less (an empty span, say), encoding updates the cells directly instead: the same bytes, slower.
/// Decoding and `heavy_hitters` use n estimates of the cell type and 48 KiB of histograms;
/// `estimate` uses none.
///
/// Estimate: x̂_i = median over rows of σ_j(i)·S[j][h_j(i)]; for even r, the mean of the two
/// middle values, computed as a/2 + b/2 (no overflow). Estimates are of the cell type. Decoding
/// recovers the heavy hitters: the `heavy_hitter_count(n)` estimates of largest magnitude (ties to
/// the lower index) are written at their indices, zeros elsewhere; a 16-bit codec decodes into
/// float32 or, rounded to nearest even, into its own type (a result beyond that type's range is
/// `narrowing_overflow`, the output untouched). `heavy_hitters` returns those indices, for a second
/// round that fetches their exact values (FetchSGD).
///
/// Special values: a gradient holding NaN or ±Inf is rejected with `errc::non_finite_input` before
/// anything is written. A finite gradient whose cell sums overflow (possible only when n·max|x|
/// exceeds the largest finite value) is rejected with `non_finite_input` after the cells were
/// summed: the envelope is then left zeroed, so `out` holds no valid message. Decoders reject NaN
/// and ±Inf cells (a SUM that overflowed) with `malformed_payload`. The message size depends on r, c and T only; n (64-bit) is in the envelope.
/// No payload checksum: a SUM collective of the cells would leave it stale.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include <gradcomp/core/codec_interface.hpp>
#include <gradcomp/core/config.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/murmur3.hpp>
#include <gradcomp/core/rounded_product.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/sparsify/sparsity.hpp>

namespace gradcomp {

/// Most rows a count sketch may have.
inline constexpr std::uint32_t count_sketch_max_rows = 16;
/// Most columns a count sketch may have: buckets come from the 31 low bits of the hash.
inline constexpr std::uint64_t count_sketch_max_columns = std::uint64_t{1} << 31;

/// Parameters of the count sketch.
struct count_sketch_params {
  std::uint32_t rows = 3;  ///< r: hash rows, in [1, 16]; odd, so the median is one row's estimate.
  std::uint64_t columns = 65536;  ///< c: cells per row, in [1, 2^31].
  std::uint64_t seed = 0;  ///< Keys the bucket and sign hashes of every row.
  sparsity heavy_hitters{};  ///< How many estimates `decode` keeps (default 1% of n).

  /// Throws `invalid_argument` for rows outside [1, 16], columns outside [1, 2^31], or an invalid
  /// heavy-hitter amount.
  void validate() const {
    detail::require(rows >= 1 && rows <= count_sketch_max_rows, errc::invalid_argument,
                    [&] { return "rows must be in [1, 16], got " + std::to_string(rows); });
    detail::require(columns >= 1 && columns <= count_sketch_max_columns, errc::invalid_argument,
                    [&] { return "columns must be in [1, 2^31], got " + std::to_string(columns); });
    heavy_hitters.validate();
  }

  friend constexpr bool operator==(const count_sketch_params&, const count_sketch_params&) = default;
};

/// s_j: the hash seed of row `row` for the sketch seed `seed` (see this file's comment).
GRADCOMP_HOST_DEVICE constexpr std::uint32_t count_sketch_row_seed(std::uint64_t seed, std::uint32_t row) noexcept {
  return murmur3_32(static_cast<std::uint32_t>(seed >> 32) ^ row, static_cast<std::uint32_t>(seed));
}

/// H_j(i): the 32-bit hash of element `index` in the row whose seed is `row_seed`.
GRADCOMP_HOST_DEVICE constexpr std::uint32_t count_sketch_hash(std::uint32_t row_seed, std::uint64_t index) noexcept {
  return murmur3_32(static_cast<std::uint32_t>(index),
                    row_seed ^ murmur3_fmix32(static_cast<std::uint32_t>(index >> 32)));
}

/// h_j(i) from H_j(i): the low 31 bits scaled to [0, columns) by multiply-shift.
GRADCOMP_HOST_DEVICE constexpr std::uint64_t count_sketch_bucket(std::uint32_t hash, std::uint64_t columns) noexcept {
  return (std::uint64_t{hash & 0x7FFFFFFFu} * columns) >> 31;
}

/// σ_j(i)·v from H_j(i): `value` with its sign bit flipped when bit 31 of `hash` is set (exact).
template <gradient_value T>
GRADCOMP_HOST_DEVICE inline T count_sketch_signed(std::uint32_t hash, T value) noexcept {
  using bits_type = typename float_traits<T>::bits_type;
  return from_bits<T>(
      static_cast<bits_type>(to_bits(value) ^ (static_cast<bits_type>(hash >> 31) << (8 * sizeof(T) - 1))));
}

/// The median of three row estimates: max(min(a, b), min(max(a, b), c)), each min and max taking
/// the first of two equal values as std::min and std::max do, so that every backend picks the same
/// one of +0 and −0.
template <gradient_value T>
GRADCOMP_HOST_DEVICE constexpr T count_sketch_median3(T a, T b, T c) noexcept {
  const T low = b < a ? b : a;
  const T high = a < b ? b : a;
  const T middle = c < high ? c : high;
  return low < middle ? middle : low;
}

/// x̂ from the r row estimates v[0, r) (1 ≤ r ≤ 16): `count_sketch_median3` for r = 3, else the
/// middle value of v sorted by a stable insertion sort for odd r, and the mean a/2 + b/2 of the two
/// middle values for even r (each half rounded on its own, so no backend fuses them). Reorders v.
template <gradient_value T>
GRADCOMP_HOST_DEVICE inline T count_sketch_median(T* v, std::uint32_t r) noexcept {
  if (r == 3) return count_sketch_median3(v[0], v[1], v[2]);
  for (std::uint32_t i = 1; i < r; ++i) {
    const T value = v[i];
    std::uint32_t j = i;
    for (; j > 0 && value < v[j - 1]; --j) v[j] = v[j - 1];
    v[j] = value;
  }
  return r % 2 == 1 ? v[r / 2] : mul_rn(T{0.5}, v[r / 2 - 1]) + mul_rn(T{0.5}, v[r / 2]);
}

/// Count sketch of `float`, `double`, `bf16` or `fp16` gradients: a fixed-size, summable message of
/// r·c cells, decoded by heavy-hitter recovery.
///
/// Protocol per tensor: `encode` → SUM all-reduce of bytes [summable_offset(n), summable_offset(n)
/// + summable_bytes(n)) as `cell_type` (or `accumulate_encoded`) → `decode` (the heavy hitters of the sum),
/// or `heavy_hitters` → an all-reduce of the exact gradient values at those indices
/// (`gather_values`) → the exact sum at the heavy hitters.
template <gradient_value T = float>
class count_sketch : public codec_interface<count_sketch<T>, T> {
 public:
  using value_type = T;  ///< Element type of the gradient.
  using cell_type = compute_type<T>;  ///< Element type of the cells and estimates: float32 for bf16 and fp16.
  static constexpr codec_id id = codec_id::count_sketch;  ///< Wire identifier.
  static constexpr bool is_homomorphic = true;  ///< Summed cells are the sketch of the sum.
  static constexpr bool takes_half_precision = true;  ///< bf16 and fp16: widened into float32 cells.

  /// @throws error `invalid_argument` for invalid parameters.
  explicit count_sketch(count_sketch_params params = {}) : params_(params) { params_.validate(); }

  /// The parameters.
  [[nodiscard]] const count_sketch_params& params() const noexcept { return params_; }
  /// r: hash rows.
  [[nodiscard]] std::uint32_t rows() const noexcept { return params_.rows; }
  /// c: cells per row.
  [[nodiscard]] std::uint64_t columns() const noexcept { return params_.columns; }
  /// Heavy hitters `decode` keeps of an n-element tensor.
  [[nodiscard]] std::uint64_t heavy_hitter_count(std::uint64_t n) const noexcept {
    return params_.heavy_hitters.count(n);
  }
  /// Offset from the start of the message of its summable region: the envelope's 56 bytes.
  [[nodiscard]] std::size_t summable_offset(std::uint64_t) const noexcept { return envelope::size; }
  /// Bytes of the summable region, which is the whole payload: r·c·sizeof(cell_type). A SUM
  /// collective adds them as `cell_type` values.
  [[nodiscard]] std::size_t summable_bytes(std::uint64_t) const noexcept {
    return static_cast<std::size_t>(params_.rows * params_.columns * sizeof(cell_type));
  }
  /// Exact size of every message, whatever n: 56 + r·c·sizeof(cell_type).
  [[nodiscard]] std::size_t max_encoded_bytes(std::uint64_t n) const noexcept {
    return envelope::size + summable_bytes(n);
  }
  /// Hash of the parameters, carried in every message and checked by decoders: the id, the dtype,
  /// rows (u32), columns (u64), seed (u64) and the heavy-hitter amount.
  [[nodiscard]] std::uint64_t params_hash() const noexcept {
    params_hasher hasher;
    hasher.add(id).add(dtype_of<T>).add(params_.rows).add(params_.columns).add(params_.seed);
    params_.heavy_hitters.hash_into(hasher);
    return hasher.value();
  }

  /// Writes the estimate x̂_i of every element of the sketched tensor into `out` (n values of the
  /// cell type). Everything is validated first; on error `out` is untouched.
  /// @throws error naming what is wrong with the message (as `decode`).
  template <executor E>
  void estimate(const E& e, std::span<const std::byte> message, std::span<cell_type> out, std::span<std::byte> ws,
                decode_limits limits = {}) const {
    this->template require_value_type<E>();
    backend<count_sketch, E>::estimate(*this, e, message, out, ws, limits);
  }

  /// Writes the indices of the `heavy_hitter_count(n)` estimates of largest magnitude (ties to the
  /// lower index), ascending, into the first entries of `indices`: the indices whose exact values a
  /// second round fetches. `n` is the sketched tensor's element count.
  /// @returns how many indices were written. @throws error as `decode`, or `buffer_too_small` when
  ///          `indices` holds fewer than heavy_hitter_count(n) entries.
  template <executor E>
  std::size_t heavy_hitters(const E& e, std::span<const std::byte> message, std::uint64_t n,
                            std::span<std::uint64_t> indices, std::span<std::byte> ws,
                            decode_limits limits = {}) const {
    this->template require_value_type<E>();
    return backend<count_sketch, E>::heavy_hitters(*this, e, message, n, indices, ws, limits);
  }

  /// Turns message `acc` into the sketch of the sum of `acc` and `other` (same parameters, n, step
  /// and tensor), as a SUM collective over the cells would.
  /// @throws error on a malformed message, `step_mismatch` when the keys differ, or
  ///         `non_finite_input` when a summed cell would overflow; `acc` is untouched then.
  template <executor E>
  void accumulate_encoded(const E& e, std::span<std::byte> acc, std::span<const std::byte> other) const {
    this->template require_value_type<E>();
    backend<count_sketch, E>::accumulate_encoded(*this, e, acc, other);
  }

 private:
  count_sketch_params params_;
};

/// values[m] = grad[indices[m]] for every m: this rank's exact values at the heavy hitters, the
/// input of the second round's SUM all-reduce. A 16-bit gradient's values may be gathered widened
/// into float32 `values`, so that the SUM adds float32 (docs/half-precision.md §3).
/// @throws error `size_mismatch` when the spans differ in length, `invalid_argument` for an index
///         outside `grad` (nothing is written then).
template <gradient_value T, gradient_value V>
  requires std::same_as<V, T> || std::same_as<V, compute_type<T>>
void gather_values(std::span<const T> grad, std::span<const std::uint64_t> indices, std::span<V> values) {
  detail::require(values.size() == indices.size(), errc::size_mismatch, [&] {
    return std::to_string(indices.size()) + " indices, " + std::to_string(values.size()) + " values";
  });
  for (const std::uint64_t i : indices)
    detail::require(i < grad.size(), errc::invalid_argument, [&] {
      return "index " + std::to_string(i) + " lies outside the " + std::to_string(grad.size()) + " values";
    });
  for (std::size_t m = 0; m < indices.size(); ++m) {
    const T v = grad[static_cast<std::size_t>(indices[m])];
    if constexpr (std::same_as<V, T>) values[m] = v;
    else
      values[m] = widen(v);
  }
}

namespace detail {

/// docs/wire-format.md §16.2, in order: the envelope against an `elements`-element tensor, layout
/// 0, a payload of exactly r·c cells, every cell finite.
template <gradient_value T>
envelope count_sketch_checked(const count_sketch<T>& codec, std::span<const std::byte> message, std::uint64_t elements,
                              const decode_limits& limits) {
  const envelope e = parse_envelope(message);
  validate_envelope(e, {codec_id::count_sketch, dtype_of<T>, elements, codec.params_hash()}, limits);
  require(e.layout == 0, errc::malformed_payload, "count-sketch messages have layout 0");
  require(e.payload_bytes == codec.summable_bytes(e.elements), errc::malformed_payload, [&] {
    return "payload of " + std::to_string(e.payload_bytes) + " bytes, the sketch has " +
           std::to_string(codec.summable_bytes(e.elements)) + " bytes of cells";
  });
  // The largest magnitude key over the cells, without an early exit, so that the loop vectorizes.
  using C = compute_type<T>;
  const std::span<const std::byte> cells = payload_of(message);
  typename float_traits<C>::bits_type largest = 0;
  for (std::uint64_t m = 0; m < codec.rows() * codec.columns(); ++m) {
    C cell;
    std::memcpy(&cell, cells.data() + m * sizeof(C), sizeof cell);
    largest = std::max(largest, magnitude_key(cell));
  }
  require(largest < float_traits<C>::infinity_key, errc::malformed_payload,
          "a cell is NaN or Inf (a sum of sketches overflowed)");
  return e;
}

/// Throws `buffer_too_small` unless `indices` holds the k heavy hitters.
inline void require_heavy_hitter_room(std::span<const std::uint64_t> indices, std::uint64_t k) {
  require(indices.size() >= k, errc::buffer_too_small, [&] {
    return "room for " + std::to_string(indices.size()) + " indices, the sketch has " + std::to_string(k) +
           " heavy hitters";
  });
}

}  // namespace detail

}  // namespace gradcomp

#include <gradcomp/reference/count_sketch.hpp>
#include <gradcomp/cpu/count_sketch.hpp>
