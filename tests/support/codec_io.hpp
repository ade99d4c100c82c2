#pragma once
// Small helpers that run a codec on the CPU with buffers sized as the codec asks.
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/wire_envelope.hpp>

#include <cstddef>
#include <span>
#include <vector>

namespace gradcomp::test {

/// Encodes `x` and returns exactly the bytes written.
template <class Codec, class T>
std::vector<std::byte> encode_bytes(const Codec& codec, const std::vector<T>& x, message_key key = {}) {
  const cpu_executor cpu;
  std::vector<std::byte> out(codec.max_encoded_bytes(x.size()));
  std::vector<std::byte> ws(codec.workspace_bytes(cpu, x.size()));
  out.resize(codec.encode(cpu, std::span<const T>(x), out, ws, key));
  return out;
}

/// Decodes `message` into a fresh vector of n values.
template <class Codec>
std::vector<typename Codec::value_type> decode_values(const Codec& codec, std::span<const std::byte> message,
                                                      std::size_t n, decode_limits limits = {}) {
  const cpu_executor cpu;
  std::vector<typename Codec::value_type> out(n);
  std::vector<std::byte> ws(codec.workspace_bytes(cpu, n));
  codec.decode(cpu, message, std::span<typename Codec::value_type>(out), ws, limits);
  return out;
}

}  // namespace gradcomp::test
