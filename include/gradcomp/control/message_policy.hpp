#pragma once
/// @file
/// Per-message codec choice of the hybrid 3D-parallel scheme (Xu et al. 2024, docs/control.md §2):
/// a `message_policy` maps each class of message a 3D-parallel trainer sends (data-parallel
/// gradients, tensor- and pipeline-parallel activations, parameter all-gathers, optimizer states)
/// to a `message_codec`, a plain description that the trainer turns into codec objects. Ready-made
/// policies: `naive_policy` (one codec everywhere), `mz_hybrid_policy` (lossy ZFP for
/// data-parallel gradients, lossless MPC for the rest) and `z_hybrid_policy` (ZFP everywhere at a
/// rate per class).
///
/// A trainer maps `mpc(d)` to `mpc_codec<T>(mpc_params{d})` and `zfp(R)` to
/// `zfp_fixed_rate_codec<T>(zfp_params{R})` (T: the tensor's float, bf16 or fp16). The paper's rates are not known (its tables are not
/// readable here): the defaults below are placeholders to tune, not published values.

#include <array>
#include <cstddef>
#include <cstdint>

#include <gradcomp/core/error.hpp>
#include <gradcomp/lossless/mpc.hpp>
#include <gradcomp/lossless/zfp_fixed_rate.hpp>

namespace gradcomp {

/// The classes of message of 3D-parallel training (data, tensor and pipeline parallelism, ZeRO).
enum class message_class : std::uint8_t {
  dp_gradient,  ///< Data-parallel gradient all-reduce / reduce-scatter.
  tp_activation,  ///< Tensor-parallel activation all-reduce / all-gather.
  pp_activation,  ///< Pipeline-parallel activation (and activation gradient) send / receive.
  parameter_gather,  ///< ZeRO parameter all-gather.
  optimizer_state,  ///< Optimizer-state exchange.
};

/// Number of message classes.
inline constexpr std::size_t message_class_count = 5;

/// Every message class, in declaration order.
inline constexpr std::array<message_class, message_class_count> all_message_classes{message_class::dp_gradient,
                                                                                    message_class::tp_activation,
                                                                                    message_class::pp_activation,
                                                                                    message_class::parameter_gather,
                                                                                    message_class::optimizer_state};

/// Which codec family a message uses.
enum class message_codec_kind : std::uint8_t {
  none,  ///< Sent uncompressed.
  mpc,  ///< MPC lossless float32 (`mpc_codec<T>`, dimensionality `mpc_dim`).
  zfp,  ///< ZFP fixed-rate lossy float32 at `zfp_rate_bits` bits per value (`zfp_fixed_rate_codec<T>`).
};

/// A codec choice, described by value. Fields that the kind does not use keep their defaults.
struct message_codec {
  message_codec_kind kind = message_codec_kind::none;  ///< Codec family.
  std::uint32_t zfp_rate_bits = 0;  ///< ZFP: bits per value, 3..32 (`zfp_params::rate_bits`).
  std::uint32_t mpc_dim = 1;  ///< MPC: dimensionality, 1..32 (`mpc_params::dim`).

  /// Uncompressed.
  [[nodiscard]] static constexpr message_codec uncompressed() noexcept { return {}; }
  /// MPC with dimensionality `dim`.
  [[nodiscard]] static constexpr message_codec mpc(std::uint32_t dim = 1) noexcept {
    return {.kind = message_codec_kind::mpc, .mpc_dim = dim};
  }
  /// ZFP fixed rate at `rate_bits` bits per value.
  [[nodiscard]] static constexpr message_codec zfp(std::uint32_t rate_bits) noexcept {
    return {.kind = message_codec_kind::zfp, .zfp_rate_bits = rate_bits};
  }

