// LHC's peeling decoder on the GPU against reference_executor's, bit for bit: the values, every field of
// lhc_decode_result and the errors (code and message), into an output with poisoned guard values
// on both sides (never written) and a poisoned workspace; an error leaves the output untouched.
// The "cuda:" cases need a GPU and skip without one.
//
// The other cases run on the CPU: they replay the GPU decoder's rounds on the host through the very
// functions its kernels call (detail::cuda::lhc_peeling), a loop standing in for each kernel,
// std::stable_sort by cell for CUB's stable radix sort and a loop for each selection, and require
// the reference decoder's bits and errors. Their inputs put values from 2^-60 to 2^60 on one cell, where
// the order of a cell's subtractions decides the double accumulator's rounding: the same replay
// with each cell's subtractions reversed must give other bits, or the inputs would not test the
// order at all.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda/device_io.cuh"
#include "support/errors.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

namespace {

using bytes = std::vector<std::byte>;

// ---- inputs ------------------------------------------------------------------------------------

/// How the ranks' non-zero values are drawn.
enum class values {
  grid,    ///< k·2^-12, 0 < |k| < 2^10: every float sum of up to 2^13 of them is exact.
  normal,  ///< N(0, 1): sums round.
  wide,    ///< ±(1 + u)·2^e, e uniform in [-60, 60]: a cell's contributions span 120 binary orders.
};

/// `ranks` gradients of n values, each element non-zero with probability `density`.
template <class T>
std::vector<std::vector<T>> make_ranks(std::size_t ranks, std::size_t n, double density, std::uint64_t seed,
                                       values kind) {
  std::mt19937_64 engine(seed);
  std::bernoulli_distribution keep(density);
  std::uniform_int_distribution<int> level(1, 1023);
  std::uniform_int_distribution<int> exponent(-60, 60);
  std::uniform_real_distribution<double> mantissa(1.0, 2.0);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<std::vector<T>> x(ranks, std::vector<T>(n, T{0}));
  for (std::vector<T>& g : x)
    for (T& v : g) {
      if (!keep(engine)) continue;
      const double sign = engine() % 2 == 0 ? 1.0 : -1.0;
      switch (kind) {
        case values::grid: v = static_cast<T>(std::ldexp(sign * level(engine), -12)); break;
        case values::normal: v = static_cast<T>(normal(engine)); break;
        case values::wide: v = static_cast<T>(std::ldexp(sign * mantissa(engine), exponent(engine))); break;
      }
    }
  return x;
}

/// What `decode` is given: the aggregated index, its plan and the summed sketch, from the CPU's
/// encoders (the GPU's give the same bytes: tests/cuda/test_sketch_device.cu).
template <class T>
struct lhc_input {
  bytes index;
  lhc_plan plan;
  std::vector<T> sketch;
};

/// The protocol's first stages for `ranks`: indexes aggregated by OR (bitmap) or uint8 SUM, the plan,
/// and the sketches summed in rank order.
template <class T>
lhc_input<T> encode_ranks(const lossless_homomorphic<T>& lhc, const std::vector<std::vector<T>>& ranks) {
  const cpu_executor cpu;
  const std::size_t n = ranks.front().size();
  lhc_input<T> in;
  in.index.assign(lhc.index_bytes(n), std::byte{0});
  for (const std::vector<T>& x : ranks) {
    bytes mine(in.index.size());
    lhc.encode_index(cpu, std::span<const T>(x), std::span<std::byte>(mine));
    for (std::size_t q = 0; q < mine.size(); ++q) {
      const auto a = std::to_integer<unsigned>(in.index[q]), b = std::to_integer<unsigned>(mine[q]);
      in.index[q] =
          static_cast<std::byte>(lhc.params().index == lhc_index_coding::bitmap ? (a | b) : ((a + b) & 0xFFu));
    }
  }
  in.plan = lhc.plan(cpu, std::span<const std::byte>(in.index), n, ranks.size());
  std::vector<T> sketch(in.plan.sketch_values());
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    lhc.encode_sketch(cpu, std::span<const T>(ranks[r]), std::span<const std::byte>(in.index), in.plan,
                      std::span<T>(sketch));
    if (r == 0) in.sketch = sketch;
    else
      for (std::size_t c = 0; c < sketch.size(); ++c) in.sketch[c] += sketch[c];
  }
  return in;
}

