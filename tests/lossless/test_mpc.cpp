// MPC lossless float32 codec: the payload equals, byte for byte, a literal transcription of the
// reference's four steps (per-bit transpose loop included: support/mpc_oracle.hpp); every bit
// pattern round-trips (NaN payloads, −0, subnormals, ±Inf); sizes stay within the worst case,
// which adversarial data reaches; smooth data compresses; bad messages get named errors with
// the output untouched; the golden file pins the bytes.
#include <gradcomp/lossless/mpc.hpp>

#include <doctest/doctest.h>

#include <algorithm>
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
#include "support/mpc_oracle.hpp"
#include "support/reference_check.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

static_assert(codec_for<mpc_codec<float>, cpu_executor>);
static_assert(mpc_codec<float>::id == codec_id::mpc && static_cast<int>(codec_id::mpc) == 48);
static_assert(std::is_same_v<mpc_codec<float>::value_type, float>);

namespace {


std::vector<float> from_words(const std::vector<std::uint32_t>& words) {
  std::vector<float> x(words.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::bit_cast<float>(words[i]);
  return x;
}

std::vector<float> random_bits(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::vector<std::uint32_t> words(n);
  for (std::uint32_t& w : words) w = static_cast<std::uint32_t>(engine());
  return from_words(words);
}

// Every special pattern, repeated through the tensor among random bits.
std::vector<float> special_values(std::size_t n, std::uint64_t seed) {
  const std::uint32_t specials[] = {0x7f800001u /* signalling NaN, payload 1 */,
                                    0x7fc00001u /* quiet NaN, payload 1 */,
                                    0xffc12345u /* negative quiet NaN */,
                                    0x7fbfffffu /* signalling NaN, full payload */,
                                    0x80000000u /* −0 */,
                                    0x00000001u /* smallest subnormal */,
                                    0x807fffffu /* largest negative subnormal */,
                                    0x7f800000u /* +Inf */,
                                    0xff800000u /* −Inf */,
                                    0x00000000u};
  std::vector<float> x = random_bits(n, seed);
  for (std::size_t i = 0; i < n; i += 3) x[i] = std::bit_cast<float>(specials[(i / 3) % std::size(specials)]);
  return x;
}

// sin sampled finely: neighbouring values share sign, exponent and leading mantissa bits.
std::vector<float> smooth(std::size_t n) {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(std::sin(1e-4 * static_cast<double>(i)));
  return x;
}

std::vector<std::byte> encode_on(const mpc_codec<float>& q, const cpu_executor& cpu, const std::vector<float>& x) {
  std::vector<std::byte> out(q.max_encoded_bytes(x.size()));
  out.resize(q.encode(cpu, std::span<const float>(x), out, {}, {.step = 3}));
  return out;
}

std::uint32_t word_at(const std::vector<std::byte>& payload, std::size_t i) {
  std::uint32_t w;
  std::memcpy(&w, payload.data() + 4 * i, 4);
  return w;
}

void set_word(std::vector<std::byte>& payload, std::size_t i, std::uint32_t w) {
  std::memcpy(payload.data() + 4 * i, &w, 4);
}

const std::size_t mpc_sizes[] = {0, 1, 31, 32, 33, 1023, 1024, 1025, 3000};
const std::uint32_t dims[] = {1, 2, 3, 4, 7, 32};

}  // namespace

TEST_CASE("mpc payloads equal the reference transform byte for byte on every kernel") {
  const cpu_executor fast;
  const cpu_executor baseline{.max_simd = cpu_simd::baseline};
  for (const std::uint32_t dim : dims) {
    const mpc_codec<float> q({.dim = dim});
    for (const std::size_t n : mpc_sizes) {
      for (int kind = 0; kind < 3; ++kind) {
        CAPTURE(dim);
        CAPTURE(n);
        CAPTURE(kind);
        const std::vector<float> x = kind == 0   ? smooth(n)
                                     : kind == 1 ? make_input<float>(input_kind::normal, n, n + 1)
                                                 : random_bits(n, n + 2);
        const std::vector<std::byte> m = encode_on(q, fast, x);
        REQUIRE(m.size() >= envelope_bytes);
        const std::vector<std::byte> payload(m.begin() + envelope_bytes, m.end());
        CHECK(payload == mpc_oracle_payload(x, dim));
        CHECK(encode_on(q, baseline, x) == m);
        const envelope e = parse_envelope(m);
        CHECK(e.codec == codec_id::mpc);
        CHECK(e.dtype == value_dtype::float32);
        CHECK(e.layout == 0);
        CHECK(e.elements == n);
        CHECK(e.payload_bytes == payload.size());
        CHECK(e.key == message_key{.step = 3});
      }
    }
  }
}

TEST_CASE("mpc round trips every bit pattern on both kernels, for every size and dimensionality") {
  const cpu_executor baseline{.max_simd = cpu_simd::baseline};
  for (const std::uint32_t dim : {1u, 2u, 3u, 4u, 32u}) {
    const mpc_codec<float> q({.dim = dim});
    for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{31}, std::size_t{32}, std::size_t{33},
                                std::size_t{1023}, std::size_t{1024}, std::size_t{1025}, (std::size_t{1} << 20) + 3}) {
      CAPTURE(dim);
      CAPTURE(n);
      std::vector<std::vector<float>> inputs = {random_bits(n, 7 * n + dim), special_values(n, n + dim)};
      if (n < 5000) {
        inputs.push_back(std::vector<float>(n, -0.25f));
        inputs.push_back(std::vector<float>(n, std::bit_cast<float>(0x7fa00badu)));  // all one signalling NaN
        for (const input_kind kind : all_input_kinds) inputs.push_back(make_input<float>(kind, n, n + 5));
      }
      for (const std::vector<float>& x : inputs) {
        const std::vector<std::byte> m = encode_bytes(q, x);
        CHECK(same_bits(decode_values(q, m, n), x));
        std::vector<float> out(n, 7.0f);
        q.decode(baseline, m, std::span<float>(out), {});
        CHECK(same_bits(out, x));
      }
    }
  }
}

