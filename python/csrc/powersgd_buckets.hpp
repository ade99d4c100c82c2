#pragma once
// PowerSGD over DDP's buckets (docs/lowrank.md §6): every parameter of a bucket goes through
// gradcomp's PowerSGD all-reduce as its own matrix, viewed as PyTorch's powerSGD_hook views it (the
// first dimension × the rest; a vector is 1 × n and goes dense), with its state kept here, keyed by
// the parameter's index in the model, so DDP's bucket rebuilds change nothing. Batched, as
// PyTorch's batched_powerSGD_hook: the whole bucket padded to one square matrix, its state keyed by
// the bucket's set of parameters (a rebuilt bucket starts from zero error).
#include <gradcomp/gradcomp.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace gradcomp_torch {

class powersgd_buckets {
 public:
  /// A parameter of a bucket: its index in the model, its name and its shape.
  using parameter_info = std::tuple<std::uint32_t, std::string, std::vector<std::int64_t>>;

  explicit powersgd_buckets(gradcomp::powersgd_params params, bool batched = false)
      : scheme_(params), batched_(batched) {}

  /// `data` (the bucket's parameters one after another, in the order of `params`) becomes the
  /// mean over the ranks, parameter by parameter (tensor id: the parameter's index; warm-up: the
  /// `dense` plan while `step < dense_steps`). Returns the bytes this rank sent, as ring
  /// all-reduces send them. @throws gradcomp::error `non_finite_input` on every rank alike, before
  /// any state moves, when any rank's bucket holds NaN or Inf (a MAX all-reduce of a flag).
  template <gradcomp::transport X>
  std::size_t all_reduce_mean(X& t, std::span<float> data, const std::vector<parameter_info>& params,
                              std::uint64_t step, std::uint64_t dense_steps) {
    std::size_t offset = 0;
    std::vector<gradcomp::matrix_shape> shapes;
    for (const auto& [id, name, shape] : params) {
      std::uint64_t count = 1;
      for (const std::int64_t d : shape) count *= static_cast<std::uint64_t>(d);
      const std::uint64_t rows = shape.size() >= 2 ? static_cast<std::uint64_t>(shape[0]) : 1;
      shapes.push_back({rows, rows == 0 ? 0 : count / rows});
      offset += static_cast<std::size_t>(count);
    }
    gradcomp::detail::require(offset == data.size(), gradcomp::errc::size_mismatch, [&] {
      return "the bucket holds " + std::to_string(data.size()) + " values, its parameters " + std::to_string(offset);
    });
    const bool finite = std::ranges::all_of(data, [](float v) { return gradcomp::is_finite(v); });
    gradcomp::detail::agree_on_status(t, finite ? gradcomp::errc{} : gradcomp::errc::non_finite_input, "PowerSGD hook");
    std::size_t sent = 0;
    if (batched_) {
      std::uint64_t key = 0xcbf29ce484222325ull;  // FNV-1a over the parameter ids
      for (const auto& parameter : params) key = (key ^ std::get<0>(parameter)) * 0x100000001b3ull;
      const auto id = static_cast<std::uint32_t>(key ^ (key >> 32));
      const std::uint64_t side = gradcomp::powersgd_square_side(data.size());
      shapes_[id] = {side, side};
      return gradcomp::compressed_all_reduce(gradcomp::cpu_executor{}, t, scheme_, states_[id], data,
                                             {.key = {.step = step, .tensor_id = id},
                                              .average = true,
                                              .dense_steps = dense_steps})
          .sent_bytes;
    }
    offset = 0;
    for (std::size_t l = 0; l < params.size(); ++l) {
      const auto id = std::get<0>(params[l]);
      const gradcomp::matrix_shape shape = shapes[l];
      const std::span<float> values = data.subspan(offset, static_cast<std::size_t>(shape.count()));
      offset += values.size();
      shapes_[id] = shape;
      sent += gradcomp::compressed_all_reduce(gradcomp::cpu_executor{}, t, scheme_, states_[id], values, shape,
                                              {.key = {.step = step, .tensor_id = id},
                                               .average = true,
                                               .dense_steps = dense_steps})
                  .sent_bytes;
    }
    return sent;
  }

  /// The states as bytes: per parameter (batched: per bucket) compressed at least once, its key
  /// (u32), rows and columns (u64 each), the size of its saved state (u64) and that state
  /// (lowrank/powersgd.hpp's format), native byte order.
  [[nodiscard]] std::vector<std::byte> save() const {
    std::vector<std::byte> bytes;
    for (const auto& [id, state] : states_) {
      if (state.steps == 0) continue;  // never compressed (a vector, a small matrix, the warm-up): nothing kept
      const gradcomp::matrix_shape shape = shapes_.at(id);
      std::vector<std::byte> saved(scheme_.saved_state_bytes(shape));
      saved.resize(scheme_.save_state(state, shape, saved));
      append(bytes, id);
      append(bytes, shape.rows);
      append(bytes, shape.cols);
      append(bytes, static_cast<std::uint64_t>(saved.size()));
      bytes.insert(bytes.end(), saved.begin(), saved.end());
    }
    return bytes;
  }

  /// Restores what `save` wrote. @throws gradcomp::error naming what is wrong; unchanged then.
  void load(std::span<const std::byte> bytes) {
    std::map<std::uint32_t, gradcomp::powersgd_state<float>> states;
    std::map<std::uint32_t, gradcomp::matrix_shape> shapes;
    std::size_t at = 0;
    const auto take = [&](std::size_t size) {
      gradcomp::detail::require(bytes.size() - at >= size, gradcomp::errc::truncated, "PowerSGD hook state ends early");
      const auto part = bytes.subspan(at, size);
      at += size;
      return part;
    };
    const auto read = [&]<class V>(V) {
      V v{};
      std::memcpy(&v, take(sizeof v).data(), sizeof v);
      return v;
    };
    while (at < bytes.size()) {
      const auto id = read(std::uint32_t{});
      const gradcomp::matrix_shape shape{read(std::uint64_t{}), read(std::uint64_t{})};
      const auto size = read(std::uint64_t{});
      gradcomp::detail::require(size <= bytes.size(), gradcomp::errc::truncated, "PowerSGD hook state ends early");
      scheme_.load_state(take(static_cast<std::size_t>(size)), shape, states[id]);
      shapes[id] = shape;
    }
    states_ = std::move(states);
    shapes_ = std::move(shapes);
  }

 private:
  template <class V>
  static void append(std::vector<std::byte>& bytes, V value) {
    const auto raw = std::as_bytes(std::span<const V>(&value, 1));
    bytes.insert(bytes.end(), raw.begin(), raw.end());
  }

  gradcomp::powersgd<float> scheme_;
  bool batched_;
  std::map<std::uint32_t, gradcomp::powersgd_state<float>> states_;  // by parameter index (batched: bucket key)
  std::map<std::uint32_t, gradcomp::matrix_shape> shapes_;
};

}  // namespace gradcomp_torch
