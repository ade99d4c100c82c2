#pragma once
/// @file
/// Dynamic sparsification with error feedback (TAGC, Polyakov et al. 2025).
///
/// Each step of tensor `id` forms the compensated gradient a = g + R[id], finds a magnitude
/// threshold τ*, writes the dense ã (a_i where |a_i| ≥ τ*, zero elsewhere) and carries what was
/// dropped: R[id] ← a − ã. There is no message: ã is the dense input of the next stage (TAGC's
/// bitmap index and count sketch). Two rules give τ*:
///
/// - `exact` (default): with z = ⌊f*·n⌋, τ* is the z-th smallest |a_i| (0-based), so exactly z
///   elements lie below it when no other element ties with it. Every |a_i| ≥ τ* is kept, ties at
///   τ* included, so the zero fraction reached is at most f*, and exactly z/n without ties. The
///   product f*·n is rounded to double before the floor (0.7·10 gives z = 7, as one expects, not
///   the 6 of the exact product of the double nearest 0.7), and z is capped at n. z = 0 keeps
///   everything (τ* = min |a_i|); z = n keeps nothing and reports τ* = +Inf (n = 0 included).
///   Found with one counting pass over a around a sampled key window and radix selection inside
///   it, or, when the window misses, one histogram pass and selection inside the chosen bucket
///   (cpu/dynamic.hpp); both are exact.
/// - `tagc_table`: the public reference, literally. With the table `tagc_threshold_table` and
///   frac(τ) = #{|a_i| < τ}/n (as a double quotient, as Python's `/`), idx = bisect_left(table,
///   f*, key = frac) by Python's loop (each probe a full pass); τ* = table[idx − 1] when idx > 0
///   (idx = 25 gives 0.5), and when idx = 0 nothing is dropped (τ* = 0 reported). The reference
///   compares a float32 tensor with a Python float, which PyTorch does in float32: each table
///   value is rounded to T (round to nearest) before comparing, and the reported τ* is that
///   rounded value. n = 0 makes no probe and drops nothing. The achieved zero fraction is the
///   largest table step's below f*, often far below it.
///
/// Both rules keep |a_i| ≥ τ*. Residuals are keyed by tensor id, never by call order: the state
/// maps each id to its residual, created (zeros, n elements) by the first successful step of the
/// id, after which n is fixed for that id.
///
/// Signed zeros: the part of a_i that is not passed on keeps a_i's sign: a kept element leaves a
/// zero residual of a_i's sign, a dropped one writes a zero of a_i's sign to ã. So ã + R_new
/// equals a = g + R_old bit for bit, −0 included.
///
/// bf16 and fp16 gradients (host executors): a = widen(g) + R is formed in float32, the residuals
/// are float32 (a 16-bit residual would drop what is below the gradient's resolution, as for error
/// feedback: docs/feedback.md), and ã and τ* are float32 too: ã is the float32 input of TAGC's
/// sketch, never rounded to 16 bits, so ã + R_new = a still holds bit for bit. Such a step is the
/// float32 sparsifier's step on the widened gradient.
///
/// Special values: a step whose a holds NaN or ±Inf (g + R may overflow) throws
/// `errc::non_finite_input` and leaves the state bit-identical. Subnormals are magnitudes like
/// any other. A failed step leaves `out` unspecified (it is not used as scratch, but may be the
/// gradient itself: see `sparsify`).
///
/// Saved state (`save_state`, `load_state`; integers little-endian, no padding; the frame of
/// core/saved_state.hpp, whose codec field is 0 because this stage writes no messages):
///
/// | Offset | Size | Field |
/// |---:|---:|---|
/// | 0 | 4 | magic "GCDS" |
/// | 4 | 2 | format version (1) |
/// | 6 | 2 | codec field, 0 |
/// | 8 | 1 | `value_dtype` of the gradient |
/// | 9 | 8 | N, total residual elements of all tensors |
/// | 17 | 8 | m, number of tensors |
/// | 25 | 8 | steps taken |
/// | 33 | 4 | CRC-32C of bytes 0..32 |
/// | 37 | 16·m + N·v | m entries in ascending id order: u64 id, u64 n_id, n_id residual values |
/// | 37 + 16·m + N·v | 4 | CRC-32C of the entries |
///
/// v = 8 for a float64 gradient, else 4: the residuals of a bf16 or fp16 gradient are float32.
///
/// `load_state` checks, in this order, and throws the named `errc` before touching the state:
/// length of the header (`truncated`), magic (`bad_magic`), version (`unsupported_version`),
/// header CRC (`header_checksum`), codec field (`codec_mismatch`), dtype (`dtype_mismatch`), m and
/// N against the length (`truncated`), total length (`truncated`, `trailing_bytes`), entries CRC
/// (`payload_checksum`), then the entries themselves: ids strictly ascending, each entry inside
/// the payload, Σ n_id = N (`malformed_payload`). The parameters are not saved: a residual is
/// valid whatever f* the next step uses.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/concepts.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/memory_space.hpp>
#include <gradcomp/core/saved_state.hpp>
#include <gradcomp/core/wire_envelope.hpp>

