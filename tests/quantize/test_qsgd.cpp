// QSGD: norms follow the documented summation (an oracle in this file, so equality is bitwise),
// codes follow the documented arithmetic, every decoded value lies on the grid norm·k/s with k one
// of the two levels around |x|·s/norm, the quantizer is unbiased and within its variance bounds
// (measured over many draws against bounds derived below), zero buckets decode to exact zeros,
// draws are reproducible from (seed, step, tensor), special values and bad messages get named
// errors, and golden files pin the bytes.
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/quantize/qsgd.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "support/codec_io.hpp"
#include "support/data.hpp"
#include "support/errors.hpp"
#include "support/executor_io.hpp"
#include "support/golden_cases.hpp"
#include "support/reference_check.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

static_assert(codec_for<qsgd_quantizer<float>, cpu_executor>);
static_assert(codec_for<qsgd_quantizer<double>, cpu_executor>);
static_assert(qsgd_quantizer<float>::id == codec_id::qsgd && static_cast<int>(codec_id::qsgd) == 17);

namespace {


// The documented norm of x[first, last): Σ x² left to right in double (double inputs scaled by
// 2^−ilogb(max|x|) first), square root, back to T.
template <class T>
T oracle_norm(const std::vector<T>& x, std::size_t first, std::size_t last) {
  T max_abs = 0;
  for (std::size_t i = first; i < last; ++i) max_abs = std::max(max_abs, std::fabs(x[i]));
  if (max_abs == T{0}) return T{0};
  if constexpr (std::is_same_v<T, float>) {
    double acc = 0;
    for (std::size_t i = first; i < last; ++i) acc += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    return static_cast<float>(std::sqrt(acc));
  } else {
    const int e = std::ilogb(max_abs);
    double acc = 0;
    for (std::size_t i = first; i < last; ++i) acc += std::ldexp(x[i], -e) * std::ldexp(x[i], -e);
    return std::ldexp(std::sqrt(acc), e);
  }
}

// The documented level of element i: t = min(|x|/norm, 1), r = t·s, level ⌊r⌋ + [u < r − ⌊r⌋] with
// u from word i of the Philox stream (core/philox.hpp, tested on its own).
template <class T>
int oracle_level(T x, T norm, unsigned s, std::uint64_t seed, message_key key, std::uint64_t i) {
  if (norm == T{0}) return 0;
  const T t = std::min(std::fabs(x) / norm, T{1});
  const T r = t * static_cast<T>(s);
  const T l = std::floor(r);
  const random_stream stream{seed, key.step, key.tensor_id, random_purpose::stochastic_rounding};
  const T u = static_cast<T>(stream.word(i) >> 8) / static_cast<T>(16777216.0);
  return static_cast<int>(l) + (u < r - l ? 1 : 0);
}

int width_of(unsigned s) { return s == 1 ? 2 : (s <= 7 ? 4 : 8); }

template <class T>
T norm_in(const std::vector<std::byte>& m, std::size_t j) {
  T v;
  std::memcpy(&v, m.data() + envelope_bytes + j * sizeof(T), sizeof v);
  return v;
}

unsigned code_in(const std::vector<std::byte>& m, std::size_t codes_offset, std::size_t i, int bits) {
  const std::size_t bit = i * static_cast<std::size_t>(bits);
  return (std::to_integer<unsigned>(m[codes_offset + bit / 8]) >> (bit % 8)) & ((1u << bits) - 1u);
}

// Decoded value of level k with sign under `norm`, as documented: ±norm·fl(k/s), +0 for k = 0.
template <class T>
T grid_value(T norm, int k, unsigned s, bool negative) {
  if (k == 0) return T{0};
  const T v = norm * (static_cast<T>(k) / static_cast<T>(s));
  return negative ? -v : v;
}

template <class T>
void check_message(const std::vector<T>& x, unsigned s, std::uint32_t bucket, std::uint64_t seed, message_key key) {
  const qsgd_quantizer<T> q({.levels = s, .bucket = bucket, .seed = seed});
  const int bits = width_of(s);
  REQUIRE(q.bits() == bits);
  const std::vector<std::byte> m = encode_on(reference_executor{}, q, x, key);
  const std::size_t n = x.size();
  const std::size_t buckets = (n + bucket - 1) / bucket;
  REQUIRE(m.size() == envelope_bytes + buckets * sizeof(T) + (n * static_cast<std::size_t>(bits) + 7) / 8);
  const std::size_t codes_offset = envelope_bytes + buckets * sizeof(T);
  const std::vector<T> decoded = decode_on(reference_executor{}, q, m, poisoned_values<T>(n));
  bool norms_ok = true, codes_ok = true, grid_ok = true, values_ok = true, zeros_exact = true;
  for (std::size_t j = 0; j < buckets; ++j) {
    const std::size_t first = j * bucket, last = std::min(n, first + bucket);
    const T norm = oracle_norm(x, first, last);
    norms_ok = norms_ok && to_bits(norm_in<T>(m, j)) == to_bits(norm);
    for (std::size_t i = first; i < last; ++i) {
      const unsigned code = code_in(m, codes_offset, i, bits);
      const int level = static_cast<int>(code & ((1u << (bits - 1)) - 1u));
      const bool negative = (code >> (bits - 1)) != 0;
      const int want = oracle_level(x[i], norm, s, seed, key, i);
      codes_ok = codes_ok && level == want && negative == (want > 0 && std::signbit(x[i]));
      // Independently of the arithmetic: the level is ⌊r⌋ or ⌊r⌋ + 1 for the exact r = |x|·s/norm
      // (either neighbour when r lies within rounding of an integer).
      if (norm > T{0}) {
        const long double r = std::fabs(static_cast<long double>(x[i])) * s / static_cast<long double>(norm);
        const long double fl = std::floor(r);
        const bool near_integer = r - fl < 1e-5L || fl + 1 - r < 1e-5L;
        const long double lo = near_integer ? std::round(r) - 1 : fl, hi = near_integer ? std::round(r) + 1 : fl + 1;
        grid_ok = grid_ok && level >= lo && level <= hi && level <= static_cast<int>(s);
      } else {
        zeros_exact = zeros_exact && code == 0u && decoded[i] == T{0} && !std::signbit(decoded[i]);
      }
      const T v = grid_value(norm, level, s, negative);
      values_ok = values_ok && to_bits(decoded[i]) == to_bits(v);
    }
  }
  const std::size_t used = n * static_cast<std::size_t>(bits);
  if (used % 8 != 0) CHECK((std::to_integer<unsigned>(m.back()) >> (used % 8)) == 0u);
  CHECK(norms_ok);
  CHECK(codes_ok);
  CHECK(grid_ok);
  CHECK(values_ok);
  CHECK(zeros_exact);
}


}  // namespace

