// Conan test_package: round-trips a gradient through the packaged gradcomp with exact top-k.
#include <gradcomp/gradcomp.hpp>

#include <cstddef>
#include <cstdio>
#include <span>
#include <vector>

int main() {
  using namespace gradcomp;
  const cpu_executor cpu;
  const topk_sparsifier<float> topk(sparsity{.density = 0.125});
  std::vector<float> gradient(256);
  for (std::size_t i = 0; i < gradient.size(); ++i) gradient[i] = (i % 8 == 3) ? 2.0f : 0.25f;
  std::vector<std::byte> message(topk.max_encoded_bytes(gradient.size()));
  std::vector<std::byte> workspace(topk.workspace_bytes(cpu, gradient.size()));
  const std::size_t bytes =
      topk.encode(cpu, std::span<const float>(gradient), message, workspace, message_key{.step = 1, .tensor_id = 0});
  std::vector<float> decoded(gradient.size());
  topk.decode(cpu, std::span<const std::byte>(message.data(), bytes), std::span<float>(decoded), workspace);
  // k = 32: exactly the 32 entries equal to 2 survive, every other entry decodes to 0.
  for (std::size_t i = 0; i < gradient.size(); ++i) {
    if (decoded[i] != (i % 8 == 3 ? 2.0f : 0.0f)) {
      std::printf("gradcomp test_package: mismatch at %zu\n", i);
      return 1;
    }
  }
  std::printf("gradcomp test_package: %zu-byte message round-tripped\n", bytes);
  return 0;
}
