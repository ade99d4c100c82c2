// gradcomp._gradcomp_torch: gradcomp's CPU codecs and compressed all-reduce as a PyTorch C++
// extension, built by the package's setup.py (torch's BuildExtension) and used by gradcomp/ddp.py.
//
// Python sees:
//   codec_names()                        the codecs of hook_codecs.hpp: the training examples'
//                                        table rows that are one codec, and a homomorphic one
//   refused_rows() -> {name: why}        the table's rows the hook cannot run (the rings, sketched
//                                        SGD): Codec(name) raises GradcompError saying why
//   Codec(name)                          one of them
//     .stateful                          error feedback and LoCo keep a State per tensor
//     .encode(grad[, state], step=0, tensor_id=0) -> uint8 tensor   a message
//     .decode(message, n) -> float tensor
//     .decode_accumulate(message, acc)   acc += decode(message)
//     .make_state(n), .save_state(state) -> bytes, .load_state(bytes, n) -> State
//     .carried_error(state) -> tensor    the error the state carries, one value per element
//     .relaid_state(error, like) -> State   a state carrying `error`, counters from `like`
//                                        (re-laying states when DDP rebuilds its buckets)
//     .plan(n, ranks) -> str             the plan of a bucket of n values (bucket_state.hpp:
//                                        the library's automatic_plan)
//     .max_encoded_bytes(n)              the codec's bound on a message of n values
//     .modelled_encoded_bytes(n)         the size of a message of n values the all-reduce cost
//                                        model (and so .plan) uses: gradcomp::modelled_encoded_bytes
//     .make_bucket_state(n, ranks, rank), .save_bucket_state(state) -> bytes,
//     .load_bucket_state(bytes, n, ranks, rank)   a bucket's states for its plan
//     .bucket_errors(state) -> (worker, server)   the errors they carry, per element
//     .relaid_bucket_state(worker, server, like, ranks, rank) -> (State, dropped)
//                                        re-laid states (bucket_state.hpp says what is dropped)
//     .all_reduce_mean(ops, data[, state], step, tensor_id, dense_steps=0) -> dict
//                                        gradcomp::compressed_all_reduce over `ops` (a
//                                        gradcomp.ProcessGroupOps; with a bucket state its
//                                        plan, else the plan from the codec's traits;
//                                        uncompressed while step < dense_steps, the warm-up),
//                                        then divided by P: `data` becomes the mean, the same
//                                        bits on every rank; {"sent_bytes", "dense_bytes"}
//     .make_chunk_states(n, ranks), .save_chunk_states(states), .load_chunk_states(bytes, n, ranks),
//     .reduce_scatter_mean(ops, data, out[, chunk_states], step,
//                                        tensor_id, dense_steps=0)   gradcomp::compressed_reduce_scatter
//                                        with `average`: `out`, this rank's chunk, becomes that chunk
//                                        of the mean (the FSDP hook, gradcomp/fsdp.py)
//     .in_process_scatter_reduce(data, states, step=0, tensor_id=0)   the tests' reference:
//                                        the scatter_reduce plan over the in-process transport,
//                                        rank r on data[r] with bucket state states[r]
//   tagc_names(), Tagc(name)             the table's TAGC rows over a bucket's parameters:
//     .make_state(), .save_state(state), .load_state(bytes)   one state for the whole model
//     .all_reduce_mean(ops, data, state, params)   params: (index in the model, name, shape)
//                                        of each parameter of `data`, in order; three collectives
//     .reduce_scatter_mean(ops, data, out, state, step, tensor_id)   one TAGC reduce-scatter of a
//                                        flat gradient into this rank's shard (the FSDP hook)
//     .owner_residuals(state) -> {bucket key: tensor}   the residuals of the shards this rank
//                                        owns (the rows with a re-sparsified gather; else empty)
//     .bytes_by_part()                   bytes sent so far: index, sketch, tail, padding, resent,
//                                        dense, gather
//   gravac_names(), Gravac(name)         the table's GraVAC rows (gravac_buckets.hpp): top-k + EF
//                                        whose density one controller chooses for the model
//     .all_reduce_mean(ops, data, params, step, tensor_id, last)   params: (index, size) per
//                                        parameter; last: the step's last bucket
//     .save() -> bytes, .load(bytes), .density (what the coming step sends; None: dense),
//     .candidate (the density θ_cur the search tries), .decision (the coming step's: send
//                                        "candidate", "safe" or "dense", both densities, both
//                                        gains (None before observed), searching)
//   gravac_ladder_names(), GravacLadder(name)   the GraVAC rows over bit widths (gravac_ladder.hpp):
//                                        one controller, each width sent by a codec row
//     .decision (as Gravac's, and candidate_bits, safe_bits), .row(bits) -> the codec row's name,
//     .measure(data, sizes, step, tensor_id) -> (gradient, candidate, safe)   a bucket's magnitudes
//     .end_step(ops, observed, sent_bytes)   the step's magnitudes aggregated, the controller moved on
//     .save() -> bytes, .load(bytes)
//   GradcompError(code, message)         every gradcomp::error, `code` its errc name
//
// Tensors are contiguous float32 on the CPU (the caller stages device buffers).
#include <torch/extension.h>

#include <gradcomp/gradcomp.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "../../examples/train/tagc_aggregator.hpp"
#include "tagc_bucket.hpp"
#include "bucket_state.hpp"
#include "codec_spec.hpp"
#include "gravac_buckets.hpp"
#include "gravac_ladder.hpp"
#include "hook_codecs.hpp"
#include "powersgd_buckets.hpp"

// Hidden, as pybind11's own namespace is: the types hold Python objects.
namespace [[gnu::visibility("hidden")]] gradcomp_torch {

namespace py = pybind11;

template <class V>
torch::Dtype torch_dtype() {
  if constexpr (std::is_same_v<V, float>) return torch::kFloat32;
  else if constexpr (std::is_same_v<V, double>)
    return torch::kFloat64;
  else if constexpr (std::is_same_v<V, std::uint64_t>)
    return torch::kInt64;  // same bits; sums wrap alike
  else
    return torch::kUInt8;                                                  // uint8_t, std::byte
}

/// A tensor over the memory of `s` (no copy).
template <class V>
torch::Tensor tensor_over(std::span<V> s) {
  using U = std::remove_const_t<V>;
  return torch::from_blob(const_cast<U*>(s.data()), {static_cast<std::int64_t>(s.size())},
                          torch::TensorOptions().dtype(torch_dtype<U>()));
}

/// gradcomp's transport concept over torch.distributed: every collective calls the method of the
/// same name of `ops` (gradcomp.ProcessGroupOps), which runs it on the process group, in place
/// on a tensor over gradcomp's buffer. A Python exception becomes `errc::transport_failed`.
class process_group_transport {
 public:
  explicit process_group_transport(py::object ops)
      : ops_(std::move(ops)), rank_(ops_.attr("rank")().cast<int>()), size_(ops_.attr("size")().cast<int>()) {}

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }

  template <class V>
  void all_reduce_sum(std::span<V> data) {
    call("all_reduce_sum", tensor_over(data));
  }
  template <class V>
  void all_reduce_max(std::span<V> data) {
    call("all_reduce_max", tensor_over(data));
  }
  void all_reduce_or(std::span<std::uint8_t> data) { call("all_reduce_or", tensor_over(data)); }
  template <class V>
  void reduce_sum(std::span<V> data, int root) {
    call("reduce_sum", tensor_over(data), root);
  }
  template <class V>
  void reduce_scatter_sum(std::span<const V> in, std::span<V> out) {
    call("reduce_scatter_sum", tensor_over(in).clone(), tensor_over(out));
  }
  void broadcast(std::span<std::byte> data, int root) { call("broadcast", tensor_over(data), root); }
  std::vector<std::vector<std::byte>> all_gather_bytes(std::span<const std::byte> mine) {
    return buffers_of(call("all_gather_bytes", tensor_over(mine).clone()), "all_gather_bytes");
  }
  std::vector<std::vector<std::byte>> all_to_all_bytes(std::span<const std::span<const std::byte>> to_each) {
    py::list buffers;
    for (const std::span<const std::byte> b : to_each) buffers.append(tensor_over(b).clone());
    return buffers_of(call("all_to_all_bytes", buffers), "all_to_all_bytes");
  }

