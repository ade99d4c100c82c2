// Uniform b-bit quantization: codes follow the documented arithmetic (checked on the reference
// executor with an independent rounding), RTN error ≤ s/2, stochastic rounding is unbiased within
// its variance bound, zero blocks decode to exact zeros, every cpu_executor setting writes the
// reference's bytes, and special values and bad messages get named errors.
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/quantize/uniform.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "support/codec_io.hpp"
#include "support/data.hpp"
#include "support/errors.hpp"
#include "support/executor_io.hpp"
#include "support/oracles.hpp"
#include "support/reference_check.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

namespace {

// Reads the scales and codes of a message straight from the documented layout.
template <class T>
struct parsed {
  std::vector<T> scales;
  std::vector<unsigned> codes;
};

template <class T>
parsed<T> parse(const std::vector<std::byte>& m, std::size_t n, int bits, std::size_t block) {
  parsed<T> p;
  const std::size_t blocks = (n + block - 1) / block;
  p.scales.resize(blocks);
  if (blocks > 0) std::memcpy(p.scales.data(), m.data() + 56, blocks * sizeof(T));
  const std::byte* codes = m.data() + 56 + blocks * sizeof(T);
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t bit = i * static_cast<std::size_t>(bits);
    p.codes.push_back((std::to_integer<unsigned>(codes[bit / 8]) >> (bit % 8)) & ((1u << bits) - 1));
  }
  return p;
}

// The level the documentation prescribes for RTN, with std::nearbyint as the rounding.
template <class T>
int documented_rtn_level(T h, T max_abs, int bits) {
  const T L = static_cast<T>(levels_of(bits));
  const T s = documented_step(max_abs, bits);
  if (s == T{0}) return bits == 1 ? 1 : 0;
  const T inv = L / max_abs;
  const T t = std::isfinite(inv) ? h * inv : h / s;
  if (bits == 1) return t < T{0} ? -1 : 1;
  const int q = static_cast<int>(std::nearbyint(t));
  return std::max(-levels_of(bits), std::min(levels_of(bits), q));
}

template <class T>
void check_rtn(const std::vector<T>& x, int bits, std::uint32_t block) {
  const uniform_quantizer<T> q({.bits = bits, .block = block});
  const std::vector<std::byte> m = encode_on(reference_executor{}, q, x, {.step = 1});
  const std::size_t n = x.size();
  const std::size_t blocks = (n + block - 1) / block;
  REQUIRE(m.size() == 56 + blocks * sizeof(T) + (n * static_cast<std::size_t>(bits) + 7) / 8);
  const parsed<T> p = parse<T>(m, n, bits, block);
  const std::vector<T> decoded = decode_on(reference_executor{}, q, m, poisoned_values<T>(n));
  bool scales_ok = true, codes_ok = true, error_ok = true, zeros_exact = true;
  for (std::size_t j = 0; j < blocks; ++j) {
    T max_abs = 0;
    for (std::size_t i = j * block; i < std::min(n, (j + 1) * block); ++i) max_abs = std::max(max_abs, std::fabs(x[i]));
    const T s = documented_step(max_abs, bits);
    scales_ok = scales_ok && p.scales[j] == s;
    for (std::size_t i = j * block; i < std::min(n, (j + 1) * block); ++i) {
      const int level = documented_rtn_level(x[i], max_abs, bits);
      const unsigned code =
          bits == 1 ? static_cast<unsigned>((level + 1) / 2) : static_cast<unsigned>(level + levels_of(bits));
      codes_ok = codes_ok && p.codes[i] == code;
      // The RTN error bound, as a predicate that fails on NaN: half a step (a whole step s between
      // the 1-bit levels ±s), plus the rounding of s = m/L, of t = h·(L/m) and of q·s, each within
      // one ulp of |h| + s.
      const double err = std::fabs(static_cast<double>(x[i]) - static_cast<double>(decoded[i]));
      const double ulps = 4.0 * std::numeric_limits<T>::epsilon() * (std::fabs(static_cast<double>(x[i])) + s);
      const double bound = (bits == 1 ? 1.0 : 0.5) * static_cast<double>(s) + ulps;
      error_ok = error_ok && err <= bound;
      if (max_abs == 0)
        zeros_exact =
            zeros_exact &&
            std::bit_cast<std::make_unsigned_t<std::conditional_t<sizeof(T) == 4, std::int32_t, std::int64_t>>>(
                decoded[i]) == 0;
    }
  }
  CHECK(scales_ok);
  CHECK(codes_ok);
  CHECK(error_ok);
  CHECK(zeros_exact);
}

}  // namespace

