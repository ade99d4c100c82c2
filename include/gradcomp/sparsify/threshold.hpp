#pragma once
/// @file
/// Threshold sparsification with a sampled threshold estimate (DGC, Lin et al. 2018).
///
/// A Philox-keyed sample of |x| (a fraction `sample_fraction` of n, at least `min_samples`)
/// gives the threshold τ as the sample's (1 − density)-quantile; one pass then keeps every
/// element with |x| ≥ τ (exact zeros are never kept). When `refine` is on and more than 1.3·k
/// elements survive (10·survivors > 13·k), the exact top-k among the survivors is kept instead (DGC's second stage).
/// The achieved density is reported. The payload is the sparse layout of
/// sparsify/sparse_format.hpp, so decoding is identical to top-k's. A gradient holding NaN or
/// ±Inf is rejected with `errc::non_finite_input` (non-finite magnitudes always exceed τ, so the
/// selection pass sees every one of them).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <gradcomp/core/codec_interface.hpp>
#include <gradcomp/core/concepts.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/memory_space.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/sparsify/sparse_format.hpp>
#include <gradcomp/sparsify/sparsity.hpp>

namespace gradcomp {

/// Parameters of the threshold sparsifier.
struct threshold_params {
  sparsity target{};                 ///< Target amount kept.
  double sample_fraction = 0.01;     ///< Fraction of n sampled to estimate τ, in (0, 1].
  std::uint64_t min_samples = 4096;  ///< Fewest samples drawn (all of n when n is smaller).
  bool refine = true;                ///< Re-select exactly k when more than 1.3·k survive.
  std::uint64_t seed = 0;            ///< Keys the sample with step and tensor id.

  /// Throws `invalid_argument` for a parameter out of range.
  void validate() const {
    target.validate();
    detail::require(sample_fraction > 0.0 && sample_fraction <= 1.0, errc::invalid_argument,
                    [&] { return "sample_fraction must lie in (0, 1], got " + std::to_string(sample_fraction); });
    detail::require(min_samples >= 1, errc::invalid_argument, "min_samples must be at least 1");
  }

  friend constexpr bool operator==(const threshold_params&, const threshold_params&) = default;
};

/// What one threshold encode did.
template <gradient_value T>
struct threshold_report {
  std::size_t bytes = 0;       ///< Message size.
  std::uint64_t kept = 0;      ///< Elements sent.
  std::uint64_t target = 0;    ///< Elements asked for (k).
  compute_type<T> threshold = 0;  ///< Magnitude threshold τ used by the selection pass (float32 for bf16, fp16).
  double density = 0.0;        ///< kept / n (0 for an empty tensor).
};

/// Sampled-threshold sparsifier for `float`, `double`, `bf16` or `fp16` gradients (a 16-bit gradient
/// is sampled and selected by its 16-bit magnitude keys, and its kept values sent as they are, 2 bytes
/// each: docs/half-precision.md).
template <gradient_value T = float>
class threshold_sparsifier : public codec_interface<threshold_sparsifier<T>, T> {
 public:
  using value_type = T;                               ///< Element type of the gradient.
  static constexpr codec_id id = codec_id::threshold; ///< Wire identifier.
  static constexpr bool is_homomorphic = false;       ///< Index sets differ between ranks.
  static constexpr bool takes_half_precision = true;  ///< bf16 and fp16 values are selected and sent as they are.

  /// @throws error `invalid_argument` for a parameter out of range.
  explicit threshold_sparsifier(threshold_params params = {}, wire_options wire = {}) : params_(params), wire_(wire) {
    params_.validate();
  }

  /// Target count k of an n-element tensor.
  [[nodiscard]] std::uint64_t k(std::uint64_t n) const noexcept { return params_.target.count(n); }
  /// Sample size for an n-element tensor.
  [[nodiscard]] std::uint64_t sample_count(std::uint64_t n) const noexcept {
    const sparsity sample{params_.sample_fraction, 0};
    return std::min(n, std::max(params_.min_samples, sample.count(n)));
  }
  /// The parameters.
  [[nodiscard]] const threshold_params& params() const noexcept { return params_; }
  /// Changes the target amount between steps.
  void set_target(sparsity target) {
    target.validate();
    params_.target = target;
  }
  /// Wire options used by `encode`.
  [[nodiscard]] const wire_options& wire() const noexcept { return wire_; }

  /// Largest message `encode` writes for n elements.
  [[nodiscard]] std::size_t max_encoded_bytes(std::uint64_t n) const noexcept {
    return static_cast<std::size_t>(envelope::size + max_sparse_payload_bytes(n, sizeof(T)));
  }
  /// An estimate of the message size for n elements: that of the target k(n) values in the index
  /// coding chosen for k of n, as top-k sends. Not exact: the count kept depends on the data (the
  /// sampled τ keeps more or fewer; with `refine` never more than 1.3·k). What the all-reduce cost
  /// model uses (collective/all_reduce_cost.hpp).
  [[nodiscard]] std::size_t expected_encoded_bytes(std::uint64_t n) const noexcept {
    return static_cast<std::size_t>(envelope::size + chosen_sparse_payload_bytes(n, k(n), sizeof(T)));
  }
  /// Hash of the parameters, carried in every message and checked by decoders.
  [[nodiscard]] std::uint64_t params_hash() const noexcept {
    params_hasher hasher;
    hasher.add(id).add(dtype_of<T>);
    params_.target.hash_into(hasher);
    return hasher.add(params_.sample_fraction).add(params_.min_samples).add(params_.refine).add(params_.seed).value();
  }

  /// Encodes `grad` and reports what was kept.
  /// @throws error `non_finite_input`, `buffer_too_small`, `workspace_too_small`.
  template <executor E>
  threshold_report<T> encode_with_report(const E& e, std::span<const T> grad, std::span<std::byte> out,
                                         std::span<std::byte> ws, message_key key = {}) const {
    static_assert(!half_precision<T> || memory_space_of<E> == memory_space::host,
                  "the CUDA backend takes float and double gradients only so far (docs/half-precision.md §5)");
    return backend<threshold_sparsifier, E>::encode_with_report(*this, e, grad, out, ws, key);
  }
  /// Encodes `grad` into `out` (the report discarded). @returns bytes written.
  template <executor E>
  std::size_t encode(const E& e, std::span<const T> grad, std::span<std::byte> out, std::span<std::byte> ws,
                     message_key key = {}) const {
    return encode_with_report(e, grad, out, ws, key).bytes;
  }

 private:
  threshold_params params_;
  wire_options wire_;
};

}  // namespace gradcomp

#include <gradcomp/cpu/threshold.hpp>
#include <gradcomp/reference/threshold.hpp>