namespace gradcomp {

/// How the dynamic sparsifier finds its threshold.
enum class dynamic_threshold_mode : std::uint8_t {
  exact = 0,       ///< The ⌊f*·n⌋-th smallest |a| (0-based), by radix selection.
  tagc_table = 1,  ///< TAGC's bisection over `tagc_threshold_table` (reproduces the reference).
};

/// The reference's threshold table, as Python floats; compared in T after rounding (see the file
/// comment).
inline constexpr std::array<double, 25> tagc_threshold_table = {1e-20, 1e-15, 1e-10, 1e-8, 1e-7, 2e-7, 5e-7, 1e-6, 2e-6,
                                                                5e-6,  1e-5,  2e-5,  5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3,
                                                                5e-3,  1e-2,  2e-2,  5e-2, 0.1,  0.2,  0.5};

/// Parameters of the dynamic sparsifier; a controller may change them between steps.
struct dynamic_params {
  double zero_fraction = 0.80;                               ///< Target fraction f* of zeros, in [0, 1].
  dynamic_threshold_mode mode = dynamic_threshold_mode::exact;  ///< Threshold rule.

  /// Throws `invalid_argument` unless f* is finite and in [0, 1] and the mode is known.
  void validate() const {
    detail::require(is_finite(zero_fraction) && zero_fraction >= 0.0 && zero_fraction <= 1.0, errc::invalid_argument,
                    [&] {
                      return "zero_fraction must be finite and lie in [0, 1], got " + std::to_string(zero_fraction);
                    });
    detail::require(mode == dynamic_threshold_mode::exact || mode == dynamic_threshold_mode::tagc_table,
                    errc::invalid_argument,
                    [&] { return "unknown dynamic_threshold_mode " + std::to_string(static_cast<unsigned>(mode)); });
  }

