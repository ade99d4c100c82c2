// Error feedback and LoCo around codecs of bf16 and fp16 gradients (docs/half-precision.md §5). EF: the residual
// is float32; each step's message is the inner codec's encoding of a = widen(g) + e rounded to the
// 16-bit type, and the new residual is exactly fl(a − d) with d the message decoded into float32
// (both recomputed by the test from the codec's public API); Σ d + e_T = Σ g within float32
// rounding; the reference and every cpu setting agree bit for bit; the saved state names the
// gradient's dtype and stores float32 residuals; NaN, ±Inf and an fp16 overflow of g + e reject the
// step and leave the state as it was. LoCo: each message is the inner codec's of h rounded to the
// 16-bit type, the new 8-bit error is within half a step of β·e + (1 − β)·(h − d), every backend
// agrees bit for bit, and the saved state names the dtype with float32 scales.
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/feedback/error_feedback.hpp>
#include <gradcomp/feedback/loco.hpp>
#include <gradcomp/pipeline.hpp>
#include <gradcomp/quantize/qsgd.hpp>
#include <gradcomp/quantize/sign.hpp>
#include <gradcomp/quantize/uniform.hpp>
#include <gradcomp/sketch/count_sketch.hpp>
#include <gradcomp/sparsify/threshold.hpp>
#include <gradcomp/sparsify/topk.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "support/codec_io.hpp"
#include "support/data.hpp"
#include "support/errors.hpp"
#include "support/executor_io.hpp"
#include "support/reference_check.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

namespace {

// One error-feedback wrapper stepped on executor E, with its buffers.
template <class Codec, class E>
struct ef_run {
  using H = typename Codec::value_type;
  error_feedback<Codec> ef;
  E exec;
  typename error_feedback<Codec>::state_type state;
  std::vector<std::byte> ws;

  ef_run(const error_feedback<Codec>& wrapper, E e, std::size_t n)
      : ef(wrapper), exec(e), state(ef.make_state(exec, n)), ws(ef.workspace_bytes(exec, n)) {}

  // One step: the message, or the named error (and an empty message).
  outcome<std::byte> step(const std::vector<H>& g, message_key key) {
    std::vector<std::byte> out(ef.max_encoded_bytes(g.size()));
    std::size_t bytes = 0;
    const std::string status = thrown_by([&] { bytes = ef.encode(exec, std::span<const H>(g), state, out, ws, key); });
    out.resize(status == "no exception" ? bytes : 0);
    return {status, out};
  }

