// Hostile bytes: every truncation and every single-bit flip of each golden message, appended
// bytes, seeded garbage and the caller's caps give a named error or a valid tensor, never a crash,
// and never touch the output on error. Run under the asan preset too.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <random>
#include <span>
#include <vector>

#include "support/golden_cases.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

namespace {

enum class verdict { rejected, decoded };

/// Decodes a message of n elements (with caps `limits`) into an output pre-filled with a
/// sentinel; checks that a rejection leaves the sentinel and a success yields finite values.
using decoder = std::function<verdict(std::span<const std::byte> message, std::size_t n, decode_limits limits)>;

/// The decoder of a golden codec, which keeps its output and workspace across the hundreds of
/// thousands of calls below.
template <class Codec>
decoder decoder_of(const Codec& codec) {
  using T = typename Codec::value_type;
  struct buffers {
    std::vector<T> out;
    std::vector<std::byte> ws;
  };
  return [codec, b = std::make_shared<buffers>()](std::span<const std::byte> message, std::size_t n,
                                                  decode_limits limits) {
    const cpu_executor cpu;
    T seven{};  // the sentinel, 7 in T
    if constexpr (half_precision<T>) seven = narrow<T>(7.0f);
    else
      seven = T{7};
    b->out.assign(n, seven);
    b->ws.resize(codec.workspace_bytes(cpu, n));
    try {
      codec.decode(cpu, message, std::span<T>(b->out), b->ws, limits);
    } catch (const error&) {
      bool untouched = true;
      for (const T v : b->out) untouched = untouched && to_bits(v) == to_bits(seven);
      CHECK(untouched);
      return verdict::rejected;
    }
    if constexpr (requires { requires Codec::may_decode_infinity; }) {  // ZFP: a corrupted exponent may give ±Inf
      bool no_nan = true;
      for (const T v : b->out) no_nan = no_nan && magnitude_key(v) <= float_traits<T>::infinity_key;
      CHECK(no_nan);
    } else if constexpr (!requires { requires Codec::is_lossless; }) {  // lossless codecs carry NaN and Inf
      bool finite = true;
      for (const T v : b->out) finite = finite && is_finite(v);
      CHECK(finite);
    }
    return verdict::decoded;
  };
}

/// The decoder that matches the golden file, made once.
const decoder& decoder_for(const std::string& file) {
  static std::map<std::string, decoder> decoders;
  if (const auto found = decoders.find(file); found != decoders.end()) return found->second;
  decoder d;
  if (file == "shared_scale8_sum3_f32.bin") {
    d = decoder_of(golden_shared_sum_codec());
  } else {
    const auto match = [&](const std::string& name, const auto& codec, const auto&, message_key) {
      if (name == file) d = decoder_of(codec);
    };
    for_each_golden_codec(match);
    for_each_golden_half_codec(match);
  }
  REQUIRE(d);
  return decoders.emplace(file, std::move(d)).first->second;
}

verdict try_decode(const std::string& file, std::span<const std::byte> message, std::size_t n,
                   decode_limits limits = {}) {
  return decoder_for(file)(message, n, limits);
}

}  // namespace

TEST_CASE("every truncation of a valid message is rejected and leaves the output untouched") {
  for (const golden_case& c : golden_cases()) {
    CAPTURE(c.file);
    const std::vector<std::byte> message = read_golden(c.file);
    REQUIRE(try_decode(c.file, message, c.elements) == verdict::decoded);
    for (std::size_t length = 0; length < message.size(); ++length) {
      CAPTURE(length);
      // A copy of exactly `length` bytes, so ASan sees any read past the end.
      const std::vector<std::byte> prefix(message.begin(), message.begin() + static_cast<std::ptrdiff_t>(length));
      CHECK(try_decode(c.file, prefix, c.elements) == verdict::rejected);
    }
    std::vector<std::byte> longer = message;
    longer.push_back(std::byte{0});
    CHECK(try_decode(c.file, longer, c.elements) == verdict::rejected);
  }
}

