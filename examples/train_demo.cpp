// gradcomp training demo: four in-process workers train the same small MLP with data-parallel SGD,
// once per codec. Each step, every worker computes the gradient of its own minibatch and
// compresses it; the messages are "all-gathered": decoded in rank order into one sum, averaged,
// and applied as one SGD step (identical on every worker, so one copy of the model is kept). The
// TAGC rows instead reduce-scatter every tensor over an in-process group of threads, as a sharded
// trainer would. The table compares what each codec sends with the loss and accuracy it reaches.
//
// Everything is deterministic (fixed seeds; the threads of the TAGC rows sum in rank order): the
// same build prints the same losses and accuracies on every run; only the times vary.
#include <gradcomp/gradcomp.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "train/compressor.hpp"
#include "train/data.hpp"
#include "train/gravac_aggregator.hpp"
#include "train/mlp.hpp"
#include "train/ring_aggregator.hpp"
#include "train/sketch_aggregator.hpp"
#include "train/tagc_aggregator.hpp"

namespace {

constexpr std::size_t workers = 4;
constexpr std::size_t steps = 300;
constexpr std::size_t batch = 64;        // samples per worker per step
constexpr std::size_t loss_window = 20;  // final training loss: mean over the last steps
constexpr float learning_rate = 0.3f;
constexpr std::size_t inputs = 64, hidden = 128, classes = 10;
constexpr std::size_t train_per_worker = 4096, test_samples = 4096;

// The rows of the table, in order; the first row is the baseline the others are compared with.
// Each row is one line: train::make_entry(name, codec) accepts any gradcomp codec, stateless
// (encode(cpu, grad, out, ws, key)) or stateful (make_state(cpu, n), then
// encode(cpu, grad, state, out, ws, key)); every worker gets its own copy of the codec and state.
std::vector<train::codec_entry> demo_codecs() {
  using namespace gradcomp;
  const sparsity one_percent{.density = 0.01};
  return {
      train::dense_entry("dense"),
      train::make_entry("top-k 1%", topk_sparsifier<float>(one_percent)),
      train::make_entry("top-k 1% + EF", error_feedback(topk_sparsifier<float>(one_percent))),
      // Unscaled: under EF the n/k scaling of unbiased random-k only inflates the residual.
      train::make_entry("random-k 1% + EF",
                        error_feedback(randomk_sparsifier<float>({.amount = one_percent, .seed = 7, .scaled = false}))),
      train::make_entry("threshold 1% + EF", error_feedback(threshold_sparsifier<float>({.target = one_percent}))),
      train::make_entry("uniform 4-bit", uniform_quantizer<float>({.bits = 4})),
      train::make_entry("uniform 4-bit + LoCo", loco(uniform_quantizer<float>({.bits = 4}))),
      train::make_entry("uniform 2-bit", uniform_quantizer<float>({.bits = 2})),
      train::make_entry("uniform 2-bit + LoCo", loco(uniform_quantizer<float>({.bits = 2}))),
      train::make_entry("sign + EF", error_feedback(sign_quantizer<float>())),
      train::make_entry("top-k 1% + 8-bit values + EF",
                        error_feedback(pipeline(topk_sparsifier<float>(one_percent), uniform_quantizer<float>({.bits = 8})))),
      train::make_entry("QSGD 7 levels", qsgd_quantizer<float>({.levels = 7, .seed = 5})),
      train::make_entry("uniform 4-bit SR + EF",
                        error_feedback(uniform_quantizer<float>({.bits = 4, .round = rounding::stochastic, .seed = 3}))),
      // Sketched SGD: 3 x 512 sketches choose the 5% heavy hitters of the sum, whose exact values
      // travel in a second round; EF keeps the rest.
      train::sketched_sgd_entry("count sketch 3x512 + 5% exact + EF",
                                count_sketch<float>({.rows = 3, .columns = 512, .seed = 11,
                                                     .heavy_hitters = {.density = 0.05}})),
      // Sharded: each tensor reduce-scattered; the weights through TAGC (the biases dense, by TAGC's
      // layer policy). Blocks of 128 suit the demo's 2048-value shards.
      train::tagc_entry("TAGC f*=0.80 (sharded)", tagc_params{.sparsify = {.zero_fraction = 0.80},
                                                              .sketch = {.block = 128}}),
      train::tagc_entry("TAGC f*=0.95 (sharded)", tagc_params{.sparsify = {.zero_fraction = 0.95},
                                                              .sketch = {.block = 128}}),
      // The hybrid scheme's float codecs: ZFP fixed rate (8 bits per value) all-gathered (each
      // gradient encoded once), and the ring all-reduce (decode, add, re-encode at every hop) with
      // MPC (lossless) and ZFP (the error of P encodings per chunk).
      train::make_entry("ZFP R=8", zfp_fixed_rate_codec(zfp_params{.rate_bits = 8})),
      train::ring_entry("MPC ring all-reduce (lossless)", mpc_codec()),
      train::ring_entry("ZFP R=8 ring all-reduce", zfp_fixed_rate_codec(zfp_params{.rate_bits = 8})),
      // GraVAC searches top-k densities from 10% down to 0.1%, one window of 20 steps each, and
      // sends the most aggressive one whose gain (‖C(g)‖ / ‖g‖, EWMA) stays above 0.75. Both
      // paths keep their residuals every step (the reference's choice): with `sent_path_only`
      // a candidate that was never sent has no residual, its gain stays below 0.75 on this
      // model, and the run sends θ_min throughout (7.5x).
      train::gravac_entry("GraVAC top-k 10%..0.1% + EF",
                          gravac_options{.theta_min = 0.1, .theta_max = 0.001, .window = 20,
                                         .feedback = gravac_feedback::both_paths},
                          batch),
  };
}

struct setup {
  train::dataset train_set;  // worker w's shard: samples w * train_per_worker to (w + 1) * train_per_worker - 1
  train::dataset test_set;
};

struct result {
  std::string name;
  double bytes = 0;        // per worker per step
  double loss = 0;         // mean training loss over the last loss_window steps
  train::evaluation test;  // held-out loss and accuracy
  double encode_us = 0;    // per worker per step
  double decode_us = 0;    // per step: one worker decoding all `workers` messages (NaN: inside encode)
  std::string failure;     // empty unless the run stopped early
  std::string notes;       // what the row's aggregator reports after the table
  double dense_bytes = 0;  // per worker per step, the same aggregation uncompressed
};

using train::clock_type;
double micros(clock_type::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

// One worker's minibatch stream: its shard in a fresh random order each epoch.
class batch_stream {
 public:
  batch_stream(std::size_t first, std::size_t count, std::uint64_t seed) : order_(count), rng_(seed) {
    std::iota(order_.begin(), order_.end(), first);
    rng_.shuffle(order_);
  }
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
  train::rng rng_;
  std::size_t cursor_ = 0;
};

result train_with(const train::codec_entry& entry, const setup& data) {
  result r;
  r.name = entry.name;

  train::mlp model(inputs, hidden, classes);
  train::rng init(42);
  model.init(init);  // the same initial weights for every codec
  const std::size_t n = model.size();

  const auto aggregator = entry.make(model.layout(), workers);
  std::vector<batch_stream> streams;
  std::vector<std::vector<float>> grads;
  for (std::size_t w = 0; w < workers; ++w) {
    streams.emplace_back(w * train_per_worker, train_per_worker, 1000 + w);
    grads.emplace_back(n);
  }
  std::vector<float> mean(n);

  std::size_t sent = 0, done = 0, loss_steps = 0;
  double loss_sum = 0;
  train::clock_type::duration encode{}, decode{};
  try {
    for (std::size_t step = 0; step < steps; ++step) {
      double step_loss = 0;
      for (std::size_t w = 0; w < workers; ++w)
        step_loss += model.gradient(data.train_set, streams[w].next(batch), grads[w]);
      step_loss /= static_cast<double>(workers);
      if (!std::isfinite(step_loss)) {
        r.failure = fmt::format("diverged: the training loss is not finite at step {}", step);
        break;
      }
      if (step + loss_window >= steps) {
        loss_sum += step_loss;
        ++loss_steps;
      }
      const train::step_cost cost = aggregator->aggregate(grads, mean, step);
      sent += cost.bytes;
      encode += cost.encode;
      decode += cost.decode;
      model.sgd(mean, learning_rate);
      done = step + 1;
    }
  } catch (const gradcomp::error& e) {
    r.failure = fmt::format("stopped at step {}: {}", done, e.what());
  }

  if (done > 0) {
    r.bytes = static_cast<double>(sent) / static_cast<double>(done * workers);
    r.encode_us = micros(encode) / static_cast<double>(done * workers);
    r.decode_us = aggregator->times_decode() ? micros(decode) / static_cast<double>(done)
                                             : std::numeric_limits<double>::quiet_NaN();
  }
  r.loss = r.failure.empty() ? loss_sum / static_cast<double>(loss_steps) : std::numeric_limits<double>::quiet_NaN();
  r.test = model.evaluate(data.test_set);
  r.notes = aggregator->notes();
  r.dense_bytes = aggregator->dense_bytes(n);
  return r;
}

std::string relative(double value, double baseline) {
  return fmt::format("{:+.1f}%", 100.0 * (value - baseline) / baseline);
}

}  // namespace

int main() {
  const auto started = clock_type::now();
  const train::data_config config{.dim = inputs, .classes = static_cast<int>(classes)};
  train::data_generator generator(config);
  const setup data{.train_set = generator.sample(workers * train_per_worker),
                   .test_set = generator.sample(test_samples)};
  const std::size_t n = train::mlp(inputs, hidden, classes).size();
  const double dense_bytes = static_cast<double>(n * sizeof(float));

  fmt::print("gradcomp training demo: {} workers, MLP {}-{}-{} (ReLU, softmax) = {} parameters in one float32 bucket\n",
             workers, inputs, hidden, classes, n);
  fmt::print("synthetic data: {} classes x {} overlapping Gaussian clusters in {} dimensions, {:.0f}% label noise;\n"
             "{} training samples per worker, {} held out. SGD, lr {}, {} steps of {} samples per worker.\n\n",
             classes, config.clusters_per_class, inputs, 100.0 * config.label_noise, train_per_worker, test_samples,
             learning_rate, steps, batch);

  std::vector<result> results;
  for (const train::codec_entry& entry : demo_codecs()) results.push_back(train_with(entry, data));
  const result& base = results.front();

  std::size_t width = 5;  // the name column fits the longest name
  for (const result& r : results) width = std::max(width, r.name.size());
  fmt::print("{:<{}}  {:>12} {:>8} {:>10} {:>10} {:>9} {:>9} {:>10} {:>10}\n", "codec", width, "bytes/worker", "ratio",
             "train loss", "vs " + base.name, "test acc", "vs " + base.name, "encode µs", "decode µs");
  for (const result& r : results) {
    const bool is_base = &r == &base, failed = !r.failure.empty();
    const std::string loss = failed ? "-" : fmt::format("{:.4f}", r.loss);
    const std::string loss_vs = failed ? "-" : is_base ? "" : relative(r.loss, base.loss);
    const std::string acc = failed ? "-" : fmt::format("{:.1f}%", 100.0 * r.test.accuracy);
    const std::string acc_vs =
        failed ? "-" : is_base ? "" : fmt::format("{:+.1f} pt", 100.0 * (r.test.accuracy - base.test.accuracy));
    const std::string decode_us = std::isnan(r.decode_us) ? "-" : fmt::format("{:.1f}", r.decode_us);
    fmt::print("{:<{}}  {:>12.0f} {:>7.1f}x {:>10} {:>10} {:>9} {:>9} {:>10.1f} {:>10}\n", r.name, width, r.bytes,
               r.dense_bytes / r.bytes, loss, loss_vs, acc, acc_vs, r.encode_us, decode_us);
    if (failed) fmt::print("{:<{}}  ^ {}\n", "", width, r.failure);
  }
  fmt::print("\nbytes/worker: average bytes each worker sends per step; ratio: what the same aggregation sends\n"
             "uncompressed ({} float32 bytes for an all-gather) / that.\n"
             "train loss: mean minibatch loss over the last {} steps, next to {}'s;\n"
             "test acc: on the {} held-out samples (chance: {:.0f}%), in points next to {}'s.\n"
             "encode µs: one worker compressing its gradient, per step;\n"
             "decode µs: one worker decoding all {} messages into the sum, per step.\n"
             "TAGC rows reduce-scatter each tensor over an in-process group (threads): bytes/worker counts the\n"
             "index, sketch and tail segments a rank contributes; encode µs is one rank's whole collective step\n"
             "(sparsify, index, sketch, peel, and the waiting for the other ranks).\n"
             "Ring rows all-reduce the whole gradient over an in-process ring: bytes/worker counts both phases\n"
             "(2(P-1)/P of the gradient: {:.0f} bytes uncompressed); encode µs is one rank's whole collective.\n",
             n * sizeof(float), loss_window, base.name, test_samples, 100.0 / classes, base.name, workers,
             2.0 * static_cast<double>(workers - 1) / static_cast<double>(workers) * dense_bytes);
  for (const result& r : results)
    if (!r.notes.empty()) fmt::print("\n{}: {}\n", r.name, r.notes);
  fmt::print("\ntotal {:.1f} s\n", std::chrono::duration<double>(clock_type::now() - started).count());
  return 0;
}
