// Built with gradcomp added by add_subdirectory: round-trips a gradient with exact top-k.
#include <gradcomp/gradcomp.hpp>

#include <cstddef>
#include <span>
#include <vector>

int main() {
  using namespace gradcomp;
  const cpu_executor cpu;
  const topk_sparsifier<float> topk(sparsity{.density = 0.25});
  std::vector<float> gradient(64);
  for (std::size_t i = 0; i < gradient.size(); ++i) gradient[i] = static_cast<float>(i) - 40.0f;
  std::vector<std::byte> message(topk.max_encoded_bytes(gradient.size()));
  std::vector<std::byte> workspace(topk.workspace_bytes(cpu, gradient.size()));
  const std::size_t bytes = topk.encode(cpu, std::span<const float>(gradient), message, workspace, {});
  std::vector<float> decoded(gradient.size());
  topk.decode(cpu, std::span<const std::byte>(message.data(), bytes), std::span<float>(decoded), workspace);
  // The 16 largest magnitudes are |i - 40| for i = 0..15 (40 down to 25); everything else is zero.
  for (std::size_t i = 0; i < gradient.size(); ++i) {
    const float expected = i < 16 ? gradient[i] : 0.0f;
    if (decoded[i] != expected) return 1;
  }
  return 0;
}
