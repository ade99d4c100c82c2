#pragma once
/// @file
/// Layer selection: which parameters a trainer compresses, and with what. A `layer_policy` is an
/// ordered list of rules, each a predicate on a parameter's (name, kind, numel, shape) and the
/// choice to make when it holds; the first rule that holds decides, and a default covers the rest.
/// `tagc_layer_policy()` is TAGC's choice (docs/sketches.md §4): compress the MLP linears and the
/// embeddings, keep attention, norms, biases and everything else dense.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

namespace gradcomp {

/// What kind of parameter a tensor is, as far as compression policies care.
enum class layer_kind : std::uint8_t {
  linear,     ///< Weight of a dense layer outside attention (an MLP linear).
  attention,  ///< Weight of an attention projection (query, key, value, output).
  embedding,  ///< Token or position embedding table (also a tied output head).
  norm,       ///< Scale or shift of a normalisation layer.
  bias,       ///< Bias vector of any layer.
  other,      ///< Anything else.
};

/// What a policy sees of one parameter.
struct layer_info {
  std::string_view name;                    ///< The framework's parameter name, e.g. "h.0.mlp.c_fc.weight".
  layer_kind kind = layer_kind::other;      ///< Its kind (see `infer_layer_kind`).
  std::uint64_t numel = 0;                  ///< Number of elements.
  std::span<const std::uint64_t> shape{};   ///< Its shape, outermost dimension first.
};

/// Guesses a parameter's kind from common naming conventions (GPT-2/nanoGPT, Hugging Face
/// LLaMA/BERT, Megatron) and its rank: names ending in "bias" are biases; names mentioning
/// "norm", "Norm" or "ln_" are norms; "attn", "attention", "q_proj", "k_proj", "v_proj",
/// "o_proj", "qkv", "query", ".key" or "value" mark attention; "wte", "wpe", "embed" or "lm_head"
/// mark embeddings; any other parameter of rank 2 or more is a linear; the rest is `other`.
/// Name matching is case-sensitive (frameworks use lower case). A trainer that knows the kinds
/// should pass them instead.
[[nodiscard]] constexpr layer_kind infer_layer_kind(std::string_view name, std::size_t rank) noexcept {
  const auto has = [&](std::string_view part) { return name.find(part) != std::string_view::npos; };
  const auto last_dot = name.rfind('.');
  const std::string_view leaf = last_dot == std::string_view::npos ? name : name.substr(last_dot + 1);
  if (leaf == "bias") return layer_kind::bias;
  if (has("norm") || has("Norm") || has("ln_") || has("ln.") || leaf.starts_with("ln")) return layer_kind::norm;
  if (has("attn") || has("attention") || has("q_proj") || has("k_proj") || has("v_proj") || has("o_proj") ||
      has("qkv") || has("query") || has(".key") || has("value"))
    return layer_kind::attention;
  if (has("wte") || has("wpe") || has("embed") || has("lm_head")) return layer_kind::embedding;
  return rank >= 2 ? layer_kind::linear : layer_kind::other;
}

/// An ordered list of rules choosing a `Choice` per parameter: the first rule whose predicate
/// holds decides, otherwise the default. `Choice` is whatever the trainer routes on: a bool, an
/// enum naming a codec, an index into a table of codecs.
template <class Choice>
class layer_policy {
 public:
  /// A predicate on a parameter.
  using predicate = std::function<bool(const layer_info&)>;

  /// A policy whose every parameter gets `fallback` until rules are added.
  explicit layer_policy(Choice fallback) : fallback_(std::move(fallback)) {}

  /// Adds a rule after the existing ones: parameters for which `when` holds (and no earlier rule
  /// did) get `choice`. Returns the policy, so rules chain.
  layer_policy& add(predicate when, Choice choice) & {
    rules_.push_back({std::move(when), std::move(choice)});
    return *this;
  }
  /// Rvalue overload of `add`, for building a policy in one expression.
  layer_policy&& add(predicate when, Choice choice) && { return std::move(add(std::move(when), std::move(choice))); }

  /// The choice for `layer`.
  [[nodiscard]] const Choice& choose(const layer_info& layer) const {
    for (const auto& r : rules_)
      if (r.when(layer)) return r.choice;
    return fallback_;
  }

 private:
  struct rule {
    predicate when;
    Choice choice;
  };
  std::vector<rule> rules_;
  Choice fallback_;
};

/// How TAGC treats a parameter.
enum class tagc_treatment : std::uint8_t {
  dense,       ///< Plain fp32 reduce-scatter.
  compressed,  ///< Dynamic sparsification, LHC index and sketch (the TAGC scheme).
};

/// TAGC's default policy: MLP linears and embeddings compressed, everything else dense. Pass
/// `min_numel` to keep small tensors dense too (their per-collective latency outweighs the bytes
/// saved); the reference compresses only its largest matrices.
[[nodiscard]] inline layer_policy<tagc_treatment> tagc_layer_policy(std::uint64_t min_numel = 0) {
  return layer_policy<tagc_treatment>(tagc_treatment::dense)
      .add(
          [min_numel](const layer_info& l) {
            return (l.kind == layer_kind::linear || l.kind == layer_kind::embedding) && l.numel >= min_numel;
          },
          tagc_treatment::compressed);
}

}  // namespace gradcomp