// ---- decoding on an executor, with guards ------------------------------------------------------------

/// Values on each side of the output, which no decoder may write.
constexpr std::size_t guard = 19;

/// What the output buffer and its guards hold before a decode: a NaN no decoder writes.
template <class T>
T poison() {
  return from_bits<T>(float_traits<T>::infinity_key | 0x5A5u);
}

/// What a decode gave: the output buffer with its guards, the result, and the error (code and
/// message; empty when none).
template <class T>
struct decoding {
  std::vector<T> buffer;
  lhc_decode_result result;
  std::string code;
  std::string message;

  /// Whether the guards hold the poison, and the output too after an error.
  [[nodiscard]] bool untouched_outside() const {
    const auto is_poison = [](T v) { return to_bits(v) == to_bits(poison<T>()); };
    const std::size_t n = buffer.size() - 2 * guard;
    return std::all_of(buffer.begin(), buffer.begin() + guard, is_poison) &&
           std::all_of(buffer.end() - guard, buffer.end(), is_poison) &&
           (code.empty() ||
            std::all_of(buffer.begin() + guard, buffer.begin() + static_cast<std::ptrdiff_t>(guard + n), is_poison));
  }

  friend bool operator==(const decoding& a, const decoding& b) {
    return bit_patterns(a.buffer) == bit_patterns(b.buffer) && a.result == b.result && a.code == b.code &&
           a.message == b.message;
  }
};

/// A decoding of n values whose buffer holds only the poison, before anything is decoded into it.
template <class T>
decoding<T> poisoned(std::size_t n) {
  return {std::vector<T>(guard + n + guard, poison<T>()), {}, {}, {}};
}

/// Records `e` as the decoding's error.
template <class T>
void record(decoding<T>& d, const error& e) {
  d.code = named(e.code());
  d.message = e.what();
}

/// Decodes on `exec` into n values between guards, with a workspace of 0xA5 bytes:
/// `workspace_bytes(exec, plan)` less `short_by`.
template <class E, class T>
decoding<T> decode_on(const E& exec, const lossless_homomorphic<T>& lhc, const bytes& index, const lhc_plan& plan,
                      const std::vector<T>& sketch, std::size_t n, std::size_t short_by = 0) {
  using memory = executor_memory<E>;
  decoding<T> d = poisoned<T>(n);
  auto index_in = memory::copy_in(exec, index);
  auto sketch_in = memory::copy_in(exec, sketch);
  auto buffer = memory::copy_in(exec, d.buffer);
  auto ws = memory::template poisoned<std::byte>(exec, lhc.workspace_bytes(exec, plan) - short_by);
  try {
    d.result = lhc.decode(exec, std::span<const std::byte>(memory::span(index_in)), plan,
                          std::span<const T>(memory::span(sketch_in)), memory::span(buffer).subspan(guard, n),
                          memory::span(ws));
  } catch (const error& e) {
    record(d, e);
  }
  d.buffer = memory::copy_out(exec, buffer, d.buffer.size());
  return d;
}

/// Decodes `in` on the GPU and on the CPU and requires the same decoding, the guards untouched.
template <class T>
void check_gpu_decodes_as_reference(const lossless_homomorphic<T>& lhc, const lhc_input<T>& in) {
  CAPTURE(in.plan.n);
  CAPTURE(in.plan.union_nonzeros);
  CAPTURE(in.plan.rows);
  CAPTURE(lhc.params().block);
  CAPTURE(static_cast<int>(lhc.params().index));
  CAPTURE(lhc.params().reference_layout);
  CAPTURE(static_cast<int>(lhc.params().on_stall));
  const decoding<T> cpu = decode_on(reference_executor{}, lhc, in.index, in.plan, in.sketch, in.plan.n);
  const decoding<T> gpu = decode_on(test_gpu(), lhc, in.index, in.plan, in.sketch, in.plan.n);
  CHECK(gpu.untouched_outside());
  CHECK(gpu.code == cpu.code);
  CHECK(gpu.message == cpu.message);
  CHECK(gpu.result == cpu.result);
  CHECK(gpu == cpu);
}

