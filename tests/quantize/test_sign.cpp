// Sign quantization (EF-signSGD / 1-bit): scales are the documented block mean magnitudes (an
// oracle in this file, summed in the documented order, so equality is bitwise), bits are the
// IEEE sign bits, zero blocks decode to exact +0, error feedback keeps Σ decoded + residual = Σ g,
// special values and bad messages get named errors, and golden files pin the bytes.
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/feedback/error_feedback.hpp>
#include <gradcomp/quantize/sign.hpp>

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
#include "support/ef_invariant.hpp"
#include "support/errors.hpp"
#include "support/executor_io.hpp"
#include "support/golden_cases.hpp"
#include "support/reference_check.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

static_assert(codec_for<sign_quantizer<float>, cpu_executor>);
static_assert(codec_for<sign_quantizer<double>, cpu_executor>);
static_assert(sign_quantizer<float>::id == codec_id::sign && static_cast<int>(codec_id::sign) == 18);

namespace {


// The documented scale of x[first, last): the mean magnitude, summed left to right (float: in
// double; double: scaled by 2^−ilogb(max|x|)), clamped to the largest magnitude.
template <class T>
T oracle_scale(const std::vector<T>& x, std::size_t first, std::size_t last) {
  T max_abs = 0;
  for (std::size_t i = first; i < last; ++i) max_abs = std::max(max_abs, std::fabs(x[i]));
  if (max_abs == T{0}) return T{0};
  const auto count = static_cast<double>(last - first);
  if constexpr (std::is_same_v<T, float>) {
    double acc = 0;
    for (std::size_t i = first; i < last; ++i) acc += std::fabs(static_cast<double>(x[i]));
    return static_cast<float>(std::min(acc / count, static_cast<double>(max_abs)));
  } else {
    const int e = std::ilogb(max_abs);
    double acc = 0;
    for (std::size_t i = first; i < last; ++i) acc += std::ldexp(std::fabs(x[i]), -e);
    return std::min(std::ldexp(acc / count, e), max_abs);
  }
}

template <class T>
T scale_in(const std::vector<std::byte>& m, std::size_t j) {
  T s;
  std::memcpy(&s, m.data() + envelope_bytes + j * sizeof(T), sizeof s);
  return s;
}

unsigned bit_in(const std::vector<std::byte>& m, std::size_t bits_offset, std::size_t i) {
  return (std::to_integer<unsigned>(m[bits_offset + i / 8]) >> (i % 8)) & 1u;
}

template <class T>
void check_against_oracle(const std::vector<T>& x, std::uint32_t block) {
  const sign_quantizer<T> q({.block = block});
  const std::vector<std::byte> m = encode_on(reference_executor{}, q, x, {.step = 2});
  const std::size_t n = x.size();
  const std::size_t blocks = (n + block - 1) / block;
  REQUIRE(m.size() == envelope_bytes + blocks * sizeof(T) + (n + 7) / 8);
  const std::vector<T> decoded = decode_on(reference_executor{}, q, m, poisoned_values<T>(n));
  const std::size_t bits_offset = envelope_bytes + blocks * sizeof(T);
  bool scales_ok = true, bits_ok = true, values_ok = true, mean_close = true;
  for (std::size_t j = 0; j < blocks; ++j) {
    const std::size_t first = j * block, last = std::min(n, first + block);
    const T s = oracle_scale(x, first, last);
    scales_ok = scales_ok && to_bits(scale_in<T>(m, j)) == to_bits(s);
    // Independently of the summation order: recursive summation of c terms in double errs by at
    // most (c − 1)·u_d·Σ|x|, the division and the final rounding to T by an ulp of T each (or by
    // denorm_min below the normal range); the long double reference adds its own c·u_ld.
    long double exact = 0;
    for (std::size_t i = first; i < last; ++i) exact += std::fabs(static_cast<long double>(x[i]));
    exact /= static_cast<long double>(last - first);
    const auto c = static_cast<long double>(last - first);
    const long double tolerance = (2 * static_cast<long double>(std::numeric_limits<T>::epsilon()) +
                                   (c + 1) * static_cast<long double>(std::numeric_limits<double>::epsilon())) *
                                      exact +
                                  static_cast<long double>(std::numeric_limits<T>::denorm_min());
    mean_close = mean_close && std::fabs(static_cast<long double>(s) - exact) <= tolerance;
    for (std::size_t i = first; i < last; ++i) {
      const unsigned want_bit = s == T{0} ? 0u : (std::signbit(x[i]) ? 1u : 0u);
      bits_ok = bits_ok && bit_in(m, bits_offset, i) == want_bit;
      const T want = s == T{0} ? T{0} : (std::signbit(x[i]) ? -s : s);
      values_ok = values_ok && std::signbit(decoded[i]) == std::signbit(want) && decoded[i] == want;
    }
  }
  if (n % 8 != 0) CHECK((std::to_integer<unsigned>(m.back()) >> (n % 8)) == 0u);
  CHECK(scales_ok);
  CHECK(mean_close);
  CHECK(bits_ok);
  CHECK(values_ok);
}


}  // namespace