TEST_CASE("mpc decodes with non-temporal stores into 32-byte aligned memory to the same bits") {
  // A plain decode of at least streaming_store_bytes (here 0) into aligned memory streams its
  // output; the words around the destination stay as they were.
  const cpu_executor streaming{.streaming_store_bytes = 0};
  for (const std::uint32_t dim : {1u, 3u, 32u}) {
    const mpc_codec<float> q({.dim = dim});
    for (const std::size_t n : {std::size_t{1}, std::size_t{1025}, std::size_t{5000}, std::size_t{70001}}) {
      CAPTURE(dim);
      CAPTURE(n);
      for (const std::vector<float>& x :
           {random_bits(n, 11 * n + dim), make_input<float>(input_kind::normal, n, n + dim)}) {
        const std::vector<std::byte> m = encode_bytes(q, x);
        std::vector<float> storage(n + 16, 7.0f);
        const std::size_t offset = (32 - reinterpret_cast<std::uintptr_t>(storage.data()) % 32) % 32 / sizeof(float);
        const std::span<float> out(storage.data() + offset, n);
        REQUIRE(reinterpret_cast<std::uintptr_t>(out.data()) % 32 == 0);
        q.decode(streaming, m, out, {});
        CHECK(same_bits(std::vector<float>(out.begin(), out.end()), x));
        CHECK(std::all_of(storage.begin(), storage.begin() + static_cast<std::ptrdiff_t>(offset),
                          [](float v) { return v == 7.0f; }));
        CHECK(std::all_of(storage.begin() + static_cast<std::ptrdiff_t>(offset + n), storage.end(),
                          [](float v) { return v == 7.0f; }));
      }
    }
  }
}

TEST_CASE("mpc messages stay within max_encoded_bytes and data without zero differences reaches it") {
  const mpc_codec<float> q;
  for (const std::size_t n : mpc_sizes) {
    CAPTURE(n);
    const std::size_t groups = (n + 31) / 32;
    CHECK(q.max_encoded_bytes(n) == envelope_bytes + 4 * (groups + 32 * groups));
    for (const std::vector<float>& x : {smooth(n), special_values(n, 3), random_bits(n, 4)})
      CHECK(encode_bytes(q, x).size() <= q.max_encoded_bytes(n));
  }
  // Random bits leave no zero difference (each is zero with probability 2^-32): n a multiple of 32.
  for (const std::size_t n : {std::size_t{32}, std::size_t{1024}, std::size_t{4096}})
    CHECK(encode_bytes(q, random_bits(n, n)).size() == q.max_encoded_bytes(n));
  // One value 0x55555555: transposed words alternate 1, 0, 1, …, so all 32 differences are ±1.
  CHECK(encode_bytes(q, from_words({0x55555555u})).size() == q.max_encoded_bytes(1));
  // The size arithmetic is 64-bit: n past 2^32, and saturation where size_t cannot hold it.
  const std::uint64_t big = (std::uint64_t{1} << 33) + 5;
  CHECK(mpc_codec<float>::group_count(big) == (std::uint64_t{1} << 28) + 1);
  CHECK(mpc_codec<float>::max_payload_bytes(big) == ((std::uint64_t{1} << 28) + 1) * 132);
  if constexpr (sizeof(std::size_t) == 8)
    CHECK(q.max_encoded_bytes(big) == envelope_bytes + ((std::size_t{1} << 28) + 1) * 132);
  CHECK(q.max_encoded_bytes(UINT64_MAX) == std::numeric_limits<std::size_t>::max());
}

