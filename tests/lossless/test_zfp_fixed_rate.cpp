// ZFP fixed-rate float32 codec: the payload equals, bit for bit, a literal transcription of zfp
// 1.0's fixed-rate 1-D float coder written in this file (its own bit stream, one bit at a time),
// and decodes to that transcription's floats; every message has the fixed size; the error stays
// within the documented bound and shrinks as the rate grows; zeros, −0, subnormals and the range
// below 2^−98 round-trip; NaN/Inf are reported with the output untouched; bad messages get named
// errors with the output untouched; the golden file pins the bytes. Where libzfp is installed,
// tests/lossless/test_zfp_fixed_rate_libzfp.cpp compares with the library itself.
#include <gradcomp/lossless/zfp_fixed_rate.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "support/codec_io.hpp"
#include "support/data.hpp"
#include "support/errors.hpp"
#include "support/golden_cases.hpp"
#include "support/reference_check.hpp"
#include "support/zfp_inputs.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

static_assert(codec_for<zfp_fixed_rate_codec<float>, cpu_executor>);
static_assert(zfp_fixed_rate_codec<float>::id == codec_id::zfp_fixed_rate &&
              static_cast<int>(codec_id::zfp_fixed_rate) == 49);
static_assert(std::is_same_v<zfp_fixed_rate_codec<float>::value_type, float>);
static_assert(!zfp_fixed_rate_codec<float>::is_lossless && !zfp_fixed_rate_codec<float>::is_homomorphic);

namespace {


// ---- the oracle: zfp 1.0's encodef.c / encode.c / decodef.c / decode.c for 1-D float blocks in
// fixed-rate mode (maxprec 32, minexp below every float exponent), transcribed statement by
// statement with a bit stream of its own. Integer steps run in int64 and wrap to int32 after each
// operation, as libzfp's int32 arithmetic does.

class bit_stream {
 public:
  bool write_bit(bool bit) {
    bits_.push_back(bit);
    return bit;
  }
  std::uint64_t write_bits(std::uint64_t value, unsigned count) {
    for (unsigned i = 0; i < count; ++i) write_bit(((value >> i) & 1u) != 0);
    return count < 64 ? value >> count : 0;
  }
  void pad_to(std::size_t size) {
    while (bits_.size() < size) write_bit(false);
  }
  [[nodiscard]] std::size_t size() const { return bits_.size(); }

  bool read_bit() { return bits_.at(position_++); }
  std::uint64_t read_bits(unsigned count) {
    std::uint64_t value = 0;
    for (unsigned i = 0; i < count; ++i) value |= static_cast<std::uint64_t>(read_bit() ? 1u : 0u) << i;
    return value;
  }
  void seek(std::size_t position) { position_ = position; }

  // Bit j is bit j mod 8 of byte j / 8; the last byte is zero-padded.
  [[nodiscard]] std::vector<std::byte> bytes() const {
    std::vector<std::byte> out((bits_.size() + 7) / 8, std::byte{0});
    for (std::size_t j = 0; j < bits_.size(); ++j)
      if (bits_[j]) out[j / 8] |= static_cast<std::byte>(1u << (j % 8));
    return out;
  }
  static bit_stream from_bytes(std::span<const std::byte> bytes) {
    bit_stream s;
    for (const std::byte b : bytes)
      for (unsigned i = 0; i < 8; ++i) s.bits_.push_back(((static_cast<unsigned>(b) >> i) & 1u) != 0);
    return s;
  }

