#pragma once
/// @file
/// Random-k on the GPU, byte-identical to the CPU backend: one thread per kept position j
/// gathers x[π(j)] (the keyed permutation of core/random_permutation.hpp, built once on the host
/// and passed to the kernel by value). Decoding checks every value (finite once scaled by n/k),
/// then zero-fills the output unless accumulating and scatters. `accumulate_encoded` adds another
/// rank's values on the device and reseals.

#include <gradcomp/cuda/config.cuh>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/random_permutation.hpp>
#include <gradcomp/core/rounded_product.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cuda/executor.cuh>
#include <gradcomp/cuda/detail/grid.cuh>
#include <gradcomp/cuda/detail/message.cuh>
#include <gradcomp/cuda/detail/operation.cuh>
#include <gradcomp/sparsify/randomk.hpp>

namespace gradcomp {

namespace detail::cuda {

/// values[j] = x[π(j)], recording a NaN or Inf at its draw position j.
template <class T>
struct randomk_gather {
  const T* g;
  random_permutation pick;
  T* values;
  device_status* status;

  __device__ void operator()(std::uint64_t j) const {
    const T v = g[pick(j)];
    if (!is_finite(v)) record_failure(status, errc::non_finite_input, j);  // the first in draw order, as on the CPU
    values[j] = v;
  }
};

/// Records a value that is not finite once scaled.
template <class T>
struct randomk_check {
  const T* values;
  T scale;
  device_status* status;

  __device__ void operator()(std::uint64_t j) const {
    if (!is_finite(mul_rn(values[j], scale))) record_failure(status, errc::malformed_payload, j);
  }
};

/// out[π(j)] = value_j·scale, or += when accumulating.
template <class T>
struct randomk_scatter {
  const T* values;
  T scale;
  random_permutation pick;
  T* out;
  bool accumulate;

  __device__ void operator()(std::uint64_t j) const {
    const std::uint64_t i = pick(j);
    const T v = mul_rn(values[j], scale);
    out[i] = accumulate ? out[i] + v : v;
  }
};

/// Records a sum of two messages' values that is not finite.
template <class T>
struct randomk_check_sum {
  const T* sum;
  const T* add;
  device_status* status;

  __device__ void operator()(std::uint64_t j) const {
    if (!is_finite(sum[j] + add[j])) record_failure(status, errc::non_finite_input, j);
  }
};

/// sum += add, value by value.
template <class T>
struct randomk_add {
  T* sum;
  const T* add;

  __device__ void operator()(std::uint64_t j) const { sum[j] = sum[j] + add[j]; }
};

}  // namespace detail::cuda

/// Random-k on the GPU.
template <gradient_value T>
struct backend<randomk_sparsifier<T>, cuda_executor> {
  static std::size_t workspace_bytes(const randomk_sparsifier<T>&, const cuda_executor&, std::uint64_t) {
    return detail::cuda::status_and_crc_bytes();
  }

  static std::size_t encode(const randomk_sparsifier<T>& codec, const cuda_executor& exec, std::span<const T> grad,
                            std::span<std::byte> out, std::span<std::byte> ws, message_key key) {
    const std::uint64_t n = grad.size();
    const std::uint64_t k = codec.k(n);
    const std::size_t size = codec.max_encoded_bytes(n);
    workspace_arena arena(ws);
    const detail::cuda::operation op(exec, arena);
    const detail::cuda::crc_scratch crc = detail::cuda::carve_seal(arena, codec.wire().payload_checksum);
    detail::cuda::begin_message(exec, out, size);  // after the workspace is carved: a refused call writes nothing
    auto* const values = reinterpret_cast<T*>(out.data() + envelope::size);
    if (k > 0)
      detail::cuda::for_each_item(exec, k,
                                  detail::cuda::randomk_gather<T>{grad.data(), codec.permutation(n, key), values,
                                                                  op.status()});
    seal(codec, exec, out.data(), n, key, crc, op);
    op.finish_encode([&](errc, std::uint64_t j, std::uint32_t) {
      return "gradient value " + std::to_string(codec.permutation(n, key)(j)) + " is NaN or Inf";
    });
    return size;
  }