template <class T>
void check_gpu_decodes_as_reference(const lhc_params& p, const std::vector<std::vector<T>>& ranks) {
  const lossless_homomorphic<T> lhc(p);
  check_gpu_decodes_as_reference(lhc, encode_ranks(lhc, ranks));
}

// ---- the GPU's rounds, replayed on the host ---------------------------------------------------------

/// The order in which the replay applies each cell's subtractions within a round.
enum class cell_order {
  by_key,    ///< Ascending key 3·position + hash: the GPU's (CUB's stable sort), which is the CPU's.
  reversed,  ///< Descending key: a wrong order, to show that the inputs test the order.
};

/// One subtraction the replay applied: its round, cell and element.
struct applied {
  std::uint64_t round, cell, element;
};

/// What the replay saw, for the constructed case: every subtraction in the order applied, and the
/// element recovered from each cell (`detail::cuda::lhc_no_element` if none).
struct replay_trace {
  std::vector<applied> subtractions;
  std::vector<std::uint64_t> recovered_from;
};

/// The GPU decoder's `peel` for a sketched plan, on the host: the same `lhc_peeling` functions in
/// the same sequence, a loop for each kernel, std::stable_sort by cell for CUB's stable radix sort
/// of the round's (sort key, subtraction key) pairs, and a loop for each selection. The errors are
/// built as the GPU driver builds them.
template <class Index, class T>
decoding<T> replay_gpu_peeling(const lossless_homomorphic<T>& lhc, const lhc_input<T>& in, cell_order order,
                               replay_trace* trace = nullptr) {
  namespace cd = detail::cuda;
  const lhc_params& p = lhc.params();
  const lhc_plan& plan = in.plan;
  REQUIRE((!plan.dense && plan.cells > 0));
  const std::uint64_t n = plan.n;
  const std::uint64_t cells = plan.cells;
  const auto* const index = reinterpret_cast<const unsigned char*>(in.index.data());
  std::vector<lhc_block_layout> layouts(lhc.block_count(n));
  for (std::uint64_t b = 0; b < layouts.size(); ++b)
    layouts[b] = lhc_layout_of_block(b, plan.rows, p.block, p.seed, p.reference_layout);
  std::vector<double> sums(cells), recovered_value(cells);
  std::vector<std::uint64_t> ids(cells), counts(cells), recovered_element(cells);
  std::vector<Index> sort_keys(3 * cells), subtractions(3 * cells), queued(3 * cells);
  const cd::lhc_peeling<Index> peeling{
      layouts.data(),        p.block, cells, sums.data(), ids.data(), counts.data(), recovered_element.data(),
      recovered_value.data()};
  decoding<T> d = poisoned<T>(n);
  const auto selected = [&](std::uint64_t items) {  // DeviceSelect::If, the candidates that name a cell
    std::vector<Index> list;
    for (std::uint64_t q = 0; q < items; ++q)
      if (queued[q] != cells) list.push_back(queued[q]);
    return list;
  };

  for (std::uint64_t c = 0; c < cells; ++c)
    if (!peeling.load(c, in.sketch.data())) {
      record(d, error(errc::non_finite_input, detail::lhc_non_finite_message(c)));
      return d;
    }
  for (std::uint64_t i = 0; i < n; ++i) peeling.count(i, index, p.index);
  for (std::uint64_t c = 0; c < cells; ++c) peeling.queue_if_pure(c, queued.data());
  std::vector<Index> list = selected(cells);
  lhc_decode_result result;
  for (std::uint64_t round = 1; !list.empty(); ++round) {
    const std::uint64_t entries = list.size();
    const std::uint64_t items = 3 * entries;
    std::uint64_t recovered = 0;
    std::uint64_t first_beyond = entries;
    for (std::uint64_t e = 0; e < entries; ++e) {
      const cd::lhc_recovery outcome =
          peeling.template recover<T>(e, list.data(), sort_keys.data(), subtractions.data(), queued.data());
      recovered += outcome != cd::lhc_recovery::skipped ? 1 : 0;
      if (outcome == cd::lhc_recovery::out_of_range) first_beyond = std::min(first_beyond, e);
    }
    std::vector<std::pair<Index, Index>> pairs(items);
    for (std::uint64_t q = 0; q < items; ++q) pairs[q] = {sort_keys[q], subtractions[q]};
    std::stable_sort(pairs.begin(), pairs.end(), [order](const auto& a, const auto& b) {
      return a.first != b.first ? a.first < b.first : (order == cell_order::reversed && a.second > b.second);
    });
    std::vector<Index> sorted_keys(items), sorted_subtractions(items);
    for (std::uint64_t q = 0; q < items; ++q) std::tie(sorted_keys[q], sorted_subtractions[q]) = pairs[q];
    for (std::uint64_t t = 0; t < items; ++t)
      peeling.subtract(t, items, list.data(), sorted_keys.data(), sorted_subtractions.data(), queued.data());
    if (trace != nullptr)
      for (std::uint64_t t = 0; t < items; ++t)
        if (sorted_keys[t] != cells)
          trace->subtractions.push_back({round, sorted_keys[t], recovered_element[list[sorted_subtractions[t] / 3]]});
    if (first_beyond < entries) {
      record(d, error(errc::non_finite_input, detail::lhc_range_message("sum", recovered_element[list[first_beyond]])));
      return d;
    }
    result.recovered += recovered;
    result.rounds += recovered != 0 ? 1 : 0;
    list = selected(items);
  }
  if (trace != nullptr) trace->recovered_from = recovered_element;
  result.unrecovered = plan.union_nonzeros - result.recovered;
  try {
    detail::lhc_require_peeled(p.on_stall, result, plan);
  } catch (const error& e) {
    record(d, e);
    return d;
  }
  if (result.unrecovered != 0) {
    for (std::uint64_t i = 0; i < n; ++i)
      if (!peeling.template estimate_left<T>(i, index, p.index, nullptr)) {
        record(d, error(errc::non_finite_input, detail::lhc_range_message("estimate", i)));
        return d;
      }
    result.estimated = result.unrecovered;
  }
  T* const out = d.buffer.data() + guard;
  std::fill(out, out + n, T{0});
  for (std::uint64_t c = 0; c < cells; ++c) peeling.write_recovered(c, out);
  if (result.unrecovered != 0)
    for (std::uint64_t i = 0; i < n; ++i) (void)peeling.estimate_left(i, index, p.index, out);
  d.result = result;
  return d;
}