 private:
  std::vector<bool> bits_;
  std::size_t position_ = 0;
};

std::int64_t wrap32(std::int64_t v) { return static_cast<std::int32_t>(static_cast<std::uint32_t>(v & 0xffffffff)); }

// fwd_lift_int32 (block1.h, stride 1).
void oracle_forward_lift(std::int64_t* p) {
  std::int64_t x = p[0], y = p[1], z = p[2], w = p[3];
  x = wrap32(x + w);
  x >>= 1;
  w = wrap32(w - x);
  z = wrap32(z + y);
  z >>= 1;
  y = wrap32(y - z);
  x = wrap32(x + z);
  x >>= 1;
  z = wrap32(z - x);
  w = wrap32(w + y);
  w >>= 1;
  y = wrap32(y - w);
  w = wrap32(w + (y >> 1));
  y = wrap32(y - (w >> 1));
  p[0] = x;
  p[1] = y;
  p[2] = z;
  p[3] = w;
}

// inv_lift_int32.
void oracle_inverse_lift(std::int64_t* p) {
  std::int64_t x = p[0], y = p[1], z = p[2], w = p[3];
  y = wrap32(y + (w >> 1));
  w = wrap32(w - (y >> 1));
  y = wrap32(y + w);
  w = wrap32(w * 2);
  w = wrap32(w - y);
  z = wrap32(z + x);
  x = wrap32(x * 2);
  x = wrap32(x - z);
  y = wrap32(y + z);
  z = wrap32(z * 2);
  z = wrap32(z - y);
  w = wrap32(w + x);
  x = wrap32(x * 2);
  x = wrap32(x - w);
  p[0] = x;
  p[1] = y;
  p[2] = z;
  p[3] = w;
}

// encode_few_ints with intprec = maxprec = 32 (kmin = 0), size 4.
void oracle_encode_ints(bit_stream& s, unsigned maxbits, const std::uint32_t* data) {
  unsigned bits = maxbits, n = 0;
  for (unsigned k = 32; bits != 0 && k-- > 0;) {
    std::uint64_t x = 0;
    for (unsigned i = 0; i < 4; ++i) x += static_cast<std::uint64_t>((data[i] >> k) & 1u) << i;
    const unsigned m = std::min(n, bits);
    bits -= m;
    x = s.write_bits(x, m);
    for (; bits != 0 && n < 4; x >>= 1, ++n) {
      --bits;
      if (s.write_bit(x != 0)) {
        for (; bits != 0 && n < 4 - 1; x >>= 1, ++n) {
          --bits;
          if (s.write_bit((x & 1u) != 0)) break;
        }
      } else {
        break;
      }
    }
  }
}

// decode_few_ints with the same settings.
void oracle_decode_ints(bit_stream& s, unsigned maxbits, std::uint32_t* data) {
  std::fill(data, data + 4, 0u);
  unsigned bits = maxbits, n = 0;
  for (unsigned k = 32; bits != 0 && k-- > 0;) {
    const unsigned m = std::min(n, bits);
    bits -= m;
    std::uint64_t x = s.read_bits(m);
    for (; bits != 0 && n < 4; ++n) {
      --bits;
      if (s.read_bit()) {
        for (; bits != 0 && n < 4 - 1; ++n) {
          --bits;
          if (s.read_bit()) break;
        }
        x += std::uint64_t{1} << n;
      } else {
        break;
      }
    }
    for (unsigned i = 0; x != 0; ++i, x >>= 1) data[i] += static_cast<std::uint32_t>(x & 1u) << k;
  }
}

// exponent() of encodef.c: frexp exponent of the largest magnitude, clamped for subnormals.
int oracle_emax(const float* f) {
  float largest = 0.0f;
  for (int i = 0; i < 4; ++i)
    if (largest < std::fabs(f[i])) largest = std::fabs(f[i]);
  if (!(largest > 0.0f)) return -127;
  int e = 0;
  std::frexp(largest, &e);
  return std::max(e, 1 - 127);
}

// The block of values [4b, 4b + 4) padded as pad_block does for a partial block.
void oracle_block(const std::vector<float>& x, std::size_t b, float* f) {
  const std::size_t m = std::min<std::size_t>(4, x.size() - 4 * b);
  for (std::size_t i = 0; i < m; ++i) f[i] = x[4 * b + i];
  if (m < 2) f[1] = f[0];
  if (m < 3) f[2] = f[1];
  if (m < 4) f[3] = f[0];
}

// The stream of zfp_compress in fixed-rate mode (the cast is the exact f · 2^(30 − emax),
// truncated, which libzfp computes where its float scale does not overflow).
std::vector<std::byte> zfp_oracle_payload(const std::vector<float>& x, unsigned rate) {
  bit_stream s;
  const unsigned block_bits = 4 * rate;
  for (std::size_t b = 0; 4 * b < x.size(); ++b) {
    float f[4];
    oracle_block(x, b, f);
    const std::size_t start = s.size();
    const int emax = oracle_emax(f);
    const auto e = static_cast<unsigned>(emax + 127);
    if (e != 0) {
      s.write_bits(2 * e + 1, 9);
      std::int64_t i[4];
      for (int k = 0; k < 4; ++k)
        i[k] = static_cast<std::int32_t>(std::trunc(std::ldexp(static_cast<double>(f[k]), 30 - emax)));
      oracle_forward_lift(i);
      std::uint32_t u[4];
      for (int k = 0; k < 4; ++k) u[k] = (static_cast<std::uint32_t>(i[k] & 0xffffffff) + 0xaaaaaaaau) ^ 0xaaaaaaaau;
      oracle_encode_ints(s, block_bits - 9, u);
    } else {
      s.write_bit(false);
    }
    s.pad_to(start + block_bits);
  }
  return s.bytes();
}

// zfp_decompress's floats of the stream: each value float(i) · 2^(emax − 30), one rounding.
std::vector<float> oracle_values(std::span<const std::byte> payload, std::size_t n, unsigned rate) {
  bit_stream s = bit_stream::from_bytes(payload);
  std::vector<float> out(n);
  const unsigned block_bits = 4 * rate;
  for (std::size_t b = 0; 4 * b < n; ++b) {
    s.seek(b * block_bits);
    float g[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (s.read_bit()) {
      const int emax = static_cast<int>(s.read_bits(8)) - 127;
      std::uint32_t u[4];
      oracle_decode_ints(s, block_bits - 9, u);
      std::int64_t i[4];
      for (int k = 0; k < 4; ++k) i[k] = wrap32(static_cast<std::int64_t>(u[k] ^ 0xaaaaaaaau) - 0xaaaaaaaa);
      oracle_inverse_lift(i);
      for (int k = 0; k < 4; ++k)
        g[k] = static_cast<float>(static_cast<double>(static_cast<float>(i[k])) * std::ldexp(1.0, emax - 30));
    }
    for (std::size_t k = 0; k < 4 && 4 * b + k < n; ++k) out[4 * b + k] = g[k];
  }
  return out;
}

// ---- helpers ---------------------------------------------------------------------------------

// Random finite bit patterns: every exponent, subnormals and ±0 included, below 2^126 in
// magnitude (blocks from 2^126 up may decode to ±Inf, which the bound check cannot take).
std::vector<float> random_finite(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::vector<float> x(n);
  for (float& v : x) {
    std::uint32_t bits = static_cast<std::uint32_t>(engine());
    if (((bits >> 23) & 0xFFu) >= 253) bits &= 0x807fffffu;  // exponents 253 … 255 become 0 (subnormal)
    v = std::bit_cast<float>(bits);
  }
  return x;
}

std::vector<float> test_input(int kind, std::size_t n, std::uint64_t seed) {
  if (kind == static_cast<int>(std::size(all_zfp_inputs))) return random_finite(n, seed);
  return zfp_test_input(all_zfp_inputs[kind], n, seed);
}
constexpr int test_input_kinds = static_cast<int>(std::size(all_zfp_inputs)) + 1;

std::vector<std::byte> payload_of(const std::vector<std::byte>& message) {
  return std::vector<std::byte>(message.begin() + static_cast<std::ptrdiff_t>(envelope_bytes), message.end());
}

// The documented bound: |f − g| ≤ (2^(8 − R) + 2^−23) · 2^emax in every block, emax its exponent.
double error_bound(unsigned rate, int emax) {
  return (std::ldexp(1.0, 8 - static_cast<int>(rate)) + std::ldexp(1.0, -23)) * std::ldexp(1.0, emax);
}

// Largest |f − g| / bound over the blocks (≤ 1 when the bound holds).
double worst_bound_ratio(const std::vector<float>& x, const std::vector<float>& g, unsigned rate) {
  double worst = 0.0;
  for (std::size_t b = 0; 4 * b < x.size(); ++b) {
    float f[4];
    oracle_block(x, b, f);
    const int emax = oracle_emax(f);
    if (emax == -127) continue;
    for (std::size_t k = 4 * b; k < std::min(x.size(), 4 * b + 4); ++k)
      worst =
          std::max(worst, std::fabs(static_cast<double>(x[k]) - static_cast<double>(g[k])) / error_bound(rate, emax));
  }
  return worst;
}

std::vector<std::size_t> oracle_sizes() {
  std::vector<std::size_t> sizes;
  for (std::size_t n = 0; n <= 13; ++n) sizes.push_back(n);
  for (const std::size_t n : {std::size_t{1001}, std::size_t{1002}, std::size_t{1003}}) sizes.push_back(n);
  return sizes;
}

}  // namespace

TEST_CASE("zfp payloads equal the transcribed zfp coder bit for bit and decode to its floats, for every rate") {
  const cpu_executor fast;
  const cpu_executor baseline{.max_simd = cpu_simd::baseline};
  for (unsigned rate = 3; rate <= 32; ++rate) {
    const zfp_fixed_rate_codec<float> q({.rate_bits = rate});
    for (const std::size_t n : oracle_sizes()) {
      for (int kind = 0; kind < test_input_kinds; ++kind) {
        CAPTURE(rate);
        CAPTURE(n);
        CAPTURE(kind);
        const std::vector<float> x = test_input(kind, n, 100 * n + rate);
        std::vector<std::byte> m(q.max_encoded_bytes(n));
        REQUIRE(q.encode(fast, std::span<const float>(x), m, {}, {.step = 3}) == m.size());
        const std::vector<std::byte> payload = payload_of(m);
        CHECK(payload == zfp_oracle_payload(x, rate));
        std::vector<std::byte> again(m.size());
        q.encode(baseline, std::span<const float>(x), again, {}, {.step = 3});
        CHECK(again == m);
        CHECK(same_bits(decode_values(q, m, n), oracle_values(payload, n, rate)));
        CHECK(same_bits(decode_values(q, m, n, {}, baseline), oracle_values(payload, n, rate)));
        const envelope e = parse_envelope(m);
        CHECK(e.codec == codec_id::zfp_fixed_rate);
        CHECK(e.dtype == value_dtype::float32);
        CHECK(e.layout == 0);
        CHECK(e.elements == n);
        CHECK(e.key == message_key{.step = 3});
      }
    }
  }
}

TEST_CASE("zfp portable kernels write the same stream and decode to the same floats as the codec's") {
  // The codec runs detail::cpu::zfp_detail::fast_kernels (SSE2 on x86-64); the scalar twins must agree.
  using namespace gradcomp::detail::cpu::zfp_detail;
  for (const unsigned rate : {3u, 5u, 8u, 13u, 16u, 17u, 24u, 32u}) {
    const zfp_fixed_rate_codec<float> q({.rate_bits = rate});
    for (const std::size_t n : {std::size_t{1}, std::size_t{15}, std::size_t{16}, std::size_t{17}, std::size_t{1003}}) {
      for (int kind = 0; kind < test_input_kinds; ++kind) {
        CAPTURE(rate);
        CAPTURE(n);
        CAPTURE(kind);
        const std::vector<float> x = test_input(kind, n, 13 * n + rate);
        const std::vector<std::byte> m = encode_bytes(q, x);
        const std::vector<std::byte> payload = payload_of(m);
        std::vector<std::byte> portable(payload.size() + 8, std::byte{0});
        if (rate <= 16) encode_blocks<portable_kernels, std::uint64_t>(x.data(), n, rate, false, portable.data());
        else
          encode_blocks<portable_kernels, wide_word>(x.data(), n, rate, false, portable.data());
        CHECK(std::equal(payload.begin(), payload.end(), portable.begin()));
        std::vector<float> g(n, 7.0f);
        if (rate <= 16)
          decode_blocks<portable_kernels, std::uint64_t>(payload.data(), payload.data() + payload.size(), n, rate,
                                                         false, false, g.data());
        else
          decode_blocks<portable_kernels, wide_word>(payload.data(), payload.data() + payload.size(), n, rate, false,
                                                     false, g.data());
        CHECK(same_bits(g, decode_values(q, m, n)));
      }
    }
  }
}

TEST_CASE("zfp on every cpu setting equals the reference (zfp_block, one block at a time), random payloads included") {
  // reference/zfp_fixed_rate.hpp codes each block with zfp_block::encode_block and decode_block
  // (which the CUDA backend runs one block per thread) and moves its 4R bits one at a time; the
  // CPU's table-driven coders must write the same stream and decode any payload of the right
  // length, random ones (hostile bits) included, to the same floats, at both ends of the float range.
  std::mt19937_64 engine(77);
  for (unsigned rate = 3; rate <= 32; ++rate) {
    const zfp_fixed_rate_codec<float> q({.rate_bits = rate});
    for (const std::size_t n :
         {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{4}, std::size_t{1003}}) {
      for (int kind = 0; kind <= test_input_kinds; ++kind) {
        CAPTURE(rate);
        CAPTURE(n);
        CAPTURE(kind);
        const std::vector<float> x =
            kind < test_input_kinds ? test_input(kind, n, 17 * n + rate) : zfp_extreme_input(n, rate);
        std::vector<std::byte> m = check_same_as_reference(q, x, {.step = 3});
        REQUIRE(m.size() == q.max_encoded_bytes(n));
        for (std::size_t i = envelope::size; i < m.size(); ++i) m[i] = static_cast<std::byte>(engine());
        if (zfp_fixed_rate_codec<float>::block_count(n) % 2 == 1 && rate % 2 == 1) m.back() &= std::byte{0x0F};
        const std::vector<float> expected = decode_on(reference_executor{}, q, m, std::vector<float>(n));
        for (const cpu_executor& cpu : cpu_settings())
          CHECK(bit_patterns(decode_on(cpu, q, m, std::vector<float>(n))) == bit_patterns(expected));
      }
    }
  }
}

TEST_CASE("zfp rejects what the reference rejects: NaN and Inf, and stray bits after the last block") {
  check_non_finite_same_as_reference(zfp_fixed_rate_codec<float>({.rate_bits = 8}));
  const zfp_fixed_rate_codec<float> odd({.rate_bits = 7});
  // Three blocks of 28 bits end in the middle of the 11th byte.
  std::vector<std::byte> m = encode_on(reference_executor{}, odd, make_input<float>(input_kind::normal, 9, 1));
  CHECK(decode_status_everywhere(odd, m, 9) == "no exception");
  m.back() |= std::byte{0x10};
  CHECK(decode_status_everywhere(odd, m, 9) == named(errc::malformed_payload));
}

TEST_CASE("zfp coders on every executor setting write the same stream and decode to the same floats") {
  // With AVX2, rates up to 16 code and decode eight blocks in lock step; the rest of the stream
  // (a partial group of eight) and the baseline setting take the four-block path.
  const cpu_executor fast;
  const cpu_executor baseline{.max_simd = cpu_simd::baseline};
  for (unsigned rate = 3; rate <= 17; ++rate) {
    const zfp_fixed_rate_codec<float> q({.rate_bits = rate});
    for (const std::size_t n : {std::size_t{32}, std::size_t{4099}}) {
      for (int kind = 0; kind < test_input_kinds; ++kind) {
        CAPTURE(rate);
        CAPTURE(n);
        CAPTURE(kind);
        const std::vector<float> x = test_input(kind, n, 31 * n + rate);
        std::vector<std::byte> m(q.max_encoded_bytes(n)), again(m.size());
        q.encode(fast, std::span<const float>(x), m, {});
        q.encode(baseline, std::span<const float>(x), again, {});
        CHECK(m == again);
        const std::vector<float> g = decode_values(q, m, n, {}, baseline);
        CHECK(same_bits(decode_values(q, m, n, {}, fast), g));
        std::vector<float> sum(n, 0.25f), sum_baseline(n, 0.25f);
        q.decode_accumulate(fast, m, std::span<float>(sum), {});
        q.decode_accumulate(baseline, m, std::span<float>(sum_baseline), {});
        CHECK(same_bits(sum, sum_baseline));
      }
    }
  }
}

TEST_CASE("zfp messages take exactly max_encoded_bytes, 4R bits per block of 4 values") {
  for (unsigned rate = 3; rate <= 32; ++rate) {
    const zfp_fixed_rate_codec<float> q({.rate_bits = rate});
    for (const std::size_t n :
         {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{4}, std::size_t{5},
          std::size_t{8}, std::size_t{9}, std::size_t{63}, std::size_t{64}, std::size_t{1000}, std::size_t{4099}}) {
      CAPTURE(rate);
      CAPTURE(n);
      const std::size_t blocks = (n + 3) / 4;
      const std::size_t payload = (blocks * 4 * rate + 7) / 8;
      CHECK(q.payload_bytes(n) == payload);
      CHECK(q.max_encoded_bytes(n) == envelope_bytes + payload);
      for (const std::vector<float>& x :
           {make_input<float>(input_kind::normal, n, n), std::vector<float>(n, 0.0f), random_finite(n, n)}) {
        const std::vector<std::byte> m = encode_bytes(q, x);
        CHECK(m.size() == q.max_encoded_bytes(n));
        CHECK(parse_envelope(m).payload_bytes == payload);
      }
    }
  }
  // 64-bit size arithmetic: n past 2^32, and saturation where the size does not fit.
  const zfp_fixed_rate_codec<float> q32({.rate_bits = 32});
  const std::uint64_t big = (std::uint64_t{1} << 34) + 1;  // 2^32 + 1 blocks, 16 bytes each
  CHECK(zfp_fixed_rate_codec<float>::block_count(big) == (std::uint64_t{1} << 32) + 1);
  CHECK(q32.payload_bytes(big) == ((std::uint64_t{1} << 32) + 1) * 16);
  CHECK(zfp_fixed_rate_codec<float>({.rate_bits = 3}).payload_bytes(big) == ((std::uint64_t{1} << 32) + 1) * 3 / 2 + 1);
  CHECK(q32.payload_bytes(UINT64_MAX) == UINT64_MAX);
  CHECK(q32.max_encoded_bytes(UINT64_MAX) == std::numeric_limits<std::size_t>::max());
}

TEST_CASE("zfp error stays within the documented bound and shrinks as the rate grows") {
  // The bound for every rate and input kind.
  for (unsigned rate = 3; rate <= 32; ++rate) {
    const zfp_fixed_rate_codec<float> q({.rate_bits = rate});
    for (int kind = 0; kind < test_input_kinds; ++kind) {
      CAPTURE(rate);
      CAPTURE(kind);
      const std::vector<float> x = test_input(kind, 4099, 7 * rate + static_cast<unsigned>(kind));
      CHECK(worst_bound_ratio(x, decode_values(q, encode_bytes(q, x), x.size()), rate) <= 1.0);
    }
  }
  // Max and RMS error on N(0, 1), as docs/lossless.md §2 tabulates them.
  const std::size_t n = std::size_t{1} << 18;
  const std::vector<float> x = zfp_test_input(zfp_input::normal, n, 2024);
  double previous = std::numeric_limits<double>::infinity();
  for (const unsigned rate : {4u, 8u, 12u, 16u, 24u, 32u}) {
    const zfp_fixed_rate_codec<float> q({.rate_bits = rate});
    const std::vector<float> g = decode_values(q, encode_bytes(q, x), n);
    double worst = 0.0, squares = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      const double d = static_cast<double>(x[i]) - static_cast<double>(g[i]);
      worst = std::max(worst, std::fabs(d));
      squares += d * d;
    }
    MESSAGE("ZFP R = ", rate, " on N(0, 1): max error ", worst, ", RMS error ",
            std::sqrt(squares / static_cast<double>(n)));
    CAPTURE(rate);
    CHECK(worst < previous);
    previous = worst;
  }
}

