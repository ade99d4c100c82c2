#pragma once
/// @file
/// PowerSGD (Vogels et al., NeurIPS 2019): rank-r compression of a gradient matrix by one step of
/// subspace iteration, summed across ranks by two small all-reduces (docs/lowrank.md).
///
/// One step on a rows × cols matrix G (row-major, a = rows, b = cols, r = `rank` capped at
/// min(a, b)), with its state (error E, a × b; factor Q, b × r):
///
///     M = G + E                                     (error feedback; E = 0 at first)
///     P = M·Q                                       (a × r)   then all-reduce P (SUM)
///     P̂ = orthonormalise(P)                         (modified Gram–Schmidt, columns in order)
///     Q = Mᵀ·P̂                                      (b × r)   then all-reduce Q (SUM)
///     result = P̂·Qᵀ (the sum over ranks), or P̂·(Q/p)ᵀ with `average` (p ranks)
///     E = M − P̂·(Q/p)ᵀ   (`powersgd_feedback::shared`: the mean every rank applies, PyTorch's hook)
///     E = M − P̂·(Mᵀ·P̂)ᵀ (`powersgd_feedback::local`: this rank's own approximation, before the Q
///                          all-reduce)
///     Q ← Q/p for the next step (`warm_start`; orthonormalised before it is used), else a fresh draw
///
/// A new error that is not finite (M − M̂ overflowed) is replaced by zeros.
///
/// Arithmetic, on every host backend alike (bit for bit, whatever the compiler's flags): every sum
/// is a sequential float sum (T) in index order, each product rounded on its own (`mul_rn`):
/// P[i][k] = Σ_j M[i][j]·Q[j][k] (j ascending), Q[j][k] = Σ_i M[i][j]·P̂[i][k] (i ascending),
/// result[i][j] = Σ_k P̂[i][k]·Q[j][k] (k ascending); M = G + E and E = M − result are single
/// operations. The orthonormalisation is `powersgd_orthonormalise` (lowrank/powersgd_math.hpp).
/// Q's first draw (and every draw without `warm_start`) is uniform in [−1, 1) from the Philox
/// stream keyed by (seed, step, tensor id), then orthonormalised: bit-stable everywhere, unlike a
/// Gaussian draw through the C library.
///
/// A matrix is compressed only when (a + b)·r < a·b / `min_compression_rate` (PyTorch's rule);
/// otherwise, and while `key.step < start_iter`, the collective sums it uncompressed and leaves
/// the state untouched.
///
/// Saved state (`save_state`, `load_state`; integers little-endian, no padding):
///
/// | Offset | Size | Field |
/// |---:|---:|---|
/// | 0 | 4 | magic "GCPS" |
/// | 4 | 2 | format version (1) |
/// | 6 | 2 | `codec_id::powersgd` |
/// | 8 | 1 | `value_dtype` |
/// | 9 | 8 | element count n = a·b |
/// | 17 | 8 | rows a |
/// | 25 | 4 | rank r (capped) |
/// | 29 | 8 | steps taken |
/// | 37 | 8 | `params_hash()` |
/// | 45 | 4 | CRC-32C of bytes 0..44 |
/// | 49 | b·r·sizeof(T) | Q, row-major (b × r) |
/// | 49 + b·r·sizeof(T) | n·sizeof(T) | error E, row-major |
/// | … | 4 | CRC-32C of Q and E |
///
/// `load_state` checks, in this order, before touching the state: header length (`truncated`),
/// magic (`bad_magic`), version (`unsupported_version`), header CRC (`header_checksum`), codec
/// (`codec_mismatch`), dtype (`dtype_mismatch`), n, rows and rank against the state's shape
/// (`size_mismatch`), the parameter hash (`parameter_mismatch`), total length (`truncated`,
/// `trailing_bytes`), payload CRC (`payload_checksum`), every value finite (`malformed_payload`).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/saved_state.hpp>
#include <gradcomp/core/wire_envelope.hpp>

namespace gradcomp {

/// A gradient of rows·cols values viewed as a row-major matrix.
struct matrix_shape {
  std::uint64_t rows = 0;  ///< a: rows (PyTorch's first dimension).
  std::uint64_t cols = 0;  ///< b: columns (the other dimensions, flattened).

  /// Number of values, a·b.
  [[nodiscard]] constexpr std::uint64_t count() const noexcept { return rows * cols; }
  friend constexpr bool operator==(const matrix_shape&, const matrix_shape&) = default;
};

/// Which approximation PowerSGD's error feedback subtracts (epfml/powersgd#3).
enum class powersgd_feedback : std::uint8_t {
  shared = 0,  ///< E = M − P̂·(Q/p)ᵀ: the mean reconstruction every rank applies (PyTorch's hook; default).
  local = 1,   ///< E = M − P̂·(Mᵀ·P̂)ᵀ: this rank's own approximation, before the Q all-reduce.
};

/// Parameters of PowerSGD.
struct powersgd_params {
  std::uint32_t rank = 4;              ///< r: columns of P and Q (≥ 1), capped at min(a, b) per matrix.
  float min_compression_rate = 2.0f;   ///< Compress only when (a + b)·r < a·b / this (≥ 1).
  std::uint64_t start_iter = 0;        ///< Steps with key.step below this are summed uncompressed.
  bool warm_start = true;              ///< Start each step from the last step's Q (else a fresh draw).
  std::uint64_t seed = 0;              ///< Keys the draws of Q with the step and tensor id.
  powersgd_feedback feedback = powersgd_feedback::shared;  ///< Which error the state keeps.
  bool orthonormalise_in_double = false;  ///< Norms and projections of P̂ accumulated in double.

