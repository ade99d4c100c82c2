// The count sketch on the GPU. Encoding adds with atomics, in no fixed order: inputs whose cell
// sums are exact give the reference's bytes, and on any input every cell lies within twice the
// recursive-summation bound of the reference's (per-cell term counts and magnitude sums from the
// test's own hashing oracle), plus, for float, what the atomics' flushing of subnormal operands and
// results to zero can lose. Decoding is the reference's arithmetic: estimates, heavy-hitter
// indices, decodings and summed messages equal the reference's bit for bit. On both executors: NaN
// or Inf in the gradient, or a cell sum that overflows, leaves no message; a NaN cell is
// malformed_payload and leaves the output untouched; a summed cell that overflows, or a step
// mismatch, leaves the sum untouched.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "cuda/device_io.cuh"
#include "support/data.hpp"
#include "support/errors.hpp"
#include "support/sketch_oracle.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

namespace {

const count_sketch_params shapes[] = {
    {.rows = 3, .columns = 1000, .seed = 7},
    {.rows = 1, .columns = 1, .seed = 1},
    {.rows = 4, .columns = 7, .seed = 2},
    {.rows = 5, .columns = 65536, .seed = (std::uint64_t{1} << 40) | 3},
    {.rows = 16, .columns = 257, .seed = 4, .heavy_hitters = {.density = 0.1}},
};

/// n values k·2^−8 with k uniform in [−255, 255]: every partial sum of a cell is exact.
template <class T>
std::vector<T> exact_grid(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::uniform_int_distribution<int> k(-255, 255);
  std::vector<T> x(n);
  for (T& v : x) v = static_cast<T>(k(engine)) / T{256};
  return x;
}

/// Requires equal envelopes, and every cell of `gpu` within 2·γ(m−1)·Σ|x| of `cpu`'s, where m and
/// Σ|x| are the cell's term count and magnitude sum (the test's hashing) and γ(k) = k·u/(1 − k·u):
/// each order of summation lies within γ(m−1)·Σ|x| of the exact sum. For float, each of the m
/// atomic adds may also flush a subnormal operand and a subnormal result (each below the smallest
/// normal, 2^−126) to zero: 4·m·2^−126 more.
template <class T>
void check_within_summation_bound(const count_sketch_params& p, const std::vector<T>& x,
                                  const std::vector<std::byte>& gpu, const std::vector<std::byte>& cpu) {
  REQUIRE(gpu.size() == cpu.size());
  CHECK(std::memcmp(gpu.data(), cpu.data(), envelope::size) == 0);
  std::vector<double> terms(p.rows * p.columns, 0.0);
  std::vector<double> magnitude(p.rows * p.columns, 0.0);
  for (std::size_t i = 0; i < x.size(); ++i)
    for (std::uint32_t j = 0; j < p.rows; ++j) {
      const std::size_t cell = j * p.columns + oracle_bucket(oracle_hash(p.seed, j, i), p.columns);
      terms[cell] += 1;
      magnitude[cell] += std::fabs(static_cast<double>(x[i]));
    }
  const double u = std::numeric_limits<T>::epsilon() / 2;
  const std::vector<T> a = cells_of<T>(gpu);
  const std::vector<T> b = cells_of<T>(cpu);
  std::size_t outside = 0;
  std::size_t differing = 0;
  for (std::size_t c = 0; c < a.size(); ++c) {
    const double k = terms[c] > 0 ? terms[c] - 1 : 0;
    const double flushed = sizeof(T) == 4 ? 4 * terms[c] * static_cast<double>(std::numeric_limits<float>::min()) : 0.0;
    const double bound = 2 * (k * u / (1 - k * u)) * (magnitude[c] + flushed) + flushed;
    const double gap = std::fabs(static_cast<double>(a[c]) - static_cast<double>(b[c]));
    outside += gap <= bound ? 0u : 1u;  // NaN fails
    differing += to_bits(a[c]) != to_bits(b[c]) ? 1u : 0u;
  }
  CAPTURE(differing);
  CHECK(outside == 0);
}

template <class T>
void check_encodings(const count_sketch_params& p, std::size_t n) {
  const count_sketch<T> codec(p);
  CAPTURE(p.rows);
  CAPTURE(p.columns);
  CAPTURE(n);
  const message_key key{.step = 3, .tensor_id = 9};
  // Exact sums: the reference's bytes. Subnormals only for double: float atomics flush them to zero.
  for (const input_kind kind : {input_kind::ties, input_kind::all_equal, input_kind::subnormals}) {
    if (kind == input_kind::subnormals && sizeof(T) == 4) continue;
    CAPTURE(name(kind));
    const std::vector<T> x = make_input<T>(kind, n, 40 + n);
    CHECK(encode_on(test_gpu(), codec, x, key) == encode_on(reference_executor{}, codec, x, key));
  }
  const std::vector<T> grid = exact_grid<T>(n, 41 + n);
  CHECK(encode_on(test_gpu(), codec, grid, key) == encode_on(reference_executor{}, codec, grid, key));
  for (const input_kind kind : {input_kind::normal, input_kind::signed_zeros, input_kind::subnormals}) {
    CAPTURE(name(kind));
    const std::vector<T> x = make_input<T>(kind, n, 42 + n);
    check_within_summation_bound(p, x, encode_on(test_gpu(), codec, x, key),
                                 encode_on(reference_executor{}, codec, x, key));
  }
}

/// The reference's message of `kind` input decoded on both executors: estimates, heavy hitters, decode
/// and decode_accumulate bit for bit.
template <class T>
void check_decodings(const count_sketch_params& p, std::size_t n, input_kind kind) {
  const count_sketch<T> codec(p);
  CAPTURE(p.rows);
  CAPTURE(n);
  CAPTURE(name(kind));
  const std::vector<T> x = make_input<T>(kind, n, 50 + n);
  const std::vector<std::byte> message = encode_on(reference_executor{}, codec, x, {.step = 1});
  const reference_executor cpu;
  const cuda_executor gpu = test_gpu();

  std::vector<T> cpu_estimates(n);
  std::vector<std::byte> cpu_ws = poisoned_values<std::byte>(codec.workspace_bytes(cpu, n));
  codec.estimate(cpu, std::span<const std::byte>(message), std::span<T>(cpu_estimates), std::span<std::byte>(cpu_ws));
  const device_array<std::byte> m = to_device(gpu, message);
  device_array<T> gpu_estimates = poisoned<T>(gpu, n);
  device_array<std::byte> gpu_ws = poisoned<std::byte>(gpu, codec.workspace_bytes(gpu, n));
  codec.estimate(gpu, std::span<const std::byte>(m.span()), gpu_estimates.span(), gpu_ws.span());
  CHECK(bit_patterns(to_host(gpu, gpu_estimates)) == bit_patterns(cpu_estimates));

  const std::uint64_t k = codec.heavy_hitter_count(n);
  std::vector<std::uint64_t> cpu_indices = poisoned_values<std::uint64_t>(k);
  const std::size_t cpu_count =
      codec.heavy_hitters(cpu, std::span<const std::byte>(message), n, std::span<std::uint64_t>(cpu_indices),
                          std::span<std::byte>(cpu_ws));
  device_array<std::uint64_t> gpu_indices = poisoned<std::uint64_t>(gpu, k);
  const std::size_t gpu_count =
      codec.heavy_hitters(gpu, std::span<const std::byte>(m.span()), n, gpu_indices.span(), gpu_ws.span());
  CHECK(gpu_count == cpu_count);
  CHECK(to_host(gpu, gpu_indices) == cpu_indices);  // the entries past the count keep their poison on both

  const std::vector<T> start = make_input<T>(input_kind::normal, n, 51 + n);
  CHECK(bit_patterns(decode_on(gpu, codec, message, poisoned_values<T>(n))) ==
        bit_patterns(decode_on(cpu, codec, message, poisoned_values<T>(n))));
  CHECK(bit_patterns(decode_on(gpu, codec, message, start, true)) ==
        bit_patterns(decode_on(cpu, codec, message, start, true)));
}

/// Sums `b` into a copy of `a` on `exec`: what happened and the sum's bytes.
template <class E, class T>
outcome<std::byte> accumulate_outcome_on(const E& exec, const count_sketch<T>& codec, const std::vector<std::byte>& a,
                                         const std::vector<std::byte>& b) {
  using memory = executor_memory<E>;
  auto acc = memory::copy_in(exec, a);
  auto other = memory::copy_in(exec, b);
  const std::string status = thrown_by(
      [&] { codec.accumulate_encoded(exec, memory::span(acc), std::span<const std::byte>(memory::span(other))); });
  return {status, memory::copy_out(exec, acc, a.size())};
}

const auto bad_input_leaves_nothing = [](const auto& exec) {
  const count_sketch<float> codec({.rows = 3, .columns = 100, .seed = 5});
  const auto no_message = [](const outcome<std::byte>& result) {
    CHECK(result.status == named(errc::non_finite_input));
    CHECK(thrown_by([&] { (void)parse_envelope(result.output); }) != "no exception");
  };
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<float> x = make_input<float>(input_kind::normal, 5000, 8);
    x[4321] = bad;
    no_message(encode_outcome_on(exec, codec, x));
  }
  // Finite values whose cell sum overflows: one row, one cell, each value signed so that σ·x = 3e38.
  const count_sketch<float> single({.rows = 1, .columns = 1});
  std::vector<float> huge(4);
  for (std::size_t i = 0; i < huge.size(); ++i) huge[i] = (oracle_hash(0, 0, i) >> 31) != 0 ? -3e38f : 3e38f;
  no_message(encode_outcome_on(exec, single, huge));

