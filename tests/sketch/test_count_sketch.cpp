// Count sketch: encode equals a plain-loop oracle (its own MurmurHash3, checked against the
// published vectors) bit for bit; sketches add up exactly; the estimate is the oracle's median;
// heavy hitters are recovered where buckets collide; error feedback keeps its invariant; corrupted,
// mismatched and non-finite messages get named errors and leave the outputs untouched.
#include <gradcomp/feedback/error_feedback.hpp>
#include <gradcomp/sketch/count_sketch.hpp>
#include <gradcomp/sparsify/topk.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "support/codec_io.hpp"
#include "support/data.hpp"
#include "support/ef_invariant.hpp"
#include "support/errors.hpp"
#include "support/golden_io.hpp"
#include "support/oracles.hpp"
#include "support/reference_check.hpp"
#include "support/sketch_oracle.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

static_assert(count_sketch<float>::id == codec_id::count_sketch && static_cast<int>(codec_id::count_sketch) == 32);
static_assert(homomorphic<count_sketch<float>, cpu_executor>);
static_assert(homomorphic<count_sketch<double>, cpu_executor>);
static_assert(!sparsifier<count_sketch<float>>);

namespace {

template <class T>
std::vector<T> estimates_of(const count_sketch<T>& cs, const std::vector<std::byte>& message, std::size_t n) {
  std::vector<T> out(n);
  cs.estimate(cpu_executor{}, message, std::span<T>(out), {});
  return out;
}

template <class T>
bool numerically_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

template <class T>
std::string decode_error(const count_sketch<T>& cs, const std::vector<std::byte>& m, std::size_t n,
                         decode_limits limits = {}) {
  const cpu_executor cpu;
  std::vector<T> out(n, T{7});
  std::vector<std::byte> ws(cs.workspace_bytes(cpu, n));
  const std::string e = thrown_by([&] { cs.decode(cpu, m, std::span<T>(out), ws, limits); });
  CHECK(thrown_by([&] { cs.decode_accumulate(cpu, m, std::span<T>(out), ws, limits); }) == e);
  CHECK(thrown_by([&] { cs.estimate(cpu, m, std::span<T>(out), ws, limits); }) == e);
  std::vector<std::uint64_t> indices(n + 1, 99);
  CHECK(thrown_by([&] { (void)cs.heavy_hitters(cpu, m, n, indices, ws, limits); }) == e);
  CHECK(std::all_of(out.begin(), out.end(), [](T v) { return v == T{7}; }));
  CHECK(std::all_of(indices.begin(), indices.end(), [](std::uint64_t i) { return i == 99; }));
  return e;
}

}  // namespace

TEST_CASE("the test's MurmurHash3 matches the published vectors and the library's hashing rule") {
  // MurmurHash3_x86_32 of the 4-byte little-endian keys 0..3 with seeds 0, 1, 2 (docs/sketches.md §1.1).
  const std::uint32_t published[4][3] = {{0x2362f9de, 0x78ed212d, 0x06dfadfc},
                                         {0xfbf1402a, 0x5e11e574, 0x13d35112},
                                         {0x40b23b7f, 0xdb9a7e8c, 0x2cdefd20},
                                         {0x32850971, 0xcf6cc8a9, 0xde0eb68b}};
  for (std::uint32_t key = 0; key < 4; ++key)
    for (std::uint32_t seed = 0; seed < 3; ++seed) {
      CHECK(oracle_murmur(key, seed) == published[key][seed]);
      CHECK(murmur3_32(key, seed) == published[key][seed]);
    }
  // The library's hash functions follow the documented rule, for indices above 2^32 too.
  for (const std::uint64_t seed : {0ull, 7ull, 0x123456789abcdef0ull})
    for (const std::uint64_t i : {0ull, 1ull, 12345ull, 0xffffffffull, 0x100000000ull, 0x1234567800000009ull})
      for (std::uint32_t j = 0; j < 5; ++j) {
        const std::uint32_t h = count_sketch_hash(count_sketch_row_seed(seed, j), i);
        CHECK(h == oracle_hash(seed, j, i));
        CHECK(count_sketch_bucket(h, 1000) == oracle_bucket(h, 1000));
        CHECK(count_sketch_signed(h, 1.5f) == ((h >> 31) != 0 ? -1.5f : 1.5f));
      }
  // The high word of the index changes the hash: i and i + 2^32 land apart.
  CHECK(count_sketch_hash(5, 3) != count_sketch_hash(5, 3 + (1ull << 32)));
  // Runs of keys hashed eight at a time equal the scalar hash, for every run length and alignment.
  for (const std::uint32_t first : {0u, 5u, 0xfffffff0u - 40u})
    for (std::size_t count = 0; count < 40; ++count) {
      std::vector<std::uint32_t> fast(count), slow(count);
      detail::cpu::murmur3_32_run(first, count, 0xabcdu, fast.data(), cpu_has_avx2());
      detail::cpu::murmur3_32_run(first, count, 0xabcdu, slow.data(), false);
      bool equal = fast == slow;
      for (std::size_t m = 0; m < count; ++m)
        equal = equal && slow[m] == oracle_murmur(first + static_cast<std::uint32_t>(m), 0xabcdu);
      CHECK(equal);
    }
}

