#pragma once
/// @file
/// Reference backend of the MPC codec (docs/lossless.md §1): the specification the `cpu_executor`
/// and `cuda_executor` backends are checked against, byte for byte. The encoder runs the four
/// steps of docs/lossless.md §1.2 on each chunk of 1024 words, one loop per step; the decoder
/// checks the bitmaps against the payload, undoes the steps chunk by chunk into its workspace
/// (which lets it check the last group's padding, and for a 16-bit dtype that every word is a
/// widened 16-bit value, before it touches the output), then writes or adds the values.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/half_float.hpp>
#include <gradcomp/core/narrowing.hpp>
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/lossless/mpc.hpp>

namespace gradcomp {

/// MPC, written to be read.
template <gradient_value T>
struct backend<mpc_codec<T>, reference_executor> {
  using codec_type = mpc_codec<T>;
  static constexpr std::uint64_t chunk = codec_type::chunk;
  static constexpr std::uint64_t group = codec_type::group;

  /// The decoder's n words; the encoder needs none.
  static std::size_t workspace_bytes(const codec_type&, const reference_executor&, std::uint64_t n) {
    workspace_arena arena = workspace_arena::measure();
    (void)arena.take<std::uint32_t>(static_cast<std::size_t>(n));
    return arena.bytes_needed();
  }

  static std::size_t encode(const codec_type& codec, const reference_executor&, std::span<const T> grad,
                            std::span<std::byte> out, std::span<std::byte>, message_key key) {
    const std::uint64_t n = grad.size();
    detail::begin_host_message(out, codec.max_encoded_bytes(n));
    std::byte* const bitmaps = out.data() + envelope::size;
    std::byte* const words = bitmaps + 4 * codec_type::group_count(n);
    std::uint64_t kept = 0;
    const std::uint64_t d = codec.params().dim;
    for (std::uint64_t base = 0; base < n; base += chunk) {
      const std::uint64_t c = std::min(chunk, n - base);
      const std::uint64_t padded = (c + group - 1) / group * group;
      std::uint32_t v[chunk], a[chunk] = {}, w[chunk], b[chunk];
      // The 32-bit patterns of the values (of a 16-bit value's exact float32 widening).
      for (std::uint64_t t = 0; t < c; ++t) v[t] = std::bit_cast<std::uint32_t>(widen(grad[base + t]));
      // 1. a[t] = v[t] − v[t − d] (v[t] for t < d); the padding up to a whole group stays 0.
      for (std::uint64_t t = 0; t < c; ++t) a[t] = t < d ? v[t] : v[t] - v[t - d];
      // 2. Each group of 32 words transposed as a 32×32 bit matrix.
      for (std::uint64_t g = 0; g < padded; g += group) transpose(a + g, w + g);
      // 3. b[t] = w[t] − w[t − 1] across the chunk's groups, b[0] = w[0].
      for (std::uint64_t t = 0; t < padded; ++t) b[t] = t == 0 ? w[0] : w[t] - w[t - 1];
      // 4. Per group a bitmap of its non-zero words, and those words in order.
      for (std::uint64_t g = 0; g < padded; g += group) {
        std::uint32_t bitmap = 0;
        for (std::uint64_t L = 0; L < group; ++L) {
          if (b[g + L] == 0) continue;
          bitmap |= std::uint32_t{1} << L;
          put_word(words, kept++, b[g + L]);
        }
        put_word(bitmaps, (base + g) / group, bitmap);
      }
    }
    // The envelope last (docs/wire-format.md §17).
    const std::uint64_t payload = 4 * (codec_type::group_count(n) + kept);
    detail::seal_host_message(out, {codec_id::mpc, dtype_of<T>, 0, 0, key, n, payload, codec.params_hash(), 0},
                              codec.wire().payload_checksum);
    return static_cast<std::size_t>(envelope::size + payload);
  }