/// `replay_gpu_peeling` with the index type the GPU decoder picks for the plan.
template <class T>
decoding<T> replay(const lossless_homomorphic<T>& lhc, const lhc_input<T>& in, cell_order order,
                   replay_trace* trace = nullptr) {
  if (3 * in.plan.cells < (std::uint64_t{1} << 32)) return replay_gpu_peeling<std::uint32_t>(lhc, in, order, trace);
  return replay_gpu_peeling<std::uint64_t>(lhc, in, order, trace);
}

/// A tensor built so that one cell's value depends on the order of its subtractions: one round
/// subtracts from cell X first an element of 2^60, then one of 1, and X's last element, recovered
/// from X later, is 2^-60 (the other elements are k·2^-12). The sketch holds X's 2^60 + 1 + …
/// rounded to 2^60. Subtracting 2^60 first leaves 0, from which the 1 is subtracted exactly;
/// subtracting the 1 first is lost against 2^60 (53 bits), and then 2^60 leaves 0: X's last
/// element decodes 1 apart. The cell is found from the replay's trace of a tensor with the same
/// non-zeros.
template <class T>
std::vector<T> order_sensitive_tensor(const lossless_homomorphic<T>& lhc, std::size_t n, std::uint64_t seed) {
  std::vector<T> x = make_ranks<T>(1, n, 0.1, seed, values::grid).front();
  replay_trace trace;
  const decoding<T> structure = replay(lhc, encode_ranks(lhc, {x}), cell_order::by_key, &trace);
  REQUIRE(structure.result.unrecovered == 0);
  const std::vector<applied>& s = trace.subtractions;
  for (std::size_t q = 0; q + 1 < s.size(); ++q) {
    const applied& first = s[q];
    const applied& second = s[q + 1];
    const std::uint64_t last = trace.recovered_from[first.cell];
    const bool found = second.round == first.round && second.cell == first.cell &&
                       last != detail::cuda::lhc_no_element && last != first.element && last != second.element &&
                       (q == 0 || s[q - 1].round != first.round || s[q - 1].cell != first.cell);
    if (!found) continue;
    x[first.element] = static_cast<T>(0x1p60);
    x[second.element] = T{1};
    x[last] = static_cast<T>(0x1p-60);
    return x;
  }
  FAIL("no cell takes two subtractions in one round");
  return x;
}