TEST_CASE_TEMPLATE("count sketch encode equals the plain-loop oracle bit for bit", T, float, double) {
  for (const std::uint32_t rows : {1u, 2u, 3u, 5u}) {
    for (const std::uint64_t columns : {1ull, 7ull, 1000ull}) {
      for (const std::size_t n :
           {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{300}, std::size_t{1001}}) {
        for (const input_kind kind : all_input_kinds) {
          const count_sketch_params p{.rows = rows, .columns = columns, .seed = 0x5eed00000003ull + rows};
          const count_sketch<T> cs(p);
          const std::vector<T> x = make_input<T>(kind, n, 11 + n);
          CAPTURE(rows);
          CAPTURE(columns);
          CAPTURE(n);
          CAPTURE(std::string(name(kind)));
          const std::vector<std::byte> m = encode_bytes(cs, x, {.step = 4, .tensor_id = 9});
          REQUIRE(m.size() == 56 + rows * columns * sizeof(T));
          CHECK(m.size() == cs.max_encoded_bytes(n));
          const envelope e = parse_envelope(m);
          CHECK(e.codec == codec_id::count_sketch);
          CHECK(e.layout == 0);
          CHECK(e.flags == 0);
          CHECK(e.elements == n);
          CHECK(e.key == message_key{.step = 4, .tensor_id = 9});
          CHECK(bitwise_equal(cells_of<T>(m), oracle_table(p, x)));
          // The baseline kernels write the same bytes.
          std::vector<std::byte> base(m.size());
          cs.encode(cpu_executor{.max_simd = cpu_simd::baseline}, std::span<const T>(x), base, {},
                    {.step = 4, .tensor_id = 9});
          CHECK(base == m);
        }
      }
    }
  }
}

TEST_CASE_TEMPLATE("the estimate is the oracle's median over rows, and the mean of the middle two for even rows", T,
                   float, double) {
  for (const std::uint32_t rows : {1u, 2u, 3u, 4u, 5u, 16u}) {
    const count_sketch_params p{.rows = rows, .columns = 64, .seed = 77};
    const count_sketch<T> cs(p);
    const std::vector<T> x = make_input<T>(input_kind::normal, 2000, rows);
    const std::vector<std::byte> m = encode_bytes(cs, x);
    CAPTURE(rows);
    CHECK(numerically_equal(estimates_of(cs, m, x.size()), oracle_estimates(p, oracle_table(p, x), x.size())));
    std::vector<T> fast(x.size());
    cs.estimate(cpu_executor{.max_simd = cpu_simd::baseline}, m, std::span<T>(fast), {});
    CHECK(bitwise_equal(fast, estimates_of(cs, m, x.size())));
  }
}

