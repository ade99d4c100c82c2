/// @file
/// Prints the C++ cost model's bytes (collective/all_reduce_cost.hpp) for a grid of (codec, n, P),
/// one line per case: `codec n P dense gather_decode scatter_reduce summed_encodings`, each the
/// bytes rank 0 sends and its rounds as `bytes/rounds` (`-` where the plan does not apply). tests/tools/test_when_it_pays.py
/// compares these lines with the Python mirror in tools/when_it_pays.py, so the figure of
/// docs/when-it-pays.md is drawn from the model the library uses.

#include <gradcomp/gradcomp.hpp>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

namespace {

using gradcomp::all_reduce_cost;

/// One codec of the grid: its name in tools/when_it_pays.py, B(m), and the summable bytes S(m)
/// of a summable encoding (empty otherwise).
struct model_codec {
  const char* name;
  std::function<std::uint64_t(std::uint64_t)> encoded_bytes;
  std::function<std::uint64_t(std::uint64_t)> summable_bytes;
};

std::string plan_cost(const all_reduce_cost& cost, bool applies) {
  return applies ? std::to_string(cost.sent_bytes) + "/" + std::to_string(cost.rounds) : std::string("-");
}

}  // namespace

int main() {
  const gradcomp::uniform_quantizer<float> uniform8({.bits = 8});
  const gradcomp::uniform_quantizer<float> uniform4({.bits = 4});
  const gradcomp::uniform_quantizer<float> uniform2({.bits = 2});
  const gradcomp::sign_quantizer<float> sign;
  const gradcomp::qsgd_quantizer<float> qsgd15;  // 15 levels, 8-bit codes: the benches' QSGD
  const gradcomp::topk_sparsifier<float> topk(gradcomp::sparsity{.density = 0.01});
  const gradcomp::count_sketch<float> sketch({.rows = 3, .columns = std::uint64_t{1} << 20});
  const gradcomp::shared_scale_quantizer<float> shared4({.bits = 4});

  // B(m) of the library's model: expected_encoded_bytes where the codec has it (top-k's k(m)
  // values, as sent), else max_encoded_bytes.
  const auto model_bytes = [](const auto& codec) {
    return [&codec](std::uint64_t m) { return static_cast<std::uint64_t>(gradcomp::modelled_encoded_bytes(codec, m)); };
  };
  const model_codec codecs[] = {
      {"uniform8", model_bytes(uniform8), {}},
      {"uniform4", model_bytes(uniform4), {}},
      {"uniform2", model_bytes(uniform2), {}},
      {"sign", model_bytes(sign), {}},
      {"qsgd15", model_bytes(qsgd15), {}},
      {"topk1", model_bytes(topk), {}},
      {"count_sketch", model_bytes(sketch),
       [&](std::uint64_t m) { return static_cast<std::uint64_t>(sketch.summable_bytes(m)); }},
      {"shared_scale4", model_bytes(shared4),
       [&](std::uint64_t m) { return static_cast<std::uint64_t>(shared4.summable_bytes(m)); }},
  };
  const std::uint64_t sizes[] = {1, 1000, 1u << 22, 25'000'000, 25'000'003};
  const int ranks[] = {2, 3, 4, 16, 64};

  for (const model_codec& c : codecs)
    for (const std::uint64_t n : sizes)
      for (const int p : ranks) {
        const all_reduce_cost dense = gradcomp::dense_ring_cost(n * sizeof(float), p);
        const bool summable = static_cast<bool>(c.summable_bytes);
        const all_reduce_cost gather = gradcomp::gather_decode_cost(n, p, c.encoded_bytes);
        const all_reduce_cost scatter = gradcomp::scatter_reduce_cost(n, p, 0, c.encoded_bytes);
        const all_reduce_cost summed = gradcomp::summed_encodings_cost(summable ? c.summable_bytes(n) : 0, p);
        std::printf("%s %llu %d %s %s %s %s\n", c.name, static_cast<unsigned long long>(n), p,
                    plan_cost(dense, true).c_str(), plan_cost(gather, !summable).c_str(),
                    plan_cost(scatter, !summable).c_str(), plan_cost(summed, summable).c_str());
      }
  return 0;
}
