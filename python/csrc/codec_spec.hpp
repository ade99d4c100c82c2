#pragma once
// Codec specs: the text form of the Python package's typed constructors (gradcomp/codecs.py), for
// the extension and replay_mpi alike. A spec is a family and its parameters,
//
//   topk density=0.01 error_feedback=1 ef_decay=0.9
//
// tokens separated by single spaces, each parameter `key=value` (a number as Python's repr writes
// it, or 0/1 for a flag). `visit_codec_spec` builds what the spec names and hands it to the
// visitor the way `visit_hook_codecs` hands over the table's rows (`codec`, `tagc`, `powersgd`,
// `gravac`, `gravac_ladder`), named by the spec's text. Every parameter is checked: an unknown
// family or key, a repeated key, a malformed number or a value the codec's own `validate()`
// refuses throws `gradcomp::error(invalid_argument)` naming it.
#include <gradcomp/gradcomp.hpp>

#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

namespace gradcomp_torch {

/// A parsed spec: its family and parameters. The getters take a parameter (so that `finish` can
/// name any the family does not know) or give the default when it is absent.
class codec_spec {
 public:
  /// Parses `text`; throws invalid_argument for an empty family, a token without '=', an empty
  /// key or value, or a repeated key.
  explicit codec_spec(std::string_view text) : text_(text) {
    std::size_t at = 0;
    bool first = true;
    while (at <= text.size()) {
      const std::size_t end = std::min(text.find(' ', at), text.size());
      const std::string_view token = text.substr(at, end - at);
      if (first) {
        family_ = std::string(token);
        fail_unless(!family_.empty(), "has no family");
        first = false;
      } else {
        const std::size_t eq = token.find('=');
        fail_unless(eq != std::string_view::npos && eq > 0 && eq + 1 < token.size(),
                    "has a parameter that is not key=value: \"" + std::string(token) + "\"");
        const bool fresh = values_.emplace(std::string(token.substr(0, eq)), std::string(token.substr(eq + 1))).second;
        fail_unless(fresh, "names " + std::string(token.substr(0, eq)) + " twice");
      }
      at = end + 1;
    }
  }

  [[nodiscard]] const std::string& family() const noexcept { return family_; }
  [[nodiscard]] const std::string& text() const noexcept { return text_; }

  /// The real number `key` (finite), or `fallback`.
  double real(const char* key, double fallback) {
    const auto value = take(key);
    if (!value) return fallback;
    double v = 0;
    const auto [end, ec] = std::from_chars(value->data(), value->data() + value->size(), v);
    fail_unless(ec == std::errc{} && end == value->data() + value->size() && std::isfinite(v),
                std::string(key) + "=" + *value + " is not a finite number");
    return v;
  }

  /// The non-negative integer `key`, or `fallback`.
  std::uint64_t whole(const char* key, std::uint64_t fallback) {
    const auto value = take(key);
    if (!value) return fallback;
    std::uint64_t v = 0;
    const auto [end, ec] = std::from_chars(value->data(), value->data() + value->size(), v);
    fail_unless(ec == std::errc{} && end == value->data() + value->size(),
                std::string(key) + "=" + *value + " is not a non-negative integer");
    return v;
  }

  /// The integer `key`, which must fit `max`, or `fallback`.
  std::uint32_t whole32(const char* key, std::uint32_t fallback, std::uint32_t max = UINT32_MAX) {
    const std::uint64_t v = whole(key, fallback);
    fail_unless(v <= max, std::string(key) + "=" + std::to_string(v) + " is out of range");
    return static_cast<std::uint32_t>(v);
  }

  /// The flag `key` (0 or 1), or `fallback`.
  bool flag(const char* key, bool fallback) {
    const auto value = take(key);
    if (!value) return fallback;
    fail_unless(*value == "0" || *value == "1", std::string(key) + "=" + *value + " is not 0 or 1");
    return *value == "1";
  }

  /// Throws for a parameter no getter took.
  void finish() const {
    fail_unless(values_.empty(), values_.empty()
                                     ? std::string()
                                     : "has no parameter " + values_.begin()->first + " for the family " + family_);
  }

  /// Throws invalid_argument "codec spec \"<text>\" <what>" unless `ok`.
  void fail_unless(bool ok, const std::string& what) const {
    gradcomp::detail::require(ok, gradcomp::errc::invalid_argument,
                              [&] { return "codec spec \"" + text_ + "\" " + what; });
  }

 private:
  std::optional<std::string> take(const char* key) {
    const auto it = values_.find(key);
    if (it == values_.end()) return std::nullopt;
    std::string value = std::move(it->second);
    values_.erase(it);
    return value;
  }