TEST_CASE("every single-bit flip gives a named error or a valid tensor, and envelope flips are always caught") {
  for (const golden_case& c : golden_cases()) {
    CAPTURE(c.file);
    const std::vector<std::byte> message = read_golden(c.file);
    const bool checksummed = c.file == "topk_f32_checksum.bin";
    std::size_t envelope_escapes = 0, payload_rejections = 0;
    for (std::size_t bit = 0; bit < message.size() * 8; ++bit) {
      std::vector<std::byte> flipped = message;
      flipped[bit / 8] ^= static_cast<std::byte>(1u << (bit % 8));
      const verdict result = try_decode(c.file, flipped, c.elements);
      if (bit < envelope::size * 8) envelope_escapes += result == verdict::decoded ? 1u : 0u;
      else
        payload_rejections += result == verdict::rejected ? 1u : 0u;
      if (checksummed) CHECK(result == verdict::rejected);
    }
    CHECK(envelope_escapes == 0);
    MESSAGE(c.file, ": ", payload_rejections, " of ", (message.size() - envelope::size) * 8,
            " payload bit flips rejected (the rest decode to another valid tensor)");
  }
}

TEST_CASE("every pair of bit flips in the first 64 bytes gives a named error or a valid tensor") {
  // The envelope and the start of the payload (counts, first indices): 130816 flip pairs per message.
  for (const golden_case& c : golden_cases()) {
    CAPTURE(c.file);
    const std::vector<std::byte> message = read_golden(c.file);
    const std::size_t bits = std::min<std::size_t>(64, message.size()) * 8;
    std::size_t decoded = 0, header_escapes = 0;
    std::vector<std::byte> flipped = message;
    for (std::size_t a = 0; a < bits; ++a) {
      for (std::size_t b = a + 1; b < bits; ++b) {
        flipped[a / 8] ^= static_cast<std::byte>(1u << (a % 8));
        flipped[b / 8] ^= static_cast<std::byte>(1u << (b % 8));
        const bool accepted = try_decode(c.file, flipped, c.elements) == verdict::decoded;
        decoded += accepted ? 1u : 0u;
        header_escapes += accepted && b < 52 * 8 ? 1u : 0u;
        flipped[a / 8] = message[a / 8];
        flipped[b / 8] = message[b / 8];
      }
    }
    // Two flips inside the CRC-covered header (bytes 0..51) are always detected: CRC-32C's Hamming
    // distance on such a short message exceeds 2.
    CHECK(header_escapes == 0);
    MESSAGE(c.file, ": ", decoded, " of ", bits * (bits - 1) / 2, " two-bit corruptions still decode");
  }
}

TEST_CASE("seeded garbage and garbage behind a valid envelope are rejected") {
  std::mt19937_64 engine(2024);
  for (const golden_case& c : golden_cases()) {
    CAPTURE(c.file);
    const std::vector<std::byte> message = read_golden(c.file);
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<std::byte> garbage(engine() % (message.size() * 2));
      for (std::byte& b : garbage) b = static_cast<std::byte>(engine());
      CHECK(try_decode(c.file, garbage, c.elements) == verdict::rejected);
      // Keep the valid envelope but scramble the payload: a named error or a valid tensor.
      std::vector<std::byte> scrambled = message;
      for (std::size_t i = envelope::size; i < scrambled.size(); ++i)
        if (engine() % 8 == 0) scrambled[i] = static_cast<std::byte>(engine());
      try_decode(c.file, scrambled, c.elements);
    }
  }
}

TEST_CASE("decoders enforce the caller's element cap and buffer size before writing") {
  for (const golden_case& c : golden_cases()) {
    CAPTURE(c.file);
    const std::vector<std::byte> message = read_golden(c.file);
    CHECK(try_decode(c.file, message, c.elements, {.max_elements = c.elements - 1}) == verdict::rejected);
    CHECK(try_decode(c.file, message, c.elements, {.max_elements = c.elements}) == verdict::decoded);
    CHECK(try_decode(c.file, message, c.elements + 1) == verdict::rejected);
    CHECK(try_decode(c.file, message, c.elements - 1) == verdict::rejected);
  }
}
