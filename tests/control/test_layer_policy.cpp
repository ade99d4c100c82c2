// Layer selection: kind inference from real frameworks' parameter names, first-match rule order,
// and TAGC's default routing.
#include <gradcomp/control/layer_policy.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gradcomp::test {
namespace {

struct named_parameter {
  std::string_view name;
  std::vector<std::uint64_t> shape;
  layer_kind kind;
};

// Parameter names and shapes as nanoGPT (GPT-2 small), Hugging Face LLaMA and BERT print them.
const std::vector<named_parameter>& transformer_parameters() {
  static const std::vector<named_parameter> parameters = {
      {"transformer.wte.weight", {50304, 768}, layer_kind::embedding},
      {"transformer.wpe.weight", {1024, 768}, layer_kind::embedding},
      {"transformer.h.0.ln_1.weight", {768}, layer_kind::norm},
      {"transformer.h.0.attn.c_attn.weight", {2304, 768}, layer_kind::attention},
      {"transformer.h.0.attn.c_proj.weight", {768, 768}, layer_kind::attention},
      {"transformer.h.0.mlp.c_fc.weight", {3072, 768}, layer_kind::linear},
      {"transformer.h.0.mlp.c_proj.weight", {768, 3072}, layer_kind::linear},
      {"transformer.h.0.mlp.c_fc.bias", {3072}, layer_kind::bias},
      {"transformer.ln_f.weight", {768}, layer_kind::norm},
      {"lm_head.weight", {50304, 768}, layer_kind::embedding},
      {"model.embed_tokens.weight", {32000, 4096}, layer_kind::embedding},
      {"model.layers.0.self_attn.q_proj.weight", {4096, 4096}, layer_kind::attention},
      {"model.layers.0.self_attn.o_proj.weight", {4096, 4096}, layer_kind::attention},
      {"model.layers.0.mlp.gate_proj.weight", {11008, 4096}, layer_kind::linear},
      {"model.layers.0.mlp.down_proj.weight", {4096, 11008}, layer_kind::linear},
      {"model.layers.0.input_layernorm.weight", {4096}, layer_kind::norm},
      {"model.norm.weight", {4096}, layer_kind::norm},
      {"bert.encoder.layer.0.attention.self.query.weight", {768, 768}, layer_kind::attention},
      {"bert.encoder.layer.0.attention.output.LayerNorm.weight", {768}, layer_kind::norm},
      {"bert.encoder.layer.0.intermediate.dense.weight", {3072, 768}, layer_kind::linear},
      {"bert.encoder.layer.0.output.LayerNorm.weight", {768}, layer_kind::norm},
      {"classifier.scale", {10}, layer_kind::other},
  };
  return parameters;
}

std::uint64_t numel(const std::vector<std::uint64_t>& shape) {
  std::uint64_t n = 1;
  for (const auto d : shape) n *= d;
  return n;
}

TEST_CASE("infer_layer_kind names the kind of GPT-2, LLaMA and BERT parameters") {
  for (const auto& p : transformer_parameters()) {
    CAPTURE(p.name);
    CHECK(infer_layer_kind(p.name, p.shape.size()) == p.kind);
  }
}

TEST_CASE("tagc_layer_policy compresses MLP linears and embeddings and keeps the rest dense") {
  const auto policy = tagc_layer_policy();
  for (const auto& p : transformer_parameters()) {
    CAPTURE(p.name);
    const layer_info info{p.name, infer_layer_kind(p.name, p.shape.size()), numel(p.shape), p.shape};
    const bool compress = p.kind == layer_kind::linear || p.kind == layer_kind::embedding;
    CHECK((policy.choose(info) == tagc_treatment::compressed) == compress);
  }
  // With a size floor, small linears stay dense.
  const auto large_only = tagc_layer_policy(1'000'000);
  const std::vector<std::uint64_t> small_shape = {64, 128};
  CHECK(large_only.choose({"fc1.weight", layer_kind::linear, 8192, small_shape}) == tagc_treatment::dense);
  CHECK(large_only.choose({"fc1.weight", layer_kind::linear, 2'359'296, {}}) == tagc_treatment::compressed);
}

TEST_CASE("layer_policy takes the first rule that holds and the default otherwise") {
  enum class route { dense, topk, uniform4 };
  const auto policy = layer_policy<route>(route::dense)
                          .add([](const layer_info& l) { return l.numel < 1000; }, route::dense)
                          .add([](const layer_info& l) { return l.kind == layer_kind::embedding; }, route::topk)
                          .add([](const layer_info& l) { return l.shape.size() == 2; }, route::uniform4);
  const std::vector<std::uint64_t> matrix = {100, 100}, vector = {5000};
  CHECK(policy.choose({"tiny.weight", layer_kind::embedding, 10, matrix}) == route::dense);     // rule 1 first
  CHECK(policy.choose({"wte.weight", layer_kind::embedding, 10000, matrix}) == route::topk);    // rule 2
  CHECK(policy.choose({"fc.weight", layer_kind::linear, 10000, matrix}) == route::uniform4);    // rule 3
  CHECK(policy.choose({"scale", layer_kind::other, 5000, vector}) == route::dense);             // default
}

}  // namespace
}  // namespace gradcomp::test
