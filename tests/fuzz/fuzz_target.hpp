#pragma once
// Shared by the fuzz targets: turning fuzzer bytes into a message, and decoding into buffers
// whose size the message itself asks for (bounded by a cap, as a real receiver would do).
#include <gradcomp/gradcomp.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

namespace gradcomp::fuzz {

/// Largest element count a fuzzed decoder accepts (the caller's cap).
inline constexpr std::uint64_t max_elements = std::uint64_t{1} << 20;
/// The cap for decoders whose work grows with the declared n whatever the message's size (the
/// count sketch estimates every element from a fixed-size sketch): at 2^20 each run would take
/// milliseconds and fuzzing would crawl, while 2^12 still spans several blocks, tails and the
/// `too_large` rejection.
inline constexpr std::uint64_t max_elements_dense_work = std::uint64_t{1} << 12;

/// The message a fuzz input stands for. The first byte chooses the mode: even = the remaining
/// bytes as they are; odd = the same bytes with the envelope's parameter hash replaced by
/// `params_hash` and its CRC recomputed, so the fuzzer can reach the payload and size checks
/// behind the header checksum.
inline std::vector<std::byte> message_from(const std::uint8_t* data, std::size_t size, std::uint64_t params_hash) {
  if (size == 0) return {};
  std::vector<std::byte> message(size - 1);
  for (std::size_t i = 1; i < size; ++i) message[i - 1] = static_cast<std::byte>(data[i]);
  if ((data[0] & 1u) != 0 && message.size() >= envelope::size) {
    detail::store_le<std::uint64_t>(message.data() + 32, params_hash);
    detail::store_le<std::uint32_t>(message.data() + 52, crc32c({message.data(), 52}));
  }
  return message;
}

/// Element count a receiver would size its buffer from: the envelope's, if it parses and fits the cap.
inline std::size_t declared_elements(std::span<const std::byte> message, std::uint64_t cap = max_elements) {
  try {
    const envelope e = parse_envelope(message);
    return e.elements <= cap ? static_cast<std::size_t>(e.elements) : 0;
  } catch (const error&) {
    return 0;
  }
}

/// decode_both's body for an output of V values.
template <class T, class Codec>
void decode_both_into(const Codec& codec, std::span<const std::byte> message, std::uint64_t cap) {
  const cpu_executor cpu;
  const std::size_t n = declared_elements(message, cap);
  std::vector<T> out(n);
  std::vector<std::byte> ws(codec.workspace_bytes(cpu, n));
  const decode_limits limits{.max_elements = cap};
  try {
    codec.decode(cpu, message, std::span<T>(out), ws, limits);
    if constexpr (requires { requires Codec::may_decode_infinity; }) {  // ZFP: a corrupted exponent may give ±Inf
      for (const T v : out)  // but never NaN, and a 16-bit output refuses ±Inf (narrowing_overflow)
        if (magnitude_key(v) > float_traits<T>::infinity_key || (half_precision<T> && !is_finite(v))) __builtin_trap();
    } else if constexpr (!requires { requires Codec::is_lossless; }) {  // lossless codecs carry NaN and Inf
      for (const T v : out)
        if (!is_finite(v)) __builtin_trap();  // a lossy decoder must never produce NaN or Inf
    }
  } catch (const error&) {
  }
  try {
    codec.decode_accumulate(cpu, message, std::span<T>(out), ws, limits);
  } catch (const error&) {
  }
}

/// Runs decode and decode_accumulate of `codec` on `message` into T values (the codec's own, or
/// float32 for a 16-bit codec), with element cap `cap`; any gradcomp::error is an accepted outcome,
/// anything else (a crash, a sanitizer report, a foreign exception) is a finding.
template <class T = void, class Codec>
void decode_both(const Codec& codec, std::span<const std::byte> message, std::uint64_t cap = max_elements) {
  using V = std::conditional_t<std::is_void_v<T>, typename Codec::value_type, T>;
  decode_both_into<V>(codec, message, cap);
}

/// decode_both of a 16-bit codec into both of its outputs: its own type and float32.
template <class Codec>
void decode_both_outputs(const Codec& codec, std::span<const std::byte> message) {
  decode_both(codec, message);
  decode_both<float>(codec, message);
}

/// decode_both of a codec's messages into every output it has: its own type, and float32 too for a
/// 16-bit codec.
template <class Codec>
void decode_every_output(const Codec& codec, std::span<const std::byte> message) {
  if constexpr (half_precision<typename Codec::value_type>) decode_both_outputs(codec, message);
  else
    decode_both(codec, message);
}

/// Calls `f(std::type_identity<T>{})` with the value type that bits 3-4 of the mode byte name for
/// the float32 codecs that also take 16-bit gradients (MPC, ZFP): 1 bf16, 2 fp16, else float.
template <class F>
void with_float_codec_dtype(std::uint8_t mode, F&& f) {
  switch ((mode >> 3) & 3u) {
    case 1: f(std::type_identity<bf16>{}); break;
    case 2: f(std::type_identity<fp16>{}); break;
    default: f(std::type_identity<float>{}); break;
  }
}

/// Runs accumulate_encoded of `message` into a copy of itself (homomorphic codecs); any
/// gradcomp::error is an accepted outcome.
template <class Codec>
void accumulate_into_copy(const Codec& codec, std::span<const std::byte> message) {
  std::vector<std::byte> sum(message.begin(), message.end());
  try {
    codec.accumulate_encoded(cpu_executor{}, sum, message);
  } catch (const error&) {
  }
}

}  // namespace gradcomp::fuzz
