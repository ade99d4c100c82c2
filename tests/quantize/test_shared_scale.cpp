// Shared-scale (homomorphic) uniform quantization: the sum of P ranks' messages, formed as a
// transport would (a uint64 SUM of the summable bytes) or with accumulate_encoded, decodes to
// exactly Σ_r q_r·s computed by an independent oracle; headroom holds 2^k contributions without a
// carry and refuses more; mismatched scales, keys, parameters and sizes, bad maxima, NaN/Inf and
// corrupted payloads get named errors and leave the output untouched; stochastic rounding is
// unbiased and draws independent numbers on each rank.
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/quantize/shared_scale.hpp>
#include <gradcomp/quantize/uniform.hpp>

#include <doctest/doctest.h>

#include <algorithm>
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
#include "support/oracles.hpp"
#include "support/reference_check.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

static_assert(shared_scale_quantizer<float>::id == codec_id::uniform_shared &&
              static_cast<int>(codec_id::uniform_shared) == 19);
static_assert(homomorphic<shared_scale_quantizer<float>, cpu_executor>);
static_assert(homomorphic<shared_scale_quantizer<double>, cpu_executor>);
static_assert(!sparsifier<shared_scale_quantizer<float>>);

namespace {

// ---- the oracle: the documented arithmetic, written with std::nearbyint, std::floor and
// documented_step (std::nextafter), with the agreed maximum of the block

// u of element i on rank r: the 16-bit half i mod 2 (low half first) of word ⌊i/2⌋ of the stream
// whose seed is seed XOR r·0x9E3779B97F4A7C15, divided by 2^16.
template <class T>
T oracle_uniform(std::uint64_t seed, std::uint64_t rank, message_key key, std::uint64_t i) {
  const random_stream stream{seed ^ (rank * 0x9E3779B97F4A7C15ull), key.step, key.tensor_id,
                             random_purpose::stochastic_rounding};
  return static_cast<T>((stream.word(i / 2) >> (16 * (i % 2))) & 0xffffu) / static_cast<T>(65536.0);
}

template <class T>
int oracle_level(T h, T agreed_max, int bits, rounding mode, T u) {
  const int L = levels_of(bits);
  const T s = documented_step(agreed_max, bits);
  T t = 0;
  if (s != T{0}) {
    const T inv = static_cast<T>(L) / agreed_max;
    t = std::isfinite(inv) ? h * inv : h / s;
  }
  if (bits == 1) {
    if (mode == rounding::nearest_even) return t < T{0} ? -1 : 1;
    return u < (t + T{1}) / T{2} ? 1 : -1;
  }
  const T y = mode == rounding::nearest_even ? std::nearbyint(t) : std::floor(t + u);
  return std::clamp(static_cast<int>(y), -L, L);
}

// Σ_r q_r·s per element: the exact integer level sum, converted to T and multiplied by s.
template <class T>
std::vector<T> oracle_sum(const std::vector<std::vector<T>>& x, int bits, std::size_t block, rounding mode,
                          std::uint64_t seed, message_key key) {
  const std::size_t n = x.front().size();
  std::vector<T> agreed((n + block - 1) / block, T{0});
  for (const std::vector<T>& g : x)
    for (std::size_t i = 0; i < n; ++i) agreed[i / block] = std::max(agreed[i / block], std::fabs(g[i]));
  std::vector<std::int64_t> levels(n, 0);
  for (std::size_t r = 0; r < x.size(); ++r)
    for (std::size_t i = 0; i < n; ++i) {
      const T u = mode == rounding::stochastic ? oracle_uniform<T>(seed, r, key, i) : T{0};
      levels[i] += oracle_level(x[r][i], agreed[i / block], bits, mode, u);
    }
  std::vector<T> sum(n);
  for (std::size_t i = 0; i < n; ++i) sum[i] = static_cast<T>(levels[i]) * documented_step(agreed[i / block], bits);
  return sum;
}

// ---- a transport: the uint64 SUM of the summable byte ranges

template <class T>
std::vector<std::byte> transport_sum(const shared_scale_quantizer<T>& q,
                                     const std::vector<std::vector<std::byte>>& messages, std::size_t n) {
  std::vector<std::byte> sum = messages.front();
  const std::size_t first = q.summable_offset(n);
  REQUIRE(first + q.summable_bytes(n) == sum.size());
  for (std::size_t r = 1; r < messages.size(); ++r) {
    for (std::size_t at = first; at < sum.size(); at += 8) {
      std::uint64_t a, b;
      std::memcpy(&a, sum.data() + at, 8);
      std::memcpy(&b, messages[r].data() + at, 8);
      a += b;
      std::memcpy(sum.data() + at, &a, 8);
    }
  }
  return sum;
}

template <class T>
std::vector<std::byte> accumulated(const shared_scale_quantizer<T>& q,
                                   const std::vector<std::vector<std::byte>>& messages) {
  std::vector<std::byte> acc = messages.front();
  for (std::size_t r = 1; r < messages.size(); ++r) q.accumulate_encoded(cpu_executor{}, acc, messages[r]);
  return acc;
}

std::uint64_t contributions_of(const std::vector<std::byte>& m, std::size_t offset) {
  std::uint64_t p;
  std::memcpy(&p, m.data() + offset, 8);
  return p;
}

// Rank r holds an input of `kind`, scaled by (1 + r) for normal inputs so that the ranks' maxima differ.
template <class T>
std::vector<std::vector<T>> rank_inputs(input_kind kind, std::size_t ranks, std::size_t n, std::uint64_t seed) {
  std::vector<std::vector<T>> x;
  for (std::size_t r = 0; r < ranks; ++r) {
    std::vector<T> g = make_input<T>(kind, n, seed + 97 * r);
    if (kind == input_kind::normal)
      for (T& v : g) v *= static_cast<T>(1 + r);
    x.push_back(std::move(g));
  }
  return x;
}

template <class T>
void check_sum_of_ranks(const shared_scale_params& params, const std::vector<std::vector<T>>& x, message_key key) {
  const shared_scale_quantizer<T> q(params);
  const std::size_t n = x.front().size();
  const std::vector<T> expected = oracle_sum(x, params.bits, params.block, params.round, params.seed, key);
  const std::vector<std::vector<std::byte>> messages = encode_shared_ranks(q, x, key);
  for (const std::vector<std::byte>& m : messages) REQUIRE(m.size() == q.max_encoded_bytes(n));

  const std::vector<std::byte> summed = transport_sum(q, messages, n);
  CHECK(contributions_of(summed, q.summable_offset(n)) == x.size());
  const std::vector<T> decoded = decode_values(q, summed, n);
  CHECK(bitwise_equal(decoded, expected));
  CHECK(accumulated(q, messages) == summed);

  // The homomorphism: the decoded sum is the sum of the individual decodings, up to the rounding
  // of each q_r·s and of Σq·s (one unit roundoff of each term).
  std::vector<double> separately(n, 0.0), magnitude(n, 0.0);
  for (const std::vector<std::byte>& m : messages) {
    const std::vector<T> d = decode_values(q, m, n);
    for (std::size_t i = 0; i < n; ++i) {
      separately[i] += static_cast<double>(d[i]);
      magnitude[i] += std::fabs(static_cast<double>(d[i]));
    }
  }
  bool homomorphic_sum = true;
  for (std::size_t i = 0; i < n; ++i) {
    const double bound =
        std::numeric_limits<T>::epsilon() * (magnitude[i] + std::fabs(static_cast<double>(decoded[i])));
    homomorphic_sum = homomorphic_sum && std::fabs(separately[i] - static_cast<double>(decoded[i])) <= bound;
  }
  CHECK(homomorphic_sum);
}

template <class T>
std::string decode_error(const shared_scale_quantizer<T>& q, const std::vector<std::byte>& m, std::size_t n,
                         decode_limits limits = {}) {
  std::vector<T> out(n, T{7});
  const std::string e = thrown_by([&] { q.decode(cpu_executor{}, m, std::span<T>(out), {}, limits); });
  CHECK(decode_status_everywhere(q, m, n, limits) == e);
  bool untouched = true;
  for (const T v : out) untouched = untouched && v == T{7};
  CHECK(untouched);
  return e;
}

}  // namespace

