// TAGC's dynamic sparsifier on the GPU: thresholds equal the CPU's bit for bit for both rules over
// zero fractions, sizes, value types and special inputs; runs of steps over several tensor ids
// (new ids, rule changes, a state saved on one executor and resumed on the other) give the CPU's
// ã, reports and saved states bit for bit. On both executors: a NaN or Inf in g + R is
// non_finite_input and leaves the state's bytes unchanged, and size mismatches are refused.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "cuda/device_io.cuh"
#include "support/data.hpp"
#include "support/errors.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

namespace {

const dynamic_threshold_mode modes[] = {dynamic_threshold_mode::exact, dynamic_threshold_mode::tagc_table};

template <class E, class T>
T threshold_on(const E& exec, const dynamic_sparsifier<T>& sp, const std::vector<T>& a) {
  using memory = executor_memory<E>;
  auto values = memory::copy_in(exec, a);
  auto ws = memory::template poisoned<std::byte>(exec, sp.workspace_bytes(exec, a.size()));
  return sp.threshold(exec, std::span<const T>(memory::span(values)), memory::span(ws));
}

/// What a run of steps gave on one executor: each step's ã (bit patterns) and report, the saved
/// state after each step, and the status of each step.
template <class T>
struct run_record {
  std::vector<std::vector<typename float_traits<T>::bits_type>> outputs;
  std::vector<T> thresholds;
  std::vector<std::uint64_t> kept;
  std::vector<double> zero_fractions;
  std::vector<std::vector<std::byte>> saved;
  std::vector<std::string> statuses;

  friend bool operator==(const run_record&, const run_record&) = default;
};

/// One step of a run: tensor id, gradient, rule.
template <class T>
struct step_input {
  std::uint64_t id;
  std::vector<T> grad;
  dynamic_params params;
};

/// Runs `steps` on `exec` from the saved state `start` (empty: a new state).
template <class E, class T>
run_record<T> run_on(const E& exec, const std::vector<step_input<T>>& steps, const std::vector<std::byte>& start = {}) {
  using memory = executor_memory<E>;
  dynamic_sparsifier<T> sp;
  auto state = sp.make_state(exec);
  if (!start.empty()) sp.load_state(exec, std::span<const std::byte>(start), state);
  run_record<T> record;
  for (const step_input<T>& s : steps) {
    sp.set_params(s.params);
    auto g = memory::copy_in(exec, s.grad);
    auto out = memory::template poisoned<T>(exec, s.grad.size());
    auto ws = memory::template poisoned<std::byte>(exec, sp.workspace_bytes(exec, s.grad.size()));
    dynamic_result<T> result{};
    record.statuses.push_back(thrown_by([&] {
      result = sp.sparsify(exec, state, s.id, std::span<const T>(memory::span(g)), memory::span(out), memory::span(ws));
    }));
    record.outputs.push_back(bit_patterns(memory::copy_out(exec, out, s.grad.size())));
    record.thresholds.push_back(result.threshold);
    record.kept.push_back(result.kept);
    record.zero_fractions.push_back(result.zero_fraction);
    std::vector<std::byte> bytes(sp.saved_state_bytes(state));
    (void)sp.save_state(exec, state, std::span<std::byte>(bytes));
    record.saved.push_back(bytes);
  }
  return record;
}

template <class T>
std::vector<step_input<T>> mixed_steps(std::size_t n) {
  std::vector<step_input<T>> steps;
  const double fractions[] = {0.8, 0.0, 0.5, 0.99, 1.0, 0.8};
  for (std::size_t k = 0; k < 6; ++k) {
    const dynamic_threshold_mode mode = k % 3 == 2 ? dynamic_threshold_mode::tagc_table : dynamic_threshold_mode::exact;
    const input_kind kind = k == 3 ? input_kind::ties : (k == 4 ? input_kind::signed_zeros : input_kind::normal);
    steps.push_back({k % 2, make_input<T>(kind, n, 60 + k), {.zero_fraction = fractions[k], .mode = mode}});
    steps.push_back({7, make_input<T>(input_kind::normal, n / 2 + 1, 70 + k), {.zero_fraction = 0.9, .mode = mode}});
  }
  return steps;
}

const auto bad_steps_change_nothing = [](const auto& exec) {
  std::vector<step_input<float>> steps;
  steps.push_back({1, make_input<float>(input_kind::normal, 3000, 1), {}});
  std::vector<float> with_nan = make_input<float>(input_kind::normal, 3000, 2);
  with_nan[1234] = std::numeric_limits<float>::quiet_NaN();
  steps.push_back({1, with_nan, {}});
  std::vector<float> overflowing = make_input<float>(input_kind::normal, 3000, 3);
  overflowing[5] = std::numeric_limits<float>::infinity();
  steps.push_back({1, overflowing, {.zero_fraction = 0.5, .mode = dynamic_threshold_mode::tagc_table}});
  steps.push_back({2, with_nan, {}});                                             // a new id: nothing allocated
  steps.push_back({1, make_input<float>(input_kind::normal, 2999, 4), {}});      // n differs from the id's
  const run_record<float> record = run_on(exec, steps);
  CHECK(record.statuses[0] == "no exception");
  CHECK(record.statuses[1] == named(errc::non_finite_input));
  CHECK(record.statuses[2] == named(errc::non_finite_input));
  CHECK(record.statuses[3] == named(errc::non_finite_input));
  CHECK(record.statuses[4] == named(errc::size_mismatch));
  for (std::size_t k = 1; k < record.saved.size(); ++k) CHECK(record.saved[k] == record.saved[0]);
};

}  // namespace