  // A NaN cell (a SUM that overflowed elsewhere) is malformed, and the output keeps its values.
  const std::vector<float> x = make_input<float>(input_kind::normal, 1000, 9);
  std::vector<std::byte> message = encode_on(reference_executor{}, codec, x, {.step = 2});
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(message.data() + envelope::size + 17 * sizeof(float), &nan, sizeof nan);
  const std::vector<float> start = make_input<float>(input_kind::normal, 1000, 10);
  const outcome<float> decoded = decode_outcome_on(exec, codec, message, start);
  CHECK(decoded.status == named(errc::malformed_payload));
  CHECK(bit_patterns(decoded.output) == bit_patterns(start));

  // Sums: overflow and a step mismatch leave the accumulator's bytes as they were.
  const std::vector<std::byte> big = encode_on(reference_executor{}, single, std::vector<float>{3e38f}, {.step = 1});
  const outcome<std::byte> overflow = accumulate_outcome_on(exec, single, big, big);
  CHECK(overflow.status == named(errc::non_finite_input));
  CHECK(overflow.output == big);
  const std::vector<std::byte> a = encode_on(reference_executor{}, codec, x, {.step = 2});
  const std::vector<std::byte> later = encode_on(reference_executor{}, codec, x, {.step = 3});
  const outcome<std::byte> mismatch = accumulate_outcome_on(exec, codec, a, later);
  CHECK(mismatch.status == named(errc::step_mismatch));
  CHECK(mismatch.output == a);
};

