#pragma once
// The CUDA side of the executor-generic tests: executor_memory<cuda_executor> (host vectors copied
// to device memory and back on the executor's stream, support/executor_io.hpp), which codecs have
// a CUDA backend, the reference-against-GPU check, and GRADCOMP_TEST_ON_EXECUTORS, which runs one test
// body on cpu_executor and on the CUDA tests' non-blocking stream (cuda/gpu_case.cuh says when the
// CUDA half runs, skips or fails).
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/cuda.cuh>

#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstddef>
#include <span>
#include <type_traits>
#include <vector>

#include "cuda/gpu_case.cuh"
#include "support/data.hpp"
#include "support/executor_io.hpp"

namespace gradcomp::test {

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
inline constexpr bool has_cuda_backend<zfp_fixed_rate_codec<float>> = true;
template <>
inline constexpr bool has_cuda_backend<mpc_codec<float>> = true;
template <class S, class Q>
inline constexpr bool has_cuda_backend<pipeline<S, Q>> = has_cuda_backend<S> && has_cuda_backend<Q>;

/// Whether C's GPU encoder writes the CPU's bytes for every input (the count sketch's atomic adds
/// match them only where its cell sums are exact, docs/cuda.md §4).
template <class C>
inline constexpr bool gpu_encodes_cpu_bytes = has_cuda_backend<C>;
template <class T>
inline constexpr bool gpu_encodes_cpu_bytes<count_sketch<T>> = false;

/// A device copy of `host`, queued on `exec`'s stream (the host vector may go once this returns).
template <class T>
device_array<T> to_device(const cuda_executor& exec, const std::vector<T>& host) {
  device_array<T> d(host.size(), exec);
  if (!host.empty())
    GRADCOMP_CUDA_CHECK(
        cudaMemcpyAsync(d.data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, exec.native_stream()));
  return d;
}

/// `count` device values, every byte `poison_byte` (the fill queued on `exec`'s stream).
template <class T>
device_array<T> poisoned(const cuda_executor& exec, std::size_t count) {
  device_array<T> d(count, exec);
  if (count > 0) GRADCOMP_CUDA_CHECK(cudaMemsetAsync(d.data(), poison_byte, count * sizeof(T), exec.native_stream()));
  return d;
}

/// A host copy of the first `count` elements of a device array, after `exec`'s queued work.
template <class T>
std::vector<T> to_host(const cuda_executor& exec, const device_array<T>& device, std::size_t count) {
  std::vector<T> host(count);
  if (count > 0)
    GRADCOMP_CUDA_CHECK(
        cudaMemcpyAsync(host.data(), device.data(), count * sizeof(T), cudaMemcpyDeviceToHost, exec.native_stream()));
  exec.synchronize();
  return host;
}

/// A host copy of a device array, after `exec`'s queued work.
template <class T>
std::vector<T> to_host(const cuda_executor& exec, const device_array<T>& device) {
  return to_host(exec, device, device.size());
}

/// Host vectors in device memory, copied in and out in order on the executor's stream.
template <>
struct executor_memory<cuda_executor> {
  template <class T>
  static device_array<T> copy_in(const cuda_executor& exec, const std::vector<T>& host) {
    return to_device(exec, host);
  }
  template <class T>
  static void poison(const cuda_executor& exec, std::span<T> buffer) {
    if (!buffer.empty())
      GRADCOMP_CUDA_CHECK(cudaMemsetAsync(buffer.data(), poison_byte, buffer.size_bytes(), exec.native_stream()));
  }
  template <class T>
  static device_array<T> poisoned(const cuda_executor& exec, std::size_t count) {
    return test::poisoned<T>(exec, count);
  }
  template <class T>
  static std::span<T> span(device_array<T>& buffer) {
    return buffer.span();
  }
  template <class T>
  static std::vector<T> copy_out(const cuda_executor& exec, const device_array<T>& buffer, std::size_t count) {
    return to_host(exec, buffer, count);
  }
};

/// Encodes `kind` input of n values on reference_executor and on the CUDA tests' stream and
/// requires the same bytes, then decodes that message on both, into poisoned values (every one must
/// be written) and onto a non-zero buffer, and requires the same bits.
template <class Codec>
void check_matches_reference(const Codec& codec, std::size_t n, input_kind kind, std::uint64_t seed) {
  using T = typename Codec::value_type;
  const reference_executor host;
  CAPTURE(n);
  CAPTURE(name(kind));
  const std::vector<T> x = make_input<T>(kind, n, seed);
  const message_key key{.step = seed % 97, .tensor_id = 6};
  const std::vector<std::byte> expected = encode_on(host, codec, x, key);
  CHECK(encode_on(test_gpu(), codec, x, key) == expected);
  const std::vector<T> start = make_input<T>(input_kind::normal, n, seed + 1);
  CHECK(bit_patterns(decode_on(test_gpu(), codec, expected, poisoned_values<T>(n))) ==
        bit_patterns(decode_on(host, codec, expected, poisoned_values<T>(n))));
  CHECK(bit_patterns(decode_on(test_gpu(), codec, expected, start, true)) ==
        bit_patterns(decode_on(host, codec, expected, start, true)));
}

}  // namespace gradcomp::test

/// Two test cases running `body(executor)`: "cpu: <name>" on cpu_executor and "cuda: <name>" on
/// the CUDA tests' non-blocking stream (test_gpu()), the second run where proceed_on_gpu() says so.
/// `body` is a generic lambda.
#define GRADCOMP_TEST_ON_EXECUTORS(name, body)                                  \
  TEST_CASE("cpu: " name) { body(::gradcomp::cpu_executor{}); }                 \
  TEST_CASE("cuda: " name) {                                                    \
    if (::gradcomp::test::proceed_on_gpu()) body(::gradcomp::test::test_gpu()); \
  }