TEST_CASE("QSGD code widths are 1 + bit_width(s) rounded up to 2, 4 or 8 bits") {
  const std::pair<unsigned, int> widths[] = {{1, 2}, {2, 4}, {3, 4}, {7, 4}, {8, 8}, {15, 8}, {127, 8}};
  for (const auto& width : widths) {
    const unsigned s = width.first;
    CAPTURE(s);
    CHECK(qsgd_quantizer<float>({.levels = s}).bits() == width.second);
  }
  CHECK(qsgd_quantizer<float>().levels() == 15);
  CHECK(qsgd_quantizer<float>().params().bucket == 256);
}

TEST_CASE_TEMPLATE("QSGD norms, codes and decoded values follow the documented arithmetic", T, float, double) {
  for (const unsigned s : {1u, 4u, 15u, 127u}) {
    for (const std::uint32_t bucket : {1u, 7u, 256u}) {
      for (const std::size_t n :
           {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{(1u << 16) + 3}}) {
        for (const input_kind kind : all_input_kinds) {
          if (n > 1000 && (kind != input_kind::normal || s != 15)) continue;
          CAPTURE(s);
          CAPTURE(bucket);
          CAPTURE(n);
          CAPTURE(std::string(name(kind)));
          check_message(make_input<T>(kind, n, 31 + n), s, bucket, 7, {.step = 3, .tensor_id = 5});
        }
      }
    }
  }
}