  /// Into T, or (a 16-bit T) into float32.
  template <gradient_value O>
  static void decode(const codec_type& codec, const reference_executor&, std::span<const std::byte> message,
                     std::span<O> out, std::span<std::byte> ws, const decode_limits& limits, bool accumulate) {
    // docs/wire-format.md §17: the envelope, whole words holding the bitmaps, and as many words
    // carried as the bitmaps mark.
    const envelope e = parse_envelope(message);
    validate_envelope(e, {codec_id::mpc, dtype_of<T>, out.size(), codec.params_hash()}, limits);
    const std::uint64_t carried = codec_type::carried_words(e);
    const std::uint64_t n = e.elements;
    const std::byte* const bitmaps = message.data() + envelope::size;
    const std::byte* const words = bitmaps + 4 * codec_type::group_count(n);
    std::uint64_t marked = 0;
    for (std::uint64_t g = 0; g < codec_type::group_count(n); ++g)
      marked += static_cast<std::uint64_t>(std::popcount(word_at(bitmaps, g)));
    detail::require(marked == carried, errc::malformed_payload, [&] {
      return "bitmaps mark " + std::to_string(marked) + " words, the payload carries " + std::to_string(carried);
    });

    // docs/lossless.md §1.2 in reverse, chunk by chunk, into the workspace.
    workspace_arena arena(ws);
    const std::span<std::uint32_t> v = arena.take<std::uint32_t>(static_cast<std::size_t>(n));
    const std::uint64_t d = codec.params().dim;
    std::uint64_t next = 0;
    for (std::uint64_t base = 0; base < n; base += chunk) {
      const std::uint64_t c = std::min(chunk, n - base);
      const std::uint64_t padded = (c + group - 1) / group * group;
      std::uint32_t b[chunk], w[chunk], a[chunk];
      // 4. The carried words scattered by their bitmaps; the others are 0.
      for (std::uint64_t g = 0; g < padded; g += group) {
        const std::uint32_t bitmap = word_at(bitmaps, (base + g) / group);
        for (std::uint64_t L = 0; L < group; ++L) b[g + L] = (bitmap >> L & 1u) != 0 ? word_at(words, next++) : 0;
      }
      // 3. w[t] = b[t] + w[t − 1].
      for (std::uint64_t t = 0; t < padded; ++t) w[t] = t == 0 ? b[0] : b[t] + w[t - 1];
      // 2. The transpose is its own inverse. The padding of a partial last group must come back 0.
      for (std::uint64_t g = 0; g < padded; g += group) transpose(w + g, a + g);
      for (std::uint64_t t = c; t < padded; ++t)
        detail::require(a[t] == 0, errc::malformed_payload,
                        "the last group's transposed words have bits set for elements past the tensor's end");
      // 1. v[t] = a[t] + v[t − d].
      for (std::uint64_t t = 0; t < c; ++t) v[base + t] = t < d ? a[t] : a[t] + v[base + t - d];
    }
    // A 16-bit tensor's words are the widenings of its values (docs/lossless.md §1.8); an
    // accumulation into a 16-bit output needs each sum to fit. Element by element, the first
    // element that fails names the error.
    const auto sum = [&](std::uint64_t i) { return widen(out[i]) + std::bit_cast<float>(v[i]); };
    for (std::uint64_t i = 0; i < n; ++i) {
      detail::require(narrows_exactly<T>(std::bit_cast<float>(v[i])), errc::malformed_payload,
                      [&] { return "decoded word " + std::to_string(i) + " is not a widened 16-bit value"; });
      if constexpr (half_precision<O>)
        if (accumulate) detail::require_narrows<O>(i, sum(i));
    }
    if constexpr (half_precision<O>) {
      // A 16-bit output: the values themselves, bit for bit; or the float32 sums rounded once.
      for (std::uint64_t i = 0; i < n; ++i)
        out[i] = accumulate ? narrow<O>(sum(i)) : exact_narrow<O>(std::bit_cast<float>(v[i]));
    } else {
      for (std::uint64_t i = 0; i < n; ++i) {
        const float x = std::bit_cast<float>(v[i]);
        out[i] = accumulate ? out[i] + x : x;
      }
    }
  }

 private:
  /// Word j of the uint32 array at `at` (little-endian, as the host: core/config.hpp).
  static std::uint32_t word_at(const std::byte* at, std::uint64_t j) noexcept {
    std::uint32_t w;
    std::memcpy(&w, at + 4 * j, sizeof w);
    return w;
  }
  /// Writes `w` as word j of the uint32 array at `at`.
  static void put_word(std::byte* at, std::uint64_t j, std::uint32_t w) noexcept {
    std::memcpy(at + 4 * j, &w, sizeof w);
  }

  /// The 32×32 bit transpose of one group: to[L] = Σᵢ ((from[i] >> L) & 1) << i.
  static void transpose(const std::uint32_t* from, std::uint32_t* to) noexcept {
    for (std::uint64_t L = 0; L < group; ++L) {
      std::uint32_t word = 0;
      for (std::uint64_t i = 0; i < group; ++i) word |= ((from[i] >> L) & 1u) << i;
      to[L] = word;
    }
  }
};

}  // namespace gradcomp