TEST_CASE("mpc compresses smooth data and reports its ratio on normal gradients") {
  const std::size_t n = std::size_t{1} << 20;
  const mpc_codec<float> q;
  const double smooth_ratio = 4.0 * static_cast<double>(n) / static_cast<double>(encode_bytes(q, smooth(n)).size());
  const double normal_ratio = 4.0 * static_cast<double>(n) /
                              static_cast<double>(encode_bytes(q, make_input<float>(input_kind::normal, n, 1)).size());
  MESSAGE("MPC dim 1 compression ratio: smooth sin(1e-4 i) ", smooth_ratio, ", N(0, 1e-3) float32 ", normal_ratio);
  CHECK(smooth_ratio > 1.5);
  CHECK(normal_ratio > 1.0);
  // Interleaved fields compress better with the matching dimensionality.
  std::vector<float> xyz(3 * (n / 4));
  for (std::size_t i = 0; i < xyz.size(); ++i)
    xyz[i] = static_cast<float>(static_cast<double>(i % 3 + 1) * 100.0 + std::sin(1e-3 * static_cast<double>(i / 3)));
  CHECK(encode_bytes(mpc_codec<float>({.dim = 3}), xyz).size() < encode_bytes(q, xyz).size());
}

TEST_CASE("mpc decode_accumulate adds the decoded floats, NaN propagating as IEEE addition does") {
  const mpc_codec<float> q({.dim = 2}, wire_options{.payload_checksum = true});
  std::vector<float> x = make_input<float>(input_kind::normal, 2000, 4);
  x[17] = std::numeric_limits<float>::quiet_NaN();
  x[18] = std::numeric_limits<float>::infinity();
  const std::vector<std::byte> m = encode_bytes(q, x);
  std::vector<float> acc(x.size(), 0.5f);
  q.decode_accumulate(cpu_executor{}, m, std::span<float>(acc), {}, {.require_checksum = true});
  bool sums = true;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (i != 17 && i != 18) sums = sums && acc[i] == 0.5f + x[i];
  CHECK(sums);
  CHECK(std::isnan(acc[17]));
  CHECK(acc[18] == std::numeric_limits<float>::infinity());
}

