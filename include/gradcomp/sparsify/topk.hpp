#pragma once
/// @file
/// Exact top-k sparsification by magnitude.
///
/// Keeps the k elements of largest |x| (ties go to the lower index) and sends them as a sparse
/// payload (sparsify/sparse_format.hpp) with ascending indices. Selection is a radix select on the
/// magnitude key, never a full sort. Policy for special values: ±0 and subnormals are ordered by
/// magnitude like any other value (the sign is kept); a gradient holding NaN or ±Inf is rejected
/// with `errc::non_finite_input` before anything is written. A bf16 or fp16 gradient is selected
/// by its 16-bit magnitude keys (they order as the values do) and its kept values travel as they
/// are, 2 bytes each (docs/half-precision.md); they decode into the 16-bit type or into float32.

#include <cstddef>
#include <cstdint>
#include <span>

#include <gradcomp/core/codec_interface.hpp>
#include <gradcomp/core/concepts.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/sparsify/sparse_format.hpp>
#include <gradcomp/sparsify/sparsity.hpp>

namespace gradcomp {

/// Exact top-k sparsifier for `float`, `double`, `bf16` or `fp16` gradients.
template <gradient_value T = float>
class topk_sparsifier : public codec_interface<topk_sparsifier<T>, T> {
 public:
  using value_type = T;                            ///< Element type of the gradient.
  static constexpr codec_id id = codec_id::topk;   ///< Wire identifier.
  static constexpr bool is_homomorphic = false;    ///< Index sets differ between ranks.
  static constexpr bool takes_half_precision = true;  ///< bf16 and fp16 values are selected and sent as they are.

  /// A sparsifier keeping `amount` of each tensor.
  /// @throws error `invalid_argument` for a density outside (0, 1].
  explicit topk_sparsifier(sparsity amount = {}, wire_options wire = {}) : amount_(amount), wire_(wire) {
    amount_.validate();
  }

  /// Elements kept of an n-element tensor.
  [[nodiscard]] std::uint64_t k(std::uint64_t n) const noexcept { return amount_.count(n); }
  /// The current amount.
  [[nodiscard]] const sparsity& amount() const noexcept { return amount_; }
  /// Changes the amount between steps (e.g. on a controller's advice).
  void set_amount(sparsity amount) {
    amount.validate();
    amount_ = amount;
  }
  /// Wire options used by `encode`.
  [[nodiscard]] const wire_options& wire() const noexcept { return wire_; }

  /// Largest message `encode` writes for n elements.
  [[nodiscard]] std::size_t max_encoded_bytes(std::uint64_t n) const noexcept {
    return static_cast<std::size_t>(envelope::size + max_sparse_payload_bytes(n, sizeof(T)));
  }
  /// Size of the message `encode` writes for n elements: its k(n) values in the index coding the
  /// encoder chooses for k of n (exact: it depends on n and the amount only). What the all-reduce
  /// cost model uses (collective/all_reduce_cost.hpp).
  [[nodiscard]] std::size_t expected_encoded_bytes(std::uint64_t n) const noexcept {
    return static_cast<std::size_t>(envelope::size + chosen_sparse_payload_bytes(n, k(n), sizeof(T)));
  }
  /// Hash of the parameters, carried in every message and checked by decoders.
  [[nodiscard]] std::uint64_t params_hash() const noexcept {
    params_hasher hasher;
    hasher.add(id).add(dtype_of<T>);
    amount_.hash_into(hasher);
    return hasher.value();
  }


 private:
  sparsity amount_;
  wire_options wire_;
};

}  // namespace gradcomp

#include <gradcomp/cpu/topk.hpp>
#include <gradcomp/reference/topk.hpp>