TEST_CASE_TEMPLATE("sketches add up exactly: the sketch of a sum is the sum of the sketches", T, float, double) {
  // Values are small integers times 2^-10, so every partial sum of a cell is an integer multiple of
  // 2^-10 far below 2^24·2^-10: all additions are exact, in any order, and the float sum of the
  // messages' cells must equal the sketch of the summed gradient bit for bit.
  const count_sketch<T> cs({.rows = 3, .columns = 97, .seed = 5});
  const std::size_t n = 5000, ranks = 4;
  std::mt19937_64 engine(3);
  std::uniform_int_distribution<int> small(-1000, 1000);
  std::vector<std::vector<T>> x(ranks, std::vector<T>(n));
  std::vector<T> total(n, T{0});
  for (std::size_t r = 0; r < ranks; ++r)
    for (std::size_t i = 0; i < n; ++i) {
      x[r][i] = static_cast<T>(small(engine)) * static_cast<T>(1.0 / 1024.0);
      total[i] += x[r][i];
    }
  const message_key key{.step = 2};
  std::vector<std::byte> transport = encode_bytes(cs, x[0], key), accumulated = transport;
  for (std::size_t r = 1; r < ranks; ++r) {
    const std::vector<std::byte> m = encode_bytes(cs, x[r], key);
    // A SUM all-reduce of the summable region as T values.
    for (std::size_t at = cs.summable_offset(n); at < cs.summable_offset(n) + cs.summable_bytes(n); at += sizeof(T)) {
      T a, b;
      std::memcpy(&a, transport.data() + at, sizeof(T));
      std::memcpy(&b, m.data() + at, sizeof(T));
      a += b;
      std::memcpy(transport.data() + at, &a, sizeof(T));
    }
    cs.accumulate_encoded(cpu_executor{}, accumulated, m);
  }
  CHECK(cs.summable_offset(n) == 56);
  CHECK(cs.summable_offset(n) + cs.summable_bytes(n) == transport.size());
  CHECK(transport == encode_bytes(cs, total, key));
  CHECK(accumulated == transport);
}

TEST_CASE("heavy hitters planted among colliding noise are recovered, and decode writes their estimates") {
  for (const std::uint32_t rows : {3u, 5u}) {
    const std::size_t n = 200000, planted = 100;
    const count_sketch_params p{.rows = rows,
                                .columns = rows == 3 ? 65536u : 16384u,
                                .seed = 99,
                                .heavy_hitters = {.k = planted}};
    const count_sketch<float> cs(p);
    std::vector<float> x = make_input<float>(input_kind::normal, n, 17);
    std::mt19937_64 engine(23);
    std::set<std::size_t> heavy;
    while (heavy.size() < planted - 1) heavy.insert(static_cast<std::size_t>(engine() % n));
    // The last one shares row 0's cell with the first, so a heavy-hitter collision surely occurs.
    const std::uint64_t target = oracle_bucket(oracle_hash(p.seed, 0, *heavy.begin()), p.columns);
    for (std::size_t i = 0; heavy.size() < planted; ++i)
      if (heavy.count(i) == 0 && oracle_bucket(oracle_hash(p.seed, 0, i), p.columns) == target) heavy.insert(i);
    for (const std::size_t i : heavy)
      x[i] = (engine() % 2 == 0 ? 1.0f : -1.0f) * (1.0f + static_cast<float>(engine() % 1000) / 1000.0f);
    // Collisions occur: every cell holds about n/c noise elements, and some heavy hitters share a
    // cell with another heavy hitter in at least one row.
    std::size_t shared = 0;
    for (std::uint32_t j = 0; j < rows; ++j) {
      std::set<std::uint64_t> cells;
      for (const std::size_t i : heavy) cells.insert(oracle_bucket(oracle_hash(p.seed, j, i), p.columns));
      shared += planted - cells.size();
    }
    CAPTURE(rows);
    CHECK(shared > 0);
    CHECK(n > 3 * p.columns);

    const std::vector<std::byte> m = encode_bytes(cs, x);
    std::vector<std::uint64_t> indices(planted);
    std::vector<std::byte> ws(cs.workspace_bytes(cpu_executor{}, n));
    REQUIRE(cs.heavy_hitters(cpu_executor{}, m, n, indices, ws) == planted);
    CHECK(std::is_sorted(indices.begin(), indices.end()));
    std::size_t found = 0;
    for (const std::uint64_t i : indices) found += heavy.count(static_cast<std::size_t>(i));
    CHECK(found * 100 >= planted * 99);

    // decode: the estimates at the oracle's top-k of the estimates (ties to the lower index), zeros elsewhere.
    const std::vector<float> est = oracle_estimates(p, oracle_table(p, x), n);
    const std::vector<std::size_t> top = topk_indices_oracle<float>(est, planted);
    CHECK(std::equal(top.begin(), top.end(), indices.begin()));
    const std::vector<float> expected = dense_at<float>(est, top);
    CHECK(bitwise_equal(decode_values(cs, m, n), expected));
    std::vector<float> acc(n, 0.5f);
    cs.decode_accumulate(cpu_executor{}, m, std::span<float>(acc), ws);
    bool sums = true;
    for (std::size_t i = 0; i < n; ++i) sums = sums && acc[i] == 0.5f + expected[i];
    CHECK(sums);

    // The second round: this rank's exact values at the heavy hitters.
    std::vector<float> exact(planted);
    gather_values(std::span<const float>(x), std::span<const std::uint64_t>(indices), std::span<float>(exact));
    bool gathered = true;
    for (std::size_t m2 = 0; m2 < planted; ++m2) gathered = gathered && exact[m2] == x[indices[m2]];
    CHECK(gathered);
  }
}

