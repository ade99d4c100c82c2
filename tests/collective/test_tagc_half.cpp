// TAGC's reduce-scatter of bf16 and fp16 gradients (docs/half-precision.md): the dynamic
// sparsifier keeps float32 residuals and passes float32 values on, so each rank's step is the
// float32 sparsifier's on its widened gradient (checked against a plain loop), and the whole call is
// the float32 scheme's on the widened gradients, run through the same transport: the same residuals
// bit for bit, the same byte counts, and each chunk that float32 result rounded once (the mean
// divided in float32 first); a chunk beyond fp16's range is narrowing_overflow on every rank with
// every residual and output as before; the saved residuals name the 16-bit dtype and load back.
#include <gradcomp/collective/tagc.hpp>
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/transport/in_process.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "support/data.hpp"
#include "support/errors.hpp"
#include "support/executor_io.hpp"
#include "support/reference_check.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

namespace {

/// One rank's record of a step of both schemes: the 16-bit chunk, the float32 chunk, the reports.
struct both_chunks {
  std::vector<std::uint16_t> half;
  std::vector<float> wide;
  tagc_report half_report, wide_report;
};

/// Every residual of a state, bit for bit, by key (−0 and +0 apart).
using residual_bits = std::map<std::uint64_t, std::vector<std::uint32_t>>;
residual_bits bits_of(const std::map<std::uint64_t, std::vector<float>>& residuals) {
  residual_bits bits;
  for (const auto& [key, r] : residuals) bits[key] = bit_patterns(r);
  return bits;
}

/// Runs 4 calls of TAGC over H gradients and of TAGC over their widening, each with its own
/// states, on P in-process ranks; checks after every step that the residuals (bit for bit) and byte
/// counts agree and that each 16-bit chunk is the float32 chunk rounded once. Returns the chunks
/// resent uncompressed after a stall, over all steps and ranks.
template <class H>
std::uint64_t check_tagc_against_float(const tagc_params& params, int P, std::size_t n, bool average) {
  const tagc<H> scheme(params);
  const tagc<float> wide_scheme(params);
  std::vector<tagc_state<H, cpu_executor>> states;
  std::vector<tagc_state<float, cpu_executor>> wide_states;
  for (int r = 0; r < P; ++r) {
    states.push_back(scheme.make_state(cpu_executor{}));
    wide_states.push_back(wide_scheme.make_state(cpu_executor{}));
  }
  std::uint64_t resent = 0;
  for (std::uint64_t step = 0; step < 4; ++step) {
    CAPTURE(step);
    std::vector<both_chunks> got(static_cast<std::size_t>(P));
    in_process_group(P).run([&](in_process_transport& t) {
      const auto r = static_cast<std::size_t>(t.rank());
      const std::vector<H> g = make_half_input<H>(input_kind::normal, n, 100 * step + r, 0.5f);
      const std::vector<float> w = widened(g);
      const std::size_t count = ring_chunk_of(n, P, t.rank()).count;
      std::vector<H> out(count, H{0x7e00});
      std::vector<float> wide_out(count);
      const reduce_scatter_options options{.key = {.step = step, .tensor_id = 3}, .average = average};
      got[r].half_report = compressed_reduce_scatter(cpu_executor{}, t, scheme, states[r], std::span<const H>(g),
                                                     std::span<H>(out), options);
      got[r].wide_report = compressed_reduce_scatter(cpu_executor{}, t, wide_scheme, wide_states[r],
                                                     std::span<const float>(w), std::span<float>(wide_out), options);
      for (const H v : out) got[r].half.push_back(v.bits);
      got[r].wide = wide_out;
    });
    for (int r = 0; r < P; ++r) {
      const both_chunks& c = got[static_cast<std::size_t>(r)];
      std::vector<std::uint16_t> rounded;
      for (const float v : c.wide) rounded.push_back(narrow<H>(v).bits);
      CHECK(c.half == rounded);
      CHECK(c.half_report.sent_bytes == c.wide_report.sent_bytes);
      CHECK(c.half_report.sketch_bytes == c.wide_report.sketch_bytes);
      CHECK(c.half_report.resent_shards == c.wide_report.resent_shards);
      CHECK(c.half_report.kept == c.wide_report.kept);
      CHECK(c.half_report.dense_bytes * 2 == c.wide_report.dense_bytes);
      CHECK(bits_of(states[static_cast<std::size_t>(r)].feedback.residuals) ==
            bits_of(wide_states[static_cast<std::size_t>(r)].feedback.residuals));
      resent += c.half_report.resent_shards;
    }
  }
  return resent;
}

}  // namespace

