// Training with bf16 gradients (docs/half-precision.md): the training demo's model and data
// (examples/train/experiment.hpp), 4 workers, 300 steps of SGD on float32 weights, each worker's
// gradient rounded to bf16 and sent by a 16-bit codec with its float32 state (top-k 1% with error
// feedback, 4-bit uniform with LoCo), every message decoded into a float32 accumulator and the mean
// applied. The final training loss must stay within 5% of the float32 dense run's.
#include <gradcomp/gradcomp.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "../../examples/train/experiment.hpp"

namespace {

using train::experiment;

constexpr std::size_t workers = 4, steps = 300;

// One worker's sender: encodes its bf16 gradient (with its state) into a message.
struct sender {
  virtual ~sender() = default;
  virtual std::vector<std::byte> send(std::span<const gradcomp::bf16> grad, std::uint64_t step) = 0;
  virtual void receive(std::span<const std::byte> message, std::span<float> acc) = 0;
};

template <class Wrapper>
struct wrapped_sender final : sender {
  Wrapper wrapper;
  typename Wrapper::state_type state;
  std::vector<std::byte> ws;
  wrapped_sender(Wrapper w, std::size_t n)
      : wrapper(std::move(w)),
        state(wrapper.make_state(gradcomp::cpu_executor{}, n)),
        ws(wrapper.workspace_bytes(gradcomp::cpu_executor{}, n)) {}
  std::vector<std::byte> send(std::span<const gradcomp::bf16> grad, std::uint64_t step) override {
    std::vector<std::byte> out(wrapper.max_encoded_bytes(grad.size()));
    out.resize(wrapper.encode(gradcomp::cpu_executor{}, grad, state, out, ws, {.step = step}));
    return out;
  }
  void receive(std::span<const std::byte> message, std::span<float> acc) override {
    wrapper.decode_accumulate(gradcomp::cpu_executor{}, message, acc, ws);
  }
};

// Mean training loss over the last loss_window steps; `make` gives each worker's sender (null:
// the float32 dense mean, no rounding, no codec).
template <class Make>
double train_loss(Make&& make) {
  train::mlp model = experiment::model();
  const train::setup data(workers);
  const std::size_t n = model.size();
  std::vector<train::batch_stream> streams;
  std::vector<std::vector<float>> grads(workers, std::vector<float>(n));
  std::vector<std::unique_ptr<sender>> senders;
  for (std::size_t w = 0; w < workers; ++w) {
    streams.emplace_back(w);
    senders.push_back(make(n));
  }
  std::vector<float> mean(n);
  std::vector<gradcomp::bf16> half(n);
  double loss_sum = 0;
  for (std::size_t step = 0; step < steps; ++step) {
    double step_loss = 0;
    for (std::size_t w = 0; w < workers; ++w)
      step_loss += model.gradient(data.train_set, streams[w].next(experiment::batch), grads[w]);
    if (step + experiment::loss_window >= steps) loss_sum += step_loss / workers;
    std::fill(mean.begin(), mean.end(), 0.0f);
    for (std::size_t w = 0; w < workers; ++w) {
      if (!senders[w]) {
        for (std::size_t i = 0; i < n; ++i) mean[i] += grads[w][i];
        continue;
      }
      for (std::size_t i = 0; i < n; ++i) half[i] = gradcomp::narrow<gradcomp::bf16>(grads[w][i]);
      const std::vector<std::byte> message = senders[w]->send(half, step);
      senders[w]->receive(message, mean);  // every worker decodes every message alike: one accumulation
    }
    for (float& v : mean) v /= static_cast<float>(workers);
    model.sgd(mean, experiment::learning_rate);
  }
  return loss_sum / static_cast<double>(experiment::loss_window);
}

}  // namespace

TEST_CASE("bf16 gradients through top-k 1% + EF and 4-bit LoCo train within 5% of float32 dense") {
  using namespace gradcomp;
  const double dense = train_loss([](std::size_t) { return std::unique_ptr<sender>(); });
  const double topk_ef = train_loss([](std::size_t n) -> std::unique_ptr<sender> {
    using wrapper = error_feedback<topk_sparsifier<bf16>>;
    return std::make_unique<wrapped_sender<wrapper>>(wrapper(topk_sparsifier<bf16>(sparsity{.density = 0.01})), n);
  });
  const double loco4 = train_loss([](std::size_t n) -> std::unique_ptr<sender> {
    using wrapper = loco<uniform_quantizer<bf16>>;
    return std::make_unique<wrapped_sender<wrapper>>(wrapper(uniform_quantizer<bf16>({.bits = 4})), n);
  });
  MESSAGE("train loss after ", steps, " steps: float32 dense ", dense, ", bf16 top-k 1% + EF ", topk_ef, " (",
          100 * (topk_ef / dense - 1), "%), bf16 4-bit LoCo ", loco4, " (", 100 * (loco4 / dense - 1), "%)");
  CHECK(std::isfinite(dense));
  CHECK(topk_ef <= dense * 1.05);
  CHECK(loco4 <= dense * 1.05);
}