  /// Throws `invalid_argument` for a rank of 0 or a compression rate below 1 (or NaN).
  void validate() const {
    detail::require(rank >= 1, errc::invalid_argument, "rank must be at least 1");
    detail::require(min_compression_rate >= 1.0f, errc::invalid_argument, [&] {
      return "min_compression_rate must be at least 1, got " + std::to_string(min_compression_rate);
    });
  }
  friend constexpr bool operator==(const powersgd_params&, const powersgd_params&) = default;
};

/// PowerSGD's per-tensor state, in host memory: the error E (a × b) and the factor Q (b × r) of
/// the last step, both empty until the first compressed step, and two scratch matrices a step
/// reuses (never saved): M = G + E, and the new error, swapped with `error` when the step succeeds.
template <gradient_value T>
struct powersgd_state {
  std::vector<T> error;        ///< E, row-major; empty before the first compressed step.
  std::vector<T> q;            ///< Q/p of the last step (b × r, row-major); empty before the first.
  std::uint64_t steps = 0;     ///< Compressed steps taken.
  std::vector<T> compensated;  ///< Scratch: M = G + E of the step under way.
  std::vector<T> next_error;   ///< Scratch: the step's new error, until it succeeds.
};

/// The header of a saved PowerSGD state, field by field (the table in this file's comment), after
/// the frame's (core/saved_state.hpp).
struct powersgd_saved_format : detail::saved_state_frame {
  static constexpr std::uint32_t magic = 0x53504347u;  ///< "GCPS" as a little-endian word.
  static constexpr std::uint16_t version = 1;          ///< The version this build writes and reads.
  static constexpr detail::state_field<std::uint64_t> rows = count.then<std::uint64_t>();  ///< a.
  static constexpr detail::state_field<std::uint32_t> rank = rows.then<std::uint32_t>();   ///< r, capped.
  static constexpr detail::state_field<std::uint64_t> steps = rank.then<std::uint64_t>();  ///< Steps taken.
  static constexpr detail::state_field<std::uint64_t> params_hash = steps.then<std::uint64_t>();  ///< The scheme's.
  static constexpr std::size_t header_crc_offset = params_hash.end();  ///< The header CRC; it covers bytes before.
  static constexpr std::size_t header_bytes = header_crc_offset + checksum_bytes;  ///< Header size, its CRC included.
};
static_assert(powersgd_saved_format::header_bytes == 49, "the table in this file's comment");

/// PowerSGD for `float` or `double` gradients: a scheme of the compressed all-reduce
/// (collective/low_rank_collectives.hpp) with a state per tensor, not a codec with messages.
template <gradient_value T = float>
class powersgd {
 public:
  using value_type = T;  ///< Element type of the gradient.
  static constexpr codec_id id = codec_id::powersgd;  ///< Named in the agreement record and saved states.
  static constexpr bool is_homomorphic = true;  ///< The factors are summed by all-reduces.

  /// @throws error `invalid_argument` for invalid parameters.
  explicit powersgd(powersgd_params params = {}) : params_(params) { params_.validate(); }

  /// The parameters.
  [[nodiscard]] const powersgd_params& params() const noexcept { return params_; }

  /// The rank used for a matrix: `rank` capped at min(a, b).
  [[nodiscard]] std::uint64_t rank_for(matrix_shape shape) const noexcept {
    return std::min<std::uint64_t>({params_.rank, shape.rows, shape.cols});
  }

  /// Whether a matrix is compressed: (a + b)·r < a·b / `min_compression_rate` (never for an empty
  /// one, a vector being 1 × n or n × 1).
  [[nodiscard]] bool compresses(matrix_shape shape) const noexcept {
    if (shape.rows < 2 || shape.cols < 2) return false;
    const double factors = static_cast<double>(shape.rows + shape.cols) * static_cast<double>(rank_for(shape));
    return factors < static_cast<double>(shape.count()) / static_cast<double>(params_.min_compression_rate);
  }

  /// Hash of the parameters, compared across ranks and with saved states.
  [[nodiscard]] std::uint64_t params_hash() const noexcept {
    return params_hasher{}
        .add(id)
        .add(dtype_of<T>)
        .add(params_.rank)
        .add(params_.min_compression_rate)
        .add(params_.start_iter)
        .add(static_cast<std::uint8_t>(params_.warm_start))
        .add(params_.seed)
        .add(params_.feedback)
        .add(static_cast<std::uint8_t>(params_.orthonormalise_in_double))
        .value();
  }