TEST_CASE_TEMPLATE("sign scales are the documented block means and decoding gives ±scale", T, float, double) {
  for (const std::uint32_t block : {1u, 7u, 256u}) {
    for (const std::size_t n :
         {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{(1u << 16) + 3}}) {
      for (const input_kind kind : all_input_kinds) {
        if (n > 1000 && kind != input_kind::normal) continue;
        CAPTURE(block);
        CAPTURE(n);
        CAPTURE(std::string(name(kind)));
        check_against_oracle(make_input<T>(kind, n, 17 + n), block);
      }
    }
  }
}

TEST_CASE_TEMPLATE("sign encodes blocks of the largest finite values into decodable messages", T, float, double) {
  // Σ|x| overflows T here; the float path sums in double and the double path scales by 2^−E.
  std::vector<T> x(300, std::numeric_limits<T>::max());
  for (std::size_t i = 0; i < x.size(); i += 3) x[i] = -std::numeric_limits<T>::max();
  check_against_oracle(x, 256);
  const std::vector<T> d = decode_values(sign_quantizer<T>(), encode_bytes(sign_quantizer<T>(), x), x.size());
  bool extreme = true;
  for (std::size_t i = 0; i < x.size(); ++i) extreme = extreme && d[i] == x[i];
  CHECK(extreme);
}

TEST_CASE_TEMPLATE("sign zero blocks, and blocks whose mean underflows, decode to exact +0 with bits 0", T, float,
                   double) {
  const std::uint32_t block = 16;
  std::vector<T> x(64);
  for (std::size_t i = 0; i < 16; ++i) x[i] = i % 2 == 0 ? -T{0} : T{0};  // block 0: signed zeros
  for (std::size_t i = 16; i < 32; ++i) x[i] = static_cast<T>(0.5) - static_cast<T>(i % 3);  // block 1: ordinary
  x[40] = -std::numeric_limits<T>::denorm_min();  // block 2: mean denorm_min/16 rounds to 0
  for (std::size_t i = 48; i < 64; ++i) x[i] = -std::numeric_limits<T>::denorm_min();  // block 3: mean is denorm_min
  const sign_quantizer<T> q({.block = block});
  const std::vector<std::byte> m = encode_bytes(q, x);
  const std::vector<T> d = decode_values(q, m, x.size());
  CHECK(scale_in<T>(m, 0) == T{0});
  CHECK(scale_in<T>(m, 2) == T{0});
  CHECK(scale_in<T>(m, 3) == std::numeric_limits<T>::denorm_min());
  bool zeros = true;
  for (const std::size_t i : {std::size_t{0}, std::size_t{5}, std::size_t{10}, std::size_t{15}, std::size_t{32},
                              std::size_t{40}, std::size_t{47}})
    zeros = zeros && d[i] == T{0} && !std::signbit(d[i]) && bit_in(m, envelope_bytes + 4 * sizeof(T), i) == 0u;
  CHECK(zeros);
  CHECK(d[50] == -std::numeric_limits<T>::denorm_min());
  check_against_oracle(x, block);
}