/// The CPU's decoding of a replayed input, and whether the replay in the wrong order decoded it
/// otherwise.
template <class T>
struct replay_check {
  decoding<T> cpu;
  bool order_matters;
};

/// Requires the replay in the GPU's order to decode `in` as the CPU does; replays it in the wrong
/// order too, which must give the same result (the structure of peeling has no order).
template <class T>
replay_check<T> check_replay_decodes_as_reference(const lossless_homomorphic<T>& lhc, const lhc_input<T>& in) {
  replay_check<T> check{decode_on(reference_executor{}, lhc, in.index, in.plan, in.sketch, in.plan.n), false};
  const decoding<T> gpu_order = replay(lhc, in, cell_order::by_key);
  CHECK(gpu_order.code == check.cpu.code);
  CHECK(gpu_order.message == check.cpu.message);
  CHECK(gpu_order.result == check.cpu.result);
  CHECK(gpu_order == check.cpu);
  const decoding<T> wrong_order = replay(lhc, in, cell_order::reversed);
  CHECK(wrong_order.code == check.cpu.code);
  CHECK(wrong_order.result == check.cpu.result);
  check.order_matters = bit_patterns(wrong_order.buffer) != bit_patterns(check.cpu.buffer);
  return check;
}

/// The CPU-run check on wide values: 1 to 8 ranks at 1% and 10%, both layouts, blocks of 1024,
/// 100 and 37, every index coding. Where cells hold several elements, the wrong order must show.
template <class T>
void check_replay_on_wide_values() {
  std::uint64_t seed = 0;
  std::size_t cases = 0;
  std::size_t order_mattered = 0;
  for (const bool reference : {false, true})
    for (const std::uint32_t block : {1024u, 100u, 37u})
      for (const lhc_index_coding coding : {lhc_index_coding::bitmap, lhc_index_coding::sum4, lhc_index_coding::sum8})
        for (const double density : {0.01, 0.1}) {
          ++seed;
          const std::size_t ranks = 1 + seed % 8;
          const std::size_t n = 60'000 + 7 * seed;
          CAPTURE(reference);
          CAPTURE(block);
          CAPTURE(static_cast<int>(coding));
          CAPTURE(density);
          CAPTURE(ranks);
          const lossless_homomorphic<T> lhc({.block = block,
                                             .index = coding,
                                             .on_stall = lhc_stall_policy::median_estimate,
                                             .reference_layout = reference,
                                             .fixed_compress_ratio = reference ? 2.0 : 0.0,
                                             .seed = static_cast<std::uint32_t>(seed)});
          const lhc_input<T> in = encode_ranks(lhc, make_ranks<T>(ranks, n, density, seed, values::wide));
          REQUIRE_FALSE(in.plan.dense);
          const replay_check<T> check = check_replay_decodes_as_reference(lhc, in);
          CHECK(check.cpu.code.empty());
          ++cases;
          order_mattered += check.order_matters ? 1 : 0;
          if (!reference) CHECK(check.order_matters);  // 1.3 cells per element: cells hold several
        }
  MESSAGE(order_mattered << " of " << cases << " inputs decode otherwise in the wrong order");
}

}  // namespace

// ---- on the CPU: the GPU's rounds replayed against the CPU decoder -----------------------------------

TEST_CASE_TEMPLATE(
    "lhc GPU rounds replayed on the host decode values from 2^-60 to 2^60 as the CPU does, in an order "
    "that matters",
    T, float, double) {
  check_replay_on_wide_values<T>();
}

TEST_CASE_TEMPLATE("lhc GPU rounds replayed on the host: a cell whose last element decodes 1 apart in the wrong order",
                   T, float, double) {
  for (const std::uint32_t block : {64u, 37u}) {
    CAPTURE(block);
    const lossless_homomorphic<T> lhc({.block = block, .seed = block});
    const std::vector<T> x = order_sensitive_tensor(lhc, 4096, block);
    const replay_check<T> check = check_replay_decodes_as_reference(lhc, encode_ranks(lhc, {x}));
    CHECK(check.cpu.code.empty());
    CHECK(check.cpu.result.unrecovered == 0);
    CHECK(check.order_matters);
  }
}