  /// Size of the saved state of a matrix of this shape (format in this file's comment).
  [[nodiscard]] std::size_t saved_state_bytes(matrix_shape shape) const noexcept {
    return powersgd_saved_format::header_bytes +
           static_cast<std::size_t>((shape.cols * rank_for(shape) + shape.count()) * sizeof(T)) +
           powersgd_saved_format::checksum_bytes;
  }

  /// Writes `state` of a matrix of `shape` into `bytes` and returns its size; a state before its
  /// first compressed step is saved as zeros with steps = 0.
  /// @throws error `buffer_too_small`, `size_mismatch` when the state holds another shape.
  std::size_t save_state(const powersgd_state<T>& state, matrix_shape shape, std::span<std::byte> bytes) const {
    require_state_shape(state, shape);
    const std::size_t size = saved_state_bytes(shape);
    detail::require_state_room(bytes, size);
    std::byte* const p = bytes.data();
    detail::write_state_head<powersgd_saved_format>(p, id, dtype_of<T>, shape.count());
    powersgd_saved_format::rows.store(p, shape.rows);
    powersgd_saved_format::rank.store(p, static_cast<std::uint32_t>(rank_for(shape)));
    powersgd_saved_format::steps.store(p, state.steps);
    powersgd_saved_format::params_hash.store(p, params_hash());
    const std::size_t q_bytes = static_cast<std::size_t>(shape.cols * rank_for(shape)) * sizeof(T);
    const std::size_t e_bytes = static_cast<std::size_t>(shape.count()) * sizeof(T);
    std::byte* const payload = p + powersgd_saved_format::header_bytes;
    if (state.q.empty()) std::memset(payload, 0, q_bytes + e_bytes);
    else {
      std::memcpy(payload, state.q.data(), q_bytes);
      std::memcpy(payload + q_bytes, state.error.data(), e_bytes);
    }
    detail::seal_state<powersgd_saved_format>(p, q_bytes + e_bytes);
    return size;
  }

  /// Replaces `state` by the saved one of a matrix of `shape`, after every check of this file's
  /// comment. @throws error as listed there; `state` is unchanged when it throws.
  void load_state(std::span<const std::byte> bytes, matrix_shape shape, powersgd_state<T>& state) const {
    const std::uint64_t saved_n = detail::check_state_head<powersgd_saved_format>(bytes, id, dtype_of<T>, "GCPS");
    const std::byte* const p = bytes.data();
    const std::uint64_t saved_rows = powersgd_saved_format::rows.load(p);
    const std::uint32_t saved_rank = powersgd_saved_format::rank.load(p);
    detail::require(saved_n == shape.count() && saved_rows == shape.rows && saved_rank == rank_for(shape),
                    errc::size_mismatch, [&] {
                      return "saved state has " + std::to_string(saved_n) + " elements in " +
                             std::to_string(saved_rows) + " rows at rank " + std::to_string(saved_rank) +
                             ", the state " + std::to_string(shape.count()) + " in " + std::to_string(shape.rows) +
                             " rows at rank " + std::to_string(rank_for(shape));
                    });
    detail::require(powersgd_saved_format::params_hash.load(p) == params_hash(), errc::parameter_mismatch,
                    "PowerSGD parameters differ between the saved state and this scheme");
    const std::size_t q_count = static_cast<std::size_t>(shape.cols * rank_for(shape));
    const std::size_t e_count = static_cast<std::size_t>(shape.count());
    const std::span<const std::byte> payload =
        detail::check_state_body<powersgd_saved_format>(bytes, (q_count + e_count) * sizeof(T));
    std::vector<T> q(q_count), e(e_count);
    std::memcpy(q.data(), payload.data(), q_count * sizeof(T));
    std::memcpy(e.data(), payload.data() + q_count * sizeof(T), e_count * sizeof(T));
    const auto finite = [](const std::vector<T>& v) {
      return std::ranges::all_of(v, [](T x) { return is_finite(x); });
    };
    detail::require(finite(q) && finite(e), errc::malformed_payload, "saved PowerSGD state holds NaN or Inf");
    const std::uint64_t steps = powersgd_saved_format::steps.load(p);
    state.steps = steps;
    if (steps == 0) {
      state.q.clear();
      state.error.clear();
    } else {
      state.q = std::move(q);
      state.error = std::move(e);
    }
  }

  /// Checks that `state` is empty or holds a matrix of `shape`. @throws error `size_mismatch`.
  void require_state_shape(const powersgd_state<T>& state, matrix_shape shape) const {
    const bool empty = state.q.empty() && state.error.empty();
    detail::require(empty || (state.error.size() == shape.count() && state.q.size() == shape.cols * rank_for(shape)),
                    errc::size_mismatch, [&] {
                      return "PowerSGD state holds " + std::to_string(state.error.size()) + " errors and " +
                             std::to_string(state.q.size()) + " factor values, the matrix is " +
                             std::to_string(shape.rows) + " x " + std::to_string(shape.cols) + " at rank " +
                             std::to_string(rank_for(shape));
                    });
  }

 private:
  powersgd_params params_;
};

}  // namespace gradcomp

#include <gradcomp/cpu/powersgd.hpp>
#include <gradcomp/reference/powersgd.hpp>