TEST_CASE_TEMPLATE("QSGD encodes a bucket holding the largest finite value and rejects norms that overflow", T, float,
                   double) {
  std::vector<T> x(40, T{0});
  x[3] = -std::numeric_limits<T>::max();
  x[30] = T{1};
  check_message(x, 15, 32, 1, {});
  const qsgd_quantizer<T> q({.bucket = 32});
  const std::vector<T> d = decode_values(q, encode_bytes(q, x), x.size());
  CHECK(d[3] == -std::numeric_limits<T>::max());  // t = 1, level s, norm·fl(s/s) = norm
  std::vector<T> y(40, T{0});
  y[35] = std::numeric_limits<T>::max();
  y[36] = std::numeric_limits<T>::max() / T{2};  // ‖(max, max/2)‖ = 1.118·max
  const cpu_executor cpu;
  std::vector<std::byte> out = encode_bytes(q, x);
  CHECK(thrown_by([&] { q.encode(cpu, std::span<const T>(y), out, {}); }) == named(errc::non_finite_input));
  CHECK(thrown_by([&] { (void)parse_envelope(out); }) == named(errc::bad_magic));
}

TEST_CASE_TEMPLATE("QSGD zero buckets decode to exact +0", T, float, double) {
  std::vector<T> x(64);
  for (std::size_t i = 0; i < 16; ++i) x[i] = i % 2 == 0 ? -T{0} : T{0};
  for (std::size_t i = 16; i < 64; ++i) x[i] = static_cast<T>(std::cos(static_cast<double>(i)));
  x[20] = -T{0};
  const qsgd_quantizer<T> q({.levels = 3, .bucket = 16});
  const std::vector<std::byte> m = encode_bytes(q, x);
  CHECK(norm_in<T>(m, 0) == T{0});
  const std::vector<T> d = decode_values(q, m, x.size());
  bool zeros = true;
  for (std::size_t i = 0; i < 16; ++i) zeros = zeros && d[i] == T{0} && !std::signbit(d[i]);
  CHECK(zeros);
  CHECK((d[20] == T{0} && !std::signbit(d[20])));  // a −0 in a live bucket: level 0, sign 0
  check_message(x, 3, 16, 0, {});
}

// Unbiasedness. For an element with r = |x|·s/norm and f = r − ⌊r⌋, one draw is norm/s·⌊r⌋ or
// norm/s·(⌊r⌋ + 1), the latter with probability f, so its variance is (norm/s)²·f(1 − f) ≤
// norm²/(4s²), and the mean of D draws has standard error σ = (norm/s)·sqrt(f(1 − f)/D). The check
// allows 5σ plus a bias of 1e-6·norm for the rounding of t, r and the 24-bit uniforms.
TEST_CASE_TEMPLATE("QSGD is unbiased within its variance bound", T, float, double) {
  for (const unsigned s : {1u, 4u, 15u}) {
    const std::size_t n = 64;
    const int draws = 4000;
    std::vector<T> x(n);
    for (std::size_t i = 0; i < n; ++i)
      x[i] = static_cast<T>(std::sin(1.7 * static_cast<double>(i)) * (i % 5 == 0 ? 3.0 : 1.0));
    const qsgd_quantizer<T> q({.levels = s, .bucket = 32, .seed = 5});
    std::vector<double> sum(n, 0.0);
    const cpu_executor cpu;
    std::vector<std::byte> m(q.max_encoded_bytes(n));
    std::vector<T> out(n);
    for (int d = 0; d < draws; ++d) {
      q.encode(cpu, std::span<const T>(x), m, {}, {.step = static_cast<std::uint64_t>(d), .tensor_id = 9});
      q.decode(cpu, m, std::span<T>(out), {});
      for (std::size_t i = 0; i < n; ++i) sum[i] += static_cast<double>(out[i]);
    }
    std::size_t violations = 0;
    for (std::size_t b = 0; b < 2; ++b) {
      double sq = 0;
      for (std::size_t i = 32 * b; i < 32 * (b + 1); ++i) sq += static_cast<double>(x[i]) * static_cast<double>(x[i]);
      const double norm = std::sqrt(sq);
      for (std::size_t i = 32 * b; i < 32 * (b + 1); ++i) {
        const double r = std::fabs(static_cast<double>(x[i])) * s / norm;
        const double f = r - std::floor(r);
        const double sigma = norm / s * std::sqrt(f * (1 - f) / draws);
        const double bias = std::fabs(sum[i] / draws - static_cast<double>(x[i]));
        if (!(bias <= 5.0 * sigma + 1e-6 * norm)) {
          CAPTURE(s);
          CAPTURE(i);
          CAPTURE(bias);
          CAPTURE(sigma);
          CHECK(bias <= 5.0 * sigma + 1e-6 * norm);
          ++violations;
        }
      }
    }
    CHECK(violations == 0);
  }
}

