#pragma once
// The training demo's view of a gradient codec. Each row of the table is a `codec_entry`, which
// makes an `aggregator`: what turns the workers' gradients of one step into the mean gradient they
// all apply. Codecs aggregate as an all-gather (`gather_aggregator`): one type-erased `compressor`
// per worker (wrappers such as error feedback keep per-worker state) encodes, and every message is
// decoded in rank order into the sum. Collective schemes (TAGC) bring their own aggregator.
//
// `make_entry(name, codec)` turns any gradcomp codec into an entry. It handles both shapes:
//   stateless:  codec.encode(cpu, grad, out, ws, key)
//   stateful:   state = codec.make_state(cpu, n);  codec.encode(cpu, grad, state, out, ws, key)
// (detected by whether `codec.make_state(cpu, n)` compiles); in both cases the receiver calls
// codec.decode_accumulate(cpu, message, acc, ws), and the buffers are sized with
// codec.max_encoded_bytes(n) and codec.workspace_bytes(cpu, n).
#include <gradcomp/gradcomp.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "mlp.hpp"

namespace train {

/// One worker's gradient compressor. `compress` may update per-worker state (error feedback);
/// `decompress_accumulate` adds a decoded message (from any worker) into `acc`.
class compressor {
 public:
  compressor() = default;
  compressor(const compressor&) = delete;
  compressor& operator=(const compressor&) = delete;
  virtual ~compressor() = default;

  /// Largest message `compress` writes for an n-element gradient.
  [[nodiscard]] virtual std::size_t max_bytes(std::size_t n) const = 0;
  /// Writes the message for `grad` into `out` (at least max_bytes(grad.size()) bytes); returns its size.
  virtual std::size_t compress(std::span<const float> grad, std::span<std::byte> out, std::uint64_t step) = 0;
  /// acc += decode(message).
  virtual void decompress_accumulate(std::span<const std::byte> message, std::span<float> acc) = 0;
};

using clock_type = std::chrono::steady_clock;

/// What aggregating one step cost.
struct step_cost {
  std::size_t bytes = 0;              ///< Bytes sent by all workers together.
  clock_type::duration encode{};      ///< Encoding time summed over the workers.
  clock_type::duration decode{};      ///< Decoding time of one worker (every worker decodes alike).
};

/// Turns the workers' gradients of one step into the mean gradient that all of them apply.
class aggregator {
 public:
  aggregator() = default;
  aggregator(const aggregator&) = delete;
  aggregator& operator=(const aggregator&) = delete;
  virtual ~aggregator() = default;

  /// Writes the mean of the (compressed) gradients `grads`, one per worker, into `mean`.
  virtual step_cost aggregate(const std::vector<std::vector<float>>& grads, std::span<float> mean,
                              std::uint64_t step) = 0;

  /// False when decoding happens inside a collective and is counted as encoding time.
  [[nodiscard]] virtual bool times_decode() const { return true; }

  /// What the demo prints about this row after the table (empty: nothing).
  [[nodiscard]] virtual std::string notes() const { return {}; }

  /// Bytes a worker sends per step when the same aggregation runs uncompressed, for `n` float32
  /// values: the whole gradient once (an all-gather), unless the aggregation moves more.
  [[nodiscard]] virtual double dense_bytes(std::size_t n) const { return static_cast<double>(n * sizeof(float)); }
};

/// One step of an aggregator whose workers are ranks of `group`: `reduce(t, mine)` turns `mine`, a
/// copy of the rank's gradient, into the all-reduced result and returns its report; then, one rank
/// at a time, `done(rank, mine, report)` (rank 0 writes the mean), and the step's cost adds every
/// rank's bytes and time in the collective.
template <class Reduce, class Done>
step_cost group_step(gradcomp::in_process_group& group, const std::vector<std::vector<float>>& grads, Reduce reduce,
                     Done done) {
  step_cost cost;
  std::mutex mutex;
  group.run([&](gradcomp::in_process_transport& t) {
    const auto r = static_cast<std::size_t>(t.rank());
    std::vector<float> mine = grads[r];
    const auto started = clock_type::now();
    const gradcomp::compressed_report report = reduce(t, mine);
    const auto elapsed = clock_type::now() - started;
    const std::lock_guard lock(mutex);
    cost.bytes += report.sent_bytes;
    cost.encode += elapsed;
    done(r, mine, report);
  });
  return cost;
}

/// A row of the demo: a name and a factory of its aggregator, given the model's parameter layout
/// (n = the sum of the parameter sizes) and the number of workers.
struct codec_entry {
  std::string name;
  std::function<std::unique_ptr<aggregator>(const std::vector<parameter>& layout, std::size_t workers)> make;
};

/// The all-gather of compressed messages: every worker encodes its gradient; every message is then
/// decoded in rank order into one sum (worker 0 does it here on behalf of all, who would get the
/// same bits), which is divided by the number of workers.
class gather_aggregator final : public aggregator {
 public:
  /// `make(n)` builds one worker's compressor.
  gather_aggregator(const std::function<std::unique_ptr<compressor>(std::size_t)>& make, std::size_t n,
                    std::size_t workers)
      : sizes_(workers) {
    for (std::size_t w = 0; w < workers; ++w) {
      compressors_.push_back(make(n));
      messages_.emplace_back(compressors_.back()->max_bytes(n));
    }
  }