TEST_CASE_TEMPLATE("uniform RTN codes follow the documented arithmetic and err by at most s/2", T, float, double) {
  for (const int bits : {1, 2, 4, 8}) {
    for (const std::uint32_t block : {1u, 7u, 16u, 256u}) {
      for (const std::size_t n :
           {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{(1u << 16) + 1}}) {
        for (const input_kind kind : all_input_kinds) {
          if (n > 1000 && kind != input_kind::normal) continue;
          CAPTURE(bits);
          CAPTURE(block);
          CAPTURE(n);
          CAPTURE(std::string(name(kind)));
          check_rtn(make_input<T>(kind, n, 31 + n), bits, block);
        }
      }
    }
  }
}

TEST_CASE_TEMPLATE("uniform encodes blocks of the largest finite values into decodable messages", T, float, double) {
  // Regression: L·fl(m/L) rounded up to Inf for 8-bit float and 4/8-bit double, and the decoder
  // rightly rejected the step the encoder had written.
  for (const int bits : {1, 2, 4, 8}) {
    std::vector<T> x(64, std::numeric_limits<T>::max());
    x[3] = -std::numeric_limits<T>::max();
    CAPTURE(bits);
    check_rtn(x, bits, 16);
  }
}

TEST_CASE_TEMPLATE("uniform stochastic rounding is unbiased within its variance bound", T, float, double) {
  for (const int bits : {1, 2, 4, 8}) {
    const std::size_t n = 64;
    const int draws = 4000;
    std::vector<T> x(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<T>(std::sin(1.7 * static_cast<double>(i)));
    const uniform_quantizer<T> q({.bits = bits, .block = 32, .round = rounding::stochastic, .seed = 5});
    std::vector<double> sum(n, 0.0);
    const cpu_executor cpu;
    std::vector<std::byte> m(q.max_encoded_bytes(n));
    std::vector<T> out(n);
    for (int d = 0; d < draws; ++d) {
      q.encode(cpu, std::span<const T>(x), m, {}, {.step = static_cast<std::uint64_t>(d)});
      q.decode(cpu, m, std::span<T>(out), {});
      for (std::size_t i = 0; i < n; ++i) sum[i] += static_cast<double>(out[i]);
    }
    for (std::size_t block = 0; block < 2; ++block) {
      double max_abs = 0;
      for (std::size_t i = 32 * block; i < 32 * (block + 1); ++i)
        max_abs = std::max(max_abs, std::fabs(static_cast<double>(x[i])));
      // One draw lies within a step of width w around x (w = s, or 2s between the 1-bit levels ±s),
      // so its variance is at most w²/4: the mean of `draws` draws has standard error ≤ w/(2√draws).
      const double w = (bits == 1 ? 2.0 : 1.0) * max_abs / levels_of(bits);
      for (std::size_t i = 32 * block; i < 32 * (block + 1); ++i) {
        CAPTURE(bits);
        CAPTURE(i);
        const double bias = std::fabs(sum[i] / draws - static_cast<double>(x[i]));
        CHECK(bias <= 5.0 * w / (2.0 * std::sqrt(static_cast<double>(draws))) + 1e-6 * max_abs);
      }
    }
  }
}

TEST_CASE("uniform stochastic rounding is reproducible from (seed, step, tensor id)") {
  const std::vector<float> x = make_input<float>(input_kind::normal, 3000, 4);
  const uniform_quantizer<float> q({.bits = 4, .round = rounding::stochastic, .seed = 77});
  CHECK(encode_bytes(q, x, {.step = 3, .tensor_id = 1}) == encode_bytes(q, x, {.step = 3, .tensor_id = 1}));
  CHECK(encode_bytes(q, x, {.step = 3, .tensor_id = 1}) != encode_bytes(q, x, {.step = 4, .tensor_id = 1}));
  CHECK(encode_bytes(q, x, {.step = 3, .tensor_id = 1}) != encode_bytes(q, x, {.step = 3, .tensor_id = 2}));
}

TEST_CASE_TEMPLATE("uniform rejects NaN and Inf and leaves no valid message", T, float, double) {
  for (const T special :
       {std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity()}) {
    std::vector<T> x = make_input<T>(input_kind::normal, 1000, 2);
    x[600] = special;
    const uniform_quantizer<T> q({.bits = 8});
    const cpu_executor cpu;
    std::vector<std::byte> out = encode_bytes(q, make_input<T>(input_kind::normal, 1000, 3));  // an earlier message
    CHECK(thrown_by([&] { q.encode(cpu, std::span<const T>(x), out, {}); }) == named(errc::non_finite_input));
    CHECK(thrown_by([&] { (void)parse_envelope(out); }) == named(errc::bad_magic));
  }
}

TEST_CASE("uniform decoders reject impossible codes, bad scales, padding and other parameters") {
  const std::vector<float> x = make_input<float>(input_kind::normal, 100, 2);
  const uniform_quantizer<float> q8({.bits = 8, .block = 32});
  const uniform_quantizer<float> q4({.bits = 4, .block = 32});
  const auto reseal = [](std::vector<std::byte> m) {  // keep the envelope valid after editing the payload
    write_envelope(parse_envelope(m), m);
    return m;
  };
  std::vector<std::byte> m8 = encode_bytes(q8, x);
  m8[56 + 4 * 4 + 10] = std::byte{255};  // code 255 > 2L = 254
  CHECK(decode_status_everywhere(q8, reseal(m8), 100) == named(errc::malformed_payload));
  std::vector<std::byte> neg = encode_bytes(q8, x);
  neg[56 + 3] |= std::byte{0x80};  // a negative scale
  CHECK(decode_status_everywhere(q8, reseal(neg), 100) == named(errc::malformed_payload));
  std::vector<std::byte> huge = encode_bytes(q8, x);
  const float too_large = std::numeric_limits<float>::max() / 100.0f;  // 127·s overflows
  std::memcpy(huge.data() + 56, &too_large, 4);
  CHECK(decode_status_everywhere(q8, reseal(huge), 100) == named(errc::malformed_payload));
  std::vector<float> odd(99, 0.5f);
  std::vector<std::byte> m4 = encode_bytes(q4, odd);
  m4.back() |= std::byte{0x80};  // a padding bit after 99 four-bit codes
  CHECK(decode_status_everywhere(q4, reseal(m4), 99) == named(errc::malformed_payload));
  CHECK(decode_status_everywhere(q4, encode_bytes(q8, x), 100) == named(errc::parameter_mismatch));
  CHECK(thrown_by([] { uniform_quantizer<float> bad({.bits = 3}); }) == named(errc::invalid_argument));
  CHECK(thrown_by([] { uniform_quantizer<float> bad({.block = 0}); }) == named(errc::invalid_argument));
}

TEST_CASE("uniform decode_accumulate adds exactly the decoded values") {
  const std::vector<double> x = make_input<double>(input_kind::normal, 777, 9);
  const uniform_quantizer<double> q({.bits = 4, .block = 64, .round = rounding::stochastic, .seed = 1});
  const std::vector<std::byte> m = encode_bytes(q, x);
  const std::vector<double> decoded = decode_values(q, m, x.size());
  std::vector<double> acc(x.size(), 0.25);
  q.decode_accumulate(cpu_executor{}, m, std::span<double>(acc), {});
  bool sums = true;
  for (std::size_t i = 0; i < x.size(); ++i) sums = sums && acc[i] == 0.25 + decoded[i];
  CHECK(sums);
}

TEST_CASE("stochastic rounding codes follow the documented arithmetic, 16-bit uniforms from Philox halves") {
  // u_i = (16-bit half i mod 2 of word ⌊i/2⌋ of the stream, low half first) · 2^-16; q = ⌊t + u⌋.
  for (const int bits : {1, 2, 4, 8}) {
    for (const std::uint32_t block : {32u, 100u, 256u}) {
      const std::size_t n = 3001;
      const std::vector<float> x = make_input<float>(input_kind::normal, n, 12);
      const uniform_quantizer<float> q({.bits = bits, .block = block, .round = rounding::stochastic, .seed = 99});
      const message_key key{.step = 0x100000003ull, .tensor_id = 5};
      const std::vector<std::byte> m = encode_on(reference_executor{}, q, x, key);
      const parsed<float> p = parse<float>(m, n, bits, block);
      const random_stream stream{99, key.step, key.tensor_id, random_purpose::stochastic_rounding};
      const int L = levels_of(bits);
      bool codes_ok = true;
      for (std::size_t i = 0; i < n; ++i) {
        const std::size_t j = i / block;
        float max_abs = 0;
        for (std::size_t k = j * block; k < std::min(n, (j + 1) * block); ++k)
          max_abs = std::max(max_abs, std::fabs(x[k]));
        const float u = static_cast<float>((stream.word(i / 2) >> (16 * (i % 2))) & 0xffffu) / 65536.0f;
        const float t = x[i] * (static_cast<float>(L) / max_abs);
        int level = 0;
        if (bits == 1) level = u < (t + 1.0f) * 0.5f ? 1 : -1;
        else
          level = std::max(-L, std::min(L, static_cast<int>(std::floor(t + u))));
        const unsigned code = bits == 1 ? static_cast<unsigned>((level + 1) / 2) : static_cast<unsigned>(level + L);
        codes_ok = codes_ok && p.codes[i] == code;
      }
      CAPTURE(bits);
      CAPTURE(block);
      CHECK(codes_ok);
    }
  }
}

TEST_CASE_TEMPLATE("every cpu_executor setting writes the reference's bytes and decodes them to the same bits", T,
                   float, double) {
  // The kernels (baseline, AVX2, streamed stores) change speed only: every width, rounding and
  // block size (multiples of the 32-value kernel step and not), on every input kind and edge size.
  for (const int bits : {1, 2, 4, 8}) {
    for (const rounding round : {rounding::nearest_even, rounding::stochastic}) {
      for (const std::uint32_t block : {1u, 32u, 100u, 256u, 4096u}) {
        CAPTURE(bits);
        CAPTURE(static_cast<int>(round));
        CAPTURE(block);
        check_inputs_same_as_reference(uniform_quantizer<T>({.bits = bits, .block = block, .round = round, .seed = 3}));
      }
    }
  }
  // Blocks larger than the encoder's 4 KiB stage, a zero stretch, and n past 8192.
  const uniform_quantizer<T> wide({.bits = 8, .block = 8192, .round = rounding::stochastic, .seed = 3});
  std::vector<T> x = make_input<T>(input_kind::normal, 3 * 4096 + 17, 57);
  std::fill(x.begin() + 40, x.begin() + 90, T{0});
  (void)check_same_as_reference(wide, x, {.step = 2, .tensor_id = 1});
}

TEST_CASE_TEMPLATE("uniform rejects NaN and Inf on every executor alike", T, float, double) {
  for (const int bits : {1, 8}) check_non_finite_same_as_reference(uniform_quantizer<T>({.bits = bits, .block = 64}));
}