TEST_CASE("zfp zeros, negative zeros, subnormals and magnitudes below 2^-98 round-trip") {
  for (const unsigned rate : {3u, 8u, 16u, 32u}) {
    CAPTURE(rate);
    const zfp_fixed_rate_codec<float> q({.rate_bits = rate});
    // Blocks of ±0 are one 0 bit: they decode to +0 exactly.
    const std::vector<float> zeros = {0.0f, -0.0f, -0.0f, 0.0f, -0.0f, -0.0f, -0.0f, -0.0f, 0.0f};
    const std::vector<std::byte> m = encode_bytes(q, zeros);
    CHECK(payload_of(m) == std::vector<std::byte>(q.payload_bytes(zeros.size()), std::byte{0}));
    CHECK(same_bits(decode_values(q, m, zeros.size()), std::vector<float>(zeros.size(), 0.0f)));
    // −0 next to non-zero values counts as 0.
    const std::vector<float> mixed = {-0.0f, 0.5f, -0.0f, -0.25f};
    CHECK(worst_bound_ratio(mixed, decode_values(q, encode_bytes(q, mixed), 4), rate) <= 1.0);
    // Subnormal blocks (emax clamped to −126) and blocks far below 2^−98, where libzfp's float
    // scale overflows: the exact cast makes them round-trip within the bound, and at R = 32 to
    // within float rounding of the block's largest value.
    for (const int exponent : {-97, -98, -110, -120, -126, -135, -149}) {
      std::vector<float> x = zfp_test_input(zfp_input::normal, 1003, static_cast<std::uint64_t>(-exponent));
      for (float& v : x) v = std::ldexp(v, exponent);
      CAPTURE(exponent);
      const std::vector<float> g = decode_values(q, encode_bytes(q, x), x.size());
      CHECK(worst_bound_ratio(x, g, rate) <= 1.0);
      if (rate == 32 && exponent >= -120) {  // values still normal: 24 bits of each survive
        bool close = true;
        for (std::size_t i = 0; i < x.size(); ++i)
          close = close && std::fabs(x[i] - g[i]) <= std::ldexp(std::fabs(x[i]), -16) + std::ldexp(1.0f, exponent - 22);
        CHECK(close);
      }
    }
    const std::vector<float> tiny = make_input<float>(input_kind::subnormals, 1001, 5);
    CHECK(worst_bound_ratio(tiny, decode_values(q, encode_bytes(q, tiny), tiny.size()), rate) <= 1.0);
  }
  // A constant block codes exactly: one significant coefficient needs few planes.
  const zfp_fixed_rate_codec<float> q16({.rate_bits = 16});
  const std::vector<float> constant(12, -0.25f);
  CHECK(same_bits(decode_values(q16, encode_bytes(q16, constant), 12), constant));
}