  step_cost aggregate(const std::vector<std::vector<float>>& grads, std::span<float> mean,
                      std::uint64_t step) override {
    step_cost cost;
    for (std::size_t w = 0; w < compressors_.size(); ++w) {
      const auto t0 = clock_type::now();
      sizes_[w] = compressors_[w]->compress(grads[w], messages_[w], step);
      cost.encode += clock_type::now() - t0;
      cost.bytes += sizes_[w];
    }
    std::fill(mean.begin(), mean.end(), 0.0f);
    const auto t0 = clock_type::now();
    for (std::size_t w = 0; w < compressors_.size(); ++w)
      compressors_[0]->decompress_accumulate(std::span<const std::byte>(messages_[w].data(), sizes_[w]), mean);
    cost.decode = clock_type::now() - t0;
    for (float& v : mean) v /= static_cast<float>(compressors_.size());
    return cost;
  }

 private:
  std::vector<std::unique_ptr<compressor>> compressors_;
  std::vector<std::vector<std::byte>> messages_;
  std::vector<std::size_t> sizes_;
};

/// The number of elements of a layout.
inline std::size_t total_size(const std::vector<parameter>& layout) {
  std::size_t n = 0;
  for (const auto& p : layout) n += p.size();
  return n;
}

/// An entry that all-gathers the messages of per-worker compressors made by `make(n)`.
inline codec_entry gather_entry(std::string name, std::function<std::unique_ptr<compressor>(std::size_t)> make) {
  return {std::move(name),
          [make = std::move(make)](const std::vector<parameter>& layout,
                                   std::size_t workers) -> std::unique_ptr<aggregator> {
            return std::make_unique<gather_aggregator>(make, total_size(layout), workers);
          }};
}

// ---- dense: the uncompressed baseline (raw float32 bytes, as an all-gather would send them) ----

class dense_compressor final : public compressor {
 public:
  explicit dense_compressor(std::size_t n) : scratch_(n) {}
  [[nodiscard]] std::size_t max_bytes(std::size_t n) const override { return n * sizeof(float); }
  std::size_t compress(std::span<const float> grad, std::span<std::byte> out, std::uint64_t) override {
    const std::size_t bytes = grad.size_bytes();
    if (out.size() < bytes) throw gradcomp::error(gradcomp::errc::buffer_too_small, "dense: output too small");
    std::memcpy(out.data(), grad.data(), bytes);
    return bytes;
  }
  void decompress_accumulate(std::span<const std::byte> message, std::span<float> acc) override {
    if (message.size() != acc.size_bytes() || scratch_.size() < acc.size())
      throw gradcomp::error(gradcomp::errc::size_mismatch, "dense: message size does not match the gradient");
    std::memcpy(scratch_.data(), message.data(), message.size());
    for (std::size_t i = 0; i < acc.size(); ++i) acc[i] += scratch_[i];
  }

 private:
  std::vector<float> scratch_;
};

inline codec_entry dense_entry(std::string name = "dense") {
  return gather_entry(std::move(name), [](std::size_t n) -> std::unique_ptr<compressor> {
    return std::make_unique<dense_compressor>(n);
  });
}

// ---- any gradcomp codec ------------------------------------------------------------------------

/// True for codecs that keep per-worker state (error feedback, LoCo, ...).
template <class Codec>
concept stateful_codec =
    requires(const Codec& c, const gradcomp::cpu_executor& e, std::uint64_t n) { c.make_state(e, n); };

namespace detail {
struct no_state {};
template <class Codec>
struct state_of {
  using type = no_state;
};
template <stateful_codec Codec>
struct state_of<Codec> {
  using type =
      decltype(std::declval<const Codec&>().make_state(std::declval<const gradcomp::cpu_executor&>(), std::uint64_t{}));
};
}  // namespace detail

/// Adapts a gradcomp codec (stateless or stateful) on the CPU executor. Tensor id 0: the whole
/// model's gradient is one bucket; the training step is the message key's step.
template <class Codec>
class gradcomp_compressor final : public compressor {
 public:
  gradcomp_compressor(Codec codec, std::size_t n)
      : codec_(std::move(codec)), state_(make_state(codec_, n)), workspace_(codec_.workspace_bytes(cpu_, n)) {}

  [[nodiscard]] std::size_t max_bytes(std::size_t n) const override { return codec_.max_encoded_bytes(n); }

  std::size_t compress(std::span<const float> grad, std::span<std::byte> out, std::uint64_t step) override {
    const gradcomp::message_key key{.step = step, .tensor_id = 0};
    if constexpr (stateful_codec<Codec>) return codec_.encode(cpu_, grad, state_, out, std::span(workspace_), key);
    else
      return codec_.encode(cpu_, grad, out, std::span(workspace_), key);
  }

  void decompress_accumulate(std::span<const std::byte> message, std::span<float> acc) override {
    codec_.decode_accumulate(cpu_, message, acc, std::span(workspace_));
  }

 private:
  using state_type = typename detail::state_of<Codec>::type;
  static state_type make_state(const Codec& codec, std::size_t n) {
    if constexpr (stateful_codec<Codec>) return codec.make_state(gradcomp::cpu_executor{}, n);
    else
      return {};
  }

  gradcomp::cpu_executor cpu_;
  Codec codec_;
  [[no_unique_address]] state_type state_;
  std::vector<std::byte> workspace_;
};

/// An entry for a gradcomp codec; every worker gets its own copy of `codec` (and its own state).
template <class Codec>
codec_entry make_entry(std::string name, Codec codec) {
  return gather_entry(std::move(name), [codec = std::move(codec)](std::size_t n) -> std::unique_ptr<compressor> {
    return std::make_unique<gradcomp_compressor<Codec>>(codec, n);
  });
}

}  // namespace train