TEST_CASE_TEMPLATE("heavy-hitter selection breaks ties toward the lower index", T, float, double) {
  // Columns ≥ n and one row: most elements have their own cell, so many estimates are exact and tie.
  const count_sketch_params p{.rows = 1, .columns = 1 << 16, .seed = 1, .heavy_hitters = {.k = 37}};
  const count_sketch<T> cs(p);
  const std::vector<T> x = make_input<T>(input_kind::ties, 500, 4);
  const std::vector<T> est = oracle_estimates(p, oracle_table(p, x), x.size());
  CHECK(bitwise_equal(decode_values(cs, encode_bytes(cs, x), x.size()),
                      dense_at<T>(est, topk_indices_oracle<T>(est, 37))));
}

TEST_CASE_TEMPLATE("error feedback over the count sketch keeps its invariant", T, float, double) {
  check_ef_invariant(count_sketch<T>({.rows = 3, .columns = 256, .seed = 4, .heavy_hitters = {.k = 30}}), 3000, 12, 41,
                     3);
}

TEST_CASE_TEMPLATE("count sketch rejects NaN and Inf before writing, and overflowing cell sums", T, float, double) {
  const count_sketch<T> cs({.rows = 3, .columns = 16});
  const cpu_executor cpu;
  const std::vector<std::byte> earlier = encode_bytes(cs, make_input<T>(input_kind::normal, 100, 3));
  for (const T special :
       {std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity()}) {
    std::vector<T> x = make_input<T>(input_kind::normal, 100, 2);
    x[70] = special;
    std::vector<std::byte> out = earlier;
    CHECK(thrown_by([&] { cs.encode(cpu, std::span<const T>(x), out, {}); }) == named(errc::non_finite_input));
    CHECK(out == earlier);
  }
  // Two largest finite values whose signed contributions agree, in the one cell of a one-column sketch.
  const count_sketch<T> one({.rows = 1, .columns = 1});
  const std::uint32_t row_seed = count_sketch_row_seed(0, 0);
  const std::vector<T> huge{count_sketch_signed(count_sketch_hash(row_seed, 0), std::numeric_limits<T>::max()),
                            count_sketch_signed(count_sketch_hash(row_seed, 1), std::numeric_limits<T>::max())};
  std::vector<std::byte> out(one.max_encoded_bytes(2));
  CHECK(thrown_by([&] { one.encode(cpu, std::span<const T>(huge), out, {}); }) == named(errc::non_finite_input));
  CHECK(thrown_by([&] { (void)parse_envelope(out); }) == named(errc::bad_magic));  // no valid message left behind
  std::vector<std::byte> small(cs.max_encoded_bytes(5) - 1);
  const std::vector<T> five(5, T{1});
  CHECK(thrown_by([&] { cs.encode(cpu, std::span<const T>(five), small, {}); }) == named(errc::buffer_too_small));
}