TEST_CASE_TEMPLATE("sign rejects NaN and Inf and leaves no valid message", T, float, double) {
  for (const T special : {std::numeric_limits<T>::quiet_NaN(), -std::numeric_limits<T>::quiet_NaN(),
                          std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity()}) {
    std::vector<T> x = make_input<T>(input_kind::normal, 1000, 2);
    x[600] = special;
    const sign_quantizer<T> q;
    const cpu_executor cpu;
    std::vector<std::byte> out = encode_bytes(q, make_input<T>(input_kind::normal, 1000, 3));  // an earlier message
    CHECK(thrown_by([&] { q.encode(cpu, std::span<const T>(x), out, {}); }) == named(errc::non_finite_input));
    CHECK(thrown_by([&] { (void)parse_envelope(out); }) == named(errc::bad_magic));
  }
}

// Σ_t d_t + e_T = Σ_t g_t under error feedback, element by element, where d_t is the test's own
// decoding of message t. Bound (as in tests/feedback/test_error_feedback.cpp): with T's unit
// roundoff u, a_t = fl(g_t + e_t) and e_{t+1} = fl(a_t − d_t) each err by at most u times their
// magnitude, so the telescoped gap is at most u·Σ_t (|a_t| + |e_{t+1}|); forming the sums in
// double by recursive summation of 2·steps + 1 terms adds at most (2·steps + 1)·eps_d·Σ|terms|.
TEST_CASE_TEMPLATE("sign under error feedback keeps the invariant over 20 steps", T, float, double) {
  check_ef_invariant(sign_quantizer<T>({.block = 64}), 1000, 20, 500, 1);
}