/// One rank's gradient: each element non-zero (N(0, 1)) with probability `density`.
template <class T>
std::vector<T> sparse_gradient(std::size_t n, double density, std::uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::bernoulli_distribution keep(density);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<T> x(n, T{0});
  for (T& v : x)
    if (keep(engine)) v = static_cast<T>(normal(engine));
  return x;
}

/// What LHC's encoding side gave on one executor: the index, the plan of the aggregated index,
/// the sketch, and each call's status.
template <class T>
struct lhc_encoding {
  std::vector<std::byte> index;
  lhc_plan plan;
  std::vector<T> sketch;
  std::string index_status, plan_status, sketch_status;

  friend bool operator==(const lhc_encoding& a, const lhc_encoding& b) {
    return a.index == b.index && a.plan == b.plan && bit_patterns(a.sketch) == bit_patterns(b.sketch) &&
           a.index_status == b.index_status && a.plan_status == b.plan_status && a.sketch_status == b.sketch_status;
  }
};

/// encode_index of `x`, plan of `global` (the aggregated index) for `contributors` ranks, and
/// encode_sketch of `x` under that plan (or `forced`, when given), on `exec`.
template <class E, class T>
lhc_encoding<T> lhc_encode_on(const E& exec, const lossless_homomorphic<T>& lhc, const std::vector<T>& x,
                              const std::vector<std::byte>& global, std::uint64_t contributors,
                              const lhc_plan* forced = nullptr) {
  using memory = executor_memory<E>;
  const std::size_t n = x.size();
  auto g = memory::copy_in(exec, x);
  auto index = memory::copy_in(exec, std::vector<std::byte>(lhc.index_bytes(n), std::byte{0xAB}));
  lhc_encoding<T> result;
  result.index_status =
      thrown_by([&] { lhc.encode_index(exec, std::span<const T>(memory::span(g)), memory::span(index)); });
  result.index = memory::copy_out(exec, index, lhc.index_bytes(n));
  auto aggregated = memory::copy_in(exec, global);
  result.plan_status = thrown_by(
      [&] { result.plan = lhc.plan(exec, std::span<const std::byte>(memory::span(aggregated)), n, contributors); });
  const lhc_plan plan = forced != nullptr ? *forced : result.plan;
  auto sketch = memory::copy_in(exec, std::vector<T>(plan.sketch_values(), T{7}));
  result.sketch_status = thrown_by([&] {
    lhc.encode_sketch(exec, std::span<const T>(memory::span(g)), std::span<const std::byte>(memory::span(aggregated)),
                      plan, memory::span(sketch));
  });
  result.sketch = memory::copy_out(exec, sketch, plan.sketch_values());
  return result;
}

