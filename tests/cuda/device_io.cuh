#pragma once
// Running a codec on any executor with host vectors at the interface: on the CPU directly, on the
// GPU by copying inputs to device memory and results back. Test bodies written against these
// helpers run unchanged on cpu_executor and cuda_executor (GRADCOMP_TEST_ON_EXECUTORS), and the
// CUDA cases skip where no GPU (or no driver) is present.
#include <gradcomp/cuda.cuh>

#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "support/errors.hpp"

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
inline constexpr bool has_cuda_backend<qsgd_quantizer<T>> = true;

/// A device copy of `host`.
template <class T>
device_array<T> to_device(const std::vector<T>& host) {
  device_array<T> d(host.size());
  if (!host.empty()) GRADCOMP_CUDA_CHECK(cudaMemcpy(d.data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

/// A host copy of `count` device elements at `device`.
template <class T>
std::vector<T> to_host(const T* device, std::size_t count) {
  std::vector<T> host(count);
  if (count > 0) GRADCOMP_CUDA_CHECK(cudaMemcpy(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

/// A host copy of a device array.
template <class T>
std::vector<T> to_host(const device_array<T>& device) {
  return to_host(device.data(), device.size());
}

/// Encodes `x` on `exec` and returns exactly the bytes written.
template <class E, class Codec, class T>
std::vector<std::byte> encode_on(const E& exec, const Codec& codec, const std::vector<T>& x, message_key key = {}) {
  if constexpr (on_gpu<E>) {
    const device_array<T> g = to_device(x);
    device_array<std::byte> out(codec.max_encoded_bytes(x.size()));
    device_array<std::byte> ws(codec.workspace_bytes(exec, x.size()));
    const std::size_t size = codec.encode(exec, std::span<const T>(g.span()), out.span(), ws.span(), key);
    return to_host(out.data(), size);
  } else {
    std::vector<std::byte> out(codec.max_encoded_bytes(x.size()));
    std::vector<std::byte> ws(codec.workspace_bytes(exec, x.size()));
    out.resize(codec.encode(exec, std::span<const T>(x), out, ws, key));
    return out;
  }
}

/// Decodes `message` on `exec` into `into` (overwriting, or adding when `accumulate`) and returns
/// the result; on error throws and leaves nothing changed.
template <class E, class Codec, class T = typename Codec::value_type>
std::vector<T> decode_on(const E& exec, const Codec& codec, const std::vector<std::byte>& message, std::vector<T> into,
                         bool accumulate = false, decode_limits limits = {}) {
  const std::size_t n = into.size();
  if constexpr (on_gpu<E>) {
    const device_array<std::byte> m = to_device(message);
    device_array<T> out = to_device(into);
    device_array<std::byte> ws(codec.workspace_bytes(exec, n));
    if (accumulate) codec.decode_accumulate(exec, std::span<const std::byte>(m.span()), out.span(), ws.span(), limits);
    else codec.decode(exec, std::span<const std::byte>(m.span()), out.span(), ws.span(), limits);
    return to_host(out);
  } else {
    std::vector<std::byte> ws(codec.workspace_bytes(exec, n));
    if (accumulate) codec.decode_accumulate(exec, std::span<const std::byte>(message), std::span<T>(into), ws, limits);
    else codec.decode(exec, std::span<const std::byte>(message), std::span<T>(into), ws, limits);
    return into;
  }
}

/// What an operation gave: "ok" or the named error it threw, and the output buffer afterwards.
template <class V>
struct outcome {
  std::string status;
  std::vector<V> output;

  friend bool operator==(const outcome&, const outcome&) = default;
};

/// Encodes `x` on `exec` into a buffer of `max_encoded_bytes` pre-filled with 0xAB bytes, and
/// returns what happened and the whole buffer (on success, the message's bytes first).
template <class E, class Codec, class T>
outcome<std::byte> encode_outcome_on(const E& exec, const Codec& codec, const std::vector<T>& x, message_key key = {}) {
  std::vector<std::byte> buffer(codec.max_encoded_bytes(x.size()), std::byte{0xAB});
  std::string status = "ok";
  if constexpr (on_gpu<E>) {
    const device_array<T> g = to_device(x);
    device_array<std::byte> out = to_device(buffer);
    device_array<std::byte> ws(codec.workspace_bytes(exec, x.size()));
    try {
      (void)codec.encode(exec, std::span<const T>(g.span()), out.span(), ws.span(), key);
    } catch (const error& e) {
      status = named(e.code());
    }
    buffer = to_host(out);
  } else {
    std::vector<std::byte> ws(codec.workspace_bytes(exec, x.size()));
    try {
      (void)codec.encode(exec, std::span<const T>(x), buffer, ws, key);
    } catch (const error& e) {
      status = named(e.code());
    }
  }
  return {status, buffer};
}

/// Decodes `message` on `exec` into (or, with `accumulate`, onto) a copy of `into`, and returns
/// what happened and the output afterwards.
template <class E, class Codec, class T = typename Codec::value_type>
outcome<T> decode_outcome_on(const E& exec, const Codec& codec, const std::vector<std::byte>& message,
                             const std::vector<T>& into, bool accumulate = false, decode_limits limits = {}) {
  std::string status = "ok";
  std::vector<T> values = into;
  if constexpr (on_gpu<E>) {
    const device_array<std::byte> m = to_device(message);
    device_array<T> out = to_device(into);
    device_array<std::byte> ws(codec.workspace_bytes(exec, into.size()));
    try {
      if (accumulate) codec.decode_accumulate(exec, std::span<const std::byte>(m.span()), out.span(), ws.span(), limits);
      else codec.decode(exec, std::span<const std::byte>(m.span()), out.span(), ws.span(), limits);
    } catch (const error& e) {
      status = named(e.code());
    }
    values = to_host(out);
  } else {
    std::vector<std::byte> ws(codec.workspace_bytes(exec, into.size()));
    try {
      if (accumulate) codec.decode_accumulate(exec, std::span<const std::byte>(message), std::span<T>(values), ws, limits);
      else codec.decode(exec, std::span<const std::byte>(message), std::span<T>(values), ws, limits);
    } catch (const error& e) {
      status = named(e.code());
    }
  }
  return {status, values};
}

/// Bit patterns of values, so that outcomes compare −0 ≠ +0 and NaN payloads exactly.
template <class T>
std::vector<typename float_traits<T>::bits_type> bit_patterns(const std::vector<T>& values) {
  std::vector<typename float_traits<T>::bits_type> bits(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) bits[i] = to_bits(values[i]);
  return bits;
}

}  // namespace gradcomp::test

/// Two test cases running `body(executor)`: "cpu: <name>" on cpu_executor and "cuda: <name>" on
/// cuda_executor, the second skipped where no GPU is present. `body` is a generic lambda.
#define GRADCOMP_TEST_ON_EXECUTORS(name, body)                                                   \
  TEST_CASE("cpu: " name) { body(::gradcomp::cpu_executor{}); }                                  \
  TEST_CASE("cuda: " name * doctest::skip(!::gradcomp::test::gpu_available())) {                 \
    body(::gradcomp::cuda_executor{});                                                           \
  }