TEST_CASE("zfp reports NaN and Inf without touching the output") {
  const zfp_fixed_rate_codec<float> q;
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(), std::bit_cast<float>(0x7f800001u)}) {
    for (const std::size_t at : {std::size_t{0}, std::size_t{5}, std::size_t{998}}) {
      std::vector<float> x = make_input<float>(input_kind::normal, 999, 3);
      x[at] = bad;
      std::vector<std::byte> out(q.max_encoded_bytes(x.size()), std::byte{0xAB});
      CHECK(thrown_by([&] { q.encode(cpu_executor{}, std::span<const float>(x), out, {}); }) ==
            named(errc::non_finite_input));
      CHECK(std::all_of(out.begin(), out.end(), [](std::byte b) { return b == std::byte{0xAB}; }));
      // A buffer that is too small is reported first.
      std::vector<std::byte> small(out.size() - 1);
      CHECK(thrown_by([&] { q.encode(cpu_executor{}, std::span<const float>(x), small, {}); }) ==
            named(errc::buffer_too_small));
    }
  }
}

TEST_CASE("zfp decode_accumulate adds the decoded floats") {
  const zfp_fixed_rate_codec<float> q({.rate_bits = 12}, wire_options{.payload_checksum = true});
  const std::vector<float> x = zfp_test_input(zfp_input::mixed, 2001, 4);
  const std::vector<std::byte> m = encode_bytes(q, x);
  const std::vector<float> g = decode_values(q, m, x.size(), {.require_checksum = true});
  std::vector<float> acc(x.size(), 0.5f);
  q.decode_accumulate(cpu_executor{}, m, std::span<float>(acc), {}, {.require_checksum = true});
  bool sums = true;
  for (std::size_t i = 0; i < x.size(); ++i) sums = sums && acc[i] == 0.5f + g[i];
  CHECK(sums);
}