TEST_CASE("count sketch decoders reject corrupted and mismatched messages and leave every output untouched") {
  const count_sketch<float> cs({.rows = 3, .columns = 32, .seed = 8, .heavy_hitters = {.k = 5}});
  const std::size_t n = 200;
  const std::vector<std::byte> good = encode_bytes(cs, make_input<float>(input_kind::normal, n, 5), {.step = 1});
  REQUIRE(good.size() == 56 + 3 * 32 * 4);
  REQUIRE(decode_values(cs, good, n).size() == n);
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<std::byte> m = good;
    std::memcpy(m.data() + 56 + 4 * 50, &bad, 4);
    CHECK(decode_error(cs, reseal(m), n) == named(errc::malformed_payload));
  }
  envelope other_layout = parse_envelope(good);
  other_layout.layout = 1;
  std::vector<std::byte> layout = good;
  write_envelope(other_layout, layout);
  CHECK(decode_error(cs, layout, n) == named(errc::malformed_payload));
  // A shorter table whose envelope agrees with its length.
  std::vector<std::byte> shorter(good.begin(), good.end() - 4);
  envelope shrunk = parse_envelope(good);
  shrunk.payload_bytes -= 4;
  write_envelope(shrunk, shorter);
  CHECK(decode_error(cs, shorter, n) == named(errc::malformed_payload));
  CHECK(decode_error(cs, std::vector<std::byte>(good.begin(), good.end() - 4), n) == named(errc::truncated));
  std::vector<std::byte> longer = good;
  longer.push_back(std::byte{0});
  CHECK(decode_error(cs, longer, n) == named(errc::trailing_bytes));
  CHECK(decode_error(cs, good, n + 1) == named(errc::size_mismatch));
  CHECK(decode_error(cs, good, n, {.max_elements = n - 1}) == named(errc::too_large));
  CHECK(decode_error(cs, good, n, {.require_checksum = true}) == named(errc::payload_checksum));
  for (const count_sketch_params& other :
       {count_sketch_params{.rows = 3, .columns = 32, .seed = 9, .heavy_hitters = {.k = 5}},
        count_sketch_params{.rows = 3, .columns = 32, .seed = 8, .heavy_hitters = {.k = 6}}}) {
    CHECK(decode_error(count_sketch<float>(other), good, n) == named(errc::parameter_mismatch));
  }
  CHECK(decode_error(count_sketch<double>({.rows = 3, .columns = 16, .seed = 8, .heavy_hitters = {.k = 5}}), good, n) ==
        named(errc::dtype_mismatch));
  // heavy_hitters needs room for k indices.
  std::vector<std::uint64_t> four(4, 99);
  std::vector<std::byte> ws(cs.workspace_bytes(cpu_executor{}, n));
  CHECK(thrown_by([&] { (void)cs.heavy_hitters(cpu_executor{}, good, n, four, ws); }) == named(errc::buffer_too_small));
  CHECK(std::all_of(four.begin(), four.end(), [](std::uint64_t i) { return i == 99; }));
  std::vector<float> out(n, 7.0f);
  CHECK(thrown_by([&] { cs.decode(cpu_executor{}, good, std::span<float>(out), {}); }) ==
        named(errc::workspace_too_small));
  CHECK(std::all_of(out.begin(), out.end(), [](float v) { return v == 7.0f; }));
}

