// Error feedback and LoCo on the GPU: every step's message, carried error and saved state equal
// reference_executor's bit for bit (one-kernel paths and reference paths, with and without error feedback's
// decay, resets, magnitudes that send LoCo down its reference steps); and on both executors the EF
// invariant holds (each decayed residual exactly fl(β·(a − d))), a NaN step leaves the
// state as it was and no message behind, states saved on one executor resume on the other, and
// set_carried_error rejects NaN.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "cuda/device_io.cuh"
#include "support/data.hpp"
#include "support/ef_invariant.hpp"
#include "support/errors.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

namespace {

/// Runs `steps` steps of the same gradients on the reference and the GPU and compares every
/// message and every carried error, and the saved states at the end.
template <class Wrapper>
void check_steps_match_reference(const Wrapper& wrapper, std::size_t n, std::uint64_t steps, double scale = 1.0) {
  using T = typename Wrapper::value_type;
  stepper<reference_executor, Wrapper> cpu({}, wrapper, n);
  stepper<cuda_executor, Wrapper> gpu(test_gpu(), wrapper, n);
  for (std::uint64_t t = 0; t < steps; ++t) {
    CAPTURE(t);
    // Scaled gradients stay N(0, 1e-3·scale): finite, and above FLT_MAX/16 for scale 1e40.
    std::vector<T> g = make_input<T>(t % 3 == 2 && scale == 1.0 ? input_kind::ties : input_kind::normal, n, 500 + t);
    for (T& v : g) v = static_cast<T>(static_cast<double>(v) * scale);
    const message_key key{.step = t, .tensor_id = 4};
    CHECK(gpu.step(g, key) == cpu.step(g, key));
    CHECK(bit_patterns(gpu.carried_error()) == bit_patterns(cpu.carried_error()));
  }
  CHECK(gpu.state().steps == cpu.state().steps);
  CHECK(gpu.save() == cpu.save());
}

template <class Wrapper>
void check_nan_step_keeps_state(const auto& exec, const Wrapper& wrapper) {
  using T = typename Wrapper::value_type;
  using E = std::decay_t<decltype(exec)>;
  constexpr std::size_t n = 2000;
  stepper<E, Wrapper> run(exec, wrapper, n);
  stepper<E, Wrapper> clean(exec, wrapper, n);
  for (std::uint64_t t = 0; t < 3; ++t) {
    const std::vector<T> g = make_input<T>(input_kind::normal, n, 70 + t);
    CHECK(run.step(g, {.step = t}) == clean.step(g, {.step = t}));
  }
  const std::vector<std::byte> saved = run.save();
  std::vector<T> bad = make_input<T>(input_kind::normal, n, 80);
  bad[1234] = std::numeric_limits<T>::quiet_NaN();
  const outcome<std::byte> failed = run.try_step(bad, {.step = 3});
  CHECK(failed.status == named(errc::non_finite_input));
  CHECK(thrown_by([&] { (void)parse_envelope(failed.output); }) != "no exception");  // no message passes for this step
  CHECK(run.save() == saved);  // residual or error, and the step counters, untouched
  const std::vector<T> g = make_input<T>(input_kind::normal, n, 81);
  CHECK(run.step(g, {.step = 3}) == clean.step(g, {.step = 3}));
}

const auto nan_step_keeps_state = [](const auto& exec) {
  check_nan_step_keeps_state(exec, error_feedback(uniform_quantizer<float>({.bits = 8})));  // one kernel
  check_nan_step_keeps_state(exec, error_feedback(uniform_quantizer<double>({.bits = 2, .block = 7})));  // plain steps
  check_nan_step_keeps_state(exec, error_feedback(sign_quantizer<float>()));
  check_nan_step_keeps_state(exec, loco(uniform_quantizer<float>({.bits = 4})));  // one kernel
  check_nan_step_keeps_state(exec, loco(uniform_quantizer<float>({.bits = 4, .block = 100})));  // plain steps
};

/// 1-bit stochastic rounding decodes a value to ±s, s = max|a| of its block, with either sign: a
/// value of −m/2 decoded to +m leaves −1.5·m, which overflows for m near the largest float. The
/// step is refused, no message passes for it and the state stays (the CPU half also checks that
/// this draw does overflow).
const auto residual_overflow_is_refused = [](const auto& exec) {
  using E = std::decay_t<decltype(exec)>;
  const error_feedback<uniform_quantizer<float>> ef(
      uniform_quantizer<float>({.bits = 1, .block = 64, .round = rounding::stochastic, .seed = 5}));
  constexpr std::size_t n = 256;
  stepper<E, error_feedback<uniform_quantizer<float>>> run(exec, ef, n);
  (void)run.step(std::vector<float>(n, 0.0f), {.step = 0, .tensor_id = 3});
  const std::vector<std::byte> saved = run.save();
  const float m = std::numeric_limits<float>::max() * 0.9f;
  std::vector<float> g(n, -m / 2);
  g[0] = m;
  const outcome<std::byte> failed = run.try_step(g, {.step = 1, .tensor_id = 3});
  CHECK(failed.status == named(errc::non_finite_input));
  CHECK(thrown_by([&] { (void)parse_envelope(failed.output); }) != "no exception");
  CHECK(run.save() == saved);
};

const auto ef_invariant_holds = [](const auto& exec) {
  check_ef_invariant(uniform_quantizer<float>({.bits = 4}), 3000, 20, 11, 1, exec);
  check_ef_invariant(uniform_quantizer<double>({.bits = 8, .block = 33, .round = rounding::stochastic, .seed = 2}),
                     1000, 20, 12, 2, exec);
  check_ef_invariant(qsgd_quantizer<float>({.levels = 7, .seed = 3}), 2000, 20, 13, 3, exec);
  check_ef_invariant(uniform_quantizer<float>({.bits = 4}), 3000, 20, 11, 1, exec, 0.9);  // one kernel
  check_ef_invariant(uniform_quantizer<double>({.bits = 8, .block = 33, .round = rounding::stochastic, .seed = 2}),
                     1000, 20, 12, 2, exec, 0.5);  // plain steps
  check_ef_invariant(topk_sparsifier<float>(sparsity{.density = 0.01}), 3000, 20, 14, 4, exec, 0.9);
  check_ef_invariant(sign_quantizer<double>({.block = 64}), 1000, 20, 15, 5, exec, 0.5);
};

const auto carried_error_round_trips = [](const auto& exec) {
  using E = std::decay_t<decltype(exec)>;
  const error_feedback<uniform_quantizer<float>> ef(uniform_quantizer<float>({.bits = 4}));
  stepper<E, error_feedback<uniform_quantizer<float>>> run(exec, ef, 1000);
  const std::vector<float> e = make_input<float>(input_kind::normal, 1000, 3);
  CHECK(run.set_carried_error(e) == "no exception");
  CHECK(bit_patterns(run.carried_error()) == bit_patterns(e));
  std::vector<float> bad = e;
  bad[10] = std::numeric_limits<float>::infinity();
  CHECK(run.set_carried_error(bad) == named(errc::non_finite_input));
  CHECK(bit_patterns(run.carried_error()) == bit_patterns(e));

  const loco<uniform_quantizer<float>> lc(uniform_quantizer<float>({.bits = 4}));
  stepper<E, loco<uniform_quantizer<float>>> l(exec, lc, 1000);
  CHECK(l.set_carried_error(e) == "no exception");
  stepper<reference_executor, loco<uniform_quantizer<float>>> reference({}, lc, 1000);
  CHECK(reference.set_carried_error(e) == "no exception");
  CHECK(bit_patterns(l.carried_error()) == bit_patterns(reference.carried_error()));
};

}  // namespace