  std::vector<float> residual() const {
    std::vector<float> r(state.residual.size());
    ef.carried_error(exec, state, std::span<float>(r));
    return r;
  }
};

template <class Codec>
void check_half_error_feedback(const Codec& inner, std::size_t n, double decay) {
  using H = typename Codec::value_type;
  const error_feedback<Codec> ef(inner, {.decay = decay});
  const float beta = ef.decay();
  ef_run<Codec, reference_executor> reference(ef, {}, n);
  std::vector<ef_run<Codec, cpu_executor>> cpus;
  for (const cpu_executor& cpu : cpu_settings()) cpus.emplace_back(ef, cpu, n);
  std::vector<double> sum_decoded(n, 0.0), sum_grad(n, 0.0), sum_decayed(n, 0.0), bound(n, 0.0);
  std::uint64_t wrong_messages = 0, wrong_residuals = 0, disagreements = 0;
  const double u = std::numeric_limits<float>::epsilon() / 2;
  for (std::uint64_t t = 0; t < 12; ++t) {
    const std::vector<H> g = make_half_input<H>(input_kind::normal, n, 50 + t, 100.0f);
    const message_key key{.step = t, .tensor_id = 9};
    const std::vector<float> before = reference.residual();
    const outcome<std::byte> message = reference.step(g, key);
    REQUIRE(message.status == "no exception");
    // The test's own step: a in float32, rounded to H, the inner codec's message and its decoding.
    std::vector<float> a(n);
    std::vector<H> rounded(n);
    for (std::size_t i = 0; i < n; ++i) {
      a[i] = widen(g[i]) + before[i];
      rounded[i] = narrow<H>(a[i]);
    }
    const std::vector<std::byte> expected = encode_bytes(inner, rounded, key);
    wrong_messages += message.output != expected;
    std::vector<float> d(n);
    std::vector<std::byte> inner_ws(inner.workspace_bytes(cpu_executor{}, n));
    inner.decode(cpu_executor{}, expected, std::span<float>(d), inner_ws);
    const std::vector<float> after = reference.residual();
    for (std::size_t i = 0; i < n; ++i) {
      const float r = a[i] - d[i];
      volatile float product = beta * r;  // rounded to float here, whatever the contraction flags
      const float want = beta == 1.0f ? r : float{product};
      wrong_residuals += to_bits(after[i]) != to_bits(want);
      sum_decoded[i] += d[i];
      sum_grad[i] += widen(g[i]);
      sum_decayed[i] += static_cast<double>(r) - static_cast<double>(after[i]);
      bound[i] += u * (std::fabs(a[i]) + std::fabs(r)) + 1e-15 * (std::fabs(d[i]) + std::fabs(widen(g[i])));
    }
    for (auto& cpu : cpus) {
      const outcome<std::byte> m = cpu.step(g, key);
      disagreements += m.status != message.status || m.output != message.output ||
                       bit_patterns(cpu.residual()) != bit_patterns(after);
    }
  }
  CHECK(wrong_messages == 0);
  CHECK(wrong_residuals == 0);
  CHECK(disagreements == 0);
  // Nothing lost: Σ d + e_T + what the decay removed = Σ g, within float32's rounding of a and r.
  const std::vector<float> last = reference.residual();
  std::size_t outside = 0;
  for (std::size_t i = 0; i < n; ++i)
    outside += std::fabs(sum_decoded[i] + last[i] + sum_decayed[i] - sum_grad[i]) > 4 * bound[i] + 1e-30;
  CHECK(outside == 0);
}

}  // namespace

TEST_CASE_TEMPLATE("error feedback of 16-bit gradients keeps a float32 residual, exactly as documented", H, bf16,
                   fp16) {
  const std::size_t n = 3000;
  check_half_error_feedback(topk_sparsifier<H>(sparsity{.density = 0.01}), n, 1.0);
  check_half_error_feedback(topk_sparsifier<H>(sparsity{.density = 0.05}), n, 0.9);
  check_half_error_feedback(uniform_quantizer<H>({.bits = 4}), n, 1.0);
  check_half_error_feedback(uniform_quantizer<H>({.bits = 8, .block = 64}), n, 1.0);
  check_half_error_feedback(sign_quantizer<H>({.block = 128}), n, 1.0);
  check_half_error_feedback(qsgd_quantizer<H>({.levels = 7, .bucket = 128, .seed = 2}), n, 1.0);
  check_half_error_feedback(threshold_sparsifier<H>({.target = {.density = 0.02}, .seed = 3}), n, 1.0);
  check_half_error_feedback(count_sketch<H>({.rows = 3, .columns = 512, .seed = 6, .heavy_hitters = {.density = 0.02}}),
                            n, 1.0);
  check_half_error_feedback(pipeline(topk_sparsifier<H>(sparsity{.density = 0.02}),
                                     uniform_quantizer<H>({.bits = 8, .block = 32})),
                            n, 1.0);
}

