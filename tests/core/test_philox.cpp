// Philox4x32-10 against the Random123 known-answer vectors, the documented keying of
// random_stream's counters, and the arithmetic of uniform() and scale_to_range().

#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/cpu/detail/philox_simd.hpp>

namespace {

using gradcomp::philox4x32_10;
using gradcomp::philox_block;
using gradcomp::random_purpose;
using gradcomp::random_stream;
using gradcomp::cpu_executor;
using gradcomp::cpu_simd;
namespace detail = gradcomp::detail;

// Random123 kat_vectors, "philox4x32 10": counter words, key words -> output words.
struct known_answer {
  std::uint32_t counter[4];
  std::uint32_t key[2];
  std::uint32_t output[4];
};

constexpr known_answer random123_kats[] = {
    {{0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u},
     {0x00000000u, 0x00000000u},
     {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
    {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
     {0xffffffffu, 0xffffffffu},
     {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
    {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
     {0xa4093822u, 0x299f31d0u},
     {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
};

constexpr bool blocks_equal(const philox_block& a, const std::uint32_t (&b)[4]) {
  return a.word[0] == b[0] && a.word[1] == b[1] && a.word[2] == b[2] && a.word[3] == b[3];
}

constexpr philox_block block_of(const std::uint32_t (&w)[4]) { return philox_block{{w[0], w[1], w[2], w[3]}}; }

// Compile-time evaluation of the generator (it is constexpr so device and host share it).
static_assert(blocks_equal(philox4x32_10(block_of(random123_kats[0].counter), 0u, 0u), random123_kats[0].output));
static_assert(blocks_equal(philox4x32_10(block_of(random123_kats[2].counter), random123_kats[2].key[0],
                                         random123_kats[2].key[1]),
                           random123_kats[2].output));
// The all-zero stream is the all-zero counter under the all-zero key: the first Random123 vector.
static_assert(random_stream{}.word(0) == 0x6627e8d5u && random_stream{}.word(3) == 0x9b00dbd8u);

// floor(x * n / 2^64) through 32-bit limbs: an oracle that shares no code with scale_to_range.
std::uint64_t high_word_of_product(std::uint64_t x, std::uint64_t n) {
  const std::uint64_t x_lo = x & 0xffffffffu, x_hi = x >> 32;
  const std::uint64_t n_lo = n & 0xffffffffu, n_hi = n >> 32;
  const std::uint64_t lo_lo = x_lo * n_lo;
  const std::uint64_t lo_hi = x_lo * n_hi;
  const std::uint64_t hi_lo = x_hi * n_lo;
  const std::uint64_t hi_hi = x_hi * n_hi;
  const std::uint64_t middle = (lo_lo >> 32) + (lo_hi & 0xffffffffu) + (hi_lo & 0xffffffffu);
  return hi_hi + (lo_hi >> 32) + (hi_lo >> 32) + (middle >> 32);
}

}  // namespace

TEST_CASE("philox4x32_10 reproduces the published Random123 known-answer vectors") {
  for (const known_answer& kat : random123_kats) {
    const philox_block out = philox4x32_10(block_of(kat.counter), kat.key[0], kat.key[1]);
    for (int w = 0; w < 4; ++w) {
      CAPTURE(w);
      CHECK(out.word[w] == kat.output[w]);
    }
  }
}

TEST_CASE("random_stream word i is word i%4 of philox4x32_10 on the documented counter and key") {
  // The three Random123 vectors, reached through the documented layout:
  // key = (seed lo, seed hi); counter = (block lo, block bits 32..55 | purpose << 24, step lo, tensor).
  SUBCASE("all-zero fields give the all-zero vector") {
    const random_stream s{};
    for (std::uint64_t i = 0; i < 4; ++i) CHECK(s.word(i) == random123_kats[0].output[i]);
  }
  SUBCASE("all-ones fields give the all-ones vector") {
    const random_stream s{0xffffffffffffffffull, 0xffffffffull, 0xffffffffu, static_cast<random_purpose>(0xff)};
    const std::uint64_t block = 0x00ffffffffffffffull;  // low 32 and bits 32..55 all ones
    for (std::uint64_t w = 0; w < 4; ++w) CHECK(s.word(block * 4 + w) == random123_kats[1].output[w]);
  }
  SUBCASE("the pi-digits vector") {
    const random_stream s{0x299f31d0a4093822ull, 0x13198a2eull, 0x03707344u, static_cast<random_purpose>(0x85)};
    const std::uint64_t block = 0x00a308d3243f6a88ull;
    for (std::uint64_t w = 0; w < 4; ++w) CHECK(s.word(block * 4 + w) == random123_kats[2].output[w]);
    const philox_block b = s.block(block);
    for (int w = 0; w < 4; ++w) CHECK(b.word[w] == random123_kats[2].output[w]);
  }
  SUBCASE("the pi-digits vector with the second key word carried by the step's high half") {
    // key word 1 = seed hi ^ step hi = 0 ^ 0x299f31d0.
    const random_stream s{0x00000000a4093822ull, 0x299f31d013198a2eull, 0x03707344u, static_cast<random_purpose>(0x85)};
    const std::uint64_t block = 0x00a308d3243f6a88ull;
    for (std::uint64_t w = 0; w < 4; ++w) CHECK(s.word(block * 4 + w) == random123_kats[2].output[w]);
  }
  SUBCASE("arbitrary fields, counter written out by hand") {
    const random_stream s{0x0123456789abcdefull, 0x1122334455667788ull, 0xcafef00du, random_purpose::threshold_sample};
    const std::uint64_t block = 0x00abcdef12345678ull;
    // block lo = 0x12345678; bits 32..55 = 0xabcdef; purpose 2 -> 0x02abcdef; step lo = 0x55667788;
    // key = (seed lo, seed hi ^ step hi) = (0x89abcdef, 0x01234567 ^ 0x11223344 = 0x10017623).
    const philox_block expected =
        philox4x32_10(philox_block{{0x12345678u, 0x02abcdefu, 0x55667788u, 0xcafef00du}}, 0x89abcdefu, 0x10017623u);
    for (std::uint64_t w = 0; w < 4; ++w) {
      CAPTURE(w);
      CHECK(s.word(block * 4 + w) == expected.word[w]);
    }
    const philox_block first =
        philox4x32_10(philox_block{{0u, 0x02000000u, 0x55667788u, 0xcafef00du}}, 0x89abcdefu, 0x10017623u);
    for (std::uint64_t w = 0; w < 4; ++w) CHECK(s.word(w) == first.word[w]);
  }
}

TEST_CASE("random_stream words differ between purposes, steps, tensors and seeds") {
  const random_stream base{42, 7, 3, random_purpose::random_k};
  std::vector<random_stream> variants;
  for (const random_purpose p :
       {random_purpose::stochastic_rounding, random_purpose::threshold_sample, random_purpose::sketch_hash}) {
    random_stream s = base;
    s.purpose = p;
    variants.push_back(s);
  }
  random_stream other_step = base;
  other_step.step = 8;
  random_stream other_tensor = base;
  other_tensor.tensor_id = 4;
  random_stream other_seed = base;
  other_seed.seed = 43;
  random_stream other_seed_high = base;
  other_seed_high.seed = 42 + (std::uint64_t{1} << 32);
  variants.insert(variants.end(), {other_step, other_tensor, other_seed, other_seed_high});

  for (const random_stream& v : variants) {
    int equal_words = 0;
    for (std::uint64_t i = 0; i < 64; ++i) equal_words += v.word(i) == base.word(i) ? 1 : 0;
    CHECK(equal_words <= 1);  // 64 words of independent streams: a coincidence has probability ~2^-26
  }
}

TEST_CASE("random_stream steps that differ only above bit 31 draw different words") {
  const random_stream a{9, 5, 1, random_purpose::sketch_hash};
  const random_stream b{9, 5 + (std::uint64_t{1} << 32), 1, random_purpose::sketch_hash};
  const random_stream c{9, 5 + (std::uint64_t{1} << 63), 1, random_purpose::sketch_hash};
  int equal_ab = 0, equal_ac = 0;
  for (std::uint64_t i = 0; i < 64; ++i) {
    equal_ab += a.word(i) == b.word(i) ? 1 : 0;
    equal_ac += a.word(i) == c.word(i) ? 1 : 0;
  }
  CHECK(equal_ab <= 1);
  CHECK(equal_ac <= 1);
}

TEST_CASE("random_stream keys philox with seed hi XOR step hi, so only that XOR matters") {
  // A consequence of key = (seed lo, seed hi ^ step hi): moving bits between the seed's and the
  // step's high halves leaves the stream unchanged.
  const random_stream a{0x0000000100000007ull, 0x0000000200000005ull, 3, random_purpose::random_k};
  const random_stream b{0x0000000300000007ull, 0x0000000000000005ull, 3, random_purpose::random_k};
  for (std::uint64_t i = 0; i < 16; ++i) CHECK(a.word(i) == b.word(i));
}

TEST_CASE("two random_stream objects with the same fields draw the same words") {
  const random_stream a{0xfeedfacecafebeefull, 1234, 56, random_purpose::stochastic_rounding};
  random_stream b;
  b.seed = 0xfeedfacecafebeefull;
  b.step = 1234;
  b.tensor_id = 56;
  b.purpose = random_purpose::stochastic_rounding;
  for (std::uint64_t i = 0; i < 256; i += 7) CHECK(a.word(i) == b.word(i));
}

TEST_CASE("random_stream words within one stream are not repeated blocks") {
  const random_stream s{1, 2, 3, random_purpose::random_k};
  std::set<std::uint32_t> seen;
  for (std::uint64_t i = 0; i < 4096; ++i) seen.insert(s.word(i));
  CHECK(seen.size() >= 4094);  // birthday bound: expected collisions among 4096 words ~0.002
}

TEST_CASE("uniform() lies in 0 <= u < 1, carries the top 24 bits of its word, and averages one half") {
  const random_stream s{2024, 11, 5, random_purpose::stochastic_rounding};
  constexpr std::uint64_t draws = 100000;
  double sum = 0.0;
  float smallest = 1.0f, largest = 0.0f;
  bool in_range = true, exact = true;
  for (std::uint64_t i = 0; i < draws; ++i) {
    const float u = s.uniform(i);
    in_range = in_range && u >= 0.0f && u < 1.0f;
    // 24 random bits: u * 2^24 is exactly the word's top 24 bits.
    exact = exact && static_cast<double>(u) * 16777216.0 == static_cast<double>(s.word(i) / 256u);
    sum += static_cast<double>(u);
    smallest = u < smallest ? u : smallest;
    largest = u > largest ? u : largest;
  }
  CHECK(in_range);
  CHECK(exact);
  // The mean of 1e5 uniforms has standard deviation 0.0009; 0.005 is more than 5 of them.
  CHECK(sum / static_cast<double>(draws) > 0.495);
  CHECK(sum / static_cast<double>(draws) < 0.505);
  CHECK(smallest < 0.001f);
  CHECK(largest > 0.999f);
}

TEST_CASE("scale_to_range(x, n) is floor(x * n / 2^64) and below n") {
  using gradcomp::scale_to_range;
  SUBCASE("hand-computed values") {
    CHECK(scale_to_range(0, 1000) == 0);
    CHECK(scale_to_range(0xffffffffffffffffull, 1000) == 999);
    CHECK(scale_to_range(0xffffffffffffffffull, 1) == 0);
    CHECK(scale_to_range(std::uint64_t{1} << 63, 1001) == 500);
    CHECK(scale_to_range(std::uint64_t{1} << 62, 8) == 2);
    CHECK(scale_to_range(std::uint64_t{3} << 62, 0xffffffffffffffffull) == 0xbfffffffffffffffull);
    CHECK(scale_to_range(0xffffffffffffffffull, 0xffffffffffffffffull) == 0xfffffffffffffffeull);
    CHECK(scale_to_range(0x123456789abcdef0ull, std::uint64_t{1} << 32) == 0x12345678ull);
  }
  SUBCASE("random operands against a 32-bit-limb product") {
    std::mt19937_64 rng(0x5eed);
    for (int t = 0; t < 20000; ++t) {
      const std::uint64_t x = rng();
      std::uint64_t n = rng() >> (rng() % 64);
      if (n == 0) n = 1;
      const std::uint64_t r = scale_to_range(x, n);
      CAPTURE(x);
      CAPTURE(n);
      REQUIRE(r == high_word_of_product(x, n));
      REQUIRE(r < n);
    }
  }
}

TEST_CASE("the vectorised Philox kernels draw the words of random_stream::block at every SIMD level") {
  const random_stream stream{0x0123456789ABCDEFull, 0x500000001ull, 7, random_purpose::stochastic_rounding};
  for (const cpu_simd max : {cpu_simd::baseline, cpu_simd::avx2, cpu_simd::avx512}) {
    const cpu_simd simd = cpu_executor{.max_simd = max}.simd();  // what this CPU has, up to `max`
    bool equal = true;
    // Runs starting anywhere, of lengths around the kernel widths, including runs that cross a
    // multiple of 2^32 blocks (where counter word 1 changes).
    for (const std::uint64_t first : {0ull, 3ull, 1000ull, 0xFFFFFFF0ull, 0x1FFFFFFFAull}) {
      for (const std::uint64_t count : {0ull, 1ull, 5ull, 16ull, 31ull, 32ull, 37ull, 100ull, 129ull}) {
        std::vector<std::uint32_t> words(4 * count + 4, 0xDEADBEEFu);
        detail::philox_stream_words(stream, first, count, words.data(), simd);
        for (std::uint64_t k = 0; k < count; ++k) {
          const philox_block b = stream.block(first + k);
          for (int w = 0; w < 4; ++w) equal = equal && words[4 * k + static_cast<std::uint64_t>(w)] == b.word[w];
        }
        equal = equal && words[4 * count] == 0xDEADBEEFu;  // nothing written past the run
      }
    }
    CAPTURE(static_cast<int>(simd));
    CHECK(equal);
  }
}