 private:
  /// The P uint8 tensors of `list` as byte vectors.
  std::vector<std::vector<std::byte>> buffers_of(const py::list& list, const char* name) const {
    std::vector<std::vector<std::byte>> out;
    for (const py::handle item : list) {
      const torch::Tensor t = item.cast<torch::Tensor>().contiguous();
      const auto* p = static_cast<const std::byte*>(t.data_ptr());
      out.emplace_back(p, p + t.numel());
    }
    if (out.size() != static_cast<std::size_t>(size_))
      throw gradcomp::error(gradcomp::errc::transport_failed, std::string(name) + " returned " +
                                                                  std::to_string(out.size()) + " buffers for " +
                                                                  std::to_string(size_) + " ranks");
    return out;
  }

  template <class... A>
  py::object call(const char* name, A&&... args) {
    try {
      return ops_.attr(name)(std::forward<A>(args)...);
    } catch (py::error_already_set& e) {
      throw gradcomp::error(gradcomp::errc::transport_failed,
                            std::string("torch.distributed ") + name + ": " + e.what());
    }
  }

  py::object ops_;
  int rank_;
  int size_;
};
static_assert(gradcomp::transport<process_group_transport>);
static_assert(gradcomp::transport_with_bitwise_or<process_group_transport>);
static_assert(gradcomp::transport_with_all_to_all<process_group_transport>);

/// Checks that `t` is a contiguous float32 CPU tensor and views it.
inline std::span<float> floats_of(const torch::Tensor& t, const char* what) {
  gradcomp::detail::require(t.device().is_cpu() && t.scalar_type() == torch::kFloat32 && t.is_contiguous(),
                            gradcomp::errc::invalid_argument,
                            [&] { return std::string(what) + " must be a contiguous float32 CPU tensor"; });
  return {t.data_ptr<float>(), static_cast<std::size_t>(t.numel())};
}

inline std::span<const std::byte> bytes_of(const torch::Tensor& t) {
  gradcomp::detail::require(t.device().is_cpu() && t.scalar_type() == torch::kUInt8 && t.is_contiguous(),
                            gradcomp::errc::invalid_argument, "a message must be a contiguous uint8 CPU tensor");
  return {static_cast<const std::byte*>(t.data_ptr()), static_cast<std::size_t>(t.numel())};
}

/// The state of a stateful codec for one tensor; opaque to Python.
struct state_handle {
  virtual ~state_handle() = default;
  [[nodiscard]] virtual std::uint64_t size() const = 0;
};

/// One codec of the table behind a type-erased interface.
class codec_handle {
 public:
  virtual ~codec_handle() = default;
  [[nodiscard]] virtual bool stateful() const = 0;
  [[nodiscard]] virtual torch::Tensor encode(const torch::Tensor& grad, state_handle* state,
                                             gradcomp::message_key key) const = 0;
  virtual void decode(const torch::Tensor& message, const torch::Tensor& out, bool accumulate) const = 0;
  [[nodiscard]] virtual std::shared_ptr<state_handle> make_state(std::uint64_t n) const = 0;
  [[nodiscard]] virtual py::bytes save_state(const state_handle& state) const = 0;
  [[nodiscard]] virtual std::shared_ptr<state_handle> load_state(const std::string& bytes, std::uint64_t n) const = 0;
  [[nodiscard]] virtual torch::Tensor carried_error(const state_handle& state) const = 0;
  [[nodiscard]] virtual std::shared_ptr<state_handle> relaid_state(const torch::Tensor& error,
                                                                   const state_handle& like) const = 0;
  virtual gradcomp::compressed_report all_reduce(process_group_transport& t, std::span<float> data, state_handle* state,
                                                 gradcomp::message_key key, std::uint64_t dense_steps) const = 0;
  // A bucket's states (bucket_state.hpp).
  [[nodiscard]] virtual gradcomp::all_reduce_plan plan(std::uint64_t n, int ranks) const = 0;
  [[nodiscard]] virtual std::size_t max_encoded_bytes(std::uint64_t n) const = 0;
  [[nodiscard]] virtual std::size_t modelled_encoded_bytes(std::uint64_t n) const = 0;
  [[nodiscard]] virtual std::shared_ptr<state_handle> make_bucket_state(std::uint64_t n, int ranks, int rank) const = 0;
  [[nodiscard]] virtual py::bytes save_bucket_state(const state_handle& state) const = 0;
  [[nodiscard]] virtual std::shared_ptr<state_handle> load_bucket_state(const std::string& bytes, std::uint64_t n,
                                                                        int ranks, int rank) const = 0;
  [[nodiscard]] virtual std::pair<torch::Tensor, torch::Tensor> bucket_errors(const state_handle& state) const = 0;
  [[nodiscard]] virtual std::pair<std::shared_ptr<state_handle>, std::uint64_t> relaid_bucket_state(
      const torch::Tensor& worker, const torch::Tensor& server, const state_handle& like, int ranks,
      int rank) const = 0;
  virtual void in_process_scatter_reduce(const std::vector<torch::Tensor>& data,
                                         const std::vector<state_handle*>& states, gradcomp::message_key key) const = 0;
  // The FSDP hook's reduce-scatter.
  [[nodiscard]] virtual std::shared_ptr<state_handle> make_chunk_states(std::uint64_t n, int ranks) const = 0;
  [[nodiscard]] virtual py::bytes save_chunk_states(const state_handle& states) const = 0;
  [[nodiscard]] virtual std::shared_ptr<state_handle> load_chunk_states(const std::string& bytes, std::uint64_t n,
                                                                        int ranks) const = 0;
  virtual gradcomp::compressed_report reduce_scatter(process_group_transport& t, std::span<const float> data,
                                                     std::span<float> out, state_handle* chunk_states,
                                                     gradcomp::message_key key, std::uint64_t dense_steps) const = 0;
};

template <class C>
class codec_of final : public codec_handle {
  static constexpr bool has_state = gradcomp::stateful<C, gradcomp::cpu_executor>;
  struct state_of_codec;

 public:
  explicit codec_of(C codec) : codec_(std::move(codec)) {}

  [[nodiscard]] bool stateful() const override { return has_state; }

  [[nodiscard]] torch::Tensor encode(const torch::Tensor& grad, state_handle* state,
                                     gradcomp::message_key key) const override {
    const std::span<const float> g = floats_of(grad, "the gradient");
    std::vector<std::byte> ws(codec_.workspace_bytes(cpu_, g.size()));
    torch::Tensor out = torch::empty({static_cast<std::int64_t>(codec_.max_encoded_bytes(g.size()))}, torch::kUInt8);
    const std::span<std::byte> bytes(static_cast<std::byte*>(out.data_ptr()), static_cast<std::size_t>(out.numel()));
    std::size_t size = 0;
    if constexpr (has_state) size = codec_.encode(cpu_, g, state_in(state, g.size()), bytes, ws, key);
    else {
      gradcomp::detail::require(state == nullptr, gradcomp::errc::invalid_argument, "this codec keeps no state");
      size = codec_.encode(cpu_, g, bytes, ws, key);
    }
    return out.narrow(0, 0, static_cast<std::int64_t>(size)).clone();
  }

