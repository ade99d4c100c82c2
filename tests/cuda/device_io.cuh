#pragma once
// The CUDA side of the executor-generic tests: executor_memory<cuda_executor> (host vectors copied
// to device memory and back, support/executor_io.hpp), whether a GPU is present, which codecs have
// a CUDA backend, and GRADCOMP_TEST_ON_EXECUTORS, which runs one test body on cpu_executor and on
// cuda_executor, the CUDA case skipped where no GPU (or no driver) is present.
#include <gradcomp/cuda.cuh>

#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstddef>
#include <span>
#include <type_traits>
#include <vector>

#include "support/data.hpp"
#include "support/executor_io.hpp"

namespace gradcomp::test {

/// Whether a CUDA device can run kernels here (any CUDA error at the device query means no).
inline bool gpu_available() {
  static const bool available = [] {
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  }();
  return available;
}

/// Whether E is the CUDA executor.
template <class E>
inline constexpr bool on_gpu = std::is_same_v<E, cuda_executor>;

/// Whether codec C has a CUDA backend (one line per codec family that has one).
template <class C>
inline constexpr bool has_cuda_backend = false;
template <class T>
inline constexpr bool has_cuda_backend<uniform_quantizer<T>> = true;
template <class T>
inline constexpr bool has_cuda_backend<sign_quantizer<T>> = true;
template <class T>
inline constexpr bool has_cuda_backend<shared_scale_quantizer<T>> = true;
template <class T>
inline constexpr bool has_cuda_backend<qsgd_quantizer<T>> = true;
template <class T>
inline constexpr bool has_cuda_backend<topk_sparsifier<T>> = true;
template <class T>
inline constexpr bool has_cuda_backend<randomk_sparsifier<T>> = true;
template <class T>
inline constexpr bool has_cuda_backend<threshold_sparsifier<T>> = true;
template <class T>
inline constexpr bool has_cuda_backend<count_sketch<T>> = true;
template <>
inline constexpr bool has_cuda_backend<zfp_fixed_rate_codec> = true;
template <>
inline constexpr bool has_cuda_backend<mpc_codec> = true;
template <class S, class Q>
inline constexpr bool has_cuda_backend<pipeline<S, Q>> = has_cuda_backend<S> && has_cuda_backend<Q>;

/// Whether C's GPU encoder writes the CPU's bytes for every input (the count sketch's atomic adds
/// match them only where its cell sums are exact, docs/cuda.md §4).
template <class C>
inline constexpr bool gpu_encodes_cpu_bytes = has_cuda_backend<C>;
template <class T>
inline constexpr bool gpu_encodes_cpu_bytes<count_sketch<T>> = false;

/// A device copy of `host`.
template <class T>
device_array<T> to_device(const std::vector<T>& host) {
  device_array<T> d(host.size());
  if (!host.empty()) GRADCOMP_CUDA_CHECK(cudaMemcpy(d.data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

/// A host copy of the first `count` elements of a device array.
template <class T>
std::vector<T> to_host(const device_array<T>& device, std::size_t count) {
  std::vector<T> host(count);
  if (count > 0) GRADCOMP_CUDA_CHECK(cudaMemcpy(host.data(), device.data(), count * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

/// A host copy of a device array.
template <class T>
std::vector<T> to_host(const device_array<T>& device) {
  return to_host(device, device.size());
}

/// Host vectors in device memory: copied in with cudaMemcpy, copied out after the stream's work.
template <>
struct executor_memory<cuda_executor> {
  template <class T>
  static device_array<T> copy_in(const std::vector<T>& host) {
    return to_device(host);
  }
  template <class T>
  static device_array<T> zeros(std::size_t count) {
    return device_array<T>(count);
  }
  template <class T>
  static std::span<T> span(device_array<T>& buffer) {
    return buffer.span();
  }
  template <class T>
  static std::vector<T> copy_out(const cuda_executor& exec, const device_array<T>& buffer, std::size_t count) {
    exec.synchronize();
    return to_host(buffer, count);
  }
};

/// Encodes `kind` input of n values on the CPU and the GPU and requires the same bytes, then
/// decodes that message on both, into zeros and onto a non-zero buffer, and requires the same bits.
template <class Codec>
void check_matches_cpu(const Codec& codec, std::size_t n, input_kind kind, std::uint64_t seed) {
  using T = typename Codec::value_type;
  CAPTURE(n);
  CAPTURE(name(kind));
  const std::vector<T> x = make_input<T>(kind, n, seed);
  const message_key key{.step = seed % 97, .tensor_id = 6};
  const std::vector<std::byte> cpu = encode_on(cpu_executor{}, codec, x, key);
  CHECK(encode_on(cuda_executor{}, codec, x, key) == cpu);
  const std::vector<T> start = make_input<T>(input_kind::normal, n, seed + 1);
  CHECK(bit_patterns(decode_on(cuda_executor{}, codec, cpu, std::vector<T>(n))) ==
        bit_patterns(decode_on(cpu_executor{}, codec, cpu, std::vector<T>(n))));
  CHECK(bit_patterns(decode_on(cuda_executor{}, codec, cpu, start, true)) ==
        bit_patterns(decode_on(cpu_executor{}, codec, cpu, start, true)));
}

}  // namespace gradcomp::test

/// Two test cases running `body(executor)`: "cpu: <name>" on cpu_executor and "cuda: <name>" on
/// cuda_executor, the second skipped where no GPU is present. `body` is a generic lambda.
#define GRADCOMP_TEST_ON_EXECUTORS(name, body)                                                   \
  TEST_CASE("cpu: " name) { body(::gradcomp::cpu_executor{}); }                                  \
  TEST_CASE("cuda: " name * doctest::skip(!::gradcomp::test::gpu_available())) {                 \
    body(::gradcomp::cuda_executor{});                                                           \
  }