TEST_CASE_TEMPLATE(
    "lhc GPU rounds replayed on the host: stalls, estimates, out-of-range sums and NaN give the CPU's "
    "results and errors",
    T, float, double) {
  const std::size_t n = std::size_t{1} << 16;
  const auto x = make_ranks<T>(4, n, 0.03, 9, values::wide);
  for (const lhc_stall_policy policy : {lhc_stall_policy::report, lhc_stall_policy::median_estimate}) {
    CAPTURE(static_cast<int>(policy));
    const lossless_homomorphic<T> lhc({.cells_per_nonzero = 1.0, .on_stall = policy, .seed = 3});
    const lhc_input<T> in = encode_ranks(lhc, x);
    const replay_check<T> stalled = check_replay_decodes_as_reference(lhc, in);
    if (policy == lhc_stall_policy::report) {
      CHECK(stalled.cpu.code == named(errc::peeling_stalled));
    } else {
      CHECK(stalled.cpu.code.empty());
      CHECK(stalled.cpu.result.estimated > 0);
      CHECK(stalled.cpu.result.estimated == stalled.cpu.result.unrecovered);
      CHECK(stalled.order_matters);
    }

    // A finite sketch whose peeled sums leave T's range: every cell ±(largest finite T).
    lhc_input<T> beyond = in;
    for (std::size_t c = 0; c < beyond.sketch.size(); ++c)
      beyond.sketch[c] = (c % 3 == 0 ? -1 : 1) * std::numeric_limits<T>::max();
    CHECK(check_replay_decodes_as_reference(lhc, beyond).cpu.code == named(errc::non_finite_input));

    lhc_input<T> not_finite = in;
    not_finite.sketch[not_finite.sketch.size() / 2] = std::numeric_limits<T>::quiet_NaN();
    not_finite.sketch[not_finite.sketch.size() / 3] = -std::numeric_limits<T>::infinity();
    CHECK(check_replay_decodes_as_reference(lhc, not_finite).cpu.code == named(errc::non_finite_input));
  }
}

// ---- on the GPU --------------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("cuda: LHC decode equals the CPU's on the CPU tests' cases", T, float, double) {
  if (!proceed_on_gpu()) return;
  // Exact sums of 2 to 16 ranks at 1.3 cells per non-zero.
  for (const std::size_t ranks : {2u, 4u, 8u, 16u})
    for (const double density : {0.002, 0.02, 0.08})
      check_gpu_decodes_as_reference<T>({.seed = static_cast<std::uint32_t>(ranks * 31)},
                                        make_ranks<T>(ranks, (std::size_t{1} << 18) + 123, density, 1000 + ranks,
                                                      values::grid));
  // General data, 1 to 16 ranks.
  for (const std::size_t ranks : {1u, 4u, 16u})
    check_gpu_decodes_as_reference<T>({.cells_per_nonzero = 1.4, .seed = 5},
                                      make_ranks<T>(ranks, std::size_t{1} << 17, 0.05, 77 + ranks, values::normal));
  // The reference layout: rows coincide, and peeling stalls.
  check_gpu_decodes_as_reference<T>({.on_stall = lhc_stall_policy::median_estimate,
                                     .reference_layout = true,
                                     .fixed_compress_ratio = 2},
                                    make_ranks<T>(2, std::size_t{1} << 18, 0.1, 31, values::grid));
  // Blocks that are not powers of two, nor multiples of 64 bits.
  for (const std::uint32_t block : {100u, 1000u, 37u})
    for (const lhc_index_coding coding : {lhc_index_coding::bitmap, lhc_index_coding::sum4})
      check_gpu_decodes_as_reference<T>({.block = block, .index = coding, .seed = block},
                                        make_ranks<T>(3, 40 * 1000 + 77, 0.04, block, values::grid));
  // Many small blocks (32-bit counters on the CPU).
  check_gpu_decodes_as_reference<T>({.block = 2, .seed = 1}, make_ranks<T>(3, 300000, 0.1, 8, values::grid));
  // Tiny sketches of 16 cells, peeled or stalled.
  for (std::uint32_t seed = 0; seed < 400; seed += 7)
    check_gpu_decodes_as_reference<T>({.block = 2, .seed = seed}, make_ranks<T>(1, 64, 0.19, seed, values::grid));
  // Dense plans, empty tensors, all zeros, tensors shorter than a block.
  for (const std::size_t n : {std::size_t{1000}, std::size_t{5000}, std::size_t{100000}})
    check_gpu_decodes_as_reference<T>({}, make_ranks<T>(3, n, 0.6, n, values::normal));
  check_gpu_decodes_as_reference<T>({}, std::vector<std::vector<T>>(4, std::vector<T>()));
  check_gpu_decodes_as_reference<T>({}, std::vector<std::vector<T>>(2, std::vector<T>(5000, T{0})));
  for (const std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{70 * 64 + 13}})
    check_gpu_decodes_as_reference<T>({.block = 64, .cells_per_nonzero = 2, .seed = 2},
                                      make_ranks<T>(4, n, 0.02, n + 1, values::grid));
}