  void decode(const torch::Tensor& message, const torch::Tensor& out, bool accumulate) const override {
    const std::span<float> values = floats_of(out, "the output");
    std::vector<std::byte> ws(codec_.workspace_bytes(cpu_, values.size()));
    if (accumulate) codec_.decode_accumulate(cpu_, bytes_of(message), values, ws);
    else
      codec_.decode(cpu_, bytes_of(message), values, ws);
  }

  [[nodiscard]] std::shared_ptr<state_handle> make_state(std::uint64_t n) const override {
    if constexpr (has_state) return std::make_shared<state_of_codec>(codec_.make_state(cpu_, n), n);
    else
      throw gradcomp::error(gradcomp::errc::invalid_argument, "this codec keeps no state");
  }

  [[nodiscard]] py::bytes save_state(const state_handle& state) const override {
    if constexpr (has_state) {
      const auto& s = state_in(state);
      std::string bytes(codec_.saved_state_bytes(s.n), '\0');
      bytes.resize(codec_.save_state(cpu_, s.state, std::as_writable_bytes(std::span<char>(bytes))));
      return py::bytes(bytes);
    } else {
      throw gradcomp::error(gradcomp::errc::invalid_argument, "this codec keeps no state");
    }
  }

  [[nodiscard]] std::shared_ptr<state_handle> load_state(const std::string& bytes, std::uint64_t n) const override {
    if constexpr (has_state) {
      auto s = std::make_shared<state_of_codec>(codec_.make_state(cpu_, n), n);
      codec_.load_state(cpu_, std::as_bytes(std::span<const char>(bytes)), s->state);
      return s;
    } else {
      throw gradcomp::error(gradcomp::errc::invalid_argument, "this codec keeps no state");
    }
  }

  [[nodiscard]] torch::Tensor carried_error(const state_handle& state) const override {
    if constexpr (has_state) {
      const auto& s = state_in(state);
      torch::Tensor out = torch::empty({static_cast<std::int64_t>(s.n)}, torch::kFloat32);
      codec_.carried_error(cpu_, s.state, floats_of(out, "the output"));
      return out;
    } else {
      throw gradcomp::error(gradcomp::errc::invalid_argument, "this codec keeps no state");
    }
  }

  [[nodiscard]] std::shared_ptr<state_handle> relaid_state(const torch::Tensor& error,
                                                           const state_handle& like) const override {
    if constexpr (has_state) {
      const std::span<const float> e = floats_of(error, "the error");
      auto s = std::make_shared<state_of_codec>(codec_.make_state(cpu_, e.size()), e.size());
      // The step counters go on: every bucket of a DDP model steps together.
      s->state.steps = state_in(like).state.steps;
      if constexpr (requires { s->state.total_steps; }) s->state.total_steps = state_in(like).state.total_steps;
      codec_.set_carried_error(cpu_, e, s->state);
      return s;
    } else {
      throw gradcomp::error(gradcomp::errc::invalid_argument, "this codec keeps no state");
    }
  }

  gradcomp::compressed_report all_reduce(process_group_transport& t, std::span<float> data, state_handle* state,
                                         gradcomp::message_key key, std::uint64_t dense_steps) const override {
    // With a bucket state (make_bucket_state): the plan of bucket_state.hpp, the library's
    // `automatic_plan`. With a codec state or none: the plan from the codec's traits: a SUM all-reduce of the encodings for a homomorphic
    // codec, else the all-gather and decoding in rank order (the only plan of a stateful one);
    // the warm-up's uncompressed all-reduce while key.step < dense_steps, the state untouched.
    const gradcomp::all_reduce_options options{.key = key, .dense_steps = dense_steps};
    if (auto* bucket = dynamic_cast<bucket_of_codec*>(state)) {
      return bucket_all_reduce(cpu_, t, codec_, bucket->state, data, options);
    }
    if constexpr (has_state)
      return gradcomp::compressed_all_reduce(cpu_, t, codec_, state_in(state, data.size()), data, options);
    else {
      gradcomp::detail::require(state == nullptr, gradcomp::errc::invalid_argument, "this codec keeps no state");
      return gradcomp::compressed_all_reduce(cpu_, t, codec_, data, options);
    }
  }

  /// P states, one per chunk of n values (`make_chunk_states`): what a stateful codec keeps for
  /// `reduce_scatter`.
  [[nodiscard]] std::shared_ptr<state_handle> make_chunk_states(std::uint64_t n, int ranks) const override {
    if constexpr (has_state)
      return std::make_shared<chunks_of_codec>(gradcomp::make_chunk_states(cpu_, codec_, n, ranks), n);
    else
      throw gradcomp::error(gradcomp::errc::invalid_argument, "this codec keeps no state");
  }

  /// The chunk states saved: a u32 count P, then per chunk its u64 size and gradcomp's saved state
  /// (bucket_state.hpp's format).
  [[nodiscard]] py::bytes save_chunk_states(const state_handle& handle) const override {
    if constexpr (has_state) {
      const chunks_of_codec& c = chunks_in(handle);
      const auto ranks = static_cast<int>(c.states.size());
      std::vector<std::byte> out(4);
      const auto count = static_cast<std::uint32_t>(ranks);
      std::memcpy(out.data(), &count, 4);
      for (int j = 0; j < ranks; ++j)
        append_saved_state(out, cpu_, codec_, c.states[static_cast<std::size_t>(j)],
                           gradcomp::ring_chunk_of(c.n, ranks, j).count);
      return py::bytes(reinterpret_cast<const char*>(out.data()), out.size());
    } else {
      throw gradcomp::error(gradcomp::errc::invalid_argument, "this codec keeps no state");
    }
  }

  /// Chunk states of n values at P = `ranks` from `save_chunk_states`' bytes. @throws
  /// gradcomp::error `truncated`, `trailing_bytes`, `size_mismatch` (another P), or as the codec's
  /// `load_state`.
  [[nodiscard]] std::shared_ptr<state_handle> load_chunk_states(const std::string& bytes, std::uint64_t n,
                                                                int ranks) const override {
    if constexpr (has_state) {
      auto loaded = std::make_shared<chunks_of_codec>(gradcomp::make_chunk_states(cpu_, codec_, n, ranks), n);
      const std::span<const std::byte> saved = std::as_bytes(std::span<const char>(bytes));
      std::size_t at = 0;
      std::uint32_t count = 0;
      std::memcpy(&count, take_saved(saved, at, 4).data(), 4);
      gradcomp::detail::require(count == static_cast<std::uint32_t>(ranks), gradcomp::errc::size_mismatch, [&] {
        return "saved chunk states of " + std::to_string(count) + " chunks, P = " + std::to_string(ranks);
      });
      for (auto& state : loaded->states) load_saved_state(saved, at, cpu_, codec_, state);
      gradcomp::detail::require(at == saved.size(), gradcomp::errc::trailing_bytes,
                                "saved chunk states have trailing bytes");
      return loaded;
    } else {
      throw gradcomp::error(gradcomp::errc::invalid_argument, "this codec keeps no state");
    }
  }