TEST_CASE("zfp decoders reject short, long and inconsistent payloads and leave the output untouched") {
  const zfp_fixed_rate_codec<float> q({.rate_bits = 9});
  const std::size_t n = 1001;  // 251 blocks of 36 bits: the stream ends 4 bits into its last byte
  const std::vector<float> x = zfp_test_input(zfp_input::normal, n, 9);
  const std::vector<std::byte> good = encode_bytes(q, x);
  const std::vector<std::byte> payload = payload_of(good);
  REQUIRE(payload.size() == (251 * 36 + 4) / 8);
  const auto rejects = [&](const zfp_fixed_rate_codec<float>& codec, const std::vector<std::byte>& m, errc want) {
    std::vector<float> out(n, 7.0f);
    const std::string got = thrown_by([&] { codec.decode(cpu_executor{}, m, std::span<float>(out), {}); });
    std::vector<float> acc(n, 7.0f);
    const std::string accumulated =
        thrown_by([&] { codec.decode_accumulate(cpu_executor{}, m, std::span<float>(acc), {}); });
    bool untouched = true;
    for (std::size_t i = 0; i < n; ++i) untouched = untouched && out[i] == 7.0f && acc[i] == 7.0f;
    CHECK(untouched);
    CHECK(accumulated == got);
    return got == named(want);
  };
  for (std::size_t length = 0; length < good.size(); ++length)
    CHECK(rejects(q, std::vector<std::byte>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(length)),
                  errc::truncated));
  CHECK(rejects(
      q,
      [&] {
        auto m = good;
        m.push_back(std::byte{0});
        return m;
      }(),
      errc::trailing_bytes));
  // Consistently declared payloads of the wrong length.
  CHECK(rejects(q, with_payload(good, std::vector<std::byte>(payload.begin(), payload.end() - 1)),
                errc::malformed_payload));
  CHECK(rejects(q,
                with_payload(good,
                             [&] {
                               auto p = payload;
                               p.push_back(std::byte{0});
                               return p;
                             }()),
                errc::malformed_payload));
  CHECK(rejects(q, with_payload(good, {}), errc::malformed_payload));
  // Each of the 4 padding bits after the last block.
  for (unsigned bit = 4; bit < 8; ++bit) {
    std::vector<std::byte> p = payload;
    p.back() ^= static_cast<std::byte>(1u << bit);
    CAPTURE(bit);
    CHECK(rejects(q, with_payload(good, p), errc::malformed_payload));
  }
  std::vector<std::byte> layout = good;
  envelope e = parse_envelope(layout);
  e.layout = 1;
  write_envelope(e, layout);
  CHECK(rejects(q, layout, errc::malformed_payload));
  CHECK(rejects(zfp_fixed_rate_codec<float>({.rate_bits = 8}), good, errc::parameter_mismatch));
  CHECK(thrown_by([&] { decode_values(q, good, n - 1); }) == named(errc::size_mismatch));
  CHECK(thrown_by([&] { decode_values(q, good, n, {.max_elements = n - 1}); }) == named(errc::too_large));
  for (const std::uint32_t rate : {0u, 1u, 2u, 33u}) {
    CAPTURE(rate);
    CHECK(thrown_by([&] { zfp_fixed_rate_codec<float> bad({.rate_bits = rate}); }) == named(errc::invalid_argument));
  }
  for (std::uint32_t rate = 3; rate < 32; ++rate)
    CHECK(zfp_fixed_rate_codec<float>({.rate_bits = rate}).params_hash() !=
          zfp_fixed_rate_codec<float>({.rate_bits = rate + 1}).params_hash());
  CHECK(zfp_fixed_rate_codec<float>({.rate_bits = 8}).params_hash() == 0x69EA68CD1317EFF7ull);  // wire-format.md §2
}