/// The rank-wise OR (bitmap) or uint8 sum (sum4, sum8) of the reference's indexes of `ranks`.
template <class T>
std::vector<std::byte> aggregated_index(const lossless_homomorphic<T>& lhc, const std::vector<std::vector<T>>& ranks) {
  std::vector<std::byte> total(lhc.index_bytes(ranks.front().size()), std::byte{0});
  for (const std::vector<T>& x : ranks) {
    std::vector<std::byte> mine(total.size());
    lhc.encode_index(reference_executor{}, std::span<const T>(x), std::span<std::byte>(mine));
    for (std::size_t q = 0; q < total.size(); ++q) {
      const auto a = static_cast<unsigned>(total[q]), b = static_cast<unsigned>(mine[q]);
      total[q] = static_cast<std::byte>(lhc.params().index == lhc_index_coding::bitmap ? (a | b) : ((a + b) & 0xFFu));
    }
  }
  return total;
}

template <class T>
void check_lhc_encodings(const lhc_params& params, std::size_t n, double density) {
  const lossless_homomorphic<T> lhc(params);
  CAPTURE(n);
  CAPTURE(density);
  CAPTURE(params.block);
  CAPTURE(params.reference_layout);
  CAPTURE(static_cast<int>(params.index));
  std::vector<std::vector<T>> ranks;
  for (std::uint64_t r = 0; r < 3; ++r) ranks.push_back(sparse_gradient<T>(n, density, 100 * n + r));
  const std::vector<std::byte> global = aggregated_index(lhc, ranks);
  for (const std::vector<T>& x : ranks)
    CHECK(lhc_encode_on(test_gpu(), lhc, x, global, 3) == lhc_encode_on(reference_executor{}, lhc, x, global, 3));
}

}  // namespace

