#pragma once
// The training experiment both examples run: the model, the data, each worker's minibatch stream
// and the SGD settings, so that train_demo (simulated workers) and mpi_train (one worker per rank)
// compute the same numbers for the same number of workers.
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "data.hpp"
#include "mlp.hpp"

namespace train {

/// The experiment's fixed settings.
struct experiment {
  static constexpr std::size_t batch = 64;        ///< Samples per worker per step.
  static constexpr std::size_t loss_window = 20;  ///< Final training loss: mean over the last steps.
  static constexpr float learning_rate = 0.3f;
  static constexpr std::size_t inputs = 64, hidden = 128, classes = 10;
  static constexpr std::size_t train_per_worker = 4096, test_samples = 4096;
  static constexpr std::uint64_t init_seed = 42;          ///< Initial weights, the same for every codec.
  static constexpr std::uint64_t stream_seed = 1000;      ///< Worker w shuffles its shard with seed 1000 + w.

  /// The data generator's settings.
  [[nodiscard]] static data_config data() { return {.dim = inputs, .classes = static_cast<int>(classes)}; }
  /// A freshly initialised model.
  [[nodiscard]] static mlp model() {
    mlp m(inputs, hidden, classes);
    rng init(init_seed);
    m.init(init);
    return m;
  }
};

/// The training and held-out sets for `workers` workers: worker w's shard is samples
/// w · train_per_worker to (w + 1) · train_per_worker − 1 of `train_set`.
struct setup {
  dataset train_set;
  dataset test_set;

  explicit setup(std::size_t workers) {
    data_generator generator(experiment::data());
    train_set = generator.sample(workers * experiment::train_per_worker);
    test_set = generator.sample(experiment::test_samples);
  }
};

/// One worker's minibatch stream: its shard in a fresh random order each epoch.
class batch_stream {
 public:
  /// The stream of worker `w`.
  explicit batch_stream(std::size_t w) : order_(experiment::train_per_worker), rng_(experiment::stream_seed + w) {
    std::iota(order_.begin(), order_.end(), w * experiment::train_per_worker);
    rng_.shuffle(order_);
  }
  /// The sample indices of the next minibatch.
  std::span<const std::size_t> next(std::size_t size) {
    if (cursor_ + size > order_.size()) {
      rng_.shuffle(order_);
      cursor_ = 0;
    }
    cursor_ += size;
    return std::span<const std::size_t>(order_).subspan(cursor_ - size, size);
  }

 private:
  std::vector<std::size_t> order_;
  rng rng_;
  std::size_t cursor_ = 0;
};

/// FNV-1a over the bytes of the parameters: equal hashes mean (practically) equal models.
[[nodiscard]] inline std::uint64_t parameter_hash(std::span<const float> params) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const std::byte b : std::as_bytes(params)) {
    h ^= std::to_integer<std::uint64_t>(b);
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace train