  std::string text_;
  std::string family_;
  std::map<std::string, std::string> values_;
};

namespace detail {

/// The quantizers' optional wrappers: `loco=1` (with loco_beta, loco_group, loco_reset) or
/// `error_feedback=1` (with ef_decay), not both; then hands the codec to the visitor.
template <class Visitor, class C>
void visit_wrapped(codec_spec& spec, Visitor& visitor, C codec, bool loco_allowed) {
  const bool ef = spec.flag("error_feedback", false);
  const double decay = spec.real("ef_decay", 1.0);
  const bool with_loco = loco_allowed && spec.flag("loco", false);
  gradcomp::loco_params loco{};
  if (with_loco) {
    loco.beta = static_cast<float>(spec.real("loco_beta", loco.beta));
    loco.error_group = spec.whole32("loco_group", loco.error_group);
    loco.reset_period = spec.whole32("loco_reset", loco.reset_period);
  }
  spec.finish();
  spec.fail_unless(!(ef && with_loco), "asks for both error feedback and LoCo");
  spec.fail_unless(ef || decay == 1.0, "sets ef_decay without error_feedback=1");
  spec.fail_unless(decay > 0.0 && decay <= 1.0, "ef_decay must lie in (0, 1]");
  const char* name = spec.text().c_str();
  if (with_loco) visitor.codec(name, gradcomp::loco(std::move(codec), loco));
  else if (ef)
    visitor.codec(name, gradcomp::error_feedback(std::move(codec), {.decay = decay}));
  else
    visitor.codec(name, std::move(codec));
}

/// `density=` of a sparsifier, required.
inline gradcomp::sparsity amount_of(codec_spec& spec) {
  const double density = spec.real("density", -1.0);
  spec.fail_unless(density > 0.0 && density <= 1.0, "needs density in (0, 1]");
  return {.density = density};
}

}  // namespace detail

/// Builds what the spec `text` names and hands it to `visitor` under the name `text` (see the
/// file comment). Families and parameters (defaults in brackets):
///   topk        density, value_bits [0: raw values; 8: the kept values in 8-bit uniform codes]
///   randomk     density, seed [0], scaled [1]
///   threshold   density, seed [0]
///   uniform     bits [4], block [256], stochastic [0], seed [0]
///   qsgd        levels [15], bucket [256], seed [0]
///   sign        block [256]
///     each of the above also error_feedback [0] with ef_decay [1]; the last three also loco [0]
///     with loco_beta [0.8], loco_group [256], loco_reset [1024]
///   shared_scale  bits [4], block [256], headroom_bits [3] (summed, homomorphic)
///   zfp         rate_bits [8]
///   tagc        zero_fraction [0.95], block [128], resparsify [0]
///   powersgd    rank [4], batched [0]
///   gravac      theta_min [0.1], theta_max [0.001], epsilon [0.75], window [20], back_off [1]
///   gravac_bits max_bits [4], min_bits [1], epsilon [0.4], window [20], back_off [1], block [64],
///               loco_beta [0.95]
template <class Visitor>
void visit_codec_spec(const std::string& text, Visitor& visitor) {
  using namespace gradcomp;
  codec_spec spec(text);
  const std::string family = spec.family();
  const char* name = spec.text().c_str();
  if (family == "topk") {
    const sparsity amount = detail::amount_of(spec);
    const std::uint64_t value_bits = spec.whole("value_bits", 0);
    spec.fail_unless(value_bits == 0 || value_bits == 8, "value_bits must be 0 (raw values) or 8");
    if (value_bits == 8)
      detail::visit_wrapped(spec, visitor,
                            pipeline(topk_sparsifier<float>(amount), uniform_quantizer<float>({.bits = 8})), false);
    else
      detail::visit_wrapped(spec, visitor, topk_sparsifier<float>(amount), false);
  } else if (family == "randomk") {
    randomk_params p{.amount = detail::amount_of(spec)};
    p.seed = spec.whole("seed", 0);
    p.scaled = spec.flag("scaled", true);
    detail::visit_wrapped(spec, visitor, randomk_sparsifier<float>(p), false);
  } else if (family == "threshold") {
    threshold_params p{.target = detail::amount_of(spec)};
    p.seed = spec.whole("seed", 0);
    detail::visit_wrapped(spec, visitor, threshold_sparsifier<float>(p), false);
  } else if (family == "uniform") {
    uniform_params p{};
    p.bits = static_cast<int>(spec.whole32("bits", 4, 64));
    p.block = spec.whole32("block", 256);
    p.round = spec.flag("stochastic", false) ? rounding::stochastic : rounding::nearest_even;
    p.seed = spec.whole("seed", 0);
    detail::visit_wrapped(spec, visitor, uniform_quantizer<float>(p), true);
  } else if (family == "qsgd") {
    qsgd_params p{};
    p.levels = spec.whole32("levels", p.levels);
    p.bucket = spec.whole32("bucket", p.bucket);
    p.seed = spec.whole("seed", 0);
    detail::visit_wrapped(spec, visitor, qsgd_quantizer<float>(p), true);
  } else if (family == "sign") {
    sign_params p{};
    p.block = spec.whole32("block", p.block);
    detail::visit_wrapped(spec, visitor, sign_quantizer<float>(p), true);
  } else if (family == "shared_scale") {
    shared_scale_params p{};
    p.bits = static_cast<int>(spec.whole32("bits", 4, 64));
    p.block = spec.whole32("block", p.block);
    p.headroom_bits = static_cast<int>(spec.whole32("headroom_bits", 3, 64));
    spec.finish();
    visitor.codec(name, shared_scale_quantizer<float>(p));
  } else if (family == "zfp") {
    const zfp_params p{.rate_bits = spec.whole32("rate_bits", 8)};
    spec.finish();
    visitor.codec(name, zfp_fixed_rate_codec<float>(p));
  } else if (family == "tagc") {
    tagc_params p{};
    p.sparsify.zero_fraction = spec.real("zero_fraction", 0.95);
    p.sketch.block = spec.whole32("block", 128);
    const bool resparsify = spec.flag("resparsify", false);
    spec.finish();
    p.sparsify.validate();
    visitor.tagc(name, p, resparsify ? std::optional<double>(p.sparsify.zero_fraction) : std::nullopt);
  } else if (family == "powersgd") {
    powersgd_params p{};
    p.rank = spec.whole32("rank", 4);
    const bool batched = spec.flag("batched", false);
    spec.finish();
    p.validate();
    visitor.powersgd(name, p, batched);
  } else if (family == "gravac") {
    gravac_options o{.feedback = gravac_feedback::both_paths, .gain_input = gravac_gain_input::gradient};
    o.theta_min = spec.real("theta_min", 0.1);
    o.theta_max = spec.real("theta_max", 0.001);
    o.epsilon = spec.real("epsilon", o.epsilon);
    o.window = spec.whole32("window", 20);
    o.back_off = spec.flag("back_off", true);
    spec.finish();
    o.validate();
    visitor.gravac(name, o, 0);
  } else if (family == "gravac_bits") {
    const std::uint32_t max_bits = spec.whole32("max_bits", 4), min_bits = spec.whole32("min_bits", 1);
    gravac_options o{.measure = gravac_gain_measure::kept_energy, .gain_input = gravac_gain_input::gradient};
    o.epsilon = spec.real("epsilon", 0.4);
    o.window = spec.whole32("window", 20);
    o.back_off = spec.flag("back_off", true);
    const std::uint32_t block = spec.whole32("block", 64);
    const double beta = spec.real("loco_beta", 0.95);
    spec.finish();
    const auto width = [](std::uint32_t b) { return b == 1 || b == 2 || b == 4 || b == 8; };
    spec.fail_unless(width(max_bits) && width(min_bits) && min_bits < max_bits,
                     "needs min_bits < max_bits, each 1, 2, 4 or 8");
    o.theta_min = max_bits / 32.0;
    o.theta_max = min_bits / 32.0;
    o.validate();
    // Each width's codec row is itself a spec: uniform codes of that width with LoCo.
    std::array<char, 32> beta_text{};
    const auto written = std::to_chars(beta_text.data(), beta_text.data() + beta_text.size(), beta);
    std::map<int, std::string> rows;
    for (std::uint32_t b = max_bits; b >= min_bits; b /= 2)
      rows.emplace(static_cast<int>(b), "uniform bits=" + std::to_string(b) + " block=" + std::to_string(block) +
                                            " loco=1 loco_beta=" + std::string(beta_text.data(), written.ptr) +
                                            " loco_group=" + std::to_string(block));
    visitor.gravac_ladder(name, o, block, rows);
  } else {
    spec.fail_unless(false,
                     "names no family gradcomp knows (topk, randomk, threshold, uniform, qsgd, sign, "
                     "shared_scale, zfp, tagc, powersgd, gravac, gravac_bits)");
  }
}

}  // namespace gradcomp_torch