TEST_CASE_TEMPLATE("a 16-bit gradient's error-feedback state saves its dtype and float32 residuals", H, bf16, fp16) {
  const std::size_t n = 500;
  const error_feedback<topk_sparsifier<H>> ef(topk_sparsifier<H>(sparsity{.density = 0.02}));
  const cpu_executor cpu;
  auto state = ef.make_state(cpu, n);
  std::vector<std::byte> out(ef.max_encoded_bytes(n)), ws(ef.workspace_bytes(cpu, n));
  const std::vector<H> g = make_half_input<H>(input_kind::normal, n, 3, 100.0f);
  (void)ef.encode(cpu, std::span<const H>(g), state, out, ws, {.step = 1});
  std::vector<std::byte> saved(error_feedback<topk_sparsifier<H>>::saved_state_bytes(n));
  CHECK(saved.size() == 37 + 4 * n + 4);
  CHECK(ef.save_state(cpu, state, saved) == saved.size());
  CHECK(std::to_integer<int>(saved[8]) == static_cast<int>(dtype_of<H>));
  auto restored = ef.make_state(cpu, n);
  ef.load_state(cpu, saved, restored);
  CHECK(bit_patterns(restored.residual) == bit_patterns(state.residual));
  CHECK(restored.steps == 1);
  // A float gradient's wrapper refuses it (another dtype, with the same residual size).
  const error_feedback<topk_sparsifier<float>> wide(topk_sparsifier<float>(sparsity{.density = 0.02}));
  auto wide_state = wide.make_state(cpu, n);
  CHECK(thrown_by([&] { wide.load_state(cpu, saved, wide_state); }) == named(errc::dtype_mismatch));
}

TEST_CASE_TEMPLATE("a 16-bit step with NaN, Inf, or g + e beyond fp16's range is rejected and changes nothing", H, bf16,
                   fp16) {
  const std::size_t n = 256;
  const error_feedback<uniform_quantizer<H>> ef(uniform_quantizer<H>({.bits = 2}));
  for (const int exec_run : {0, 1}) {
    const auto check_on = [&](const auto& exec) {
      ef_run<uniform_quantizer<H>, std::decay_t<decltype(exec)>> run(ef, exec, n);
      REQUIRE(run.step(make_half_input<H>(input_kind::normal, n, 1, 100.0f), {.step = 0}).status == "no exception");
      const std::vector<float> before = run.residual();
      std::vector<H> bad = make_half_input<H>(input_kind::normal, n, 2, 100.0f);
      bad[7] = H{static_cast<std::uint16_t>(float_traits<H>::infinity_key + 2)};
      CHECK(run.step(bad, {.step = 1}).status == named(errc::non_finite_input));
      CHECK(bit_patterns(run.residual()) == bit_patterns(before));
      CHECK(run.state.steps == 1);
      if constexpr (std::is_same_v<H, fp16>) {
        // A residual near 65504 plus a gradient of 60000: a = 1.2e5 rounds to Inf in fp16.
        std::vector<float> large(n, 0.0f);
        large[3] = 65000.0f;
        run.ef.set_carried_error(run.exec, std::span<const float>(large), run.state);
        std::vector<H> g(n, narrow<H>(0.0f));
        g[3] = narrow<H>(60000.0f);
        CHECK(run.step(g, {.step = 2}).status == named(errc::non_finite_input));
        CHECK(bit_patterns(run.residual()) == bit_patterns(large));
      }
    };
    if (exec_run == 0) check_on(reference_executor{});
    else
      check_on(cpu_executor{});
  }
}