// Variance. Per bucket of d values, E‖Q(x) − x‖² = (norm/s)²·Σ f_i(1 − f_i) exactly (f_i as above);
// the paper's bound is min(d/s², √d/s)·norm². The mean over D draws of the squared error must lie
// within 1.2× that bound, and within 5% of the exact expectation (relative standard error of the
// estimate here is below 1%).
TEST_CASE_TEMPLATE("QSGD error variance meets the exact expectation and the min(d/s², √d/s) bound", T, float, double) {
  for (const unsigned s : {1u, 2u, 15u}) {
    const std::size_t n = 1024;
    const std::uint32_t d = 256;
    const int draws = 300;
    const std::vector<T> x = make_input<T>(input_kind::normal, n, 77);
    const qsgd_quantizer<T> q({.levels = s, .bucket = d, .seed = 12});
    double bound = 0, expected = 0;
    for (std::size_t b = 0; b < n / d; ++b) {
      double sq = 0;
      for (std::size_t i = b * d; i < (b + 1) * d; ++i) sq += static_cast<double>(x[i]) * static_cast<double>(x[i]);
      const double norm = std::sqrt(sq);
      bound += std::min(static_cast<double>(d) / (s * s), std::sqrt(static_cast<double>(d)) / s) * sq;
      for (std::size_t i = b * d; i < (b + 1) * d; ++i) {
        const double r = std::fabs(static_cast<double>(x[i])) * s / norm;
        const double f = r - std::floor(r);
        expected += (norm / s) * (norm / s) * f * (1 - f);
      }
    }
    const cpu_executor cpu;
    std::vector<std::byte> m(q.max_encoded_bytes(n));
    std::vector<T> out(n);
    double total = 0;
    for (int t = 0; t < draws; ++t) {
      q.encode(cpu, std::span<const T>(x), m, {}, {.step = static_cast<std::uint64_t>(t)});
      q.decode(cpu, m, std::span<T>(out), {});
      for (std::size_t i = 0; i < n; ++i) {
        const double e = static_cast<double>(out[i]) - static_cast<double>(x[i]);
        total += e * e;
      }
    }
    const double measured = total / draws;
    CAPTURE(s);
    CAPTURE(measured);
    CAPTURE(expected);
    CAPTURE(bound);
    CHECK(measured <= 1.2 * bound);
    CHECK(std::fabs(measured - expected) <= 0.05 * expected);
  }
}

TEST_CASE("QSGD draws are reproducible from (seed, step, tensor id)") {
  const std::vector<float> x = make_input<float>(input_kind::normal, 3000, 4);
  const qsgd_quantizer<float> q({.levels = 4, .seed = 77});
  CHECK(encode_bytes(q, x, {.step = 3, .tensor_id = 1}) == encode_bytes(q, x, {.step = 3, .tensor_id = 1}));
  CHECK(encode_bytes(q, x, {.step = 3, .tensor_id = 1}) != encode_bytes(q, x, {.step = 4, .tensor_id = 1}));
  CHECK(encode_bytes(q, x, {.step = 3, .tensor_id = 1}) != encode_bytes(q, x, {.step = 3, .tensor_id = 2}));
  const qsgd_quantizer<float> other({.levels = 4, .seed = 78});
  const std::vector<std::byte> a = encode_bytes(q, x, {.step = 3}), b = encode_bytes(other, x, {.step = 3});
  CHECK(!std::equal(a.begin() + envelope_bytes, a.end(), b.begin() + envelope_bytes, b.end()));
}

TEST_CASE_TEMPLATE("QSGD rejects NaN and Inf and leaves no valid message", T, float, double) {
  for (const T special : {std::numeric_limits<T>::quiet_NaN(), -std::numeric_limits<T>::quiet_NaN(),
                          std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity()}) {
    std::vector<T> x = make_input<T>(input_kind::normal, 1000, 2);
    x[600] = special;
    const qsgd_quantizer<T> q;
    const cpu_executor cpu;
    std::vector<std::byte> out = encode_bytes(q, make_input<T>(input_kind::normal, 1000, 3));  // an earlier message
    CHECK(thrown_by([&] { q.encode(cpu, std::span<const T>(x), out, {}); }) == named(errc::non_finite_input));
    CHECK(thrown_by([&] { (void)parse_envelope(out); }) == named(errc::bad_magic));
  }
}