TEST_CASE_TEMPLATE("cuda: LHC decode equals the CPU's on random 1% and 10% patterns of 1 to 8 ranks", T, float,
                   double) {
  if (!proceed_on_gpu()) return;
  std::uint64_t seed = 0;
  for (const lhc_index_coding coding : {lhc_index_coding::bitmap, lhc_index_coding::sum4, lhc_index_coding::sum8})
    for (const std::uint32_t block : {1024u, 100u, 37u})
      for (const std::size_t n :
           {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{100003}, std::size_t{1} << 20})
        for (const double density : {0.01, 0.1}) {
          ++seed;
          const std::size_t ranks = 1 + seed % 8;
          const values kind = seed % 3 == 0 ? values::wide : (seed % 3 == 1 ? values::normal : values::grid);
          check_gpu_decodes_as_reference<T>({.block = block, .index = coding, .seed = static_cast<std::uint32_t>(seed)},
                                            make_ranks<T>(ranks, n, density, seed, kind));
          check_gpu_decodes_as_reference<T>({.block = block,
                                             .index = coding,
                                             .on_stall = lhc_stall_policy::median_estimate,
                                             .reference_layout = true,
                                             .fixed_compress_ratio = 2,
                                             .seed = static_cast<std::uint32_t>(seed)},
                                            make_ranks<T>(ranks, n, density, seed + 1000, kind));
        }
  for (const double density : {0.01, 0.1})
    check_gpu_decodes_as_reference<T>({}, make_ranks<T>(8, std::size_t{1} << 22, density, 4242, values::normal));
}

TEST_CASE_TEMPLATE("cuda: LHC decode of values from 2^-60 to 2^60 on one cell equals the CPU's", T, float, double) {
  if (!proceed_on_gpu()) return;
  for (const std::uint32_t block : {64u, 37u}) {
    const lossless_homomorphic<T> lhc({.block = block, .seed = block});
    check_gpu_decodes_as_reference<T>(lhc, encode_ranks(lhc, {order_sensitive_tensor(lhc, 4096, block)}));
  }
  for (const std::uint32_t block : {1024u, 100u, 37u})
    for (const std::size_t ranks : {1u, 3u, 8u})
      check_gpu_decodes_as_reference<T>({.block = block, .on_stall = lhc_stall_policy::median_estimate, .seed = block},
                                        make_ranks<T>(ranks, std::size_t{1} << 20, 0.05, ranks * block, values::wide));
}