TEST_CASE("count sketch accumulate_encoded rejects mismatched and overflowing sums, leaving acc unchanged") {
  const count_sketch<float> cs({.rows = 2, .columns = 10});
  const std::vector<float> a = make_input<float>(input_kind::normal, 100, 1);
  const cpu_executor cpu;
  const auto rejects = [&](std::vector<std::byte> acc, const std::vector<std::byte>& other, errc expected) {
    const std::vector<std::byte> before = acc;
    CHECK(thrown_by([&] { cs.accumulate_encoded(cpu, acc, other); }) == named(expected));
    CHECK(acc == before);
  };
  const std::vector<std::byte> mine = encode_bytes(cs, a, {.step = 2});
  rejects(mine, encode_bytes(cs, a, {.step = 3}), errc::step_mismatch);
  rejects(mine, encode_bytes(cs, a, {.step = 2, .tensor_id = 1}), errc::step_mismatch);
  rejects(mine, encode_bytes(count_sketch<float>({.rows = 2, .columns = 10, .seed = 1}), a, {.step = 2}),
          errc::parameter_mismatch);
  rejects(mine, encode_bytes(cs, std::vector<float>(a.begin(), a.begin() + 99), {.step = 2}), errc::size_mismatch);
  rejects(mine, encode_bytes(topk_sparsifier<float>(), a, {.step = 2}), errc::codec_mismatch);
  std::vector<std::byte> nan = mine;
  const float q = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(nan.data() + 60, &q, 4);
  rejects(mine, reseal(nan), errc::malformed_payload);
  rejects(reseal(nan), mine, errc::malformed_payload);
  const std::vector<float> huge(1, std::numeric_limits<float>::max() * 0.75f);  // finite alone, not twice
  const std::vector<std::byte> big = encode_bytes(count_sketch<float>({.rows = 1, .columns = 1}), huge);
  std::vector<std::byte> acc = big;
  CHECK(thrown_by([&] { count_sketch<float>({.rows = 1, .columns = 1}).accumulate_encoded(cpu, acc, big); }) ==
        named(errc::non_finite_input));
  CHECK(acc == big);
}

TEST_CASE_TEMPLATE("empty tensors give a valid all-zero sketch", T, float, double) {
  const count_sketch<T> cs({.rows = 3, .columns = 4});
  const std::vector<std::byte> m = encode_bytes(cs, std::vector<T>{});
  CHECK(m.size() == 56 + 12 * sizeof(T));
  CHECK(cs.workspace_bytes(cpu_executor{}, 0) == 0);
  CHECK(bitwise_equal(cells_of<T>(m), std::vector<T>(12, T{0})));
  CHECK(decode_values(cs, m, 0).empty());
  std::vector<std::uint64_t> none;
  CHECK(cs.heavy_hitters(cpu_executor{}, m, 0, none, {}) == 0);
  std::vector<std::byte> twice = m;
  cs.accumulate_encoded(cpu_executor{}, twice, m);
  CHECK(twice == m);
}

TEST_CASE("count sketch parameters are validated and hashed") {
  CHECK(thrown_by([] { count_sketch<float> bad({.rows = 0}); }) == named(errc::invalid_argument));
  CHECK(thrown_by([] { count_sketch<float> bad({.rows = 17}); }) == named(errc::invalid_argument));
  CHECK(thrown_by([] { count_sketch<float> bad({.columns = 0}); }) == named(errc::invalid_argument));
  CHECK(thrown_by([] { count_sketch<float> bad({.columns = (1ull << 31) + 1}); }) == named(errc::invalid_argument));
  CHECK(thrown_by([] { count_sketch<float> bad({.heavy_hitters = {.density = 0.0}}); }) ==
        named(errc::invalid_argument));
  const count_sketch<float> widest({.rows = 1, .columns = 1ull << 31});
  CHECK(widest.max_encoded_bytes(5) == 56 + (std::size_t{1} << 33));
  CHECK(count_sketch<float>().rows() == 3);
  CHECK(count_sketch<float>().columns() == 65536);
  CHECK(count_sketch<float>().heavy_hitter_count(1000) == 10);
  const std::uint64_t base = count_sketch<float>().params_hash();
  CHECK(base != count_sketch<double>().params_hash());
  CHECK(base != count_sketch<float>({.rows = 5}).params_hash());
  CHECK(base != count_sketch<float>({.columns = 65537}).params_hash());
  CHECK(base != count_sketch<float>({.seed = 1}).params_hash());
  CHECK(base != count_sketch<float>({.heavy_hitters = {.k = 10}}).params_hash());
  const std::vector<float> grad{1, 2, 3};
  std::vector<float> values(2);
  CHECK(thrown_by([&] {
          gather_values(std::span<const float>(grad), std::span<const std::uint64_t>(std::vector<std::uint64_t>{0, 3}),
                        std::span<float>(values));
        }) == named(errc::invalid_argument));
  CHECK(thrown_by([&] {
          gather_values(std::span<const float>(grad), std::span<const std::uint64_t>(std::vector<std::uint64_t>{0}),
                        std::span<float>(values));
        }) == named(errc::size_mismatch));
  CHECK(values == std::vector<float>(2, 0.0f));
}