TEST_CASE("QSGD decoders reject bad norms, impossible codes, padding, layouts and other parameters") {
  std::vector<float> x = make_input<float>(input_kind::normal, 99, 2);
  for (std::size_t i = 64; i < 96; ++i) x[i] = 0.0f;  // bucket 2 is zero
  const qsgd_quantizer<float> q({.levels = 4, .bucket = 32, .seed = 3});  // 4-bit codes after 4 norms
  const std::size_t codes = envelope_bytes + 4 * 4;
  const std::vector<std::byte> good = encode_bytes(q, x);
  CHECK(decode_values(q, good, 99).size() == 99);
  const auto with_norm = [&](std::size_t j, float v) {
    std::vector<std::byte> m = good;
    std::memcpy(m.data() + envelope_bytes + 4 * j, &v, 4);
    return reseal(m);
  };
  for (const float bad :
       {-1.0f, -0.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    CAPTURE(bad);
    CHECK(decode_status_everywhere(q, with_norm(0, bad), 99) == named(errc::malformed_payload));
  }
  // The largest finite norm is fine: |value| ≤ norm.
  const std::vector<float> huge = decode_values(q, with_norm(1, std::numeric_limits<float>::max()), 99);
  CHECK(std::all_of(huge.begin(), huge.end(), [](float v) { return std::isfinite(v); }));
  const auto with_code = [&](std::size_t i, unsigned code) {
    std::vector<std::byte> m = good;
    std::byte& b = m[codes + i / 2];
    b = (b & std::byte{static_cast<unsigned char>(i % 2 == 0 ? 0xF0 : 0x0F)}) |
        std::byte{static_cast<unsigned char>(code << (4 * (i % 2)))};
    return reseal(m);
  };
  CHECK(decode_values(q, with_code(5, 4u), 99).size() == 99);  // level s is fine
  CHECK(decode_status_everywhere(q, with_code(5, 5u), 99) == named(errc::malformed_payload));   // level 5 > s
  CHECK(decode_status_everywhere(q, with_code(6, 0xFu), 99) == named(errc::malformed_payload));  // level 7, negative
  CHECK(decode_status_everywhere(q, with_code(7, 8u), 99) == named(errc::malformed_payload));    // −0 level
  CHECK(decode_status_everywhere(q, with_code(70, 1u), 99) == named(errc::malformed_payload));   // code under norm 0
  // Padding after 99 four-bit codes: bits 4..7 of the last byte.
  std::vector<std::byte> pad = good;
  pad.back() |= std::byte{0x10};
  CHECK(decode_status_everywhere(q, reseal(pad), 99) == named(errc::malformed_payload));
  std::vector<std::byte> layout = good;
  envelope e = parse_envelope(layout);
  e.layout = 2;
  write_envelope(e, layout);
  CHECK(decode_status_everywhere(q, layout, 99) == named(errc::malformed_payload));
  std::vector<std::byte> short_payload(good.begin(), good.end() - 1);
  e = parse_envelope(good);
  e.payload_bytes -= 1;
  write_envelope(e, short_payload);
  CHECK(decode_status_everywhere(q, short_payload, 99) == named(errc::malformed_payload));
  CHECK(decode_status_everywhere(qsgd_quantizer<float>({.levels = 4, .bucket = 32, .seed = 4}), good, 99) ==
        named(errc::parameter_mismatch));
  CHECK(decode_status_everywhere(qsgd_quantizer<float>({.levels = 5, .bucket = 32, .seed = 3}), good, 99) ==
        named(errc::parameter_mismatch));
  CHECK(decode_status_everywhere(qsgd_quantizer<float>({.levels = 4, .bucket = 33, .seed = 3}), good, 99) ==
        named(errc::parameter_mismatch));
  CHECK(decode_status_everywhere(qsgd_quantizer<double>({.levels = 4, .bucket = 32, .seed = 3}), good, 99) ==
        named(errc::dtype_mismatch));
  CHECK(thrown_by([] { qsgd_quantizer<float> bad({.levels = 0}); }) == named(errc::invalid_argument));
  CHECK(thrown_by([] { qsgd_quantizer<float> bad({.levels = 128}); }) == named(errc::invalid_argument));
  CHECK(thrown_by([] { qsgd_quantizer<float> bad({.bucket = 0}); }) == named(errc::invalid_argument));
  std::vector<std::byte> small(q.max_encoded_bytes(99) - 1);
  CHECK(thrown_by([&] { q.encode(cpu_executor{}, std::span<const float>(x), small, {}); }) ==
        named(errc::buffer_too_small));
}

TEST_CASE("QSGD decode_accumulate adds exactly the decoded values") {
  const std::vector<double> x = make_input<double>(input_kind::normal, 777, 9);
  const qsgd_quantizer<double> q({.levels = 7, .bucket = 64, .seed = 1}, wire_options{.payload_checksum = true});
  const std::vector<std::byte> m = encode_bytes(q, x);
  const std::vector<double> decoded = decode_values(q, m, x.size(), {.require_checksum = true});
  std::vector<double> acc(x.size(), 0.25);
  q.decode_accumulate(cpu_executor{}, m, std::span<double>(acc), {});
  bool sums = true;
  for (std::size_t i = 0; i < x.size(); ++i) sums = sums && acc[i] == 0.25 + decoded[i];
  CHECK(sums);
}

TEST_CASE("golden QSGD files reproduce byte for byte and decode within a level of the known input") {
  const std::vector<float> x = golden_input_with_zeros<float>(100, false);
  const qsgd_quantizer<float> q32({.levels = 15, .bucket = 32, .seed = 3});
  const std::vector<std::byte> m32 = golden_bytes("qsgd_f32.bin", encode_bytes(q32, x, {.step = 4, .tensor_id = 1}));
  CHECK(m32 == encode_bytes(q32, x, {.step = 4, .tensor_id = 1}));
  const std::vector<double> y = golden_input_with_zeros<double>(50, false);
  const qsgd_quantizer<double> q64({.levels = 3, .bucket = 16, .seed = 9});
  const std::vector<std::byte> m64 = golden_bytes("qsgd_f64.bin", encode_bytes(q64, y, {.step = 6, .tensor_id = 2}));
  CHECK(m64 == encode_bytes(q64, y, {.step = 6, .tensor_id = 2}));
  if (m32.empty() || m64.empty()) return;  // reported above

  // Norms are ‖x‖ of each bucket; each decoded value lies on norm·k/s with |x − value| < norm/s.
  const auto check_file = [](const auto& input, const auto& q, const std::vector<std::byte>& m, std::size_t bucket,
                             unsigned s) {
    using T = typename std::decay_t<decltype(input)>::value_type;
    const std::vector<T> d = decode_values(q, m, input.size());
    bool close = true, on_grid = true, zeros = true;
    for (std::size_t i = 0; i < input.size(); ++i) {
      const std::size_t j = i / bucket;
      const T norm = norm_in<T>(m, j);
      double sq = 0;
      for (std::size_t k = j * bucket; k < std::min(input.size(), (j + 1) * bucket); ++k)
        sq += static_cast<double>(input[k]) * static_cast<double>(input[k]);
      close = close && std::fabs(static_cast<double>(norm) - std::sqrt(sq)) <= 1e-6 * std::sqrt(sq);
      const double error = std::fabs(static_cast<double>(d[i] - input[i]));
      close = close && (norm == T{0} ? error == 0.0 : error < static_cast<double>(norm) / s * (1 + 1e-6));
      const double k = std::fabs(static_cast<double>(d[i])) * s / static_cast<double>(norm == T{0} ? T{1} : norm);
      on_grid = on_grid && std::fabs(k - std::round(k)) < 1e-5;
      if (i >= 32 && i < 48) zeros = zeros && d[i] == T{0} && !std::signbit(d[i]);
    }
    CHECK(close);
    CHECK(on_grid);
    CHECK(zeros);
  };
  check_file(x, q32, m32, 32, 15);
  check_file(y, q64, m64, 16, 3);
}

TEST_CASE_TEMPLATE("every cpu_executor setting writes the reference's QSGD bytes and decodes them alike", T, float,
                   double) {
  for (const std::uint32_t levels : {1u, 3u, 7u, 15u, 127u}) {
    for (const std::uint32_t bucket : {1u, 32u, 100u, 256u}) {
      CAPTURE(levels);
      CAPTURE(bucket);
      check_inputs_same_as_reference(qsgd_quantizer<T>({.levels = levels, .bucket = bucket, .seed = 4}));
    }
  }
}

TEST_CASE_TEMPLATE("QSGD rejects NaN and Inf on every executor alike", T, float, double) {
  check_non_finite_same_as_reference(qsgd_quantizer<T>({.levels = 15, .bucket = 64}));
}