  /// `out` (this rank's chunk, `ring_chunk_of`) becomes that chunk of the mean over the ranks:
  /// `compressed_reduce_scatter` with `average`, its `all_to_all` plan with the P chunk states
  /// for a stateful codec, its automatic plan for a stateless one; the warm-up's uncompressed
  /// reduce-scatter while key.step < dense_steps.
  gradcomp::compressed_report reduce_scatter(process_group_transport& t, std::span<const float> data,
                                             std::span<float> out, state_handle* chunk_states,
                                             gradcomp::message_key key, std::uint64_t dense_steps) const override {
    const gradcomp::reduce_scatter_options options{.key = key, .average = true, .dense_steps = dense_steps};
    if constexpr (has_state) {
      gradcomp::detail::require(chunk_states != nullptr, gradcomp::errc::invalid_argument,
                                "a stateful codec's reduce-scatter needs its chunk states");
      chunks_of_codec& chunks = chunks_in(*chunk_states);
      gradcomp::detail::require(chunks.n == data.size(), gradcomp::errc::invalid_argument,
                                "the chunk states are for another number of values");
      return gradcomp::compressed_reduce_scatter(cpu_, t, codec_, std::span(chunks.states), data, out, options);
    } else {
      gradcomp::detail::require(chunk_states == nullptr, gradcomp::errc::invalid_argument, "this codec keeps no state");
      return gradcomp::compressed_reduce_scatter(cpu_, t, codec_, data, out, options);
    }
  }

  [[nodiscard]] gradcomp::all_reduce_plan plan(std::uint64_t n, int ranks) const override {
    return bucket_plan(codec_, n, ranks);
  }
  [[nodiscard]] std::size_t max_encoded_bytes(std::uint64_t n) const override { return codec_.max_encoded_bytes(n); }
  [[nodiscard]] std::size_t modelled_encoded_bytes(std::uint64_t n) const override {
    return gradcomp::modelled_encoded_bytes(codec_, n);
  }

  [[nodiscard]] std::shared_ptr<state_handle> make_bucket_state(std::uint64_t n, int ranks, int rank) const override {
    return std::make_shared<bucket_of_codec>(gradcomp_torch::make_bucket_state(cpu_, codec_, n, ranks, rank));
  }

  [[nodiscard]] py::bytes save_bucket_state(const state_handle& state) const override {
    const std::vector<std::byte> bytes = gradcomp_torch::save_bucket_state(cpu_, codec_, bucket_in(state));
    return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }

  [[nodiscard]] std::shared_ptr<state_handle> load_bucket_state(const std::string& bytes, std::uint64_t n, int ranks,
                                                                int rank) const override {
    return std::make_shared<bucket_of_codec>(
        gradcomp_torch::load_bucket_state(cpu_, codec_, std::as_bytes(std::span<const char>(bytes)), n, ranks, rank));
  }

  [[nodiscard]] std::pair<torch::Tensor, torch::Tensor> bucket_errors(const state_handle& state) const override {
    const auto& s = bucket_in(state);
    torch::Tensor worker = torch::empty({static_cast<std::int64_t>(s.n)}, torch::kFloat32);
    torch::Tensor server = torch::empty({static_cast<std::int64_t>(s.n)}, torch::kFloat32);
    gradcomp_torch::bucket_errors(cpu_, codec_, s, floats_of(worker, "the output"), floats_of(server, "the output"));
    return {worker, server};
  }

  [[nodiscard]] std::pair<std::shared_ptr<state_handle>, std::uint64_t> relaid_bucket_state(const torch::Tensor& worker,
                                                                                            const torch::Tensor& server,
                                                                                            const state_handle& like,
                                                                                            int ranks,
                                                                                            int rank) const override {
    auto [s, dropped] =
        gradcomp_torch::relaid_bucket_state(cpu_, codec_, floats_of(worker, "the worker error"),
                                            floats_of(server, "the server error"), bucket_in(like), ranks, rank);
    return {std::make_shared<bucket_of_codec>(std::move(s)), dropped};
  }

  /// The reference of the hook's tests: gradcomp's `scatter_reduce` plan called directly over the
  /// in-process transport, rank r on data[r] with the states of states[r], then divided by P.
  void in_process_scatter_reduce(const std::vector<torch::Tensor>& data, const std::vector<state_handle*>& states,
                                 gradcomp::message_key key) const override {
    const auto P = static_cast<int>(data.size());
    gradcomp::detail::require(states.size() == data.size(), gradcomp::errc::invalid_argument, "one state per rank");
    std::vector<std::span<float>> values;
    std::vector<bucket_state<C>*> buckets;
    for (std::size_t r = 0; r < data.size(); ++r) {
      values.push_back(floats_of(data[r], "the data"));
      gradcomp::detail::require(states[r] != nullptr, gradcomp::errc::invalid_argument, "one state per rank");
      buckets.push_back(&bucket_in(*states[r]));
    }
    const gradcomp::all_reduce_options options{.key = key, .plan = gradcomp::all_reduce_plan::scatter_reduce};
    gradcomp::in_process_group(P).run([&](gradcomp::in_process_transport& t) {
      const auto r = static_cast<std::size_t>(t.rank());
      bucket_state<C>& s = *buckets[r];
      if constexpr (has_state)
        gradcomp::compressed_all_reduce(cpu_, t, codec_, std::span(s.workers), s.server.at(0), values[r], options);
      else
        gradcomp::compressed_all_reduce(cpu_, t, codec_, s.server.at(0), values[r], options);
      for (float& v : values[r]) v /= static_cast<float>(P);
    });
  }

 private:
  struct chunks_of_codec final : state_handle {
    chunks_of_codec(std::vector<gradcomp::state_type_of<C, gradcomp::cpu_executor>> s, std::uint64_t count)
        : states(std::move(s)), n(count) {}
    [[nodiscard]] std::uint64_t size() const override { return n; }
    std::vector<gradcomp::state_type_of<C, gradcomp::cpu_executor>> states;
    std::uint64_t n;
  };

  static chunks_of_codec& chunks_in(const state_handle& handle) {
    auto* c = dynamic_cast<chunks_of_codec*>(const_cast<state_handle*>(&handle));
    gradcomp::detail::require(c != nullptr, gradcomp::errc::invalid_argument, "not chunk states of this codec");
    return *c;
  }

  struct bucket_of_codec final : state_handle {
    explicit bucket_of_codec(bucket_state<C> s) : state(std::move(s)) {}
    [[nodiscard]] std::uint64_t size() const override { return state.n; }
    bucket_state<C> state;
  };

  static bucket_state<C>& bucket_in(const state_handle& handle) {
    auto* s = dynamic_cast<bucket_of_codec*>(const_cast<state_handle*>(&handle));
    gradcomp::detail::require(s != nullptr, gradcomp::errc::invalid_argument, "not a bucket state of this codec");
    return s->state;
  }

  struct state_of_codec final : state_handle {
    state_of_codec(auto s, std::uint64_t count) : state(std::move(s)), n(count) {}
    [[nodiscard]] std::uint64_t size() const override { return n; }
    typename C::state_type state;
    std::uint64_t n;
  };

  /// The codec's state in `handle`, which must be one of this codec's, for n elements.
  static auto& state_in(state_handle* handle, std::uint64_t n) {
    gradcomp::detail::require(handle != nullptr, gradcomp::errc::invalid_argument, "this codec needs its state");
    auto* s = dynamic_cast<state_of_codec*>(handle);
    gradcomp::detail::require(s != nullptr, gradcomp::errc::invalid_argument, "the state belongs to another codec");
    gradcomp::detail::require(s->n == n, gradcomp::errc::size_mismatch, [&] {
      return "the tensor has " + std::to_string(n) + " elements, the state " + std::to_string(s->n);
    });
    return s->state;
  }
  static auto& state_in(state_handle& handle, std::uint64_t n) { return state_in(&handle, n); }
  static const state_of_codec& state_in(const state_handle& handle) {
    const auto* s = dynamic_cast<const state_of_codec*>(&handle);
    gradcomp::detail::require(s != nullptr, gradcomp::errc::invalid_argument, "the state belongs to another codec");
    return *s;
  }

  C codec_;
  gradcomp::cpu_executor cpu_{};
};