GRADCOMP_CUDA_TEST_CASE("dynamic sparsifier thresholds equal the CPU's bit for bit") {
  for (const dynamic_threshold_mode mode : modes)
    for (const double f : {0.0, 0.3, 0.8, 0.99, 1.0})
      for (const std::size_t n : {0u, 1u, 7u, 1000u, 100003u, 1u << 20})
        for (const input_kind kind : all_input_kinds) {
          CAPTURE(static_cast<int>(mode));
          CAPTURE(f);
          CAPTURE(n);
          CAPTURE(name(kind));
          const dynamic_sparsifier<float> sp({.zero_fraction = f, .mode = mode});
          const std::vector<float> x = make_input<float>(kind, n, 80 + n);
          CHECK(to_bits(threshold_on(test_gpu(), sp, x)) == to_bits(threshold_on(cpu_executor{}, sp, x)));
          const dynamic_sparsifier<double> wide({.zero_fraction = f, .mode = mode});
          const std::vector<double> y = make_input<double>(kind, n, 81 + n);
          CHECK(to_bits(threshold_on(test_gpu(), wide, y)) == to_bits(threshold_on(cpu_executor{}, wide, y)));
        }
}

GRADCOMP_CUDA_TEST_CASE(
    "dynamic sparsifier steps give the CPU's outputs, reports and saved states, and resume across executors") {
  for (const std::size_t n : {1u, 1000u, 100003u}) {
    CAPTURE(n);
    const std::vector<step_input<float>> steps = mixed_steps<float>(n);
    const run_record<float> cpu = run_on(cpu_executor{}, steps);
    CHECK(run_on(test_gpu(), steps) == cpu);
    const std::vector<step_input<double>> wide = mixed_steps<double>(n);
    CHECK(run_on(test_gpu(), wide) == run_on(cpu_executor{}, wide));
    // Resume the second half from the state saved after the first half, on the other executor.
    const std::vector<step_input<float>> first(steps.begin(), steps.begin() + 6);
    const std::vector<step_input<float>> second(steps.begin() + 6, steps.end());
    const std::vector<std::byte> halfway = run_on(cpu_executor{}, first).saved.back();
    CHECK(run_on(test_gpu(), second, halfway) == run_on(cpu_executor{}, second, halfway));
    CHECK(run_on(test_gpu(), second, halfway).saved.back() == cpu.saved.back());
  }
}

GRADCOMP_TEST_ON_EXECUTORS(
    "dynamic sparsifier: NaN or Inf in g + R and size mismatches leave the state's bytes unchanged",
    bad_steps_change_nothing)