  /// Throws `invalid_argument` for an MPC dimensionality outside 1..32 (`mpc_params::validate`),
  /// a ZFP rate outside 3..32 bits per value (`zfp_params::validate`), or a field set that the
  /// kind does not use.
  void validate() const {
    switch (kind) {
      case message_codec_kind::none:
        detail::require(zfp_rate_bits == 0 && mpc_dim == 1, errc::invalid_argument,
                        "an uncompressed message codec takes no rate or dimensionality");
        break;
      case message_codec_kind::mpc:
        detail::require(zfp_rate_bits == 0, errc::invalid_argument, "an MPC message codec takes no ZFP rate");
        mpc_params{.dim = mpc_dim}.validate();
        break;
      case message_codec_kind::zfp:
        detail::require(mpc_dim == 1, errc::invalid_argument, "a ZFP message codec takes no MPC dimensionality");
        zfp_params{.rate_bits = zfp_rate_bits}.validate();
        break;
      default: detail::fail(errc::invalid_argument, "unknown message codec kind");
    }
  }

  friend constexpr bool operator==(const message_codec&, const message_codec&) = default;
};

/// A codec per message class.
class message_policy {
 public:
  /// A policy giving `codecs[c]` to class c (indexed by the enum's value).
  /// @throws error `invalid_argument` when a codec is invalid.
  explicit message_policy(const std::array<message_codec, message_class_count>& codecs) : codecs_(codecs) {
    for (const auto& c : codecs_) c.validate();
  }

  /// The codec of messages of class `c`.
  [[nodiscard]] const message_codec& codec_for(message_class c) const { return codecs_[index(c)]; }

  /// Gives class `c` the codec `codec`; the other classes keep theirs. Returns the policy.
  /// @throws error `invalid_argument` when the codec is invalid (the policy is unchanged).
  message_policy& set(message_class c, const message_codec& codec) {
    codec.validate();
    codecs_[index(c)] = codec;
    return *this;
  }

 private:
  static std::size_t index(message_class c) {
    const auto i = static_cast<std::size_t>(c);
    detail::require(i < message_class_count, errc::invalid_argument, "unknown message class");
    return i;
  }

  std::array<message_codec, message_class_count> codecs_;
};

/// The naive scheme: `codec` for every class.
/// @throws error `invalid_argument` when the codec is invalid.
[[nodiscard]] inline message_policy naive_policy(const message_codec& codec) {
  std::array<message_codec, message_class_count> codecs;
  codecs.fill(codec);
  return message_policy(codecs);
}

/// MZHybrid: ZFP at `dp_rate_bits` for data-parallel gradients (aggressive, lossy), MPC of
/// dimensionality `mpc_dim` for every other class (lossless). The default rate is a placeholder.
/// @throws error `invalid_argument` for a rate or dimensionality out of range.
[[nodiscard]] inline message_policy mz_hybrid_policy(std::uint32_t dp_rate_bits = 8, std::uint32_t mpc_dim = 1) {
  return naive_policy(message_codec::mpc(mpc_dim)).set(message_class::dp_gradient, message_codec::zfp(dp_rate_bits));
}

/// ZFP rates of ZHybrid, in bits per value, per class: low for data-parallel gradients, high
/// (mild) for the rest. The defaults are placeholders.
struct z_hybrid_rates {
  std::uint32_t dp_gradient = 8;  ///< Data-parallel gradients.
  std::uint32_t tp_activation = 16;  ///< Tensor-parallel activations.
  std::uint32_t pp_activation = 16;  ///< Pipeline-parallel activations.
  std::uint32_t parameter_gather = 16;  ///< ZeRO parameter all-gathers.
  std::uint32_t optimizer_state = 16;  ///< Optimizer states.
};

/// ZHybrid: ZFP for every class, at the class's rate.
/// @throws error `invalid_argument` for a rate outside 1..32.
[[nodiscard]] inline message_policy z_hybrid_policy(const z_hybrid_rates& rates = {}) {
  return message_policy({message_codec::zfp(rates.dp_gradient), message_codec::zfp(rates.tp_activation),
                         message_codec::zfp(rates.pp_activation), message_codec::zfp(rates.parameter_gather),
                         message_codec::zfp(rates.optimizer_state)});
}

}  // namespace gradcomp