/// A TAGC row of the table over the buckets of a DDP model: the parameters of a bucket that TAGC's
/// layer policy compresses (by name and shape) go through one TAGC reduce-scatter, the others
/// through one uncompressed reduce-scatter, and the shards of the mean are all-gathered: losslessly,
/// or, for a row with a gather zero fraction, the compressed part's re-sparsified by each owner
/// with its own residual (tagc_bucket.hpp, `resparsified_gather`). One state serves the whole
/// model: its error feedback, and the owners' residuals, are keyed by the set of parameter ids of
/// the bucket.
///
/// Saved state (little-endian): the magic "GTHS", u16 version 1, u64 size and TAGC's saved state,
/// u32 count of owner residuals, then per residual (keys ascending) u32 bucket key, u64 count m
/// and m float32 values. A state saved before the owner residuals existed (TAGC's saved state
/// alone, which starts with its own magic) loads as one without them.
class tagc_scheme {
 public:
  /// A parameter of a bucket: its index in the model, its name and its shape.
  using parameter_info = std::tuple<std::uint32_t, std::string, std::vector<std::int64_t>>;

  /// TAGC with `params`; with `gather_zero_fraction`, the owners re-sparsify their shards for the
  /// all-gather, sending 1 − that fraction of each.
  explicit tagc_scheme(gradcomp::tagc_params params, std::optional<double> gather_zero_fraction = {})
      : tagc_(params), gather_zero_fraction_(gather_zero_fraction) {}

  [[nodiscard]] std::shared_ptr<state_handle> make_state() const {
    return std::make_shared<state_of_scheme>(tagc_.make_state(cpu_));
  }

  [[nodiscard]] py::bytes save_state(const state_handle& handle) const {
    const state_of_scheme& s = scheme_state_in(handle);
    std::string tagc_bytes(gradcomp::tagc<float>::saved_state_bytes(s.state), '\0');
    tagc_bytes.resize(tagc_.save_state(cpu_, s.state, std::as_writable_bytes(std::span<char>(tagc_bytes))));
    std::string out(saved_magic);
    const auto put = [&out](const void* p, std::size_t size) { out.append(static_cast<const char*>(p), size); };
    const std::uint16_t version = 1;
    put(&version, 2);
    const std::uint64_t size = tagc_bytes.size();
    put(&size, 8);
    out += tagc_bytes;
    const auto count = static_cast<std::uint32_t>(s.owner_residuals.size());
    put(&count, 4);
    for (const auto& [key, residual] : s.owner_residuals) {
      const std::uint64_t m = residual.size();
      put(&key, 4);
      put(&m, 8);
      put(residual.data(), m * sizeof(float));
    }
    return py::bytes(out);
  }

  /// @throws gradcomp::error `truncated` / `trailing_bytes` / `unsupported_version` /
  /// `malformed_payload` (a key twice, a residual not finite) when the bytes are not `save_state`'s,
  /// `invalid_argument` for owner residuals given to a row that keeps none, or as TAGC's
  /// `load_state`.
  [[nodiscard]] std::shared_ptr<state_handle> load_state(const std::string& bytes) const {
    auto s = std::make_shared<state_of_scheme>(tagc_.make_state(cpu_));
    if (bytes.compare(0, saved_magic.size(), saved_magic) != 0) {  // the format before the owner residuals
      tagc_.load_state(cpu_, std::as_bytes(std::span<const char>(bytes)), s->state);
      return s;
    }
    std::size_t at = saved_magic.size();
    const auto take = [&](std::size_t size) {
      gradcomp::detail::require(bytes.size() - at >= size, gradcomp::errc::truncated, "a saved TAGC state ends early");
      const char* piece = bytes.data() + at;
      at += size;
      return piece;
    };
    std::uint16_t version = 0;
    std::memcpy(&version, take(2), 2);
    gradcomp::detail::require(version == 1, gradcomp::errc::unsupported_version,
                              [&] { return "a saved TAGC hook state of version " + std::to_string(version); });
    std::uint64_t size = 0;
    std::memcpy(&size, take(8), 8);
    gradcomp::detail::require(size <= bytes.size() - at, gradcomp::errc::truncated, "a saved TAGC state ends early");
    tagc_.load_state(cpu_, std::as_bytes(std::span<const char>(take(static_cast<std::size_t>(size)), size)), s->state);
    std::uint32_t count = 0;
    std::memcpy(&count, take(4), 4);
    for (std::uint32_t r = 0; r < count; ++r) {
      std::uint32_t key = 0;
      std::uint64_t m = 0;
      std::memcpy(&key, take(4), 4);
      std::memcpy(&m, take(8), 8);
      gradcomp::detail::require(m <= (bytes.size() - at) / sizeof(float), gradcomp::errc::truncated,
                                "a saved TAGC state ends early");
      gradcomp::detail::require(gather_zero_fraction_.has_value(), gradcomp::errc::invalid_argument,
                                "the saved state holds owner residuals; this TAGC row gathers losslessly");
      std::vector<float> residual(static_cast<std::size_t>(m));
      std::memcpy(residual.data(), take(residual.size() * sizeof(float)), residual.size() * sizeof(float));
      gradcomp::detail::require(std::all_of(residual.begin(), residual.end(), [](float v) { return std::isfinite(v); }),
                                gradcomp::errc::malformed_payload, [&] {
                                  return "the owner residual of bucket " + std::to_string(key) + " is not finite";
                                });
      gradcomp::detail::require(s->owner_residuals.emplace(key, std::move(residual)).second,
                                gradcomp::errc::malformed_payload,
                                [&] { return "the saved state holds bucket " + std::to_string(key) + " twice"; });
    }
    gradcomp::detail::require(at == bytes.size(), gradcomp::errc::trailing_bytes,
                              "bytes after the end of a saved TAGC state");
    return s;
  }

  /// `data` (the bucket's parameters one after another, in the order of `params`) becomes the
  /// mean over the ranks, in three collectives (tagc_bucket.hpp): one TAGC reduce-scatter of the
  /// parameters TAGC's layer policy compresses, one uncompressed reduce-scatter of the others, one
  /// all-gather of the shards. The residuals are keyed by the bucket's parameter ids, so a
  /// bucket that DDP rebuilds with other parameters starts from zero residuals. Returns the bytes
  /// this rank sent, as ring collectives send them, and adds them by part to `bytes_by_part()`.
  std::size_t all_reduce_mean(process_group_transport& t, std::span<float> data, state_handle& handle,
                              const std::vector<parameter_info>& params) const {
    std::vector<train::parameter> layout;
    std::uint64_t key = 0xcbf29ce484222325ull;  // FNV-1a over the parameter ids
    std::size_t offset = 0;
    for (const auto& [id, name, shape] : params) {
      std::size_t count = 1;
      for (const std::int64_t d : shape) count *= static_cast<std::size_t>(d);
      const std::size_t rows = shape.size() >= 2 ? static_cast<std::size_t>(shape[0]) : 1;
      layout.push_back({name, offset, rows, rows == 0 ? 0 : count / rows});
      key = (key ^ id) * 0x100000001b3ull;
      offset += count;
    }
    gradcomp::detail::require(offset == data.size(), gradcomp::errc::size_mismatch, [&] {
      return "the bucket holds " + std::to_string(data.size()) + " values, its parameters " + std::to_string(offset);
    });
    const std::vector<bool> compressed = train::tagc_compressed_tensors(gradcomp::tagc_layer_policy(), layout);
    const auto bucket_id = static_cast<std::uint32_t>(key ^ (key >> 32));
    state_of_scheme& s = scheme_state_in(handle);
    // The owner residual is updated on a copy, kept only once the step succeeded.
    std::optional<resparsified_gather> gather;
    std::vector<float> residual;
    if (gather_zero_fraction_) {
      if (const auto found = s.owner_residuals.find(bucket_id); found != s.owner_residuals.end())
        residual = found->second;
      gather = resparsified_gather{*gather_zero_fraction_, &residual};
    }
    const tagc_bucket_bytes bytes =
        tagc_bucket_all_reduce(t, tagc_, s.state, layout, compressed, data, bucket_id, gather);
    if (gather_zero_fraction_) s.owner_residuals[bucket_id] = std::move(residual);
    totals_ += bytes;
    return bytes.total();
  }

