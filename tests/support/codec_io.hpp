#pragma once
// Small helpers that run a codec on the CPU with buffers sized as the codec asks.
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/wire_envelope.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
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

/// The envelope's size on the wire, written out (docs/wire-format.md §1): where a payload starts.
inline constexpr std::size_t envelope_bytes = 56;

/// Message `m` with its envelope rewritten to match its payload (CRC included): keeps a message
/// valid after a test edited its payload.
inline std::vector<std::byte> reseal(std::vector<std::byte> m) {
  write_envelope(parse_envelope(m), m);
  return m;
}

/// `good` (a message) with its payload replaced by `payload` and the envelope resealed to match.
inline std::vector<std::byte> with_payload(const std::vector<std::byte>& good, const std::vector<std::byte>& payload) {
  envelope e = parse_envelope(good);
  e.payload_bytes = payload.size();
  std::vector<std::byte> m(envelope::size + payload.size());
  std::copy(payload.begin(), payload.end(), m.begin() + static_cast<std::ptrdiff_t>(envelope::size));
  write_envelope(e, m);
  return m;
}

/// Decodes `message` into a fresh vector of n values (on `cpu`, by default the widest kernels).
template <class Codec>
std::vector<typename Codec::value_type> decode_values(const Codec& codec, std::span<const std::byte> message,
                                                      std::size_t n, decode_limits limits = {},
                                                      const cpu_executor& cpu = {}) {
  std::vector<typename Codec::value_type> out(n);
  std::vector<std::byte> ws(codec.workspace_bytes(cpu, n));
  codec.decode(cpu, message, std::span<typename Codec::value_type>(out), ws, limits);
  return out;
}

/// The shared-scale protocol run for ranks 0 … P−1 holding x[r]: each rank's block maxima, their
/// element-wise maximum (what a MAX all-reduce gives every rank), then each rank's encode_shared.
template <class Codec, class T>
std::vector<std::vector<std::byte>> encode_shared_ranks(const Codec& codec, const std::vector<std::vector<T>>& x,
                                                        message_key key = {}) {
  using M = compute_type<T>;  // the maxima's type: float32 for a 16-bit gradient
  const cpu_executor cpu;
  const std::size_t n = x.front().size();
  std::vector<M> agreed(codec.block_count(n), M{0}), mine(agreed.size());
  for (const std::vector<T>& g : x) {
    codec.block_maxima(cpu, std::span<const T>(g), std::span<M>(mine));
    for (std::size_t j = 0; j < agreed.size(); ++j) agreed[j] = mine[j] > agreed[j] ? mine[j] : agreed[j];
  }
  std::vector<std::vector<std::byte>> messages;
  for (std::size_t r = 0; r < x.size(); ++r) {
    std::vector<std::byte> out(codec.max_encoded_bytes(n));
    out.resize(codec.encode_shared(cpu, std::span<const T>(x[r]), std::span<const M>(agreed), out, {}, key,
                                   static_cast<std::uint32_t>(r)));
    messages.push_back(std::move(out));
  }
  return messages;
}

}  // namespace gradcomp::test