TEST_CASE_TEMPLATE("shared-scale sums of 1 to 2^k ranks decode to the oracle's sum of q times s", T, float, double) {
  for (const int headroom : {0, 3, 4}) {
    for (const int bits : {1, 2, 4, 8}) {
      for (const std::uint32_t block : {1u, 7u, 256u}) {
        for (const rounding mode : {rounding::nearest_even, rounding::stochastic}) {
          for (const std::size_t ranks :
               {std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{8}, std::size_t{16}}) {
            if (ranks > (std::size_t{1} << headroom)) continue;
            for (const std::size_t n :
                 {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{300}, std::size_t{1001}}) {
              for (const input_kind kind : all_input_kinds) {
                if (n > 300 && kind != input_kind::normal) continue;
                CAPTURE(headroom);
                CAPTURE(bits);
                CAPTURE(block);
                const int mode_id = static_cast<int>(mode);
                CAPTURE(mode_id);
                CAPTURE(ranks);
                CAPTURE(n);
                CAPTURE(std::string(name(kind)));
                check_sum_of_ranks<T>(
                    {.bits = bits, .block = block, .round = mode, .seed = 21, .headroom_bits = headroom},
                    rank_inputs<T>(kind, ranks, n, 5 + n), {.step = 3, .tensor_id = 4});
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE_TEMPLATE("shared-scale message sizes and the summable range follow the documented layout", T, float, double) {
  for (const int bits : {1, 2, 4, 8}) {
    for (const int headroom : {0, 3, 24}) {
      for (const std::uint32_t block : {1u, 3u, 256u}) {
        for (const std::uint64_t n : {0ull, 1ull, 5ull, 1000ull, 4097ull}) {
          const shared_scale_quantizer<T> q({.bits = bits, .block = block, .headroom_bits = headroom});
          const std::uint64_t w = static_cast<std::uint64_t>(bits + headroom), per_word = 64 / w;
          const std::uint64_t scale_bytes = (n + block - 1) / block * sizeof(T);
          const std::uint64_t offset = 56 + (scale_bytes + 7) / 8 * 8;
          const std::uint64_t words = (n + per_word - 1) / per_word;
          CAPTURE(bits);
          CAPTURE(headroom);
          CAPTURE(block);
          CAPTURE(n);
          CHECK(q.fields_per_word() == per_word);
          CHECK(q.max_contributions() == (std::uint64_t{1} << headroom));
          CHECK(q.summable_offset(n) == offset);
          CHECK(q.summable_bytes(n) == 8 * (1 + words));
          CHECK(q.max_encoded_bytes(n) == offset + 8 * (1 + words));
        }
      }
    }
  }
  // n = 1000 at the defaults (8 bits, 3 headroom bits, B = 256), float: 4 scales (16 bytes), then
  // 201 words (the count and 200 words of five 11-bit fields): 56 + 16 + 1608 bytes.
  CHECK(shared_scale_quantizer<float>().max_encoded_bytes(1000) == 1680);
  CHECK(shared_scale_quantizer<float>().max_encoded_bytes(0) == 64);
  CHECK(encode_bytes(shared_scale_quantizer<float>(), std::vector<float>{}).size() == 64);
}

TEST_CASE_TEMPLATE("shared-scale headroom holds 2^k largest codes without a carry and refuses one more", T, float,
                   double) {
  for (const int bits : {1, 2, 4, 8}) {
    CAPTURE(bits);
    const shared_scale_quantizer<T> q({.bits = bits, .block = 16, .headroom_bits = 2});
    const std::size_t n = 100;
    std::vector<T> x(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = i % 2 == 0 ? T{1} : T{-1};  // largest code next to code 0
    const std::vector<std::vector<T>> four(4, x);
    const std::vector<std::vector<std::byte>> messages = encode_shared_ranks(q, four);
    const std::vector<std::byte> summed = transport_sum(q, messages, n);
    const std::vector<T> decoded = decode_values(q, summed, n);
    const T s = documented_step(T{1}, bits);
    const auto top = static_cast<T>(4 * levels_of(bits));
    bool exact = true;
    for (std::size_t i = 0; i < n; ++i) exact = exact && decoded[i] == (i % 2 == 0 ? top * s : -top * s);
    CHECK(exact);
    CHECK(accumulated(q, messages) == summed);

    // A fifth contribution: accumulate_encoded refuses it and leaves acc as it was; a transport
    // that summed it anyway gives a message every decoder rejects.
    std::vector<std::byte> acc = summed;
    CHECK(thrown_by([&] { q.accumulate_encoded(cpu_executor{}, acc, messages[0]); }) == named(errc::invalid_argument));
    CHECK(acc == summed);
    std::vector<std::vector<std::byte>> five = messages;
    five.push_back(messages[0]);
    CHECK(decode_error(q, transport_sum(q, five, n), n) == named(errc::malformed_payload));
  }
  // Headroom 0: one contribution only.
  const shared_scale_quantizer<float> single({.bits = 4, .headroom_bits = 0});
  std::vector<std::byte> m = encode_bytes(single, make_input<float>(input_kind::normal, 50, 1));
  const std::vector<std::byte> before = m;
  CHECK(thrown_by([&] { single.accumulate_encoded(cpu_executor{}, m, before); }) == named(errc::invalid_argument));
  CHECK(m == before);
}

TEST_CASE(
    "shared-scale accumulate_encoded rejects mismatched scales, keys, parameters and sizes, leaving acc unchanged") {
  const shared_scale_quantizer<float> q({.bits = 4, .block = 32});
  const std::vector<float> a = make_input<float>(input_kind::normal, 100, 1);
  std::vector<float> b = a;
  for (float& v : b) v *= 3.0f;
  const cpu_executor cpu;
  const auto rejects = [&](std::vector<std::byte> acc, const std::vector<std::byte>& other, errc expected) {
    const std::vector<std::byte> before = acc;
    CHECK(thrown_by([&] { q.accumulate_encoded(cpu, acc, other); }) == named(expected));
    CHECK(acc == before);
  };
  const std::vector<std::byte> mine = encode_bytes(q, a, {.step = 2});
  rejects(mine, encode_bytes(q, b, {.step = 2}), errc::parameter_mismatch);  // local maxima: other scales
  rejects(mine, encode_bytes(q, a, {.step = 3}), errc::step_mismatch);
  rejects(mine, encode_bytes(q, a, {.step = 2, .tensor_id = 1}), errc::step_mismatch);
  rejects(mine,
          encode_bytes(shared_scale_quantizer<float>({.bits = 4, .block = 32, .headroom_bits = 4}), a, {.step = 2}),
          errc::parameter_mismatch);
  rejects(mine, encode_bytes(q, std::vector<float>(a.begin(), a.begin() + 99), {.step = 2}), errc::size_mismatch);
  rejects(mine,
          encode_bytes(shared_scale_quantizer<double>({.bits = 4, .block = 32}),
                       std::vector<double>(a.begin(), a.end()), {.step = 2}),
          errc::dtype_mismatch);
  rejects(mine, encode_bytes(uniform_quantizer<float>({.bits = 4, .block = 32}), a, {.step = 2}), errc::codec_mismatch);
  std::vector<std::byte> bad = mine;
  bad[bad.size() - 1] = std::byte{0xff};  // unused high bits of the last field word
  rejects(mine, reseal(bad), errc::malformed_payload);
  rejects(reseal(bad), mine, errc::malformed_payload);
  // The same message twice is a valid sum of two.
  std::vector<std::byte> twice = mine;
  q.accumulate_encoded(cpu, twice, mine);
  CHECK(contributions_of(twice, q.summable_offset(100)) == 2);
}

TEST_CASE_TEMPLATE("shared-scale encode_shared validates the agreed maxima before writing", T, float, double) {
  const shared_scale_quantizer<T> q({.bits = 8, .block = 16, .headroom_bits = 3});
  const std::vector<T> x = make_input<T>(input_kind::normal, 40, 3);  // 3 blocks
  const cpu_executor cpu;
  std::vector<T> local(3);
  q.block_maxima(cpu, std::span<const T>(x), std::span<T>(local));
  const auto fails = [&](std::vector<T> agreed, errc expected) {
    std::vector<std::byte> out(q.max_encoded_bytes(x.size()), std::byte{0x5a});
    CHECK(thrown_by([&] { q.encode_shared(cpu, std::span<const T>(x), std::span<const T>(agreed), out, {}); }) ==
          named(expected));
    CHECK(std::all_of(out.begin(), out.end(), [](std::byte b) { return b == std::byte{0x5a}; }));
  };
  std::vector<T> below = local;
  below[1] = std::nextafter(local[1], T{0});
  fails(below, errc::parameter_mismatch);
  fails(std::vector<T>(local.begin(), local.end() - 1), errc::size_mismatch);
  std::vector<T> negative = local;
  negative[2] = -negative[2];
  fails(negative, errc::invalid_argument);
  std::vector<T> nan = local;
  nan[0] = std::numeric_limits<T>::quiet_NaN();
  fails(nan, errc::non_finite_input);
  std::vector<T> inf = local;
  inf[0] = std::numeric_limits<T>::infinity();
  fails(inf, errc::non_finite_input);
  std::vector<T> huge = local;
  huge[0] = std::numeric_limits<T>::max();  // 8·127·s overflows
  fails(huge, errc::non_finite_input);

  std::vector<std::byte> small(q.max_encoded_bytes(x.size()) - 1);
  CHECK(thrown_by([&] { q.encode_shared(cpu, std::span<const T>(x), std::span<const T>(local), small, {}); }) ==
        named(errc::buffer_too_small));
  std::vector<std::byte> out(q.max_encoded_bytes(x.size()));
  REQUIRE(q.workspace_bytes(cpu, x.size()) > 0);
  CHECK(thrown_by([&] { q.encode(cpu, std::span<const T>(x), out, {}); }) == named(errc::workspace_too_small));
  std::vector<T> wrong(2);
  CHECK(thrown_by([&] { q.block_maxima(cpu, std::span<const T>(x), std::span<T>(wrong)); }) ==
        named(errc::size_mismatch));

  // Larger agreed maxima than this rank's own are what other ranks bring: accepted.
  std::vector<T> larger = local;
  for (T& m : larger) m *= T{4};
  CHECK(q.encode_shared(cpu, std::span<const T>(x), std::span<const T>(larger), out, {}) == out.size());
  // Without headroom, blocks of the largest finite values still encode (as in the uniform quantizer).
  const shared_scale_quantizer<T> flat({.bits = 8, .block = 16, .headroom_bits = 0});
  const std::vector<T> extreme(20, -std::numeric_limits<T>::max());
  const std::vector<T> d = decode_values(flat, encode_bytes(flat, extreme), extreme.size());
  CHECK(std::all_of(d.begin(), d.end(), [](T v) { return std::isfinite(v) && v < T{0}; }));
}

TEST_CASE_TEMPLATE("shared-scale rejects NaN and Inf gradients before writing", T, float, double) {
  const shared_scale_quantizer<T> q({.bits = 4, .block = 32});
  const cpu_executor cpu;
  for (const T special :
       {std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity()}) {
    std::vector<T> x = make_input<T>(input_kind::normal, 100, 2);
    x[70] = special;
    std::vector<T> maxima(4, T{1});
    CHECK(thrown_by([&] { q.block_maxima(cpu, std::span<const T>(x), std::span<T>(maxima)); }) ==
          named(errc::non_finite_input));
    // Every maximum is +Inf: a rank that still joins the MAX all-reduce makes every rank's
    // encode_shared fail rather than encode with a wrong scale.
    CHECK(std::all_of(maxima.begin(), maxima.end(), [](T m) { return m == std::numeric_limits<T>::infinity(); }));
    const std::vector<std::byte> earlier = encode_bytes(q, make_input<T>(input_kind::normal, 100, 3));
    std::vector<std::byte> out = earlier, ws(q.workspace_bytes(cpu, x.size()));
    CHECK(thrown_by([&] { q.encode(cpu, std::span<const T>(x), out, ws); }) == named(errc::non_finite_input));
    CHECK(thrown_by([&] { q.encode_shared(cpu, std::span<const T>(x), std::span<const T>(maxima), out, ws); }) ==
          named(errc::non_finite_input));
    const std::vector<T> finite(4, T{1});
    CHECK(thrown_by([&] { q.encode_shared(cpu, std::span<const T>(x), std::span<const T>(finite), out, ws); }) ==
          named(errc::non_finite_input));
    CHECK(out == earlier);
  }
}

TEST_CASE("shared-scale decoders reject corrupted payloads and leave the output untouched") {
  const shared_scale_quantizer<float> q({.bits = 8, .block = 32, .headroom_bits = 3});  // 11-bit fields, 5 per word
  const std::size_t n = 99;                                                             // 4 scales, 20 words
  const std::vector<std::vector<float>> x = rank_inputs<float>(input_kind::normal, 2, n, 8);
  const std::vector<std::byte> good = accumulated(q, encode_shared_ranks(q, x));
  const std::size_t offset = q.summable_offset(n);
  REQUIRE(offset == 56 + 16);
  REQUIRE(decode_values(q, good, n).size() == n);
  const auto with = [&](auto edit) {
    std::vector<std::byte> m = good;
    edit(m);
    return reseal(m);
  };
  const auto set_u64 = [](std::vector<std::byte>& m, std::size_t at, std::uint64_t v) {
    std::memcpy(m.data() + at, &v, 8);
  };
  const auto get_u64 = [](const std::vector<std::byte>& m, std::size_t at) {
    std::uint64_t v;
    std::memcpy(&v, m.data() + at, 8);
    return v;
  };
  CHECK(decode_error(q, with([&](auto& m) { set_u64(m, offset, 0); }), n) == named(errc::malformed_payload));
  CHECK(decode_error(q, with([&](auto& m) { set_u64(m, offset, 9); }), n) == named(errc::malformed_payload));
  // Field 0 of word 0 set to 2·254 + 1, one above what two contributions can hold.
  CHECK(decode_error(q, with([&](auto& m) { set_u64(m, offset + 8, (get_u64(m, offset + 8) & ~0x7ffull) | 509); }),
                     n) == named(errc::malformed_payload));
  CHECK(decode_error(q, with([&](auto& m) { set_u64(m, offset + 8, get_u64(m, offset + 8) | (1ull << 63)); }), n) ==
        named(errc::malformed_payload));
  // The last word holds 4 of its 5 fields: bits 44..54 must be zero.
  CHECK(decode_error(q, with([&](auto& m) { set_u64(m, m.size() - 8, get_u64(m, m.size() - 8) | (1ull << 44)); }), n) ==
        named(errc::malformed_payload));
  CHECK(decode_error(q, with([&](auto& m) { m[56 + 3] |= std::byte{0x80}; }), n) == named(errc::malformed_payload));
  const float too_large = std::numeric_limits<float>::max() / 500.0f;  // 127·s is finite, 8·127·s is not
  CHECK(decode_error(q, with([&](auto& m) { std::memcpy(m.data() + 56, &too_large, 4); }), n) ==
        named(errc::malformed_payload));
  const shared_scale_quantizer<float> odd({.bits = 8, .block = 32});  // 3 scales: 4 padding bytes
  const std::vector<std::byte> padded = encode_bytes(odd, make_input<float>(input_kind::normal, 70, 4));
  std::vector<std::byte> stray = padded;
  stray[56 + 12] = std::byte{1};
  CHECK(decode_error(odd, reseal(stray), 70) == named(errc::malformed_payload));
  envelope other_layout = parse_envelope(good);
  other_layout.layout = 1;
  std::vector<std::byte> layout = good;
  write_envelope(other_layout, layout);
  CHECK(decode_error(q, layout, n) == named(errc::malformed_payload));
  CHECK(decode_error(q, good, n, {.require_checksum = true}) == named(errc::payload_checksum));
  CHECK(decode_error(q, good, n + 1) == named(errc::size_mismatch));
  CHECK(decode_error(q, std::vector<std::byte>(good.begin(), good.end() - 8), n) == named(errc::truncated));
}

TEST_CASE("shared-scale parameters and the checksum policy are validated") {
  CHECK(thrown_by([] { shared_scale_quantizer<float> bad({.bits = 3}); }) == named(errc::invalid_argument));
  CHECK(thrown_by([] { shared_scale_quantizer<float> bad({.block = 0}); }) == named(errc::invalid_argument));
  CHECK(thrown_by([] { shared_scale_quantizer<float> bad({.headroom_bits = -1}); }) == named(errc::invalid_argument));
  CHECK(thrown_by([] { shared_scale_quantizer<float> bad({.headroom_bits = 25}); }) == named(errc::invalid_argument));
  CHECK(thrown_by([] { shared_scale_quantizer<float> bad({}, wire_options{.payload_checksum = true}); }) ==
        named(errc::invalid_argument));
  const shared_scale_quantizer<float> widest({.bits = 8, .headroom_bits = 24});  // 32-bit fields
  CHECK(widest.fields_per_word() == 2);
  const std::vector<float> x = make_input<float>(input_kind::normal, 33, 6);
  CHECK(bitwise_equal(decode_values(widest, encode_bytes(widest, x), x.size()),
                      oracle_sum<float>({x}, 8, 256, rounding::nearest_even, 0, {})));
  CHECK(shared_scale_quantizer<float>().params_hash() !=
        shared_scale_quantizer<float>({.headroom_bits = 4}).params_hash());
  CHECK(shared_scale_quantizer<float>().params_hash() != shared_scale_quantizer<double>().params_hash());
  CHECK(shared_scale_quantizer<float>().params_hash() != uniform_quantizer<float>().params_hash());
}

TEST_CASE_TEMPLATE("shared-scale stochastic rounding of a sum over ranks is unbiased within its variance bound", T,
                   float, double) {
  for (const int bits : {1, 2, 4, 8}) {
    const std::size_t n = 64, ranks = 3;
    const int draws = 4000;
    std::vector<std::vector<T>> x(ranks, std::vector<T>(n));
    for (std::size_t r = 0; r < ranks; ++r)
      for (std::size_t i = 0; i < n; ++i)
        x[r][i] = static_cast<T>(std::sin(1.7 * static_cast<double>(i) + static_cast<double>(r)));
    const shared_scale_quantizer<T> q(
        {.bits = bits, .block = 32, .round = rounding::stochastic, .seed = 5, .headroom_bits = 2});
    std::vector<double> sum(n, 0.0);
    for (int d = 0; d < draws; ++d) {
      const std::vector<T> decoded =
          decode_values(q, accumulated(q, encode_shared_ranks(q, x, {.step = static_cast<std::uint64_t>(d)})), n);
      for (std::size_t i = 0; i < n; ++i) sum[i] += static_cast<double>(decoded[i]);
    }
    for (std::size_t block = 0; block < 2; ++block) {
      double agreed = 0;
      for (std::size_t r = 0; r < ranks; ++r)
        for (std::size_t i = 32 * block; i < 32 * (block + 1); ++i)
          agreed = std::max(agreed, std::fabs(static_cast<double>(x[r][i])));
      // Each rank's draw lies within a step of width w around its value (w = s, or 2s between the
      // 1-bit levels ±s), so its variance is at most w²/4; the ranks draw independently, so the
      // sum's variance is at most P·w²/4 and the mean of `draws` sums has standard error
      // ≤ √P·w/(2√draws).
      const double w = (bits == 1 ? 2.0 : 1.0) * agreed / levels_of(bits);
      for (std::size_t i = 32 * block; i < 32 * (block + 1); ++i) {
        double truth = 0;
        for (std::size_t r = 0; r < ranks; ++r) truth += static_cast<double>(x[r][i]);
        CAPTURE(bits);
        CAPTURE(i);
        const double bias = std::fabs(sum[i] / draws - truth);
        CHECK(bias <= 5.0 * std::sqrt(static_cast<double>(ranks)) * w / (2.0 * std::sqrt(static_cast<double>(draws))) +
                          1e-6 * agreed * ranks);
      }
    }
  }
}

TEST_CASE("shared-scale rank 0 rounds as the uniform quantizer does, and other ranks draw other numbers") {
  const std::vector<float> x = make_input<float>(input_kind::normal, 1000, 12);
  for (const int bits : {1, 2, 4, 8}) {
    for (const rounding mode : {rounding::nearest_even, rounding::stochastic}) {
      const int mode_id = static_cast<int>(mode);
      CAPTURE(bits);
      CAPTURE(mode_id);
      const shared_scale_quantizer<float> q({.bits = bits, .block = 64, .round = mode, .seed = 77});
      const uniform_quantizer<float> u({.bits = bits, .block = 64, .round = mode, .seed = 77});
      const message_key key{.step = 9, .tensor_id = 2};
      CHECK(bitwise_equal(decode_values(q, encode_bytes(q, x, key), x.size()),
                          decode_values(u, encode_bytes(u, x, key), x.size())));
    }
  }
  // Every value halfway between two levels: t = 0.5 exactly. Shared noise would round every rank
  // the same way; independent noise agrees on about half of the values.
  const shared_scale_quantizer<float> q({.bits = 4, .block = 4096, .round = rounding::stochastic, .seed = 77});
  std::vector<float> half(4096, 0.5f);
  half[0] = 7.0f;  // the block maximum: s = 1, t = x
  const std::vector<std::vector<std::byte>> two = encode_shared_ranks(q, std::vector<std::vector<float>>(2, half));
  const std::vector<float> r0 = decode_values(q, two[0], half.size()), r1 = decode_values(q, two[1], half.size());
  std::size_t same = 0;
  for (std::size_t i = 1; i < half.size(); ++i) same += r0[i] == r1[i] ? 1u : 0u;
  CHECK(same > 4095 * 45 / 100);
  CHECK(same < 4095 * 55 / 100);
  CHECK(two[0] != two[1]);
}

TEST_CASE("shared-scale decode_accumulate adds exactly the decoded values") {
  const shared_scale_quantizer<double> q({.bits = 2, .block = 64, .round = rounding::stochastic, .seed = 1});
  const std::vector<std::byte> m =
      accumulated(q, encode_shared_ranks(q, rank_inputs<double>(input_kind::normal, 3, 777, 9)));
  const std::vector<double> decoded = decode_values(q, m, 777);
  std::vector<double> acc(777, 0.25);
  q.decode_accumulate(cpu_executor{}, m, std::span<double>(acc), {});
  bool sums = true;
  for (std::size_t i = 0; i < acc.size(); ++i) sums = sums && acc[i] == 0.25 + decoded[i];
  CHECK(sums);
}

TEST_CASE_TEMPLATE("every cpu_executor setting writes the reference's shared-scale bytes and decodes them alike", T,
                   float, double) {
  for (const int bits : {1, 2, 4, 8}) {
    for (const rounding round : {rounding::nearest_even, rounding::stochastic}) {
      for (const std::uint32_t block : {1u, 32u, 100u}) {
        const shared_scale_quantizer<T> q(
            {.bits = bits, .block = block, .round = round, .seed = 3, .headroom_bits = 3});
        CAPTURE(bits);
        CAPTURE(static_cast<int>(round));
        CAPTURE(block);
        // The single-stage encode (this rank's maxima, rank 0) on every input kind and edge size.
        check_inputs_same_as_reference(q);
        // encode_shared with agreed maxima above this rank's own, as rank 2.
        check_encode_shared_same_as_reference(q, make_input<T>(input_kind::normal, 1001, 14));
      }
    }
  }
}

TEST_CASE_TEMPLATE("shared-scale rejects NaN and Inf on every executor alike", T, float, double) {
  check_non_finite_same_as_reference(shared_scale_quantizer<T>({.bits = 4, .block = 64}));
}