  /// FSDP's reduce-scatter (gradcomp/fsdp.py): `out`, this rank's shard of `data` (FSDP's flat
  /// gradient of one unit, padded to P equal shards), becomes that shard of the mean by one TAGC
  /// reduce-scatter of the whole of `data` with TAGC's residual keyed by `unit` (no layer policy:
  /// a flat gradient does not say where its parameters lie). Returns report.sent_bytes.
  std::size_t reduce_scatter_mean(process_group_transport& t, std::span<const float> data, std::span<float> out,
                                  state_handle& handle, gradcomp::message_key key) const {
    const gradcomp::tagc_report report =
        gradcomp::compressed_reduce_scatter(cpu_, t, tagc_, scheme_state_in(handle).state, data, out,
                                            {.key = key, .average = true});
    return static_cast<std::size_t>(report.sent_bytes);
  }

  /// This rank's owner residuals (re-sparsified gather), by bucket key; empty for the lossless gather.
  [[nodiscard]] static const std::map<std::uint32_t, std::vector<float>>& owner_residuals(const state_handle& handle) {
    return scheme_state_in(handle).owner_residuals;
  }

  /// The bytes sent so far, by part (tagc_bucket_bytes).
  [[nodiscard]] const tagc_bucket_bytes& bytes_by_part() const noexcept { return totals_; }

 private:
  struct state_of_scheme final : state_handle {
    explicit state_of_scheme(gradcomp::tagc_state<float, gradcomp::cpu_executor> s) : state(std::move(s)) {}
    [[nodiscard]] std::uint64_t size() const override { return 0; }  // any bucket
    gradcomp::tagc_state<float, gradcomp::cpu_executor> state;
    std::map<std::uint32_t, std::vector<float>> owner_residuals;  ///< By bucket key (re-sparsified gather).
  };

  static state_of_scheme& scheme_state_in(state_handle& handle) {
    auto* s = dynamic_cast<state_of_scheme*>(&handle);
    gradcomp::detail::require(s != nullptr, gradcomp::errc::invalid_argument,
                              "the state belongs to a codec, not to TAGC");
    return *s;
  }
  static const state_of_scheme& scheme_state_in(const state_handle& handle) {
    return scheme_state_in(const_cast<state_handle&>(handle));
  }

  /// The first bytes of `save_state`'s format.
  static constexpr std::string_view saved_magic = "GTHS";

  gradcomp::tagc<float> tagc_;
  std::optional<double> gather_zero_fraction_;
  gradcomp::cpu_executor cpu_{};
  mutable tagc_bucket_bytes totals_;
};

/// Collects the rows of examples/train/codec_table.hpp that run here: the rows that are one codec
/// all-gathered, and the TAGC rows.
struct codec_rows {
  std::map<std::string, std::function<std::shared_ptr<codec_handle>()>> rows;
  void dense(const char*) {}
  template <class C>
  void codec(const char* name, C c) {
    rows.emplace(name, [c] { return std::make_shared<codec_of<C>>(c); });
  }
  // The rows the hook cannot run are kept with the reason, so that asking for one says why
  // (`refused`) instead of "no codec named".
  template <class C>
  void ring(const char* name, const C&) {
    refused.emplace(name,
                    "runs the hybrid scheme's per-hop ring, which needs point-to-point messages; the hook's "
                    "ProcessGroupOps has none (examples/train and mpi_train run it)");
  }
  void sketched_sgd(const char* name, const gradcomp::count_sketch<float>&) {
    refused.emplace(name,
                    "needs sketched SGD's second round (an exact all-reduce at the heavy hitters) and a "
                    "server-side error, which the hook does not implement (examples/train and mpi_train run it)");
  }
  /// Rows of the table the hook cannot run, by name: why.
  std::map<std::string, std::string> refused;
  void powersgd(const char* name, const gradcomp::powersgd_params& params, bool batched = false) {
    powersgd_rows.emplace(name, [params, batched] { return std::make_shared<powersgd_buckets>(params, batched); });
  }
  void tagc(const char* name, const gradcomp::tagc_params& params, std::optional<double> gather_zero_fraction = {}) {
    tagc_rows.emplace(name, [params, gather_zero_fraction] {
      return std::make_shared<tagc_scheme>(params, gather_zero_fraction);
    });
  }
  void gravac(const char* name, const gradcomp::gravac_options& options, std::size_t) {
    gravac_rows.emplace(name, [options] { return std::make_shared<gravac_buckets>(options); });
  }
  void gravac_ladder(const char* name, const gradcomp::gravac_options& options, std::uint32_t block,
                     const std::map<int, std::string>& widths) {
    gravac_ladder_rows.emplace(name, [options, block, widths] {
      return std::make_shared<gradcomp_torch::gravac_ladder>(options, block, widths);
    });
  }
  std::map<std::string, std::function<std::shared_ptr<tagc_scheme>()>> tagc_rows;
  std::map<std::string, std::function<std::shared_ptr<gravac_buckets>()>> gravac_rows;
  // (The class, qualified: `gravac_ladder` here is the visitor's method.)
  std::map<std::string, std::function<std::shared_ptr<gradcomp_torch::gravac_ladder>()>> gravac_ladder_rows;
  std::map<std::string, std::function<std::shared_ptr<powersgd_buckets>()>> powersgd_rows;
};

inline const codec_rows& table() {
  static const codec_rows rows = [] {
    codec_rows r;
    visit_hook_codecs(r);
    return r;
  }();
  return rows;
}