GRADCOMP_CUDA_TEST_CASE("error feedback steps equal the reference's: messages, residuals and saved states") {
  check_steps_match_reference(error_feedback(uniform_quantizer<float>({.bits = 8})), 5000, 8);
  check_steps_match_reference(error_feedback(uniform_quantizer<float>(
                                  {.bits = 4, .block = 64, .round = rounding::stochastic, .seed = 9})),
                              4099, 8);
  check_steps_match_reference(error_feedback(uniform_quantizer<double>({.bits = 8})), 3000, 6);
  check_steps_match_reference(error_feedback(uniform_quantizer<double>({.bits = 2, .block = 7})), 1001, 6);
  check_steps_match_reference(error_feedback(sign_quantizer<float>({.block = 128})), 3000, 8);
  check_steps_match_reference(error_feedback(qsgd_quantizer<double>({.levels = 3, .bucket = 50, .seed = 4})), 2000, 6);
  check_steps_match_reference(error_feedback(uniform_quantizer<float>({.bits = 8}, {.payload_checksum = true})), 1000,
                              3);
  // With decay: the one-kernel path, the plain steps, and a sparsifier.
  check_steps_match_reference(error_feedback(uniform_quantizer<float>({.bits = 8}), {.decay = 0.9}), 5000, 8);
  check_steps_match_reference(error_feedback(uniform_quantizer<double>({.bits = 2, .block = 7}), {.decay = 0.5}), 1001,
                              6);
  check_steps_match_reference(error_feedback(sign_quantizer<float>({.block = 128}), {.decay = 0.9}), 3000, 8);
  check_steps_match_reference(error_feedback(topk_sparsifier<float>(sparsity{.density = 0.01}), {.decay = 0.9}), 3000,
                              8);
}