GRADCOMP_CUDA_TEST_CASE(
    "LHC indexes, plans and sketches equal the reference's bit for bit, errors and poisoning included") {
  for (const lhc_index_coding coding : {lhc_index_coding::bitmap, lhc_index_coding::sum4, lhc_index_coding::sum8})
    for (const std::size_t n : {0u, 1u, 999u, 100003u})
      for (const double density : {0.001, 0.05, 0.5}) {
        check_lhc_encodings<float>({.index = coding}, n, density);
        check_lhc_encodings<double>({.block = 100, .index = coding, .seed = 3}, n, density);
        check_lhc_encodings<float>({.index = coding, .reference_layout = true, .fixed_compress_ratio = 2}, n, density);
      }
  check_lhc_encodings<float>({}, std::size_t{1} << 22, 0.05);
  // Errors: NaN (the index marks everything, the sketch is NaN), an element outside the index, a
  // plan that is not the index's, a field above the rank limit; both executors alike.
  const lossless_homomorphic<float> lhc({.index = lhc_index_coding::sum4});
  std::vector<float> x = sparse_gradient<float>(5001, 0.05, 1);
  const std::vector<std::byte> global = aggregated_index(lhc, std::vector<std::vector<float>>{x});
  std::vector<float> with_nan = x;
  with_nan[77] = std::numeric_limits<float>::quiet_NaN();
  CHECK(lhc_encode_on(test_gpu(), lhc, with_nan, global, 1) ==
        lhc_encode_on(reference_executor{}, lhc, with_nan, global, 1));
  std::vector<float> outside = x;
  for (float& v : outside)
    if (v == 0.0f) {
      v = 1.0f;
      break;
    }
  CHECK(lhc_encode_on(test_gpu(), lhc, outside, global, 1) ==
        lhc_encode_on(reference_executor{}, lhc, outside, global, 1));
  const lhc_plan wrong = lhc.plan_for(5001, 5001);
  CHECK(lhc_encode_on(test_gpu(), lhc, x, global, 1, &wrong) ==
        lhc_encode_on(reference_executor{}, lhc, x, global, 1, &wrong));
  std::vector<std::byte> too_many = global;
  too_many[10] = std::byte{0x0F};  // a field of 15 with 2 contributors
  CHECK(lhc_encode_on(test_gpu(), lhc, x, too_many, 2) == lhc_encode_on(reference_executor{}, lhc, x, too_many, 2));
}

GRADCOMP_CUDA_TEST_CASE(
    "count-sketch encodings give the reference's bytes where sums are exact and lie within the summation bound "
    "elsewhere") {
  for (const count_sketch_params& p : shapes)
    for (const std::size_t n : {0u, 1u, 1000u, 100003u}) {
      check_encodings<float>(p, n);
      check_encodings<double>(p, n);
    }
  // FetchSGD's shape: 3 rows of 2^20 columns (a 12 MiB table), 2^22 elements.
  check_encodings<float>({.rows = 3, .columns = std::uint64_t{1} << 20, .seed = 11}, std::size_t{1} << 22);
}

GRADCOMP_CUDA_TEST_CASE("count-sketch estimates, heavy hitters and decodings equal the reference's bit for bit") {
  for (const count_sketch_params& p : shapes)
    for (const std::size_t n : {1u, 1000u, 100003u})
      for (const input_kind kind : all_input_kinds) {
        check_decodings<float>(p, n, kind);
        check_decodings<double>(p, n, kind);
      }
  // Large enough that the selection's candidate list is a sixteenth of n.
  check_decodings<float>({.rows = 3, .columns = std::uint64_t{1} << 16, .seed = 12}, std::size_t{1} << 21,
                         input_kind::normal);
}

GRADCOMP_CUDA_TEST_CASE("summed count sketches equal the reference's sums") {
  for (const count_sketch_params& p : shapes) {
    const count_sketch<float> codec(p);
    const std::vector<std::byte> a =
        encode_on(reference_executor{}, codec, make_input<float>(input_kind::normal, 7000, 1), {.step = 4});
    const std::vector<std::byte> b =
        encode_on(reference_executor{}, codec, make_input<float>(input_kind::normal, 7000, 2), {.step = 4});
    const outcome<std::byte> gpu = accumulate_outcome_on(test_gpu(), codec, a, b);
    CHECK(gpu.status == "no exception");
    CHECK(gpu == accumulate_outcome_on(reference_executor{}, codec, a, b));
  }
}

// (No ';' in a test name: CMake would split it into two ctest entries that run nothing.)
GRADCOMP_TEST_ON_EXECUTORS(
    "count sketch: bad gradients leave no message, and NaN cells and overflowing or mismatched sums "
    "change nothing",
    bad_input_leaves_nothing)
