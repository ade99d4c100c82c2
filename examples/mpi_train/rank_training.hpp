#pragma once
// One rank's side of data-parallel training over a transport: each rank computes the gradient of
// its own minibatch, the ranks sum the gradients through `compressed_all_reduce` (or the plain
// all-reduce for the dense baseline), and every rank applies the same mean. After every step the
// ranks compare a hash of their parameters, so a rank that drifts stops the run at once.
//
// The arithmetic is the demo's: the messages are decoded in rank order onto zeros, the sum is
// divided by P in float, and the step's loss is the rank-order sum of the ranks' losses over P. So
// with 4 ranks a row ends with the parameters of the same row of train_demo (`--row`).
#include <gradcomp/gradcomp.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../train/codec_table.hpp"
#include "../train/compressor.hpp"
#include "../train/experiment.hpp"
#include "../train/gravac_aggregator.hpp"
#include "../train/powersgd_aggregator.hpp"
#include "../train/tagc_aggregator.hpp"
#include "timed_transport.hpp"

namespace train {

/// Turns this rank's gradient of one step into the mean over ranks, in place; returns what it cost.
template <class X>
class rank_reducer {
 public:
  rank_reducer() = default;
  rank_reducer(const rank_reducer&) = delete;
  rank_reducer& operator=(const rank_reducer&) = delete;
  virtual ~rank_reducer() = default;
  virtual gradcomp::compressed_report reduce(X& t, std::span<float> grad, std::uint64_t step) = 0;
};

/// The uncompressed baseline: the transport's all-reduce, ranks summed in rank order.
template <class X>
class dense_reducer final : public rank_reducer<X> {
 public:
  gradcomp::compressed_report reduce(X& t, std::span<float> grad, std::uint64_t) override {
    t.all_reduce_sum(grad);
    for (float& v : grad) v /= static_cast<float>(t.size());
    gradcomp::compressed_report report;
    report.dense_bytes = gradcomp::ring_all_reduce_dense_bytes(grad.size_bytes(), static_cast<std::uint64_t>(t.size()));
    report.sent_bytes = report.dense_bytes;
    return report;
  }
};

/// Any gradcomp codec through `compressed_all_reduce`; a stateful codec keeps this rank's state.
template <class X, class Codec>
class codec_reducer final : public rank_reducer<X> {
 public:
  codec_reducer(Codec codec, std::size_t n, gradcomp::all_reduce_plan plan) : codec_(std::move(codec)), plan_(plan) {
    if constexpr (stateful_codec<Codec>) state_ = codec_.make_state(gradcomp::cpu_executor{}, n);
  }
  gradcomp::compressed_report reduce(X& t, std::span<float> grad, std::uint64_t step) override {
    const gradcomp::all_reduce_options options{.key = {.step = step}, .plan = plan_, .average = true};
    const gradcomp::cpu_executor cpu;
    if constexpr (stateful_codec<Codec>) return gradcomp::compressed_all_reduce(cpu, t, codec_, state_, grad, options);
    else
      return gradcomp::compressed_all_reduce(cpu, t, codec_, grad, options);
  }

 private:
  Codec codec_;
  gradcomp::all_reduce_plan plan_;
  [[no_unique_address]] typename detail::state_of<Codec>::type state_{};
};

/// TAGC: every tensor reduce-scattered as in the demo (tagc_rank_step), then the shards of the
/// mean all-gathered into the whole gradient (a sharded trainer's parameter all-gather, not
/// counted as gradient bytes, as in the demo). Its dense baseline is an uncompressed ring
/// reduce-scatter: (P − 1) shards of each (padded) tensor.
template <class X>
class tagc_reducer final : public rank_reducer<X> {
 public:
  tagc_reducer(const gradcomp::tagc_params& params, const std::vector<parameter>& layout)
      : tagc_(params),
        state_(tagc_.make_state(gradcomp::cpu_executor{})),
        layout_(layout),
        compressed_(tagc_compressed_tensors(gradcomp::tagc_layer_policy(), layout)) {}

  gradcomp::compressed_report reduce(X& t, std::span<float> grad, std::uint64_t) override {
    const auto P = static_cast<std::size_t>(t.size());
    gradcomp::compressed_report report;
    report.sent_bytes = tagc_rank_all_reduce(t, tagc_, state_, layout_, compressed_, grad);
    for (const parameter& p : layout_) report.dense_bytes += (p.size() + P - 1) / P * (P - 1) * sizeof(float);
    return report;
  }