  friend constexpr bool operator==(const dynamic_params&, const dynamic_params&) = default;
};

/// What one step did.
template <gradient_value T>
struct dynamic_result {
  T threshold = 0;             ///< τ*: elements with |a| ≥ τ* were kept (+Inf: none; 0: all).
  std::uint64_t kept = 0;      ///< Elements with |a| ≥ τ* (exact zeros among them included).
  double zero_fraction = 0.0;  ///< (n − kept)/n, the fraction dropped (0 for n = 0).
};

/// ã_i and the new residual from a_i for the threshold key `tau` (a magnitude key): a kept element
/// (|a| key ≥ tau) goes to `passed` whole and leaves a zero of its sign in `residual`; a dropped one
/// stays in `residual` and leaves a zero of its sign in `passed`, so passed + residual is a bit for
/// bit. Returns whether it was kept. The same on every backend.
template <gradient_value T>
GRADCOMP_HOST_DEVICE inline bool dynamic_split(T a, typename float_traits<T>::bits_type tau, T& passed,
                                               T& residual) noexcept {
  using key_type = typename float_traits<T>::bits_type;
  constexpr key_type sign = ~float_traits<T>::magnitude_mask;
  const key_type bits = to_bits<T>(a);
  const key_type keep = (bits & float_traits<T>::magnitude_mask) >= tau ? ~key_type{0} : key_type{0};
  passed = from_bits<T>(bits & (keep | sign));
  residual = from_bits<T>(bits & (~keep | sign));
  return keep != 0;
}

namespace detail {

/// A step's first checks, on every backend: `out` has the gradient's n elements, and the residual
/// of `tensor_id` (if `residuals`, a map from id to a sized container, holds one) has n too.
/// @returns the id's entry, or residuals.end() for an id not seen yet.
/// @throws error `size_mismatch`.
template <class Residuals>
auto find_dynamic_residual(Residuals& residuals, std::uint64_t tensor_id, std::size_t n, std::size_t out_size) {
  require(out_size == n, errc::size_mismatch,
          [&] { return "output has " + std::to_string(out_size) + " elements, the gradient " + std::to_string(n); });
  const auto found = residuals.find(tensor_id);
  require(found == residuals.end() || found->second.size() == n, errc::size_mismatch, [&] {
    return "tensor " + std::to_string(tensor_id) + " has a residual of " + std::to_string(found->second.size()) +
           " elements, this gradient " + std::to_string(n);
  });
  return found;
}

/// What a step that found `non_finite` NaN or ±Inf values among n of a = g + R reports.
inline std::string dynamic_non_finite_text(std::uint64_t non_finite, std::uint64_t n) {
  return std::to_string(non_finite) + " of " + std::to_string(n) +
         " values of gradient + residual are NaN or Inf; the state is unchanged";
}

/// Throws `non_finite_input` (`dynamic_non_finite_text`) unless `non_finite` is 0.
inline void require_dynamic_finite(std::uint64_t non_finite, std::uint64_t n) {
  require(non_finite == 0, errc::non_finite_input, [&] { return dynamic_non_finite_text(non_finite, n); });
}

/// τ* of the `tagc_table` rule as a magnitude key, for the n values `value_at(i)`: the reference's
/// bisection lo, hi = 0, 25; while lo < hi: mid = (lo + hi) // 2; if frac(table[mid]) < f*:
/// lo = mid + 1, else hi = mid. τ* = table[lo − 1] in T, or none (key 0) when lo = 0. Each probe
/// counts |a| < τ over all of a (and the NaN/±Inf it meets: the first probe rejects them). Plain
/// host code, the same on the reference and the CPU backend.
template <gradient_value T, class ValueAt>
typename float_traits<T>::bits_type dynamic_table_key(double zero_fraction, std::size_t n, ValueAt&& value_at) {
  using key_type = typename float_traits<T>::bits_type;
  if (n == 0) return 0;
  const auto table_value_key = [](std::size_t j) { return magnitude_key(static_cast<T>(tagc_threshold_table[j])); };
  std::size_t lo = 0;
  std::size_t hi = tagc_threshold_table.size();
  while (lo < hi) {
    const std::size_t mid = (lo + hi) / 2;
    const key_type tau = table_value_key(mid);
    std::uint64_t below = 0;
    std::uint64_t non_finite = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const key_type key = magnitude_key<T>(value_at(i));
      below += key < tau ? 1u : 0u;
      non_finite += key >= float_traits<T>::infinity_key ? 1u : 0u;
    }
    require_dynamic_finite(non_finite, n);
    if (static_cast<double>(below) / static_cast<double>(n) < zero_fraction) lo = mid + 1;
    else
      hi = mid;
  }
  return lo == 0 ? key_type{0} : table_value_key(lo - 1);
}

}  // namespace detail

/// Residuals of the dynamic sparsifier, one per tensor id, in host memory.
template <gradient_value T>
struct dynamic_state {
  std::map<std::uint64_t, std::vector<T>> residuals;  ///< R per tensor id; n is fixed per id.
  std::uint64_t steps = 0;                            ///< Successful steps, all tensors together.
};

/// The header of a saved dynamic-sparsifier state and of each of its entries, field by field (the
/// table in this file's comment), after the frame's (core/saved_state.hpp).
struct dynamic_saved_format : detail::saved_state_frame {
  static constexpr std::uint32_t magic = 0x53444347u;  ///< "GCDS" as a little-endian word.
  static constexpr std::uint16_t version = 1;          ///< The version this build writes and reads.
  static constexpr codec_id codec = codec_id{0};       ///< The codec field: this stage writes no messages.
  static constexpr detail::state_field<std::uint64_t> tensors = count.then<std::uint64_t>();  ///< Entries.
  static constexpr detail::state_field<std::uint64_t> steps = tensors.then<std::uint64_t>();  ///< Successful steps.
  static constexpr std::size_t header_crc_offset = steps.end();  ///< The header CRC; it covers bytes before.
  static constexpr std::size_t header_bytes = header_crc_offset + checksum_bytes;  ///< Header size, its CRC included.
  /// An entry's tensor id, from the entry's first byte.
  static constexpr detail::state_field<std::uint64_t> entry_id{0};
  /// An entry's value count n, after its id.
  static constexpr detail::state_field<std::uint64_t> entry_count = entry_id.then<std::uint64_t>();
  static constexpr std::size_t entry_head_bytes = entry_count.end();  ///< Before each entry's values.
};
static_assert(dynamic_saved_format::header_bytes == 37 && dynamic_saved_format::entry_head_bytes == 16,
              "the table in this file's comment");

