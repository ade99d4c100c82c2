#pragma once
/// @file
/// Composition of a sparsifier and a quantizer: `pipeline<topk_sparsifier<float>,
/// uniform_quantizer<float>>` sends top-k's indices and the kept values quantized (e.g. 8 bits).
///
/// Payload layout after the envelope (codec `pipeline`, layout byte = the index coding):
///
///     u64 k and the index section, exactly as in sparsify/sparse_format.hpp
///     a complete message of the quantizer for the k kept values (its own envelope, n = k),
///     keyed by the same step and tensor id
///
/// The parameter hash combines both stages' hashes. Policy for special values is the
/// sparsifier's (it sees the gradient first), then the quantizer's for the kept values.

#include <concepts>
#include <cstddef>
#include <cstdint>

#include <gradcomp/core/codec_interface.hpp>
#include <gradcomp/core/concepts.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/sparsify/sparse_format.hpp>

namespace gradcomp {

/// Sparsifier `S` (one that sends indices in the sparse layout: top-k, threshold) followed by
/// quantizer `Q` of the kept values.
template <class S, class Q>
class pipeline : public codec_interface<pipeline<S, Q>, typename S::value_type> {
  static_assert(sparsifier<S> && !S::is_homomorphic,
                "pipeline<S, Q>: S must be an index-sending sparsifier (topk_sparsifier, threshold_sparsifier)");
  static_assert(codec<Q> && !sparsifier<Q>, "pipeline<S, Q>: Q must be a quantizer (uniform, sign, qsgd)");
  static_assert(std::same_as<typename S::value_type, typename Q::value_type>,
                "pipeline<S, Q>: the sparsifier and the quantizer must have the same value type");

 public:
  using value_type = typename S::value_type;           ///< Element type of the gradient.
  static constexpr codec_id id = codec_id::pipeline;   ///< Wire identifier.
  static constexpr bool is_homomorphic = false;        ///< Index sets differ between ranks.
  /// bf16 and fp16 gradients when both stages take them (docs/half-precision.md): the kept values'
  /// nested message is the quantizer's 16-bit message.
  static constexpr bool takes_half_precision = takes_half_precision_values<S> && takes_half_precision_values<Q>;

  /// The composition of `sparsify` then `quantize`.
  explicit pipeline(S sparsify = S{}, Q quantize = Q{})
      : sparsify_(std::move(sparsify)), quantize_(std::move(quantize)) {}

  /// The sparsifier stage.
  [[nodiscard]] const S& sparsify_stage() const noexcept { return sparsify_; }
  /// The quantizer stage.
  [[nodiscard]] const Q& quantize_stage() const noexcept { return quantize_; }
  /// Elements the sparsifier keeps (or aims for) of an n-element tensor.
  [[nodiscard]] std::uint64_t k(std::uint64_t n) const noexcept { return sparsify_.k(n); }

  /// Largest message for n elements: the count, the largest index section (the encoder never
  /// picks one larger than the bitmap), and the quantizer's message for at most n values.
  [[nodiscard]] std::size_t max_encoded_bytes(std::uint64_t n) const noexcept {
    return static_cast<std::size_t>(envelope::size + 8 + index_section_bytes(index_coding::bitmap, n, n)) +
           quantize_.max_encoded_bytes(n);
  }
  /// Size of the message for n elements when the sparsifier keeps its k(n): the count, the index
  /// section the encoder chooses for k of n, and the quantizer's message for k values (exact for
  /// top-k, whose k is fixed, and the quantizers, whose size is; an estimate like the sparsifier's
  /// own for threshold).
  [[nodiscard]] std::size_t expected_encoded_bytes(std::uint64_t n) const noexcept {
    const std::uint64_t kept = k(n);
    return static_cast<std::size_t>(envelope::size + chosen_sparse_payload_bytes(n, kept, 0)) +
           quantize_.max_encoded_bytes(kept);
  }
  /// Hash of both stages' parameters.
  [[nodiscard]] std::uint64_t params_hash() const noexcept {
    return params_hasher{}.add(id).add(sparsify_.params_hash()).add(quantize_.params_hash()).value();
  }

 private:
  S sparsify_;
  Q quantize_;
};

}  // namespace gradcomp

#include <gradcomp/reference/pipeline.hpp>
