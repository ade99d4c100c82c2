// Built against an installed gradcomp through find_package: round-trips a gradient with random-k.
#include <gradcomp/gradcomp.hpp>

#include <cstddef>
#include <span>
#include <vector>

int main() {
  using namespace gradcomp;
  const cpu_executor cpu;
  const randomk_sparsifier<double> randomk({.amount = {.density = 0.5}, .seed = 9, .scaled = false});
  std::vector<double> gradient(64, 1.0);
  std::vector<std::byte> message(randomk.max_encoded_bytes(gradient.size()));
  const std::size_t bytes = randomk.encode(cpu, std::span<const double>(gradient), message, {});
  std::vector<double> decoded(gradient.size());
  randomk.decode(cpu, std::span<const std::byte>(message.data(), bytes), std::span<double>(decoded), {});
  double kept = 0;
  for (const double v : decoded) kept += v;
  return kept == 32.0 ? 0 : 1;
}