  static void decode(const randomk_sparsifier<T>& codec, const cuda_executor& exec, std::span<const std::byte> message,
                     std::span<T> out, std::span<std::byte> ws, const decode_limits& limits, bool accumulate) {
    workspace_arena arena(ws);
    const detail::cuda::operation op(exec, arena);
    const detail::cuda::crc_scratch crc = detail::cuda::crc_scratch::carve(arena);
    const envelope e = read_checked(codec, exec, message, out.size(), limits, crc);
    const std::uint64_t n = e.elements;
    const std::uint64_t k = codec.k(n);
    const auto* const values = reinterpret_cast<const T*>(message.data() + envelope::size);
    const T scale =
        k == 0 || !codec.params().scaled ? T{1} : static_cast<T>(static_cast<double>(n) / static_cast<double>(k));
    detail::cuda::for_each_item(exec, k, detail::cuda::randomk_check<T>{values, scale, op.status()});
    op.finish([](errc, std::uint64_t j, std::uint32_t) {
      return "value at position " + std::to_string(j) + " is non-finite or overflows when scaled";
    });
    if (!accumulate && !out.empty())
      GRADCOMP_CUDA_CHECK(cudaMemsetAsync(out.data(), 0, out.size_bytes(), exec.native_stream()));
    if (k == 0) return;
    detail::cuda::for_each_item(exec, k,
                                detail::cuda::randomk_scatter<T>{values, scale, codec.permutation(n, e.key), out.data(),
                                                                 accumulate});
  }

  static void accumulate_encoded(const randomk_sparsifier<T>& codec, const cuda_executor& exec,
                                 std::span<std::byte> acc, std::span<const std::byte> other) {
    const detail::cuda::pooled_status_and_crc scratch(exec);
    const envelope mine = detail::cuda::fetch_envelope(exec, acc, scratch.crc);
    validate_envelope(mine, expectation(codec, mine.elements), {});
    codec.validate_payload_size(mine);
    const envelope theirs = read_checked(codec, exec, other, mine.elements, {}, scratch.crc);
    detail::require(mine.key == theirs.key, errc::step_mismatch,
                    "messages of different steps or tensors cannot be summed");
    const std::uint64_t k = codec.k(mine.elements);
    auto* const sum = reinterpret_cast<T*>(acc.data() + envelope::size);
    const auto* const add = reinterpret_cast<const T*>(other.data() + envelope::size);
    detail::cuda::for_each_item(exec, k, detail::cuda::randomk_check_sum<T>{sum, add, scratch.op.status()});
    scratch.op.finish(
        [](errc, std::uint64_t j, std::uint32_t) { return "sum overflows at position " + std::to_string(j); });
    detail::cuda::for_each_item(exec, k, detail::cuda::randomk_add<T>{sum, add});
    const detail::cuda::crc_scratch seal_crc =
        codec.wire().payload_checksum ? scratch.crc : detail::cuda::crc_scratch{};
    seal(codec, exec, acc.data(), mine.elements, mine.key, seal_crc, scratch.op);
  }

 private:
  static void seal(const randomk_sparsifier<T>& codec, const cuda_executor& exec, std::byte* out, std::uint64_t n,
                   message_key key, const detail::cuda::crc_scratch& crc, const detail::cuda::operation& op) {
    detail::cuda::seal_message(exec, out,
                               {codec_id::random_k, dtype_of<T>, 0, 0, key, n, codec.k(n) * sizeof(T),
                                codec.params_hash(), 0},
                               crc, op);
  }

  /// What a decoder of an `elements`-element buffer expects of a message's envelope.
  static envelope_expectation expectation(const randomk_sparsifier<T>& codec, std::uint64_t elements) {
    return {codec_id::random_k, dtype_of<T>, elements, codec.params_hash()};
  }

  /// Reads and checks a random-k message for an `elements`-element buffer (payload: k values).
  static envelope read_checked(const randomk_sparsifier<T>& codec, const cuda_executor& exec,
                               std::span<const std::byte> message, std::uint64_t elements, const decode_limits& limits,
                               const detail::cuda::crc_scratch& crc) {
    const envelope e = detail::cuda::read_envelope(exec, message, expectation(codec, elements), limits, crc);
    codec.validate_payload_size(e);
    return e;
  }
};

}  // namespace gradcomp
