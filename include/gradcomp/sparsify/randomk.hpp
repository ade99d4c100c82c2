#pragma once
/// @file
/// Random-k sparsification.
///
/// The kept indices are π(0), …, π(k−1) for the keyed permutation π of core/random_permutation.hpp,
/// keyed by (seed, step, tensor id). Every rank with the same key keeps the same indices, so only
/// the values travel (payload: k values in draw order j, no indices) and encodings of several ranks
/// can be summed value by value: the codec is homomorphic. Decoding scales by n/k (unbiased
/// estimate of the gradient) unless `scaled` is off. A selected NaN or ±Inf is rejected with
/// `errc::non_finite_input`; values that are not selected are not inspected.
///
/// bf16 and fp16 values travel as their own 2 bytes (wire dtypes 3 and 4). Decoding computes
/// v·n/k in float32; into a 16-bit output each result (or sum) is checked to fit and then rounded
/// once (docs/half-precision.md §3). Summed messages (`accumulate_encoded`) hold 16-bit values, so
/// each addition is rounded to the type: a sum over many ranks is exact only through
/// `decode_accumulate` into a float32 buffer.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <gradcomp/core/codec_interface.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/concepts.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/random_permutation.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/sparsify/sparsity.hpp>

namespace gradcomp {

/// Parameters of random-k.
struct randomk_params {
  sparsity amount{};        ///< How many elements are kept.
  std::uint64_t seed = 0;   ///< Shared by all ranks; keys the index choice with step and tensor id.
  bool scaled = true;       ///< Decode as value·n/k (unbiased) rather than the raw value.

  friend constexpr bool operator==(const randomk_params&, const randomk_params&) = default;
};

/// Random-k sparsifier for `float`, `double`, `bf16` or `fp16` gradients.
template <gradient_value T = float>
class randomk_sparsifier : public codec_interface<randomk_sparsifier<T>, T> {
 public:
  using value_type = T;                              ///< Element type of the gradient.
  static constexpr codec_id id = codec_id::random_k; ///< Wire identifier.
  static constexpr bool is_homomorphic = true;       ///< Same indices on every rank: values add.
  static constexpr bool takes_half_precision = true;  ///< bf16 and fp16 values are sent as they are.

  /// @throws error `invalid_argument` for a density outside (0, 1].
  explicit randomk_sparsifier(randomk_params params = {}, wire_options wire = {}) : params_(params), wire_(wire) {
    params_.amount.validate();
  }

  /// Elements kept of an n-element tensor.
  [[nodiscard]] std::uint64_t k(std::uint64_t n) const noexcept { return params_.amount.count(n); }
  /// The parameters.
  [[nodiscard]] const randomk_params& params() const noexcept { return params_; }
  /// Wire options used by `encode`.
  [[nodiscard]] const wire_options& wire() const noexcept { return wire_; }
  /// The permutation whose first k images are the kept indices of tensor `key` (n ≥ 1).
  [[nodiscard]] random_permutation permutation(std::uint64_t n, message_key key) const noexcept {
    return random_permutation(n, random_stream{params_.seed, key.step, key.tensor_id, random_purpose::random_k});
  }

  /// Exact size of every message for n elements.
  [[nodiscard]] std::size_t max_encoded_bytes(std::uint64_t n) const noexcept {
    return static_cast<std::size_t>(envelope::size + k(n) * sizeof(T));
  }
  /// Size of the message for n elements, the same as `max_encoded_bytes` (k(n) values, exact).
  [[nodiscard]] std::size_t expected_encoded_bytes(std::uint64_t n) const noexcept { return max_encoded_bytes(n); }
  /// Checks the layout byte and payload size (k values) of a message whose envelope `e` matched
  /// this sparsifier (every backend's decoder calls it). @throws error `malformed_payload`.
  void validate_payload_size(const envelope& e) const {
    detail::require(e.layout == 0, errc::malformed_payload, "random-k messages have layout 0");
    const std::uint64_t kept = k(e.elements);
    detail::require(kept <= e.payload_bytes / sizeof(T) && e.payload_bytes == kept * sizeof(T), errc::malformed_payload,
                    [&] {
                      return "payload of " + std::to_string(e.payload_bytes) +
                             " bytes does not hold k = " + std::to_string(kept) + " values";
                    });
  }
  /// Hash of the parameters, carried in every message and checked by decoders.
  [[nodiscard]] std::uint64_t params_hash() const noexcept {
    params_hasher hasher;
    hasher.add(id).add(dtype_of<T>);
    params_.amount.hash_into(hasher);
    return hasher.add(params_.seed).add(params_.scaled).value();
  }

  /// Turns message `acc` into the encoding of the sum of `acc` and `other` (same n, step, tensor
  /// and parameters), as a SUM collective over the value section would.
  /// @throws error on a malformed message, `step_mismatch` when the keys differ, or
  ///         `non_finite_input` when the sum overflows; `acc` is untouched then.
  template <executor E>
  void accumulate_encoded(const E& e, std::span<std::byte> acc, std::span<const std::byte> other) const {
    backend<randomk_sparsifier, E>::accumulate_encoded(*this, e, acc, other);
  }

 private:
  randomk_params params_;
  wire_options wire_;
};

}  // namespace gradcomp

#include <gradcomp/cpu/randomk.hpp>
#include <gradcomp/reference/randomk.hpp>