 private:
  gradcomp::tagc<float> tagc_;
  gradcomp::tagc_state<float, gradcomp::cpu_executor> state_;
  std::vector<parameter> layout_;
  std::vector<bool> compressed_;
};

/// PowerSGD: every tensor through gradcomp's PowerSGD all-reduce, a state per tensor, as in the
/// demo (powersgd_rank_all_reduce). Its reports count ring all-reduces, the dense baseline too.
template <class X>
class powersgd_reducer final : public rank_reducer<X> {
 public:
  powersgd_reducer(const gradcomp::powersgd_params& params, const std::vector<parameter>& layout)
      : scheme_(params), layout_(layout), states_(layout.size()) {}

  gradcomp::compressed_report reduce(X& t, std::span<float> grad, std::uint64_t step) override {
    return powersgd_rank_all_reduce(t, scheme_, states_, layout_, grad, step);
  }

 private:
  gradcomp::powersgd<float> scheme_;
  std::vector<parameter> layout_;
  std::vector<gradcomp::powersgd_state<float>> states_;
};

/// Sketched SGD (the demo's sketched_sgd_aggregator, one worker per rank): the count sketch of
/// a = g + e is all-gathered and the sketches summed in rank order (`accumulate_encoded`), every
/// rank takes the same heavy hitters of the sum, and the ranks' exact values of a there are
/// all-gathered and summed in rank order; what was sent leaves the residual e = a.
template <class X>
class sketched_sgd_reducer final : public rank_reducer<X> {
 public:
  sketched_sgd_reducer(gradcomp::count_sketch<float> sketch, std::size_t n)
      : sketch_(std::move(sketch)),
        workspace_(sketch_.workspace_bytes(cpu_, n)),
        compensated_(n, 0.0f),
        message_(sketch_.max_encoded_bytes(n)),
        indices_(static_cast<std::size_t>(sketch_.heavy_hitter_count(n))),
        values_(indices_.size()) {}

  gradcomp::compressed_report reduce(X& t, std::span<float> grad, std::uint64_t) override {
    const auto P = static_cast<std::size_t>(t.size());
    auto& a = compensated_;  // holds e on entry
    std::transform(grad.begin(), grad.end(), a.begin(), a.begin(), std::plus<>());
    // One fixed key: the hashes depend on the seed only, and accumulate_encoded needs equal keys.
    const std::size_t bytes =
        sketch_.encode(cpu_, std::span<const float>(a), std::span<std::byte>(message_),
                       std::span<std::byte>(workspace_), gradcomp::message_key{.step = 0, .tensor_id = 0});
    std::vector<std::vector<std::byte>> sketches =
        t.all_gather_bytes(std::span<const std::byte>(message_).first(bytes));
    for (std::size_t r = 1; r < P; ++r) sketch_.accumulate_encoded(cpu_, sketches[0], sketches[r]);
    const std::size_t k = sketch_.heavy_hitters(cpu_, sketches[0], grad.size(), indices_, workspace_);
    const auto chosen = std::span<const std::uint64_t>(indices_).first(k);
    gradcomp::gather_values(std::span<const float>(a), chosen, std::span<float>(values_).first(k));
    for (const std::uint64_t i : chosen) a[i] = 0.0f;
    const auto exact = t.all_gather_bytes(std::as_bytes(std::span<const float>(values_).first(k)));
    std::fill(grad.begin(), grad.end(), 0.0f);
    for (std::size_t m = 0; m < k; ++m) {
      float sum = 0.0f;
      for (const auto& values : exact) {
        float v;
        std::memcpy(&v, values.data() + m * sizeof(float), sizeof v);
        sum += v;
      }
      grad[chosen[m]] = sum / static_cast<float>(P);
    }
    gradcomp::compressed_report report;
    report.sent_bytes = (bytes + k * sizeof(float)) * (P - 1);
    report.dense_bytes = gradcomp::ring_all_reduce_dense_bytes(grad.size_bytes(), P);
    return report;
  }

 private:
  gradcomp::cpu_executor cpu_;
  gradcomp::count_sketch<float> sketch_;
  std::vector<std::byte> workspace_;
  std::vector<float> compensated_;  // the residual e, then a = g + e
  std::vector<std::byte> message_;
  std::vector<std::uint64_t> indices_;
  std::vector<float> values_;
};

/// GraVAC-controlled top-k with EF (the demo's gravac_aggregator, one worker per rank): this rank
/// compresses both paths, sends the decided one through `compressed_all_reduce` (the dense
/// gradient through the plain all-reduce), keeps the residuals the decision names, and feeds its
/// controller the ranks' `aggregate_observation`, so every rank's controller decides alike. The
/// step time is the demo's link model of the largest message.
template <class X>
class gravac_reducer final : public rank_reducer<X> {
 public:
  gravac_reducer(const gradcomp::gravac_options& options, std::vector<parameter> layout, std::size_t batch)
      : controller_(options),
        layout_(std::move(layout)),
        batch_(batch),
        residual_current_(total_size(layout_), 0.0f),
        residual_safe_(residual_current_.size(), 0.0f),
        compensated_current_(residual_current_.size()),
        compensated_safe_(residual_current_.size()),
        decoded_current_(residual_current_.size()),
        decoded_safe_(residual_current_.size()) {}

