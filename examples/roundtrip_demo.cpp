// gradcomp demo: sparsify a synthetic gradient bucket with each codec, aggregate the messages of
// four simulated ranks, and show what a corrupted message does. Prints what happened at each step.
#include <gradcomp/gradcomp.hpp>

#include <fmt/core.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace {

constexpr std::size_t elements = 1 << 20;
constexpr int ranks = 4;

std::vector<float> synthetic_gradient(std::uint32_t seed) {
  std::mt19937 engine(seed);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  std::vector<float> g(elements);
  for (float& v : g) v = normal(engine);
  return g;
}

double relative_error(std::span<const float> exact, std::span<const float> approx) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < exact.size(); ++i) {
    diff += (static_cast<double>(exact[i]) - approx[i]) * (static_cast<double>(exact[i]) - approx[i]);
    norm += static_cast<double>(exact[i]) * exact[i];
  }
  return std::sqrt(diff / norm);
}

// Each rank encodes its gradient; the receiver decodes every message into one sum (an all-gather
// followed by decode_accumulate), then compares with the exact sum.
template <class Codec>
void show(const char* name, const Codec& codec, const std::vector<std::vector<float>>& grads) {
  const gradcomp::cpu_executor cpu;
  std::vector<std::byte> workspace(codec.workspace_bytes(cpu, elements));
  std::vector<float> exact(elements, 0.0f), sum(elements, 0.0f);
  std::size_t sent = 0;
  for (int r = 0; r < ranks; ++r) {
    std::vector<std::byte> message(codec.max_encoded_bytes(elements));
    const std::size_t bytes = codec.encode(cpu, std::span<const float>(grads[static_cast<std::size_t>(r)]), message,
                                           workspace, gradcomp::message_key{.step = 1, .tensor_id = 0});
    sent += bytes;
    codec.decode_accumulate(cpu, std::span<const std::byte>(message.data(), bytes), std::span<float>(sum), workspace);
    for (std::size_t i = 0; i < elements; ++i) exact[i] += grads[static_cast<std::size_t>(r)][i];
  }
  fmt::print("{:<10} {:>9} bytes/rank  ratio {:>6.1f}x  k = {:>6}  relative error of the sum {:.3f}\n", name,
             sent / ranks, static_cast<double>(elements * sizeof(float) * ranks) / static_cast<double>(sent),
             codec.k(elements), relative_error(exact, sum));
}

}  // namespace

int main() {
  using namespace gradcomp;
  fmt::print("gradcomp demo: {} float32 gradient values per rank, {} ranks, 1% density\n\n", elements, ranks);
  std::vector<std::vector<float>> grads;
  for (int r = 0; r < ranks; ++r) grads.push_back(synthetic_gradient(static_cast<std::uint32_t>(100 + r)));

  show("top-k", topk_sparsifier<float>(sparsity{.density = 0.01}), grads);
  show("threshold", threshold_sparsifier<float>({.target = {.density = 0.01}}), grads);
  show("random-k", randomk_sparsifier<float>({.amount = {.density = 0.01}, .seed = 7}), grads);
  fmt::print(
      "(random-k is unbiased but noisy: scaled by n/k = 100, its error is about sqrt(n/k); it is meant to\n"
      " run under error feedback. Top-k and threshold drop 99% of the values, hence errors near 1.)\n");

  // Random-k is homomorphic: the ranks' messages can be summed without decoding.
  const cpu_executor cpu;
  const randomk_sparsifier<float> randomk({.amount = {.density = 0.01}, .seed = 7});
  std::vector<std::vector<std::byte>> messages;
  for (int r = 0; r < ranks; ++r) {
    messages.emplace_back(randomk.max_encoded_bytes(elements));
    randomk.encode(cpu, std::span<const float>(grads[static_cast<std::size_t>(r)]), messages.back(), {},
                   message_key{.step = 1});
  }
  std::vector<float> from_sum(elements), from_each(elements, 0.0f);
  for (const auto& m : messages) randomk.decode_accumulate(cpu, m, std::span<float>(from_each), {});
  for (int r = 1; r < ranks; ++r) randomk.accumulate_encoded(cpu, messages[0], messages[static_cast<std::size_t>(r)]);
  randomk.decode(cpu, messages[0], std::span<float>(from_sum), {});
  fmt::print(
      "\nrandom-k: summing {} encodings before decoding differs from decoding each and adding by {:.2e}\n"
      "(relative; float rounding only, since every rank kept the same indices)\n",
      ranks, relative_error(from_each, from_sum));

  // A corrupted message is rejected with a named error, and the output is left untouched.
  const topk_sparsifier<float> topk(sparsity{.density = 0.01});
  std::vector<std::byte> message(topk.max_encoded_bytes(elements));
  std::vector<std::byte> workspace(topk.workspace_bytes(cpu, elements));
  const std::size_t bytes = topk.encode(cpu, std::span<const float>(grads[0]), message, workspace);
  message[20] ^= std::byte{0x10};  // flip one bit of the element count
  std::vector<float> out(elements, 1.0f);
  try {
    topk.decode(cpu, std::span<const std::byte>(message.data(), bytes), std::span<float>(out), workspace);
    fmt::print("corrupted message decoded?!\n");
    return 1;
  } catch (const gradcomp::error& e) {
    fmt::print("one flipped bit in a top-k message: rejected with errc::{} ({}); output untouched: {}\n",
               to_string(e.code()), e.what(), out[0] == 1.0f ? "yes" : "no");
  }
  return 0;
}