/// TAGC's dynamic sparsifier with error feedback keyed by tensor id, for `float`, `double`, `bf16`
/// or `fp16` (the 16-bit types on host executors, with float32 residuals and output).
template <gradient_value T = float>
class dynamic_sparsifier {
 public:
  using value_type = T;  ///< Element type of the gradient.
  using residual_type = compute_type<T>;  ///< Element type of a, the residuals and ã: float32 for bf16 and fp16.
  using state_type = dynamic_state<residual_type>;  ///< Residuals carried across steps on the CPU.
  using result_type = dynamic_result<residual_type>;  ///< What a step reports.
  /// The state on executor E: `dynamic_state<T>` on the CPU, `cuda_dynamic_state<T>` on the GPU.
  template <executor E>
  using state_on = typename backend<dynamic_sparsifier, E>::state_type;

  /// @throws error `invalid_argument` for parameters out of range.
  explicit dynamic_sparsifier(dynamic_params params = {}) : params_(params) { params_.validate(); }

  /// The parameters.
  [[nodiscard]] const dynamic_params& params() const noexcept { return params_; }
  /// Changes the parameters between steps. @throws error `invalid_argument`.
  void set_params(dynamic_params params) {
    params.validate();
    params_ = params;
  }

  /// z = ⌊f*·n⌋ (the product rounded to double first), at most n: the elements the exact rule
  /// puts below τ*.
  [[nodiscard]] std::uint64_t zeroed_count(std::uint64_t n) const noexcept {
    const double product = params_.zero_fraction * static_cast<double>(n);
    if (product >= static_cast<double>(n)) return n;
    return static_cast<std::uint64_t>(product);
  }

  /// Workspace bytes `threshold` and `sparsify` need on executor `e` for n elements (the same for
  /// both modes, so the mode may change between steps).
  template <executor E>
  [[nodiscard]] std::size_t workspace_bytes(const E& e, std::uint64_t n) const {
    require_value_type<E>();
    return backend<dynamic_sparsifier, E>::workspace_bytes(*this, e, n);
  }

  /// An empty state in E's memory: no tensor has a residual yet.
  template <executor E>
  [[nodiscard]] state_on<E> make_state(const E&) const {
    return state_on<E>{};
  }

  /// τ* of `a` under the current rule, with no state involved (a 16-bit a widened).
  /// @throws error `non_finite_input` (NaN or ±Inf in a), `workspace_too_small`.
  template <executor E>
  [[nodiscard]] residual_type threshold(const E& e, std::span<const T> a, std::span<std::byte> ws) const {
    require_value_type<E>();
    return backend<dynamic_sparsifier, E>::threshold(*this, e, a, ws);
  }

  /// One step for tensor `tensor_id`: a = grad + R[id] (R = 0 for an id not seen yet), out = ã,
  /// R[id] ← a − ã. `out` has grad's size and may be `grad` itself (in place), but must not
  /// overlap it otherwise; `ws` holds at least `workspace_bytes(e, n)` bytes. The first step of an
  /// id allocates its residual. On error the state is unchanged and `out` unspecified.
  /// @throws error `size_mismatch` (out's size, or n differs from the id's residual),
  ///         `non_finite_input`, `workspace_too_small`.
  template <executor E>
  result_type sparsify(const E& e, state_on<E>& state, std::uint64_t tensor_id, std::span<const T> grad,
                       std::span<residual_type> out, std::span<std::byte> ws) const {
    require_value_type<E>();
    return backend<dynamic_sparsifier, E>::sparsify(*this, e, state, tensor_id, grad, out, ws);
  }

  /// Size of `state` (on any executor) saved (format in this file's comment).
  template <class State>
  [[nodiscard]] static std::size_t saved_state_bytes(const State& state) noexcept {
    std::size_t size = dynamic_saved_format::header_bytes + dynamic_saved_format::checksum_bytes;
    for (const auto& [id, residual] : state.residuals)
      size += dynamic_saved_format::entry_head_bytes + residual.size() * sizeof(residual_type);
    return size;
  }
  /// Writes `state` into `bytes` (at least `saved_state_bytes(state)`). @returns bytes written.
  /// @throws error `buffer_too_small`.
  template <executor E>
  std::size_t save_state(const E& e, const state_on<E>& state, std::span<std::byte> bytes) const {
    require_value_type<E>();
    return backend<dynamic_sparsifier, E>::save_state(*this, e, state, bytes);
  }
  /// Replaces `state` by the saved one, checking everything before touching it.
  /// @throws error naming what is wrong with the bytes (order in this file's comment).
  template <executor E>
  void load_state(const E& e, std::span<const std::byte> bytes, state_on<E>& state) const {
    require_value_type<E>();
    backend<dynamic_sparsifier, E>::load_state(*this, e, bytes, state);
  }