TEST_CASE("zfp decodes any payload of the right length without NaN, hostile exponents at most to Inf") {
  std::mt19937_64 engine(77);
  for (const unsigned rate : {3u, 8u, 13u, 16u, 32u}) {
    const zfp_fixed_rate_codec<float> q({.rate_bits = rate});
    const std::size_t n = 257;
    const std::vector<std::byte> good = encode_bytes(q, zfp_test_input(zfp_input::normal, n, rate));
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<std::byte> p = payload_of(good);
      for (std::byte& b : p) b = static_cast<std::byte>(trial == 0 ? 0xFFu : engine());
      if (rate % 2 == 1) p.back() &= std::byte{0x0F};  // (257 blocks) the padding must stay zero
      const std::vector<float> g = decode_values(q, with_payload(good, p), n);
      CAPTURE(rate);
      CAPTURE(trial);
      CHECK(std::none_of(g.begin(), g.end(), [](float v) { return std::isnan(v); }));
      CHECK(same_bits(g, oracle_values(p, n, rate)));
      CHECK(same_bits(decode_values(q, with_payload(good, p), n, {}, cpu_executor{.max_simd = cpu_simd::baseline}), g));
    }
  }
}

TEST_CASE("golden zfp file reproduces byte for byte and decodes to the transcribed coder's floats") {
  const std::vector<float> x = golden_input<float>(1000);
  const zfp_fixed_rate_codec<float> q({.rate_bits = 8});
  const std::vector<std::byte> fresh = encode_bytes(q, x, {.step = 9, .tensor_id = 5});
  const std::vector<std::byte> m = golden_bytes("zfp_fixed_rate_r8_f32.bin", fresh);
  REQUIRE(m.size() == envelope_bytes + 1000);  // 250 blocks of 32 bits
  CHECK(m == fresh);
  CHECK(payload_of(m) == zfp_oracle_payload(x, 8));
  const std::vector<float> g = decode_values(q, m, 1000);
  CHECK(same_bits(g, oracle_values(payload_of(m), 1000, 8)));
  CHECK(worst_bound_ratio(x, g, 8) <= 1.0);
}