namespace {

// LoCo stepped on the reference and every cpu setting: the same messages and errors bit for bit;
// each message is the inner codec's encoding of h = widen(g) + e rounded to the 16-bit type, and
// the new error is v = β·e + (1 − β)·(h − d) stored in 8 bits: within half of its group's step.
template <class Codec>
void check_half_loco(const Codec& inner, std::size_t n) {
  using H = typename Codec::value_type;
  const loco<Codec> lc(inner, {.beta = 0.8f, .reset_period = 5, .error_group = 64});
  const reference_executor ref;
  auto state = lc.make_state(ref, n);
  std::vector<std::byte> ws(lc.workspace_bytes(ref, n));
  std::vector<typename loco<Codec>::state_type> cpu_states;
  for (const cpu_executor& cpu : cpu_settings()) cpu_states.push_back(lc.make_state(cpu, n));
  std::uint64_t wrong_messages = 0, far_errors = 0, disagreements = 0;
  for (std::uint64_t t = 0; t < 9; ++t) {  // a reset at step 5
    const std::vector<H> g = make_half_input<H>(input_kind::normal, n, 80 + t, 100.0f);
    const message_key key{.step = t, .tensor_id = 2};
    std::vector<float> e(n);
    lc.carried_error(ref, state, std::span<float>(e));
    const bool reset = state.steps >= 5;
    std::vector<float> h(n);
    std::vector<H> rounded(n);
    for (std::size_t i = 0; i < n; ++i) {
      h[i] = widen(g[i]) + (reset ? 0.0f : e[i]);
      rounded[i] = narrow<H>(h[i]);
    }
    std::vector<std::byte> out(lc.max_encoded_bytes(n));
    out.resize(lc.encode(ref, std::span<const H>(g), state, out, ws, key));
    const std::vector<std::byte> expected = encode_bytes(inner, rounded, key);
    wrong_messages += out != expected;
    std::vector<float> d(n), after(n);
    std::vector<std::byte> inner_ws(inner.workspace_bytes(cpu_executor{}, n));
    inner.decode(cpu_executor{}, expected, std::span<float>(d), inner_ws);
    lc.carried_error(ref, state, std::span<float>(after));
    for (std::size_t begin = 0; begin < n; begin += 64) {
      const std::size_t end = std::min(n, begin + 64);
      std::vector<double> v(end - begin);
      double largest = 0;
      for (std::size_t i = begin; i < end; ++i) {
        v[i - begin] = 0.8 * (reset ? 0.0 : e[i]) + 0.2 * (static_cast<double>(h[i]) - d[i]);
        largest = std::max(largest, std::fabs(v[i - begin]));
      }
      for (std::size_t i = begin; i < end; ++i)
        far_errors += std::fabs(after[i] - v[i - begin]) > largest / 127 / 2 * 1.01 + 1e-6 * largest;
    }
    for (std::size_t c = 0; c < cpu_states.size(); ++c) {
      const cpu_executor cpu = cpu_settings()[c];
      std::vector<std::byte> cws(lc.workspace_bytes(cpu, n)), cout(lc.max_encoded_bytes(n));
      cout.resize(lc.encode(cpu, std::span<const H>(g), cpu_states[c], cout, cws, key));
      std::vector<float> ce(n);
      lc.carried_error(cpu, cpu_states[c], std::span<float>(ce));
      disagreements += cout != out || bit_patterns(ce) != bit_patterns(after);
    }
  }
  CHECK(wrong_messages == 0);
  CHECK(far_errors == 0);
  CHECK(disagreements == 0);
  // The saved state names the gradient's dtype; its scales are float32.
  std::vector<std::byte> saved(lc.saved_state_bytes(n));
  CHECK(lc.save_state(ref, state, saved) == saved.size());
  CHECK(saved.size() == 57 + n + (n + 63) / 64 * 4 + 4);
  CHECK(std::to_integer<int>(saved[8]) == static_cast<int>(dtype_of<H>));
  auto restored = lc.make_state(ref, n);
  lc.load_state(ref, saved, restored);
  CHECK(restored.codes == state.codes);
  CHECK(bit_patterns(restored.scales) == bit_patterns(state.scales));
}

}  // namespace

TEST_CASE_TEMPLATE("LoCo of 16-bit gradients keeps a float32-scaled 8-bit error, exactly as documented", H, bf16,
                   fp16) {
  check_half_loco(uniform_quantizer<H>({.bits = 4}), 2000);
  check_half_loco(uniform_quantizer<H>({.bits = 2, .block = 64}), 1000);
  check_half_loco(topk_sparsifier<H>(sparsity{.density = 0.05}), 1000);
}