TEST_CASE("sign decoders reject bad scales, stray bits, padding, layouts and other parameters") {
  const std::vector<float> x = make_input<float>(input_kind::normal, 100, 2);
  const sign_quantizer<float> q({.block = 32});  // 4 scales, then 13 bytes of bits
  const std::vector<std::byte> good = encode_bytes(q, x);
  CHECK(decode_values(q, good, 100).size() == 100);
  const auto with_scale = [&](std::size_t j, float s) {
    std::vector<std::byte> m = good;
    std::memcpy(m.data() + envelope_bytes + 4 * j, &s, 4);
    return reseal(m);
  };
  for (const float bad :
       {-1.0f, -0.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    CAPTURE(bad);
    CHECK(decode_status_everywhere(q, with_scale(3, bad), 100) == named(errc::malformed_payload));
  }
  // A set bit in a block of scale 0.
  std::vector<std::byte> stray = with_scale(1, 0.0f);
  bool any_set = false;
  for (std::size_t i = 32; i < 64; ++i) any_set = any_set || bit_in(stray, envelope_bytes + 16, i) != 0u;
  REQUIRE(any_set);
  CHECK(decode_status_everywhere(q, stray, 100) == named(errc::malformed_payload));
  std::vector<std::byte> zeros = encode_bytes(q, std::vector<float>(100, 0.0f));
  zeros[envelope_bytes + 16 + 5] = std::byte{0x01};
  CHECK(decode_status_everywhere(q, reseal(zeros), 100) == named(errc::malformed_payload));
  // Padding after 100 bits: bits 4..7 of the last byte.
  std::vector<std::byte> pad = good;
  pad.back() |= std::byte{0x10};
  CHECK(decode_status_everywhere(q, reseal(pad), 100) == named(errc::malformed_payload));
  // Another layout byte.
  std::vector<std::byte> layout = good;
  envelope e = parse_envelope(layout);
  e.layout = 1;
  write_envelope(e, layout);
  CHECK(decode_status_everywhere(q, layout, 100) == named(errc::malformed_payload));
  // A payload one byte short, declared consistently.
  std::vector<std::byte> short_payload(good.begin(), good.end() - 1);
  e = parse_envelope(good);
  e.payload_bytes -= 1;
  write_envelope(e, short_payload);
  CHECK(decode_status_everywhere(q, short_payload, 100) == named(errc::malformed_payload));
  // Other parameters, codec, dtype.
  CHECK(decode_status_everywhere(sign_quantizer<float>({.block = 64}), good, 100) == named(errc::parameter_mismatch));
  CHECK(decode_status_everywhere(sign_quantizer<double>({.block = 32}), good, 100) == named(errc::dtype_mismatch));
  CHECK(decode_status_everywhere(q, good, 99) == named(errc::size_mismatch));
  CHECK(thrown_by([] { sign_quantizer<float> bad({.block = 0}); }) == named(errc::invalid_argument));
  CHECK(sign_quantizer<float>({.block = 32}).params_hash() != sign_quantizer<float>({.block = 64}).params_hash());
  CHECK(sign_quantizer<float>().params_hash() != sign_quantizer<double>().params_hash());
  // A short output buffer.
  std::vector<std::byte> small(q.max_encoded_bytes(100) - 1);
  CHECK(thrown_by([&] { q.encode(cpu_executor{}, std::span<const float>(x), small, {}); }) ==
        named(errc::buffer_too_small));
}

TEST_CASE("sign decode_accumulate adds exactly the decoded values, and checksums round-trip") {
  const std::vector<double> x = make_input<double>(input_kind::normal, 777, 9);
  const sign_quantizer<double> q({.block = 100}, wire_options{.payload_checksum = true});
  const std::vector<std::byte> m = encode_bytes(q, x);
  const std::vector<double> decoded = decode_values(q, m, x.size(), {.require_checksum = true});
  std::vector<double> acc(x.size(), 0.25);
  q.decode_accumulate(cpu_executor{}, m, std::span<double>(acc), {});
  bool sums = true;
  for (std::size_t i = 0; i < x.size(); ++i) sums = sums && acc[i] == 0.25 + decoded[i];
  CHECK(sums);
}

TEST_CASE("golden sign files reproduce byte for byte and decode to ±mean|x| of the known input") {
  const std::vector<float> x = golden_input_with_zeros<float>(100, true);
  const sign_quantizer<float> q32({.block = 32});
  const std::vector<std::byte> m32 = golden_bytes("sign_f32.bin", encode_bytes(q32, x, {.step = 4, .tensor_id = 2}));
  CHECK(m32 == encode_bytes(q32, x, {.step = 4, .tensor_id = 2}));
  const std::vector<double> y = golden_input_with_zeros<double>(50, true);
  const sign_quantizer<double> q64({.block = 16});
  const std::vector<std::byte> m64 = golden_bytes("sign_f64.bin", encode_bytes(q64, y, {.step = 6}));
  CHECK(m64 == encode_bytes(q64, y, {.step = 6}));
  if (m32.empty() || m64.empty()) return;  // reported above

  const std::vector<float> d32 = decode_values(q32, m32, 100);
  bool ok32 = true;
  for (std::size_t i = 0; i < 100; ++i) {
    const float s = oracle_scale(x, i / 32 * 32, std::min<std::size_t>(100, i / 32 * 32 + 32));
    ok32 = ok32 && d32[i] == (s == 0.0f ? 0.0f : (std::signbit(x[i]) ? -s : s)) && !(s == 0.0f && std::signbit(d32[i]));
  }
  CHECK(ok32);
  const std::vector<double> d64 = decode_values(q64, m64, 50);
  bool ok64 = true;
  for (std::size_t i = 0; i < 50; ++i) {
    const double s = oracle_scale(y, i / 16 * 16, std::min<std::size_t>(50, i / 16 * 16 + 16));
    ok64 = ok64 && d64[i] == (s == 0.0 ? 0.0 : (std::signbit(y[i]) ? -s : s)) && !(s == 0.0 && std::signbit(d64[i]));
  }
  CHECK(ok64);
  // Elements 32..47 form block 2 of the double file: all zero, so exact +0.
  bool zero_block = true;
  for (std::size_t i = 32; i < 48; ++i) zero_block = zero_block && d64[i] == 0.0 && !std::signbit(d64[i]);
  CHECK(zero_block);
}

TEST_CASE_TEMPLATE("every cpu_executor setting writes the reference's sign bytes and decodes them alike", T, float,
                   double) {
  for (const std::uint32_t block : {1u, 7u, 32u, 256u}) {
    CAPTURE(block);
    check_inputs_same_as_reference(sign_quantizer<T>({.block = block}));
  }
}

TEST_CASE_TEMPLATE("sign rejects NaN and Inf on every executor alike", T, float, double) {
  check_non_finite_same_as_reference(sign_quantizer<T>({.block = 64}));
}
