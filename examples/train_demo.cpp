// gradcomp training demo: four in-process workers train the same small MLP with data-parallel SGD,
// once per codec. Each step, every worker computes the gradient of its own minibatch and
// compresses it; the messages are "all-gathered": decoded in rank order into one sum, averaged,
// and applied as one SGD step (identical on every worker, so one copy of the model is kept). The
// TAGC rows instead reduce-scatter every tensor over an in-process group of threads, as a sharded
// trainer would; the PowerSGD rows all-reduce each tensor's low-rank factors over such a group.
// The table compares what each codec sends with the loss and accuracy it reaches.
//
// Everything is deterministic (fixed seeds; the threads of the TAGC rows sum in rank order): the
// same build prints the same losses and accuracies on every run; only the times vary.
#include <gradcomp/gradcomp.hpp>

#include <fmt/format.h>

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
#include <utility>
#include <vector>

#include "train/codec_table.hpp"
#include "train/compressor.hpp"
#include "train/data.hpp"
#include "train/experiment.hpp"
#include "train/gravac_aggregator.hpp"
#include "train/mlp.hpp"
#include "train/powersgd_aggregator.hpp"
#include "train/ring_aggregator.hpp"
#include "train/sketch_aggregator.hpp"
#include "train/tagc_aggregator.hpp"

namespace {

using train::experiment;
constexpr std::size_t workers = 4;
constexpr std::size_t steps = 300;
constexpr std::size_t batch = experiment::batch, loss_window = experiment::loss_window;
constexpr std::size_t inputs = experiment::inputs, hidden = experiment::hidden, classes = experiment::classes;
constexpr std::size_t train_per_worker = experiment::train_per_worker, test_samples = experiment::test_samples;

// The rows of the table (train/codec_table.hpp), in order; the first row is the baseline the
// others are compared with. Every worker gets its own copy of each codec and its own state.
struct demo_rows {
  std::vector<train::codec_entry> entries;
  void dense(const char* name) { entries.push_back(train::dense_entry(name)); }
  template <class Codec>
  void codec(const char* name, Codec c) {
    entries.push_back(train::make_entry(name, std::move(c)));
  }
  template <class Codec>
  void ring(const char* name, Codec c) {
    entries.push_back(train::ring_entry(name, std::move(c)));
  }
  void sketched_sgd(const char* name, gradcomp::count_sketch<float> sketch) {
    entries.push_back(train::sketched_sgd_entry(name, std::move(sketch)));
  }
  void tagc(const char* name, gradcomp::tagc_params params) { entries.push_back(train::tagc_entry(name, params)); }
  void gravac(const char* name, gradcomp::gravac_options options, std::size_t samples) {
    entries.push_back(train::gravac_entry(name, options, samples));
  }
  void powersgd(const char* name, gradcomp::powersgd_params params) {
    entries.push_back(train::powersgd_entry(name, params));
  }
};

std::vector<train::codec_entry> demo_codecs() {
  demo_rows rows;
  train::visit_codecs(rows, batch);
  return std::move(rows.entries);
}

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
  std::uint64_t hash = 0;  // of the final parameters
};