  gradcomp::compressed_report reduce(X& t, std::span<float> grad, std::uint64_t step) override {
    const auto P = static_cast<std::size_t>(t.size());
    const gradcomp::gravac_decision d = controller_.decision();
    const gradcomp::topk_sparsifier<float> current(d.current), safe(d.safe);
    const std::size_t safe_bytes =
        compress_path(safe, grad, residual_safe_, compensated_safe_, decoded_safe_, message_, workspace_);
    std::size_t current_bytes = safe_bytes;
    if (d.current.density == d.safe.density) {  // the candidate is not computed
      compensated_current_ = compensated_safe_;
      decoded_current_ = decoded_safe_;
    } else {
      current_bytes =
          compress_path(current, grad, residual_current_, compensated_current_, decoded_current_, message_, workspace_);
    }
    gradcomp::gravac_observation observed{};
    observed.gradient = gravac_magnitude(controller_, layout_, grad);
    observed.current = gravac_magnitude(controller_, layout_, decoded_current_);
    observed.safe = gravac_magnitude(controller_, layout_, decoded_safe_);
    if (d.update_current_residual) keep_error(grad, residual_current_, decoded_current_);
    if (d.update_safe_residual) keep_error(grad, residual_safe_, decoded_safe_);

    gradcomp::compressed_report report;
    report.dense_bytes = gradcomp::ring_all_reduce_dense_bytes(grad.size_bytes(), P);
    std::size_t bytes = grad.size_bytes();
    if (d.send == gradcomp::gravac_choice::dense) {
      t.all_reduce_sum(grad);
      report.sent_bytes = report.dense_bytes;
    } else {
      const bool send_current = d.send == gradcomp::gravac_choice::current;
      bytes = send_current ? current_bytes : safe_bytes;
      // The sum of the ranks' decoded messages in rank order, as the demo adds them.
      std::vector<float>& sum = send_current ? compensated_current_ : compensated_safe_;
      const gradcomp::all_reduce_options options{.key = {.step = step},
                                                 .plan = gradcomp::all_reduce_plan::gather_decode};
      report = gradcomp::compressed_all_reduce(gradcomp::cpu_executor{}, t, send_current ? current : safe,
                                               std::span<float>(sum), options);
      std::copy(sum.begin(), sum.end(), grad.begin());
    }
    for (float& v : grad) v /= static_cast<float>(P);
    observed.samples = batch_;
    observed.seconds = link_.seconds(bytes, P);
    controller_.next(gradcomp::aggregate_observation(t, observed));
    return report;
  }