TEST_CASE_TEMPLATE("cuda: LHC decode stalls, out-of-range sums and NaN as the CPU does, the output untouched", T, float,
                   double) {
  if (!proceed_on_gpu()) return;
  for (const lhc_stall_policy policy : {lhc_stall_policy::report, lhc_stall_policy::median_estimate})
    for (const double factor : {1.0, 1.15})
      for (const std::uint32_t block : {1024u, 37u})
        for (const lhc_index_coding coding : {lhc_index_coding::bitmap, lhc_index_coding::sum8}) {
          const lossless_homomorphic<T> lhc(
              {.block = block, .cells_per_nonzero = factor, .index = coding, .on_stall = policy, .seed = 3});
          const lhc_input<T> in =
              encode_ranks(lhc, make_ranks<T>(4, std::size_t{1} << 16, 0.03, block, values::normal));
          check_gpu_decodes_as_reference(lhc, in);
          lhc_input<T> beyond = in;  // finite cells whose peeled sums (or estimates) leave T's range
          for (std::size_t c = 0; c < beyond.sketch.size(); ++c)
            beyond.sketch[c] = (c % 3 == 0 ? -1 : 1) * std::numeric_limits<T>::max();
          check_gpu_decodes_as_reference(lhc, beyond);
          for (const T bad : {std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::infinity()}) {
            lhc_input<T> poisoned_sketch = in;
            poisoned_sketch.sketch[poisoned_sketch.sketch.size() / 2] = bad;
            poisoned_sketch.sketch[poisoned_sketch.sketch.size() / 3] = -bad;
            check_gpu_decodes_as_reference(lhc, poisoned_sketch);
          }
        }
  // A SUM of the sketches that overflowed: two ranks' largest finite values in one element.
  std::vector<std::vector<T>> x(2, std::vector<T>(4096, T{0}));
  x[0][100] = x[1][100] = std::numeric_limits<T>::max();
  x[0][2000] = T{1};
  check_gpu_decodes_as_reference<T>({.block = 64}, x);
  // A dense plan's NaN.
  const lossless_homomorphic<T> dense;
  lhc_input<T> in = encode_ranks(dense, make_ranks<T>(2, 3000, 0.5, 1, values::normal));
  REQUIRE(in.plan.dense);
  in.sketch[1234] = std::numeric_limits<T>::quiet_NaN();
  check_gpu_decodes_as_reference(dense, in);
}

GRADCOMP_CUDA_TEST_CASE("LHC decode refuses bad sizes, plans, indexes and workspaces as the CPU does") {
  const lossless_homomorphic<float> lhc({.block = 128});
  const std::size_t n = 20000;
  const lhc_input<float> in = encode_ranks(lhc, make_ranks<float>(2, n, 0.02, 99, values::grid));
  REQUIRE_FALSE(in.plan.dense);
  const auto both = [&](const bytes& index, const lhc_plan& plan, const std::vector<float>& sketch, std::size_t out,
                        std::size_t short_by = 0) {
    const decoding<float> gpu = decode_on(test_gpu(), lhc, index, plan, sketch, out, short_by);
    const decoding<float> cpu = decode_on(reference_executor{}, lhc, index, plan, sketch, out, short_by);
    CHECK_FALSE(cpu.code.empty());
    CHECK(gpu.untouched_outside());
    CHECK(gpu.code == cpu.code);
    if (short_by == 0) CHECK(gpu.message == cpu.message);  // a workspace's message gives each backend's sizes
    CHECK(bit_patterns(gpu.buffer) == bit_patterns(cpu.buffer));
  };
  both(in.index, in.plan, std::vector<float>(in.sketch.begin(), in.sketch.end() - 1), n);
  both(in.index, in.plan, in.sketch, n - 1);
  both(bytes(in.index.begin(), in.index.end() - 1), in.plan, in.sketch, n);
  both(in.index, in.plan, in.sketch, n, 100);
  lhc_plan forged = in.plan;
  forged.rows += 1;
  forged.cells += 128;
  both(in.index, forged, std::vector<float>(forged.cells, 0.0f), n);
  bytes fewer = in.index;
  const auto first = std::find_if(fewer.begin(), fewer.end(), [](std::byte b) { return b != std::byte{0}; });
  REQUIRE(first != fewer.end());
  *first &= static_cast<std::byte>(std::to_integer<unsigned>(*first) - 1);  // drop its lowest member
  both(fewer, in.plan, in.sketch, n);
  const lossless_homomorphic<float> sum4({.index = lhc_index_coding::sum4});
  bytes odd(sum4.index_bytes(n - 1), std::byte{0});
  odd.back() = std::byte{0x10};  // the nibble past the last element
  const decoding<float> gpu = decode_on(test_gpu(), sum4, odd, sum4.plan_for(n - 1, 0), {}, n - 1);
  const decoding<float> cpu = decode_on(cpu_executor{}, sum4, odd, sum4.plan_for(n - 1, 0), {}, n - 1);
  CHECK(cpu.code == named(errc::malformed_payload));
  CHECK(gpu == cpu);
}