TEST_CASE("mpc decoders reject short, long and inconsistent payloads and leave the output untouched") {
  const mpc_codec<float> q;
  const std::size_t n = 1000;  // 32 groups, the last holding 8 elements
  const std::vector<float> x = make_input<float>(input_kind::normal, n, 9);
  const std::vector<std::byte> good = encode_bytes(q, x);
  const std::vector<std::byte> payload(good.begin() + envelope_bytes, good.end());
  const auto rejects = [&](const std::vector<std::byte>& m, errc want) {
    std::vector<float> out(n, 7.0f);
    const std::string got = thrown_by([&] { q.decode(cpu_executor{}, m, std::span<float>(out), {}); });
    bool untouched = true;
    for (const float v : out) untouched = untouched && v == 7.0f;
    CHECK(untouched);
    return got == named(want);
  };
  // Every truncation: the envelope's payload length no longer matches.
  for (std::size_t length = 0; length < good.size(); ++length)
    CHECK(rejects(std::vector<std::byte>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(length)),
                  errc::truncated));
  CHECK(rejects(
      [&] {
        auto m = good;
        m.push_back(std::byte{0});
        return m;
      }(),
      errc::trailing_bytes));
  // Consistently declared payloads that contradict the layout.
  CHECK(
      rejects(with_payload(good, std::vector<std::byte>(payload.begin(), payload.end() - 4)), errc::malformed_payload));
  CHECK(
      rejects(with_payload(good, std::vector<std::byte>(payload.begin(), payload.end() - 1)), errc::malformed_payload));
  CHECK(rejects(with_payload(good, std::vector<std::byte>(payload.begin(), payload.begin() + 4 * 31)),
                errc::malformed_payload));
  CHECK(rejects(with_payload(good,
                             [&] {
                               auto p = payload;
                               p.insert(p.end(), 4, std::byte{1});
                               return p;
                             }()),
                errc::malformed_payload));
  // A bitmap claiming one word more than the payload carries, or one fewer.
  for (const std::uint32_t flip : {0u, 1u}) {
    std::vector<std::byte> p = payload;
    std::size_t g = 0, lane = 0;
    while (g < 32 && ((word_at(p, g) >> lane) & 1u) != flip) {
      lane = (lane + 1) % 32;
      g += lane == 0 ? 1 : 0;
    }
    REQUIRE(g < 32);
    set_word(p, g, word_at(p, g) ^ (1u << lane));
    CAPTURE(flip);
    CHECK(rejects(with_payload(good, p), errc::malformed_payload));
  }
  // Padding: 1000 = 31·32 + 8, so the last group's transposed words must stay below 2^8. Adding
  // 2^31 to its first carried difference sets bit 31 of every word from there on.
  {
    std::size_t before = 0;
    for (std::size_t g = 0; g < 31; ++g) before += static_cast<std::size_t>(std::popcount(word_at(payload, g)));
    REQUIRE(word_at(payload, 31) != 0);
    std::vector<std::byte> p = payload;
    set_word(p, 32 + before, word_at(p, 32 + before) + 0x80000000u);
    CHECK(rejects(with_payload(good, p), errc::malformed_payload));
  }
  std::vector<std::byte> layout = good;
  envelope e = parse_envelope(layout);
  e.layout = 1;
  write_envelope(e, layout);
  CHECK(rejects(layout, errc::malformed_payload));
  CHECK(thrown_by([&] { decode_values(mpc_codec<float>({.dim = 2}), good, n); }) == named(errc::parameter_mismatch));
  CHECK(thrown_by([&] { decode_values(q, good, n - 1); }) == named(errc::size_mismatch));
  CHECK(thrown_by([&] { decode_values(q, good, n, {.max_elements = n - 1}); }) == named(errc::too_large));
  CHECK(thrown_by([] { mpc_codec<float> bad({.dim = 0}); }) == named(errc::invalid_argument));
  CHECK(thrown_by([] { mpc_codec<float> bad({.dim = 33}); }) == named(errc::invalid_argument));
  CHECK(mpc_codec<float>({.dim = 1}).params_hash() != mpc_codec<float>({.dim = 2}).params_hash());
  std::vector<std::byte> small(q.max_encoded_bytes(n) - 1);
  CHECK(thrown_by([&] { q.encode(cpu_executor{}, std::span<const float>(x), small, {}); }) ==
        named(errc::buffer_too_small));
}

TEST_CASE("golden mpc file reproduces byte for byte and decodes to the known input's bits") {
  const std::vector<float> x = golden_input<float>(1000);
  const mpc_codec<float> q({.dim = 1});
  const std::vector<std::byte> fresh = encode_bytes(q, x, {.step = 9, .tensor_id = 4});
  const std::vector<std::byte> m = golden_bytes("mpc_f32.bin", fresh);
  REQUIRE(!m.empty());
  CHECK(m == fresh);
  CHECK(same_bits(decode_values(q, m, 1000), x));
}

TEST_CASE("mpc on every cpu setting equals the reference, which equals the literal transcription") {
  for (const std::uint32_t dim : {1u, 3u, 32u}) {
    CAPTURE(dim);
    const mpc_codec<float> q({.dim = dim});
    check_inputs_same_as_reference(q);
    for (const std::size_t n : mpc_sizes) {
      CAPTURE(n);
      const std::vector<float> x = random_bits(n, n + 5);
      const std::vector<std::byte> m = check_same_as_reference(q, x, {.step = 3});
      CHECK(std::vector<std::byte>(m.begin() + envelope_bytes, m.end()) == mpc_oracle_payload(x, dim));
    }
  }
}

TEST_CASE("mpc decoders reject what the reference rejects: bitmaps against words, padding, truncation") {
  const mpc_codec<float> q;
  const std::vector<float> x = make_input<float>(input_kind::normal, 1000, 4);  // a partial last group
  const std::vector<std::byte> good = encode_on(reference_executor{}, q, x);
  CHECK(decode_status_everywhere(q, good, 1000) == "no exception");
  // Every single-bit flip of the bitmaps and of the first and last carried words.
  for (const std::size_t at :
       {envelope_bytes, envelope_bytes + 4 * 31, envelope_bytes + 4 * 32, good.size() - 4, good.size() - 1})
    for (unsigned bit = 0; bit < 8; ++bit) {
      CAPTURE(at);
      CAPTURE(bit);
      std::vector<std::byte> m = good;
      m[at] ^= static_cast<std::byte>(1u << bit);
      (void)decode_status_everywhere(q, m, 1000);
    }
  const std::vector<std::byte> short_by_one(good.begin(), good.end() - 1);
  CHECK(decode_status_everywhere(q, short_by_one, 1000) != "no exception");
}