/// The saved state of a scheme (GraVAC, its ladder, PowerSGD) as Python bytes.
template <class Scheme>
py::bytes saved_bytes(const Scheme& scheme) {
  const std::vector<std::byte> bytes = scheme.save();
  return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

/// Restores a scheme's state from `saved_bytes`'s bytes (the scheme's `load` says what it refuses).
template <class Scheme>
void load_bytes(Scheme& scheme, const std::string& bytes) {
  scheme.load(std::as_bytes(std::span<const char>(bytes)));
}

/// A GraVAC decision as Python sees it: the path sent ("candidate", "safe" or "dense"), both
/// densities, both gains (None before observed), whether the search goes on.
inline py::dict decision_dict(const gradcomp::gravac_decision& d) {
  const auto gain = [](std::optional<double> v) { return v ? py::object(py::float_(*v)) : py::object(py::none()); };
  static constexpr std::array<const char*, 3> paths{"candidate", "safe", "dense"};
  py::dict out;
  out["send"] = paths[static_cast<std::size_t>(d.send)];
  out["candidate"] = d.current.density;
  out["safe"] = d.safe.density;
  out["gain_candidate"] = gain(d.gain_current);
  out["gain_safe"] = gain(d.gain_safe);
  out["searching"] = d.searching;
  return out;
}

/// What `name` names in `rows` (one of codec_rows' maps, of things called `what`): the table's row
/// of that name, else what the codec spec `name` builds (codec_spec.hpp: the typed constructors'
/// text). Throws invalid_argument for a refused row, for a name that is neither a row nor a valid
/// spec (saying both), and for a spec of another kind (a TAGC spec given to Codec).
template <class Made>
std::shared_ptr<Made> made_from(const std::string& name,
                                std::map<std::string, std::function<std::shared_ptr<Made>()>> codec_rows::*rows,
                                const char* what, const char* listing) {
  const auto why = table().refused.find(name);
  gradcomp::detail::require(why == table().refused.end(), gradcomp::errc::invalid_argument,
                            [&] { return "the row \"" + name + "\" " + why->second; });
  const auto row = (table().*rows).find(name);
  if (row != (table().*rows).end()) return row->second();
  codec_rows from_spec;
  try {
    visit_codec_spec(name, from_spec);
  } catch (const gradcomp::error& e) {
    throw gradcomp::error(gradcomp::errc::invalid_argument, "no " + std::string(what) + " row named \"" + name +
                                                                "\" (see " + listing +
                                                                "), and not a codec spec: " + e.what());
  }
  const auto made = (from_spec.*rows).find(name);
  gradcomp::detail::require(made != (from_spec.*rows).end(), gradcomp::errc::invalid_argument,
                            [&] { return "the codec spec \"" + name + "\" is not a " + what; });
  return made->second();
}

/// The names of one kind of the table's rows.
template <class Rows>
std::vector<std::string> row_names(const Rows& rows) {
  std::vector<std::string> names;
  for (const auto& [name, make] : rows) names.push_back(name);
  return names;
}

inline std::shared_ptr<codec_handle> codec_named(const std::string& name) {
  return made_from(name, &codec_rows::rows, "codec", "codec_names()");
}

inline std::shared_ptr<tagc_scheme> tagc_named(const std::string& name) {
  return made_from(name, &codec_rows::tagc_rows, "TAGC", "tagc_names()");
}

inline std::shared_ptr<powersgd_buckets> powersgd_named(const std::string& name) {
  return made_from(name, &codec_rows::powersgd_rows, "PowerSGD", "powersgd_names()");
}

inline std::shared_ptr<gravac_ladder> gravac_ladder_named(const std::string& name) {
  return made_from(name, &codec_rows::gravac_ladder_rows, "GraVAC ladder", "gravac_ladder_names()");
}

inline std::shared_ptr<gravac_buckets> gravac_named(const std::string& name) {
  return made_from(name, &codec_rows::gravac_rows, "GraVAC", "gravac_names()");
}

}  // namespace gradcomp_torch

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  using namespace gradcomp_torch;
  m.doc() = "gradcomp's CPU codecs and compressed all-reduce for PyTorch (the gradcomp package)";

  static py::exception<gradcomp::error> error_type(m, "GradcompError");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const gradcomp::error& e) {
      const py::object instance =
          static_cast<py::object&>(error_type)(std::string(gradcomp::to_string(e.code())), std::string(e.what()));
      PyErr_SetObject(error_type.ptr(), instance.ptr());
    }
  });

  m.def("codec_names", [] { return row_names(table().rows); });
  m.def("refused_rows", [] { return table().refused; });

  m.def(
      "powersgd_initial_q",
      [](std::uint64_t cols, std::uint64_t rank, std::uint64_t seed, std::uint64_t step, std::uint32_t tensor_id) {
        torch::Tensor q = torch::empty({static_cast<std::int64_t>(cols), static_cast<std::int64_t>(rank)});
        gradcomp::powersgd_draw_q(floats_of(q, "q"), cols, rank, seed, step, tensor_id, false);
        return q;
      },
      py::arg("cols"), py::arg("rank"), py::arg("seed"), py::arg("step"), py::arg("tensor_id"));

  m.def("powersgd_names", [] { return row_names(table().powersgd_rows); });

  m.def("tagc_names", [] { return row_names(table().tagc_rows); });

  m.def("gravac_names", [] { return row_names(table().gravac_rows); });

  m.def("gravac_ladder_names", [] { return row_names(table().gravac_ladder_rows); });

  py::class_<state_handle, std::shared_ptr<state_handle>>(m, "State")
      .def_property_readonly("size", &state_handle::size);

  const auto key = [](std::uint64_t step, std::uint32_t tensor_id) {
    return gradcomp::message_key{.step = step, .tensor_id = tensor_id};
  };
  py::class_<codec_handle, std::shared_ptr<codec_handle>>(m, "Codec")
      .def(py::init(&codec_named), py::arg("name"))
      .def_property_readonly("stateful", &codec_handle::stateful)
      .def(
          "encode",
          [key](const codec_handle& c, const torch::Tensor& grad, state_handle* state, std::uint64_t step,
                std::uint32_t tensor_id) { return c.encode(grad, state, key(step, tensor_id)); },
          py::arg("grad"), py::arg("state") = nullptr, py::arg("step") = 0, py::arg("tensor_id") = 0)
      .def(
          "decode",
          [](const codec_handle& c, const torch::Tensor& message, std::int64_t n) {
            torch::Tensor out = torch::empty({n}, torch::kFloat32);
            c.decode(message, out, false);
            return out;
          },
          py::arg("message"), py::arg("n"))
      .def(
          "decode_accumulate",
          [](const codec_handle& c, const torch::Tensor& message, const torch::Tensor& acc) {
            c.decode(message, acc, true);
          },
          py::arg("message"), py::arg("acc"))
      .def("make_state", &codec_handle::make_state, py::arg("n"))
      .def("save_state", &codec_handle::save_state, py::arg("state"))
      .def("load_state", &codec_handle::load_state, py::arg("saved"), py::arg("n"))
      .def("carried_error", &codec_handle::carried_error, py::arg("state"))
      .def("relaid_state", &codec_handle::relaid_state, py::arg("error"), py::arg("like"))
      .def(
          "plan",
          [](const codec_handle& c, std::uint64_t n, int ranks) { return std::string(plan_name(c.plan(n, ranks))); },
          py::arg("n"), py::arg("ranks"))
      .def("max_encoded_bytes", &codec_handle::max_encoded_bytes, py::arg("n"))
      .def("modelled_encoded_bytes", &codec_handle::modelled_encoded_bytes, py::arg("n"))
      .def("make_bucket_state", &codec_handle::make_bucket_state, py::arg("n"), py::arg("ranks"), py::arg("rank"))
      .def("save_bucket_state", &codec_handle::save_bucket_state, py::arg("state"))
      .def("load_bucket_state", &codec_handle::load_bucket_state, py::arg("saved"), py::arg("n"), py::arg("ranks"),
           py::arg("rank"))
      .def("bucket_errors", &codec_handle::bucket_errors, py::arg("state"))
      .def("relaid_bucket_state", &codec_handle::relaid_bucket_state, py::arg("worker"), py::arg("server"),
           py::arg("like"), py::arg("ranks"), py::arg("rank"))
      .def(
          "in_process_scatter_reduce",
          [key](const codec_handle& c, const std::vector<torch::Tensor>& data, const std::vector<state_handle*>& states,
                std::uint64_t step,
                std::uint32_t tensor_id) { c.in_process_scatter_reduce(data, states, key(step, tensor_id)); },
          py::arg("data"), py::arg("states"), py::arg("step") = 0, py::arg("tensor_id") = 0)
      .def("make_chunk_states", &codec_handle::make_chunk_states, py::arg("n"), py::arg("ranks"))
      .def("save_chunk_states", &codec_handle::save_chunk_states, py::arg("states"))
      .def("load_chunk_states", &codec_handle::load_chunk_states, py::arg("saved"), py::arg("n"), py::arg("ranks"))
      .def(
          "reduce_scatter_mean",
          [key](const codec_handle& c, py::object ops, const torch::Tensor& data, const torch::Tensor& out,
                state_handle* chunk_states, std::uint64_t step, std::uint32_t tensor_id, std::uint64_t dense_steps) {
            process_group_transport t(std::move(ops));
            const std::span<float> in = floats_of(data, "the data");
            const gradcomp::compressed_report report =
                c.reduce_scatter(t, in, floats_of(out, "the output"), chunk_states, key(step, tensor_id), dense_steps);
            py::dict result;
            result["sent_bytes"] = report.sent_bytes;
            result["dense_bytes"] = report.dense_bytes;
            return result;
          },
          py::arg("ops"), py::arg("data"), py::arg("out"), py::arg("chunk_states") = nullptr, py::arg("step") = 0,
          py::arg("tensor_id") = 0, py::arg("dense_steps") = 0)
      .def(
          "all_reduce_mean",
          [key](const codec_handle& c, py::object ops, const torch::Tensor& data, state_handle* state,
                std::uint64_t step, std::uint32_t tensor_id, std::uint64_t dense_steps) {
            process_group_transport t(std::move(ops));
            const std::span<float> values = floats_of(data, "the data");
            const gradcomp::compressed_report report =
                c.all_reduce(t, values, state, key(step, tensor_id), dense_steps);
            // The mean as the MPI example takes it: the rank-order sum divided by P in float.
            for (float& v : values) v /= static_cast<float>(t.size());
            py::dict out;
            out["sent_bytes"] = report.sent_bytes;
            out["dense_bytes"] = report.dense_bytes;
            return out;
          },
          py::arg("ops"), py::arg("data"), py::arg("state") = nullptr, py::arg("step") = 0, py::arg("tensor_id") = 0,
          py::arg("dense_steps") = 0);

  py::class_<gravac_buckets, std::shared_ptr<gravac_buckets>>(m, "Gravac")
      .def(py::init(&gravac_named), py::arg("name"))
      .def("save", &saved_bytes<gravac_buckets>)
      .def("load", &load_bytes<gravac_buckets>, py::arg("saved"))
      .def_property_readonly("density",
                             [](const gravac_buckets& g) -> py::object {
                               const auto sent = g.controller().decision().sent();
                               return sent ? py::object(py::float_(sent->density)) : py::object(py::none());
                             })
      .def_property_readonly("candidate",
                             [](const gravac_buckets& g) { return g.controller().decision().current.density; })
      .def_property_readonly("decision",
                             [](const gravac_buckets& g) { return decision_dict(g.controller().decision()); })
      .def(
          "all_reduce_mean",
          [key](gravac_buckets& g, py::object ops, const torch::Tensor& data,
                const std::vector<std::pair<std::uint32_t, std::size_t>>& params, std::uint64_t step,
                std::uint32_t tensor_id, bool last) {
            process_group_transport t(std::move(ops));
            std::vector<bucket_parameter> layout;
            for (const auto& [index, size] : params) layout.push_back({index, size});
            py::dict out;
            out["sent_bytes"] = g.all_reduce_mean(t, floats_of(data, "the data"), layout, key(step, tensor_id), last);
            return out;
          },
          py::arg("ops"), py::arg("data"), py::arg("params"), py::arg("step"), py::arg("tensor_id"), py::arg("last"));

  py::class_<gravac_ladder, std::shared_ptr<gravac_ladder>>(m, "GravacLadder")
      .def(py::init(&gravac_ladder_named), py::arg("name"))
      .def("save", &saved_bytes<gravac_ladder>)
      .def("load", &load_bytes<gravac_ladder>, py::arg("saved"))
      .def_property_readonly("decision",
                             [](const gravac_ladder& g) {
                               const gradcomp::gravac_decision& d = g.controller().decision();
                               py::dict out = decision_dict(d);
                               out["candidate_bits"] = gravac_ladder::bits_of(d.current.density);
                               out["safe_bits"] = gravac_ladder::bits_of(d.safe.density);
                               return out;
                             })
      .def("row", &gravac_ladder::row_of, py::arg("bits"))
      .def(
          "measure",
          [key](gravac_ladder& g, const torch::Tensor& data, const std::vector<std::size_t>& sizes, std::uint64_t step,
                std::uint32_t tensor_id) {
            const auto m = g.measure(floats_of(data, "the data"), sizes, key(step, tensor_id));
            return std::make_tuple(m[0], m[1], m[2]);
          },
          py::arg("data"), py::arg("sizes"), py::arg("step"), py::arg("tensor_id"))
      .def(
          "end_step",
          [](gravac_ladder& g, py::object ops, const std::tuple<double, double, double>& observed,
             std::size_t sent_bytes) {
            process_group_transport t(std::move(ops));
            g.end_step(t, {std::get<0>(observed), std::get<1>(observed), std::get<2>(observed)}, sent_bytes);
          },
          py::arg("ops"), py::arg("observed"), py::arg("sent_bytes"));

  py::class_<powersgd_buckets, std::shared_ptr<powersgd_buckets>>(m, "PowerSGD")
      .def(py::init(&powersgd_named), py::arg("name"))
      .def("save", &saved_bytes<powersgd_buckets>)
      .def("load", &load_bytes<powersgd_buckets>, py::arg("saved"))
      .def(
          "all_reduce_mean",
          [](powersgd_buckets& s, py::object ops, const torch::Tensor& data,
             const std::vector<powersgd_buckets::parameter_info>& params, std::uint64_t step,
             std::uint64_t dense_steps) {
            process_group_transport t(std::move(ops));
            py::dict out;
            out["sent_bytes"] = s.all_reduce_mean(t, floats_of(data, "the data"), params, step, dense_steps);
            return out;
          },
          py::arg("ops"), py::arg("data"), py::arg("params"), py::arg("step"), py::arg("dense_steps") = 0);

  py::class_<tagc_scheme, std::shared_ptr<tagc_scheme>>(m, "Tagc")
      .def(py::init(&tagc_named), py::arg("name"))
      .def("make_state", &tagc_scheme::make_state)
      .def("save_state", &tagc_scheme::save_state, py::arg("state"))
      .def("load_state", &tagc_scheme::load_state, py::arg("saved"))
      .def(
          "all_reduce_mean",
          [](const tagc_scheme& s, py::object ops, const torch::Tensor& data, state_handle& state,
             const std::vector<tagc_scheme::parameter_info>& params) {
            process_group_transport t(std::move(ops));
            const std::span<float> values = floats_of(data, "the data");
            py::dict out;
            out["sent_bytes"] = s.all_reduce_mean(t, values, state, params);
            return out;
          },
          py::arg("ops"), py::arg("data"), py::arg("state"), py::arg("params"))
      .def(
          "reduce_scatter_mean",
          [key](const tagc_scheme& s, py::object ops, const torch::Tensor& data, const torch::Tensor& out,
                state_handle& state, std::uint64_t step, std::uint32_t tensor_id) {
            process_group_transport t(std::move(ops));
            py::dict result;
            result["sent_bytes"] = s.reduce_scatter_mean(t, floats_of(data, "the data"), floats_of(out, "the output"),
                                                         state, key(step, tensor_id));
            return result;
          },
          py::arg("ops"), py::arg("data"), py::arg("out"), py::arg("state"), py::arg("step"), py::arg("tensor_id"))
      .def(
          "owner_residuals",
          [](const tagc_scheme&, const state_handle& state) {
            py::dict out;
            for (const auto& [key, residual] : tagc_scheme::owner_residuals(state))
              out[py::int_(key)] = torch::tensor(torch::ArrayRef<float>(residual.data(), residual.size()));
            return out;
          },
          py::arg("state"))
      .def("bytes_by_part", [](const tagc_scheme& s) {
        const tagc_bucket_bytes& b = s.bytes_by_part();
        py::dict out;
        out["index"] = b.index;
        out["sketch"] = b.sketch;
        out["tail"] = b.tail;
        out["padding"] = b.padding;
        out["resent"] = b.resent;
        out["dense"] = b.dense;
        out["gather"] = b.gather;
        return out;
      });
}