using train::clock_type;
double micros(clock_type::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

result train_with(const train::codec_entry& entry, const train::setup& data, std::size_t steps_to_run = steps) {
  result r;
  r.name = entry.name;

  train::mlp model = experiment::model();  // the same initial weights for every codec
  const std::size_t n = model.size();

  const auto aggregator = entry.make(model.layout(), workers);
  std::vector<train::batch_stream> streams;
  std::vector<std::vector<float>> grads;
  for (std::size_t w = 0; w < workers; ++w) {
    streams.emplace_back(w);
    grads.emplace_back(n);
  }
  std::vector<float> mean(n);

  std::size_t sent = 0, done = 0, loss_steps = 0;
  double loss_sum = 0;
  train::clock_type::duration encode{}, decode{};
  try {
    for (std::size_t step = 0; step < steps_to_run; ++step) {
      double step_loss = 0;
      for (std::size_t w = 0; w < workers; ++w)
        step_loss += model.gradient(data.train_set, streams[w].next(batch), grads[w]);
      step_loss /= static_cast<double>(workers);
      if (!std::isfinite(step_loss)) {
        r.failure = fmt::format("diverged: the training loss is not finite at step {}", step);
        break;
      }
      if (step + loss_window >= steps_to_run) {
        loss_sum += step_loss;
        ++loss_steps;
      }
      const train::step_cost cost = aggregator->aggregate(grads, mean, step);
      sent += cost.bytes;
      encode += cost.encode;
      decode += cost.decode;
      model.sgd(mean, experiment::learning_rate);
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
  r.hash = train::parameter_hash(model.params());
  return r;
}

std::string relative(double value, double baseline) {
  return fmt::format("{:+.1f}%", 100.0 * (value - baseline) / baseline);
}

// `gradcomp_train_demo --row NAME [--steps S]` trains that row only and prints its final loss and
// parameter hash, which mpi_train reproduces with 4 ranks.
int train_one_row(const std::string& name, std::size_t row_steps, const train::setup& data) {
  for (const train::codec_entry& entry : demo_codecs()) {
    if (entry.name != name) continue;
    const result r = train_with(entry, data, row_steps);
    if (!r.failure.empty()) {
      fmt::print("{}: {}\n", r.name, r.failure);
      return 1;
    }
    fmt::print("{}: {} workers, {} steps, train loss {:.6f}, test accuracy {:.2f}%, parameter hash {:016x}\n", r.name,
               workers, row_steps, r.loss, 100.0 * r.test.accuracy, r.hash);
    return 0;
  }
  fmt::print(stderr, "no row named \"{}\"\n", name);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  const auto started = clock_type::now();
  const train::data_config config = experiment::data();
  const train::setup data(workers);
  if (argc >= 3 && std::string(argv[1]) == "--row")
    return train_one_row(argv[2], argc >= 5 && std::string(argv[3]) == "--steps" ? std::stoul(argv[4]) : steps, data);
  const std::size_t n = train::mlp(inputs, hidden, classes).size();
  const double dense_bytes = static_cast<double>(n * sizeof(float));

  fmt::print("gradcomp training demo: {} workers, MLP {}-{}-{} (ReLU, softmax) = {} parameters in one float32 bucket\n",
             workers, inputs, hidden, classes, n);
  fmt::print(
      "synthetic data: {} classes x {} overlapping Gaussian clusters in {} dimensions, {:.0f}% label noise;\n"
      "{} training samples per worker, {} held out. SGD, lr {}, {} steps of {} samples per worker.\n\n",
      classes, config.clusters_per_class, inputs, 100.0 * config.label_noise, train_per_worker, test_samples,
      experiment::learning_rate, steps, batch);

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
    const std::string acc_vs = failed    ? "-"
                               : is_base ? ""
                                         : fmt::format("{:+.1f} pt", 100.0 * (r.test.accuracy - base.test.accuracy));
    const std::string decode_us = std::isnan(r.decode_us) ? "-" : fmt::format("{:.1f}", r.decode_us);
    fmt::print("{:<{}}  {:>12.0f} {:>7.1f}x {:>10} {:>10} {:>9} {:>9} {:>10.1f} {:>10}\n", r.name, width, r.bytes,
               r.dense_bytes / r.bytes, loss, loss_vs, acc, acc_vs, r.encode_us, decode_us);
    if (failed) fmt::print("{:<{}}  ^ {}\n", "", width, r.failure);
  }
  fmt::print(
      "\nbytes/worker: average bytes each worker sends per step; ratio: what the same aggregation sends\n"
      "uncompressed ({} float32 bytes for an all-gather) / that.\n"
      "train loss: mean minibatch loss over the last {} steps, next to {}'s;\n"
      "test acc: on the {} held-out samples (chance: {:.0f}%), in points next to {}'s.\n"
      "encode µs: one worker compressing its gradient, per step;\n"
      "decode µs: one worker decoding all {} messages into the sum, per step.\n"
      "TAGC rows reduce-scatter each tensor over an in-process group (threads): bytes/worker counts the\n"
      "index, sketch and tail segments a rank contributes; encode µs is one rank's whole collective step\n"
      "(sparsify, index, sketch, peel, and the waiting for the other ranks).\n"
      "Ring rows all-reduce the whole gradient over an in-process ring: bytes/worker counts both phases\n"
      "(2(P-1)/P of the gradient: {:.0f} bytes uncompressed); encode µs is one rank's whole collective.\n"
      "PowerSGD rows all-reduce each tensor's factors (the biases dense) over an in-process group: their\n"
      "ratio is against the same ring all-reduce uncompressed; encode µs is one rank's whole collective.\n",
      n * sizeof(float), loss_window, base.name, test_samples, 100.0 / classes, base.name, workers,
      2.0 * static_cast<double>(workers - 1) / static_cast<double>(workers) * dense_bytes);
  for (const result& r : results)
    if (!r.notes.empty()) fmt::print("\n{}: {}\n", r.name, r.notes);
  fmt::print("\ntotal {:.1f} s\n", std::chrono::duration<double>(clock_type::now() - started).count());
  return 0;
}