  /// Writes the saved state of `host`, residuals in host memory (every backend's `save_state`;
  /// format in this file's comment). @returns bytes written. @throws error `buffer_too_small`.
  std::size_t write_saved_state(const state_type& host, std::span<std::byte> bytes) const {
    using format = dynamic_saved_format;
    const std::size_t size = saved_state_bytes(host);
    detail::require_state_room(bytes, size);
    std::uint64_t total = 0;
    for (const auto& entry : host.residuals) total += entry.second.size();
    std::byte* const p = bytes.data();
    detail::write_state_head<format>(p, format::codec, dtype_of<T>, total);
    format::tensors.store(p, host.residuals.size());
    format::steps.store(p, host.steps);
    std::byte* q = p + format::header_bytes;
    for (const auto& [id, residual] : host.residuals) {
      format::entry_id.store(q, id);
      format::entry_count.store(q, residual.size());
      q = std::ranges::copy(std::as_bytes(std::span<const residual_type>(residual)), q + format::entry_head_bytes).out;
    }
    detail::seal_state<format>(p, static_cast<std::size_t>(q - (p + format::header_bytes)));
    return size;
  }

  /// Checks saved bytes in the order of this file's comment and returns the state they hold, in
  /// host memory (every backend's `load_state`, before it touches its state).
  /// @throws error naming what is wrong with the bytes.
  [[nodiscard]] state_type read_saved_state(std::span<const std::byte> bytes) const {
    using format = dynamic_saved_format;
    using R = residual_type;
    const std::uint64_t total = detail::check_state_head<format>(bytes, format::codec, dtype_of<T>, "GCDS");
    const std::byte* const p = bytes.data();
    const std::uint64_t tensors = format::tensors.load(p);
    detail::require(tensors <= bytes.size() / format::entry_head_bytes && total <= bytes.size() / sizeof(R),
                    errc::truncated, [&] {
                      return "saved state of " + std::to_string(bytes.size()) + " bytes cannot hold the " +
                             std::to_string(tensors) + " tensors and " + std::to_string(total) +
                             " values its header declares";
                    });
    const std::span<const std::byte> entries =
        detail::check_state_body<format>(bytes, static_cast<std::size_t>(tensors * format::entry_head_bytes +
                                                                         total * sizeof(R)));

    state_type loaded;
    std::size_t at = 0;
    for (std::uint64_t j = 0; j < tensors; ++j) {
      detail::require(entries.size() - at >= format::entry_head_bytes, errc::malformed_payload, [&] {
        return "saved tensor " + std::to_string(j) + " of " + std::to_string(tensors) + " starts past the entries";
      });
      const std::uint64_t id = format::entry_id.load(entries.data() + at);
      const std::uint64_t count = format::entry_count.load(entries.data() + at);
      at += format::entry_head_bytes;
      detail::require(loaded.residuals.empty() || id > loaded.residuals.rbegin()->first, errc::malformed_payload, [&] {
        return "saved tensor ids are not strictly ascending: " + std::to_string(id) + " follows " +
               std::to_string(loaded.residuals.rbegin()->first);
      });
      detail::require(count <= (entries.size() - at) / sizeof(R), errc::malformed_payload, [&] {
        return "saved tensor " + std::to_string(id) + " declares " + std::to_string(count) +
               " values, more than the entries hold";
      });
      std::vector<R> residual(static_cast<std::size_t>(count));
      std::ranges::copy(entries.subspan(at, residual.size() * sizeof(R)),
                        std::as_writable_bytes(std::span<R>(residual)).begin());
      at += residual.size() * sizeof(R);
      loaded.residuals.emplace_hint(loaded.residuals.end(), id, std::move(residual));
    }
    detail::require(at == entries.size(), errc::malformed_payload, [&] {
      return "saved tensors hold " + std::to_string(at) + " bytes of entries, the header declares " +
             std::to_string(entries.size());
    });
    loaded.steps = format::steps.load(p);
    return loaded;
  }

 private:
  /// A compile error, rather than a deep one, for a 16-bit sparsifier on the CUDA backend.
  template <executor E>
  static constexpr void require_value_type() noexcept {
    static_assert(!half_precision<T> || memory_space_of<E> == memory_space::host,
                  "the CUDA backend takes float and double gradients only so far (docs/half-precision.md §5)");
  }

  dynamic_params params_;
};

}  // namespace gradcomp

#include <gradcomp/reference/dynamic.hpp>
#include <gradcomp/cpu/dynamic.hpp>