TEST_CASE("the golden count-sketch file decodes to the oracle's heavy hitters of its known input") {
  const count_sketch_params p{.rows = 3, .columns = 64, .seed = 7, .heavy_hitters = {.k = 10}};
  std::vector<float> x(1000);  // golden_input<float>(1000) of support/golden_cases.hpp
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)) * static_cast<double>(1 + i % 5));
  const std::vector<std::byte> golden = read_golden("count_sketch_f32.bin");
  REQUIRE(golden.size() == 56 + 3 * 64 * 4);
  CHECK(bitwise_equal(cells_of<float>(golden), oracle_table(p, x)));
  const std::vector<float> est = oracle_estimates(p, oracle_table(p, x), x.size());
  CHECK(bitwise_equal(decode_values(count_sketch<float>(p), golden, x.size()),
                      dense_at<float>(est, topk_indices_oracle<float>(est, 10))));
}

TEST_CASE_TEMPLATE("count sketch: every cpu setting writes the reference's cells and decodes them to its bits", T,
                   float, double) {
  for (const std::uint32_t rows : {1u, 2u, 3u, 4u, 5u}) {
    CAPTURE(rows);
    check_inputs_same_as_reference(
        count_sketch<T>({.rows = rows, .columns = 61, .seed = 0xabcdefull + rows, .heavy_hitters = {.density = 0.05}}));
  }
  check_non_finite_same_as_reference(count_sketch<T>({.rows = 3, .columns = 100}));
}

TEST_CASE_TEMPLATE(
    "count sketch: estimate, heavy_hitters and accumulate_encoded on the reference, as on every cpu setting", T, float,
    double) {
  const reference_executor ref;
  for (const std::uint32_t rows : {1u, 3u, 4u, 16u}) {
    for (const input_kind kind : all_input_kinds) {
      CAPTURE(rows);
      CAPTURE(std::string(name(kind)));
      const count_sketch<T> cs({.rows = rows, .columns = 97, .seed = 5, .heavy_hitters = {.k = 37}});
      const std::vector<T> x = make_input<T>(kind, 3001, rows), y = make_input<T>(kind, 3001, rows + 100);
      const std::vector<std::byte> mx = encode_on(ref, cs, x, {.step = 2}), my = encode_on(ref, cs, y, {.step = 2});
      std::vector<T> expected(x.size());
      cs.estimate(ref, mx, std::span<T>(expected), {});
      // The reference's estimate is the oracle's median over rows.
      CHECK(numerically_equal(expected, oracle_estimates(cs.params(), oracle_table(cs.params(), x), x.size())));
      std::vector<std::byte> ws(cs.workspace_bytes(ref, x.size()));
      std::vector<std::uint64_t> hitters(37);
      REQUIRE(cs.heavy_hitters(ref, mx, x.size(), std::span<std::uint64_t>(hitters), ws) == 37);
      std::vector<std::byte> summed = mx;
      cs.accumulate_encoded(ref, summed, my);
      for (const cpu_executor& cpu : cpu_settings()) {
        CAPTURE(static_cast<int>(cpu.simd()));
        std::vector<T> got(x.size());
        cs.estimate(cpu, mx, std::span<T>(got), {});
        CHECK(bit_patterns(got) == bit_patterns(expected));
        std::vector<std::byte> cpu_ws(cs.workspace_bytes(cpu, x.size()));
        std::vector<std::uint64_t> cpu_hitters(37);
        REQUIRE(cs.heavy_hitters(cpu, mx, x.size(), std::span<std::uint64_t>(cpu_hitters), cpu_ws) == 37);
        CHECK(cpu_hitters == hitters);
        std::vector<std::byte> cpu_summed = mx;
        cs.accumulate_encoded(cpu, cpu_summed, my);
        CHECK(cpu_summed == summed);
      }
    }
  }
}