TEST_CASE_TEMPLATE("16-bit dynamic sparsification is the float32 step on the widened gradient, float32 residuals", H,
                   bf16, fp16) {
  const dynamic_sparsifier<H> sp({.zero_fraction = 0.9});
  constexpr std::size_t n = 70'000;  // above the CPU's sampled-window size
  const auto check_on = [&](const auto& exec) {
    auto state = sp.make_state(exec);
    std::vector<float> residual(n, 0.0f);
    std::vector<std::byte> ws(sp.workspace_bytes(exec, n));
    for (std::uint64_t step = 0; step < 3; ++step) {
      const std::vector<H> g = make_half_input<H>(input_kind::normal, n, 5 + step);
      std::vector<float> out(n);
      const auto result = sp.sparsify(exec, state, 4, std::span<const H>(g), std::span<float>(out), ws);
      // The oracle: a = widen(g) + R in float32, τ* its ⌊0.9·n⌋-th smallest magnitude.
      std::vector<float> a(n);
      for (std::size_t i = 0; i < n; ++i) a[i] = widen(g[i]) + residual[i];
      std::uint64_t below = 0, at_most = 0;
      bool split = true;
      for (std::size_t i = 0; i < n; ++i) {
        below += std::fabs(a[i]) < result.threshold ? 1u : 0u;
        at_most += std::fabs(a[i]) <= result.threshold ? 1u : 0u;
        const bool kept = std::fabs(a[i]) >= result.threshold;
        split = split && to_bits(out[i]) == to_bits(kept ? a[i] : std::copysign(0.0f, a[i])) &&
                to_bits(state.residuals.at(4)[i]) == to_bits(kept ? std::copysign(0.0f, a[i]) : a[i]);
      }
      // τ* is the 63,000th smallest |a| (0-based): ties with it may lie on either side.
      CHECK(below <= 63'000);
      CHECK(at_most > 63'000);
      CHECK(split);
      CHECK(result.kept == n - below);
      residual = state.residuals.at(4);
    }
    // The saved state names the gradient's dtype and holds float32 residuals.
    std::vector<std::byte> saved(dynamic_sparsifier<H>::saved_state_bytes(state));
    REQUIRE(sp.save_state(exec, state, saved) == 37 + 16 + 4 * n + 4);
    CHECK(static_cast<value_dtype>(saved[8]) == dtype_of<H>);
    auto loaded = sp.make_state(exec);
    sp.load_state(exec, saved, loaded);
    CHECK(loaded.residuals == state.residuals);
    CHECK(thrown_by([&] { dynamic_sparsifier<float>().load_state(cpu_executor{}, saved, loaded); }) ==
          named(errc::dtype_mismatch));
    return state.residuals.at(4);
  };
  std::vector<float> from_cpu;
  for (const cpu_executor& cpu : cpu_settings()) from_cpu = check_on(cpu);
  CHECK(bit_patterns(check_on(reference_executor{})) == bit_patterns(from_cpu));
}

TEST_CASE_TEMPLATE("16-bit TAGC is the float32 scheme on the widened gradients, each chunk rounded once", H, bf16,
                   fp16) {
  for (const tagc_schedule schedule : {tagc_schedule::fused, tagc_schedule::per_shard}) {
    for (const int P : {2, 3, 4}) {
      for (const bool average : {false, true}) {
        CAPTURE(static_cast<int>(schedule));
        CAPTURE(P);
        CAPTURE(average);
        tagc_params p;
        p.sparsify.zero_fraction = 0.9;
        p.sketch.block = 64;
        p.schedule = schedule;
        CHECK(check_tagc_against_float<H>(p, P, 10'007, average) == 0);  // ragged chunks with tails
        // One cell per non-zero: owners stall and their chunks are summed again uncompressed.
        p.sketch.cells_per_nonzero = 1.0;
        CHECK(check_tagc_against_float<H>(p, P, 10'007, average) > 0);
      }
    }
  }
}

TEST_CASE("16-bit TAGC: an fp16 chunk beyond 65504 is narrowing_overflow on every rank, nothing changed") {
  // Both ranks hold 60000 at element 9 (kept: it is the largest): its sum is beyond fp16, its mean is not.
  constexpr int P = 2;
  constexpr std::size_t n = 4096;
  tagc_params p;
  p.sketch.block = 64;
  const tagc<fp16> scheme(p);
  std::vector<tagc_state<fp16, cpu_executor>> states;
  for (int r = 0; r < P; ++r) states.push_back(scheme.make_state(cpu_executor{}));
  // A first step leaves residuals, which the failing step must restore.
  std::atomic<int> overflowed{0}, kept{0}, averaged{0};
  in_process_group(P).run([&](in_process_transport& t) {
    auto& state = states[static_cast<std::size_t>(t.rank())];
    std::vector<fp16> g = make_half_input<fp16>(input_kind::normal, n, 70 + static_cast<std::uint64_t>(t.rank()));
    std::vector<fp16> out(ring_chunk_of(n, P, t.rank()).count, fp16{0x3c00});
    (void)compressed_reduce_scatter(cpu_executor{}, t, scheme, state, std::span<const fp16>(g), std::span<fp16>(out));
    g[9] = narrow<fp16>(60000.0f);
    const std::vector<fp16> before = out;
    const auto residuals = state.feedback.residuals;
    if (thrown_by([&] {
          (void)compressed_reduce_scatter(cpu_executor{}, t, scheme, state, std::span<const fp16>(g),
                                          std::span<fp16>(out), {.key = {.step = 1}});
        }) == named(errc::narrowing_overflow))
      ++overflowed;
    if (bit_patterns(out) == bit_patterns(before) && state.feedback.residuals == residuals) ++kept;
    (void)compressed_reduce_scatter(cpu_executor{}, t, scheme, state, std::span<const fp16>(g), std::span<fp16>(out),
                                    {.key = {.step = 1}, .average = true});
    if (t.rank() != 0 || std::fabs(widen(out[9]) - 60000.0f) <= 64.0f) ++averaged;
  });
  CHECK(overflowed.load() == P);
  CHECK(kept.load() == P);
  CHECK(averaged.load() == P);
}