 private:
  gradcomp::gravac_controller controller_;
  std::vector<parameter> layout_;
  std::size_t batch_;
  link_model link_;
  std::vector<float> residual_current_, residual_safe_;
  std::vector<float> compensated_current_, compensated_safe_, decoded_current_, decoded_safe_;
  std::vector<std::byte> message_, workspace_;
};

/// A row of mpi_train: a name and a factory of this rank's reducer for the model's parameter
/// layout (empty for a ring row over a transport without point-to-point calls, which mpi_train
/// lists but does not run).
template <class X>
struct rank_row {
  std::string name;
  std::function<std::unique_ptr<rank_reducer<X>>(const std::vector<parameter>& layout)> make;
};

/// Collects the rows of train/codec_table.hpp that run over a transport.
template <class X>
struct rank_rows {
  std::vector<rank_row<X>> rows;
  void dense(const char* name) {
    rows.push_back({name, [](const std::vector<parameter>&) -> std::unique_ptr<rank_reducer<X>> {
                      return std::make_unique<dense_reducer<X>>();
                    }});
  }
  template <class Codec>
  void codec(const char* name, Codec c) {
    rows.push_back({name, [c](const std::vector<parameter>& layout) -> std::unique_ptr<rank_reducer<X>> {
                      return std::make_unique<codec_reducer<X, Codec>>(c, total_size(layout),
                                                                       gradcomp::all_reduce_plan::gather_decode);
                    }});
  }
  template <class Codec>
  void ring(const char* name, Codec c) {
    if constexpr (gradcomp::transport_with_point_to_point<X>)
      rows.push_back({name, [c](const std::vector<parameter>& layout) -> std::unique_ptr<rank_reducer<X>> {
                        return std::make_unique<codec_reducer<X, Codec>>(c, total_size(layout),
                                                                         gradcomp::all_reduce_plan::ring);
                      }});
    else
      rows.push_back({name, {}});
  }
  void sketched_sgd(const char* name, const gradcomp::count_sketch<float>& sketch) {
    rows.push_back({name, [sketch](const std::vector<parameter>& layout) -> std::unique_ptr<rank_reducer<X>> {
                      return std::make_unique<sketched_sgd_reducer<X>>(sketch, total_size(layout));
                    }});
  }
  void tagc(const char* name, const gradcomp::tagc_params& params) {
    rows.push_back({name, [params](const std::vector<parameter>& layout) -> std::unique_ptr<rank_reducer<X>> {
                      return std::make_unique<tagc_reducer<X>>(params, layout);
                    }});
  }
  void gravac(const char* name, const gradcomp::gravac_options& options, std::size_t batch) {
    rows.push_back({name, [options, batch](const std::vector<parameter>& layout) -> std::unique_ptr<rank_reducer<X>> {
                      return std::make_unique<gravac_reducer<X>>(options, layout, batch);
                    }});
  }
  void powersgd(const char* name, const gradcomp::powersgd_params& params) {
    rows.push_back({name, [params](const std::vector<parameter>& layout) -> std::unique_ptr<rank_reducer<X>> {
                      return std::make_unique<powersgd_reducer<X>>(params, layout);
                    }});
  }
};

/// The rows, in the demo's order.
template <class X>
std::vector<rank_row<X>> all_rank_rows() {
  rank_rows<X> collected;
  visit_codecs(collected, experiment::batch);
  return std::move(collected.rows);
}

/// What one rank measured for one row.
struct rank_result {
  std::string name;
  std::size_t steps = 0;           ///< Steps completed.
  double loss = 0.0;               ///< Mean training loss over the last `loss_window` steps.
  evaluation test;                 ///< Held-out loss and accuracy of the final model.
  double sent_bytes = 0.0;         ///< Per rank per step.
  double dense_bytes = 0.0;        ///< Per rank per step, an uncompressed ring all-reduce.
  double compute_us = 0.0;         ///< Per step: the all-reduce's CPU time outside the transport (encode, decode).
  std::uint64_t hash = 0;          ///< Of the final parameters.
  std::string failure;             ///< Empty unless the run stopped early.
};

/// Options of a run.
struct run_options {
  std::size_t steps = 300;
  std::size_t log_every = 0;  ///< Print every k-th step's loss and bytes (0: none).
};

/// Trains one row on this rank; every rank returns the same result except for the timings.
template <gradcomp::transport Inner>
rank_result train_row(Inner& inner, const rank_row<timed_transport<Inner>>& row, const setup& data,
                      const run_options& options) {
  using X = timed_transport<Inner>;
  X t(inner);
  rank_result r;
  r.name = row.name;
  const int P = t.size();
  mlp model = experiment::model();
  const std::size_t n = model.size();
  const auto reducer = row.make(model.layout());
  batch_stream stream(static_cast<std::size_t>(t.rank()));
  std::vector<float> grad(n);
  double loss_sum = 0.0, sent = 0.0, dense = 0.0;
  std::size_t loss_steps = 0;
  typename X::clock::duration busy{};
  try {
    for (std::size_t step = 0; step < options.steps; ++step) {
      std::array<double, 1> loss{model.gradient(data.train_set, stream.next(experiment::batch), grad)};
      t.all_reduce_sum(std::span<double>(loss));
      const double step_loss = loss[0] / static_cast<double>(P);
      if (!std::isfinite(step_loss)) {
        r.failure = fmt::format("diverged: the training loss is not finite at step {}", step);
        break;
      }
      if (step + experiment::loss_window >= options.steps) {
        loss_sum += step_loss;
        ++loss_steps;
      }
      const auto before = t.communication();
      const auto started = X::clock::now();
      const auto report = reducer->reduce(t, grad, step);
      busy += (X::clock::now() - started) - (t.communication() - before);
      model.sgd(grad, experiment::learning_rate);
      sent += static_cast<double>(report.sent_bytes);
      dense += static_cast<double>(report.dense_bytes);
      r.steps = step + 1;
      // Every rank must hold the same parameters after every step.
      std::array<std::byte, 8> mine{};
      const std::uint64_t h = parameter_hash(model.params());
      std::memcpy(mine.data(), &h, sizeof h);
      for (const auto& other : t.all_gather_bytes(mine))
        if (other.size() != mine.size() || std::memcmp(other.data(), mine.data(), mine.size()) != 0)
          throw gradcomp::error(gradcomp::errc::parameter_mismatch,
                                fmt::format("the ranks' parameters differ after step {}", step));
      if (options.log_every != 0 && step % options.log_every == 0 && t.rank() == 0)
        fmt::print("  [{}] step {:4} loss {:.4f} bytes sent by rank 0 {}\n", row.name, step, step_loss,
                   report.sent_bytes);
    }
  } catch (const gradcomp::error& e) {
    r.failure = fmt::format("stopped at step {}: {}", r.steps, e.what());
  }
  if (r.steps > 0) {
    const auto steps = static_cast<double>(r.steps);
    r.sent_bytes = sent / steps;
    r.dense_bytes = dense / steps;
    r.compute_us = std::chrono::duration<double, std::micro>(busy).count() / steps;
  }
  r.loss = r.failure.empty() && loss_steps > 0 ? loss_sum / static_cast<double>(loss_steps)
                                               : std::numeric_limits<double>::quiet_NaN();
  r.test = model.evaluate(data.test_set);
  r.hash = parameter_hash(model.params());
  return r;
}

/// Modelled time of one step's all-reduce on a link of `gbit_per_s`: the bytes this rank sends
/// (2(P − 1)/P of the message for a ring all-reduce) over the link, plus the measured compute time.
[[nodiscard]] inline double modelled_seconds(double bytes, double compute_us, double gbit_per_s) {
  return bytes * 8.0 / (gbit_per_s * 1e9) + compute_us * 1e-6;
}

/// Prints the summary table of `results` (the first row is the baseline, normally dense).
inline void print_summary(const std::vector<rank_result>& results, int ranks, double max_loss_gap_percent) {
  if (results.empty()) return;
  const rank_result& base = results.front();
  std::size_t width = 5;
  for (const auto& r : results) width = std::max(width, r.name.size());
  fmt::print("\n{:<{}}  {:>10} {:>7} {:>10} {:>9} {:>8} {:>10} {:>9} {:>10}\n", "codec", width, "bytes/step", "ratio",
             "train loss", "vs " + base.name, "test acc", "compute µs", "10 Gb/s", "100 Gb/s");
  for (const auto& r : results) {
    if (!r.failure.empty()) {
      fmt::print("{:<{}}  {}\n", r.name, width, r.failure);
      continue;
    }
    // One rank sends nothing: no ratio and no speedup to show.
    const auto ratio = [&](double a, double b) { return r.dense_bytes > 0.0 ? fmt::format("{:.2f}x", a / b) : "-"; };
    const auto speedup = [&](double gbit) {
      return ratio(modelled_seconds(r.dense_bytes, 0.0, gbit), modelled_seconds(r.sent_bytes, r.compute_us, gbit));
    };
    fmt::print("{:<{}}  {:>10.0f} {:>7} {:>10.4f} {:>+8.1f}% {:>7.1f}% {:>10.1f} {:>9} {:>10}\n", r.name, width,
               r.sent_bytes, ratio(r.dense_bytes, r.sent_bytes), r.loss, 100.0 * (r.loss - base.loss) / base.loss,
               100.0 * r.test.accuracy, r.compute_us, speedup(10.0), speedup(100.0));
  }
  fmt::print(
      "\nbytes/step: bytes each rank sends per step (a ring schedule: an all-gathered message counts\n"
      "P - 1 = {} times). ratio: what the uncompressed collective sends over that: a ring all-reduce,\n"
      "2(P-1)/P of the gradient (TAGC rows: a ring reduce-scatter, (P-1)/P; the shards' all-gather is not\n"
      "counted). compute µs: rank 0's CPU time per step inside the collective but outside the transport's\n"
      "calls (encoding, decoding). 10 / 100 Gb/s: modelled speedup of the step's communication over the\n"
      "uncompressed collective, t = bytes / bandwidth + compute.\n",
      ranks - 1);
  for (const auto& r : results)
    if (r.failure.empty()) fmt::print("final parameter hash [{}] {:016x}\n", r.name, r.hash);
  if (max_loss_gap_percent > 0.0)
    for (const auto& r : results)
      if (&r != &base && (!r.failure.empty() || !(r.loss <= base.loss * (1.0 + max_loss_gap_percent / 100.0))))
        fmt::print("loss gap exceeded: [{}] ends more than {}% above [{}]\n", r.name, max_loss_gap_percent, base.name);
}

}  // namespace train