GRADCOMP_CUDA_TEST_CASE("LoCo steps equal the reference's, resets and large magnitudes included") {
  const loco_params period4{.beta = 0.8f, .reset_period = 4, .error_group = 256};
  check_steps_match_reference(loco(uniform_quantizer<float>({.bits = 4}), period4), 5000, 10);
  check_steps_match_reference(loco(uniform_quantizer<float>(
                                       {.bits = 8, .block = 64, .round = rounding::stochastic, .seed = 5}),
                                   {.beta = 0.5f, .reset_period = 3, .error_group = 64}),
                              4099, 8);
  check_steps_match_reference(loco(uniform_quantizer<double>({.bits = 4})), 3000, 6);
  check_steps_match_reference(loco(uniform_quantizer<float>({.bits = 4}), {.error_group = 100}), 3000,
                              6);  // groups ≠ blocks
  check_steps_match_reference(loco(sign_quantizer<float>()), 3000, 6);
  // Gradients near FLT_MAX/16: the one-kernel step declines and the plain steps run.
  check_steps_match_reference(loco(uniform_quantizer<float>({.bits = 4})), 2000, 4, 1e40);
}

GRADCOMP_CUDA_TEST_CASE("states saved on the CPU resume on the GPU and the other way round") {
  const auto resume = [](const auto& wrapper) {
    using W = std::decay_t<decltype(wrapper)>;
    using T = typename W::value_type;
    constexpr std::size_t n = 3000;
    stepper<cpu_executor, W> cpu({}, wrapper, n);
    stepper<cuda_executor, W> gpu(test_gpu(), wrapper, n);
    for (std::uint64_t t = 0; t < 3; ++t) (void)cpu.step(make_input<T>(input_kind::normal, n, 40 + t), {.step = t});
    CHECK(gpu.load(cpu.save()) == "no exception");
    stepper<cpu_executor, W> back({}, wrapper, n);
    for (std::uint64_t t = 3; t < 6; ++t) {
      const std::vector<T> g = make_input<T>(input_kind::normal, n, 40 + t);
      CHECK(gpu.step(g, {.step = t}) == cpu.step(g, {.step = t}));
    }
    CHECK(back.load(gpu.save()) == "no exception");
    CHECK(back.save() == cpu.save());
    std::vector<std::byte> damaged = cpu.save();
    damaged[damaged.size() - 9] ^= std::byte{1};
    const std::vector<std::byte> before = gpu.save();
    CHECK(gpu.load(damaged) == named(errc::payload_checksum));
    CHECK(gpu.save() == before);
  };
  resume(error_feedback(uniform_quantizer<float>({.bits = 8})));
  resume(error_feedback(uniform_quantizer<float>({.bits = 8}), {.decay = 0.9}));
  resume(loco(uniform_quantizer<float>({.bits = 4})));
}

GRADCOMP_TEST_ON_EXECUTORS("feedback: a NaN step is non_finite_input, leaves the state and no message",
                           nan_step_keeps_state)
GRADCOMP_TEST_ON_EXECUTORS("error feedback: a new residual that overflows is refused, with no message left",
                           residual_overflow_is_refused)
GRADCOMP_TEST_ON_EXECUTORS("error feedback: decoded messages plus the residual sum to the gradients",
                           ef_invariant_holds)
GRADCOMP_TEST_ON_EXECUTORS("feedback: carried errors are set, read back, and NaN is refused", carried_error_round_trips)
