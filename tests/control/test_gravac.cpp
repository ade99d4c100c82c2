// The GraVAC controller against traces computed by hand (in the comments: each EWMA, gain and
// throughput), the back-off, rank agreement through the in-process transport, steps that would
// divide 0 by 0, option and observation validation, and checkpoints.
#include <gradcomp/control/gravac.hpp>
#include <gradcomp/core/crc32c.hpp>
#include <gradcomp/transport/in_process.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "support/errors.hpp"
#include "support/oracles.hpp"

namespace gradcomp::test {
namespace {

// One scripted step and the decision expected for the step after it.
struct trace_step {
  gravac_observation observed;
  gravac_choice send;                  // what the next step sends
  double theta_current;                // the next step's candidate density
  std::optional<double> gain_current;  // expected gains after this step
  double gain_safe;
  bool searching;
};

void check_trace(gravac_controller& controller, const std::vector<trace_step>& trace) {
  for (std::size_t t = 0; t < trace.size(); ++t) {
    CAPTURE(t);
    const auto& s = trace[t];
    const gravac_decision d = controller.next(s.observed);
    CHECK(d == controller.decision());
    CHECK(d.send == s.send);
    CHECK(d.current.density == doctest::Approx(s.theta_current));
    CHECK(d.safe.density == controller.options().theta_min);
    REQUIRE(d.gain_current.has_value() == s.gain_current.has_value());
    if (s.gain_current) CHECK(*d.gain_current == doctest::Approx(*s.gain_current));
    REQUIRE(d.gain_safe.has_value());
    CHECK(*d.gain_safe == doctest::Approx(s.gain_safe));
    CHECK(d.searching == s.searching);
    const auto sent = d.sent();
    CHECK(sent.has_value() == (s.send != gravac_choice::dense));
    if (s.send == gravac_choice::current) CHECK(*sent == d.current);
    if (s.send == gravac_choice::safe) CHECK(*sent == d.safe);
  }
}

// W = 2 and α = 0.5: with two samples the EWMA is (newest + 0.5·previous) / 1.5, with one it is
// the sample. The gradient's magnitude stays 10 until step 8, so a gain is EWMA / 10.
gravac_options trace_a_options() {
  return {
      .theta_min = 0.1, .theta_max = 0.0125, .step = 0.5, .epsilon = 0.75, .omega = 0.05, .window = 2, .alpha = 0.5};
}

std::vector<trace_step> trace_a() {
  using enum gravac_choice;
  return {
      // Step 0 (sent: safe, the first decision). Gains 0.9; CT(0.1) += 100/1·0.9 = 90.
      // θ_cur = θ_min, so the candidates coincide: safe.
      {{10, 9, 9, 1, 100}, safe, 0.1, 0.9, 0.9, true},
      // Step 1 (safe). Safe EWMA (8 + 4.5)/1.5 = 8.333; CT(0.1) += 83.33, mean 86.67. End of
      // window 1: one throughput only, so θ_cur = 0.05 and its EWMA restarts: not yet judged.
      {{10, 8, 8, 1, 100}, safe, 0.05, std::nullopt, 12.5 / 15, true},
      // Step 2 (safe). Safe (9 + 4)/1.5 = 8.667; CT(0.1) += 86.67, mean 86.67. Candidate 8 → 0.8.
      {{10, 8, 9, 1, 100}, current, 0.05, 0.8, 13.0 / 15, true},
      // Step 3 (current, 0.05). Candidate (7 + 4)/1.5 = 7.333 → 0.7333 (below ε, so the next
      // step would fall back to safe, 0.9); CT(0.05) = 200·0.7333 = 146.67. End of window 2:
      // 146.67 − 86.67 = 60 ≥ 0.05·86.67, no plateau; θ_cur = 0.025, not yet judged.
      {{10, 7, 9, 0.5, 100}, safe, 0.025, std::nullopt, 0.9, true},
      // Step 4 (safe). Untimed (0 s): no throughput. Candidate 8 → 0.8.
      {{10, 8, 9, 0, 100}, current, 0.025, 0.8, 0.9, true},
      // Step 5 (current, 0.025). Candidate (7.5 + 4)/1.5 = 7.667 → 0.7667; CT(0.025) = 153.33.
      // End of window 3: best two 153.33 and 146.67 differ by 6.67 < 0.05·146.67 = 7.33, a
      // plateau: keep the smaller θ, 0.025, and stop searching.
      {{10, 7.5, 9, 0.5, 100}, current, 0.025, 11.5 / 15, 0.9, false},
      // Step 6. Candidate (6 + 3.75)/1.5 = 6.5 → 0.65 < ε; safe 0.9: safe.
      {{10, 6, 9, 1, 100}, safe, 0.025, 0.65, 0.9, false},
      // Step 7. Candidate (6 + 3)/1.5 = 6 → 0.6; safe (6 + 4.5)/1.5 = 7 → 0.7: dense.
      {{10, 6, 6, 1, 100}, dense, 0.025, 0.6, 0.7, false},
      // Step 8. Gradient (0 + 5)/1.5 = 3.333; both compressed (0 + 3)/1.5 = 2 → 0.6: dense.
      {{0, 0, 0, 1, 100}, dense, 0.025, 0.6, 0.6, false},
      // Step 9. Gradient EWMA 0: gains are defined as 1, the candidate goes.
      {{0, 0, 0, 1, 100}, current, 0.025, 1.0, 1.0, false},
  };
}

TEST_CASE("gravac first decision sends the safe density before any observation") {
  const gravac_controller controller(trace_a_options());
  const gravac_decision& d = controller.decision();
  CHECK(d.send == gravac_choice::safe);
  CHECK(d.current.density == 0.1);
  CHECK(d.safe.density == 0.1);
  CHECK_FALSE(d.gain_current.has_value());
  CHECK_FALSE(d.gain_safe.has_value());
  CHECK(d.searching);
  CHECK(controller.steps() == 0);
}

TEST_CASE("gravac decisions follow the hand-computed trace through search plateau and fallbacks") {
  gravac_controller controller(trace_a_options());
  check_trace(controller, trace_a());
  CHECK(controller.steps() == 10);
}

TEST_CASE("gravac search ending at theta_max with dense best falls back to theta_min") {
  using enum gravac_choice;
  // W = 1: the EWMA is the latest sample and every step closes a window.
  gravac_controller controller({.theta_min = 0.1, .theta_max = 0.025, .window = 1, .alpha = 0.5});
  check_trace(controller, {
                              // Step 0 (safe): gain 0.5, CT(0.1) = 50. θ_cur = 0.05, not judged; safe < ε: dense.
                              {{10, 5, 5, 1, 100}, dense, 0.05, std::nullopt, 0.5, true},
                              // Step 1 (dense, gain 1): CT(1) = 400. 400 vs 50: no plateau; θ_cur = 0.025.
                              {{10, 4, 5, 0.25, 100}, dense, 0.025, std::nullopt, 0.5, true},
                              // Step 2 (dense): CT(1) mean (400 + 200)/2 = 300, still far above 50. θ_max's
                              // window is done: the best is dense, so θ_cur = θ_min (coinciding, not judged).
                              {{10, 8, 9, 0.5, 100}, safe, 0.1, std::nullopt, 0.9, false},
                              // Step 3: candidates coincide, so the safe path goes even with gain 1.
                              {{10, 10, 10, 1, 100}, safe, 0.1, 1.0, 1.0, false},
                          });
}

// trace_a's options with the back-off: W = 2, α = 0.5, the gradient's magnitude always 10, so a
// gain is EWMA / 10.
gravac_options back_off_options() {
  gravac_options options = trace_a_options();
  options.back_off = true;
  return options;
}

std::vector<trace_step> back_off_trace() {
  using enum gravac_choice;
  return {
      // Step 0 (safe). Gains 0.9; CT(0.1) += 100/1·0.9 = 90.
      {{10, 9, 9, 1, 100}, safe, 0.1, 0.9, 0.9, true},
      // Step 1 (safe). End of window 1: θ_cur = θ_min, nothing to back off from; one throughput
      // only, so the search moves on: θ_cur = 0.05, not yet judged.
      {{10, 9, 9, 1, 100}, safe, 0.05, std::nullopt, 0.9, true},
      // Step 2 (safe, CT(0.1) += 90). Candidate 8 → 0.8 ≥ ε.
      {{10, 8, 9, 1, 100}, current, 0.05, 0.8, 0.9, true},
      // Step 3 (current, 0.05). Candidate (8 + 4)/1.5 = 8 → 0.8; CT(0.05) = 200·0.8 = 160.
      // End of window 2: gain 0.8 ≥ ε, no back-off; 160 − 90 ≥ 0.05·90, no plateau; θ_cur = 0.025.
      {{10, 8, 9, 0.5, 100}, safe, 0.025, std::nullopt, 0.9, true},
      // Step 4 (safe, CT(0.1) += 90). Candidate 7 → 0.7 < ε: safe.
      {{10, 7, 9, 1, 100}, safe, 0.025, 0.7, 0.9, true},
      // Step 5 (safe). Candidate (7 + 3.5)/1.5 = 7 → 0.7. End of window 3: below ε, so θ_cur =
      // 0.025 / 0.5 = 0.05 (the last density that passed) and the search stops.
      {{10, 7, 9, 1, 100}, safe, 0.05, std::nullopt, 0.9, false},
      // Step 6 (safe). Candidate 8 → 0.8: current.
      {{10, 8, 9, 1, 100}, current, 0.05, 0.8, 0.9, false},
      // Step 7 (current). Candidate (7 + 4)/1.5 = 7.333 → 0.7333 < ε. End of the window after
      // the search: θ_cur = min(0.05 / 0.5, θ_min) = θ_min, which coincides with the safe level.
      {{10, 7, 9, 1, 100}, safe, 0.1, std::nullopt, 0.9, false},
      // Steps 8, 9: θ_cur = θ_min: the safe level, whatever the gains; nothing more to raise.
      {{10, 9, 9, 1, 100}, safe, 0.1, 0.9, 0.9, false},
      {{10, 6, 6, 1, 100}, dense, 0.1, 0.7, 0.7, false},
  };
}

TEST_CASE("gravac back-off raises the candidate whose gain is below epsilon at a window's end") {
  gravac_controller controller(back_off_options());
  check_trace(controller, back_off_trace());
  // The densities exactly: θ_min·0.5 after window 1, ·0.25 after window 2, back to θ_min·0.5
  // (exactly: halving and doubling are exact) after window 3, θ_min after the fourth.
  const auto trace = back_off_trace();
  const double theta_min = back_off_options().theta_min;
  const std::vector<double> expected{theta_min,        theta_min * 0.5, theta_min * 0.5, theta_min * 0.25,
                                     theta_min * 0.25, theta_min * 0.5, theta_min * 0.5, theta_min,
                                     theta_min,        theta_min};
  gravac_controller again(back_off_options());
  for (std::size_t t = 0; t < trace.size(); ++t) {
    CAPTURE(t);
    CHECK(again.next(trace[t].observed).current.density == expected[t]);
  }
  // Without the back-off the same statistics move the search on to θ_max after window 3.
  gravac_controller plain(trace_a_options());
  for (std::size_t t = 0; t < 6; ++t) plain.next(trace[t].observed);
  CHECK(plain.decision().current.density == theta_min * 0.125);
  CHECK(plain.decision().searching);
}

TEST_CASE("gravac gain compares a new candidate with the gradient of the steps it was observed") {
  // W = 2, α = 0.5. Steps 0 and 1: gradient 10, so θ_cur = 0.05 from step 2 on. Step 2: the
  // gradient jumps to 40 and the candidate keeps 32 of it: its gain is 32 / 40 = 0.8, not 32 over
  // the gradient's EWMA of both steps, (40 + 5)/1.5 = 30. The safe level, observed at both steps,
  // divides (36 + 4.5)/1.5 = 27 by 30: 0.9.
  gravac_controller controller(trace_a_options());
  controller.next({10, 9, 9, 1, 100});
  controller.next({10, 9, 9, 1, 100});
  const gravac_decision d = controller.next({40, 32, 36, 1, 100});
  REQUIRE(d.gain_current.has_value());
  CHECK(*d.gain_current == doctest::Approx(0.8));
  CHECK(*d.gain_safe == doctest::Approx(0.9));
}

TEST_CASE("gravac residual flags follow the feedback switch and multi_level is reported") {
  SUBCASE("sent_path_only updates only the residual of the path sent") {
    gravac_controller controller(trace_a_options());
    for (const auto& s : trace_a()) {
      const gravac_decision d = controller.next(s.observed);
      CHECK(d.update_current_residual == (d.send == gravac_choice::current));
      CHECK(d.update_safe_residual == (d.send == gravac_choice::safe));
      CHECK_FALSE(d.multi_level);
    }
  }
  SUBCASE("both_paths updates both residuals and leaves the decisions unchanged") {
    gravac_options options = trace_a_options();
    options.feedback = gravac_feedback::both_paths;
    options.multi_level = true;
    gravac_controller controller(options);
    for (const auto& s : trace_a()) {
      const gravac_decision d = controller.next(s.observed);
      CHECK(d.send == s.send);
      CHECK(d.update_current_residual);
      CHECK(d.update_safe_residual);
      CHECK(d.multi_level);
    }
  }
}

TEST_CASE("gravac magnitude is the norm or the squared norm as the measure says") {
  CHECK(gravac_controller({.measure = gravac_gain_measure::norm}).magnitude(16.0) == 4.0);
  CHECK(gravac_controller({.measure = gravac_gain_measure::squared_norm}).magnitude(16.0) == 16.0);
  CHECK(gravac_controller().magnitude(0.0) == 0.0);
}

TEST_CASE("gravac kept_energy: a path's magnitude is the energy its compression keeps, never below 0") {
  // x = (3, −4, 1, 0.5) and its top-2 (3, −4, 0, 0): ‖x‖² = 26.25, ‖x − C(x)‖² = 1.25, and the kept
  // energy 25 is ‖C(x)‖², what squared_norm measures of top-k.
  CHECK(gravac_controller::kept_energy(26.25, 1.25) == 25.0);
  CHECK(gravac_controller::kept_energy(16.0, 16.0) == 0.0);
  CHECK(gravac_controller::kept_energy(16.0, 25.0) == 0.0);  // an error that outweighs the layer
  CHECK(std::isnan(gravac_controller::kept_energy(std::numeric_limits<double>::quiet_NaN(), 1.0)));
  // The gradient's magnitude is its squared norm.
  CHECK(gravac_controller({.measure = gravac_gain_measure::kept_energy}).magnitude(16.0) == 16.0);
  // The measure is part of the options a saved state must match.
  const gravac_controller squared({.measure = gravac_gain_measure::squared_norm});
  gravac_controller kept({.measure = gravac_gain_measure::kept_energy});
  std::vector<std::byte> state(squared.saved_state_bytes());
  state.resize(squared.save_state(state));
  CHECK(thrown_by([&] { kept.load_state(state); }) == named(errc::parameter_mismatch));
}

TEST_CASE(
    "gravac over a ladder of widths sends the width that keeps ε of the energy and backs off from one that does not") {
  // θ = bits/32 from 4 bits (θ_min) down to 1 (θ_max), W = 3, ε = 0.4, ω = 0 (no plateau). Each
  // step observes gradient energy 100 and the energies kept by the candidate's and the safe
  // level's widths (4 bits 99, 2 bits 60, 1 bit 2); sending 2 bits takes 0.5 s, 4 bits 1 s (2 bits
  // have the higher throughput: 0.6/0.5 against 0.99/1). Hand-derived: window 1 (steps 0-2) tries
  // 4 bits; window 2 tries 2 bits, sent from step 4 once measured; window 3 tries 1 bit, below ε,
  // so the safe 4 bits go; at its end the back-off returns to 2 bits and the search stops, and
  // 2 bits are sent from step 10 on (step 9 measures the new candidate).
  const gravac_options options{.theta_min = 4.0 / 32,
                               .theta_max = 1.0 / 32,
                               .epsilon = 0.4,
                               .omega = 0.0,
                               .window = 3,
                               .measure = gravac_gain_measure::kept_energy,
                               .gain_input = gravac_gain_input::gradient,
                               .back_off = true};
  const auto kept = [](int bits) { return bits == 4 ? 99.0 : bits == 2 ? 60.0 : 2.0; };
  const auto bits_of = [](sparsity s) { return static_cast<int>(s.density * 32.0); };
  gravac_controller controller(options);
  std::vector<int> candidates;
  std::vector<gravac_choice> sent;
  for (int t = 0; t < 15; ++t) {
    const gravac_decision d = controller.decision();
    candidates.push_back(bits_of(d.current));
    sent.push_back(d.send);
    REQUIRE(d.send != gravac_choice::dense);
    const int width = bits_of(d.send == gravac_choice::current ? d.current : d.safe);
    controller.next({.gradient = 100.0,
                     .current = kept(bits_of(d.current)),
                     .safe = kept(bits_of(d.safe)),
                     .seconds = width == 2 ? 0.5 : 1.0,
                     .samples = 1});
  }
  const auto current = gravac_choice::current, safe = gravac_choice::safe;
  CHECK(candidates == std::vector<int>{4, 4, 4, 2, 2, 2, 1, 1, 1, 2, 2, 2, 2, 2, 2});
  CHECK(sent == std::vector<gravac_choice>{safe, safe, safe, safe, current, current, safe, safe, safe, safe, current,
                                           current, current, current, current});
  CHECK_FALSE(controller.decision().searching);
  CHECK(*controller.decision().gain_current == doctest::Approx(0.6));
}

// Rank r's local statistics at step t: gradients and gains that differ by rank and by step, so
// that controllers fed local values disagree.
gravac_observation local_observation(int rank, int step) {
  // Integers, divisions and products rounded on their own: the same bits wherever a compiler
  // inlines this and whatever it fuses with the sums below (docs/design.md §6.1).
  const double gradient = 4.0 + rank + step % 3;
  return {.gradient = gradient,
          .current = rounded_product(gradient, static_cast<double>(6 + (rank + step) % 4) / 10.0),
          .safe = rounded_product(gradient, static_cast<double>(16 + rank) / 20.0),
          .seconds = static_cast<double>(50 + 10 * rank + step) / 100.0,
          .samples = 32};
}

TEST_CASE("gravac ranks fed different local statistics decide the same after aggregation") {
  constexpr int ranks = 3;
  constexpr int steps = 60;
  const gravac_options options{.theta_max = 0.001, .window = 3, .alpha = 0.3};
  std::vector<std::vector<gravac_decision>> agreed(ranks);
  std::vector<std::vector<gravac_decision>> alone(ranks);
  std::vector<std::vector<gravac_observation>> aggregated(ranks);
  in_process_group(ranks).run([&](in_process_transport& t) {
    gravac_controller shared(options);
    gravac_controller local(options);
    const auto r = static_cast<std::size_t>(t.rank());
    for (int step = 0; step < steps; ++step) {
      const gravac_observation mine = local_observation(t.rank(), step);
      aggregated[r].push_back(aggregate_observation(t, mine));
      agreed[r].push_back(shared.next(aggregated[r].back()));
      alone[r].push_back(local.next(mine));
    }
  });
  bool locals_differ = false;
  for (int step = 0; step < steps; ++step) {
    CAPTURE(step);
    const auto s = static_cast<std::size_t>(step);
    // The aggregate, recomputed here in rank order: sums, and the slowest rank's time.
    gravac_observation expected = local_observation(0, step);
    for (int r = 1; r < ranks; ++r) {
      const gravac_observation o = local_observation(r, step);
      expected.gradient += o.gradient;
      expected.current += o.current;
      expected.safe += o.safe;
      expected.seconds = std::max(expected.seconds, o.seconds);
      expected.samples += o.samples;
    }
    for (std::size_t r = 0; r < ranks; ++r) {
      CHECK(aggregated[r][s].gradient == expected.gradient);
      CHECK(aggregated[r][s].current == expected.current);
      CHECK(aggregated[r][s].safe == expected.safe);
      CHECK(aggregated[r][s].seconds == expected.seconds);
      CHECK(aggregated[r][s].samples == expected.samples);
      CHECK(agreed[r][s] == agreed[0][s]);
      locals_differ = locals_differ || alone[r][s] != alone[0][s];
    }
  }
  // Without aggregation the same ranks would have diverged, so agreement is the aggregate's doing.
  CHECK(locals_differ);
}

TEST_CASE("gravac never divides zero by zero on zero gradients and untimed steps") {
  const gravac_options options = trace_a_options();
  gravac_controller controller(options);
  // Four candidates (0.1, 0.05, 0.025, 0.0125), W = 2 steps each; nothing is ever timed.
  for (int step = 0; step < 8; ++step) {
    CAPTURE(step);
    const gravac_decision d = controller.next({0, 0, 0, 0, 0});
    REQUIRE(d.gain_safe.has_value());
    CHECK(*d.gain_safe == 1.0);
    if (d.gain_current) CHECK(*d.gain_current == 1.0);
    CHECK(d.send != gravac_choice::dense);
    CHECK(d.searching == (step < 7));
  }
  // No throughput was recorded, so the search ends at θ_min.
  CHECK(controller.decision().current.density == 0.1);
  CHECK(controller.decision().send == gravac_choice::safe);
}

TEST_CASE("gravac rejects invalid options") {
  const auto rejected = [](gravac_options o) { return thrown_by([&] { gravac_controller c(o); }); };
  const std::string invalid = named(errc::invalid_argument);
  CHECK(thrown_by([] { gravac_controller c; }) == "no exception");
  CHECK(rejected({.theta_min = 0.0}) == invalid);
  CHECK(rejected({.theta_min = 1.5}) == invalid);
  CHECK(rejected({.theta_min = 0.1, .theta_max = 0.2}) == invalid);
  CHECK(rejected({.theta_max = 0.0}) == invalid);
  CHECK(rejected({.step = 0.0}) == invalid);
  CHECK(rejected({.step = 1.0}) == invalid);
  CHECK(rejected({.epsilon = -0.1}) == invalid);
  CHECK(rejected({.epsilon = std::numeric_limits<double>::infinity()}) == invalid);
  CHECK(rejected({.omega = -0.1}) == invalid);
  CHECK(rejected({.omega = std::numeric_limits<double>::quiet_NaN()}) == invalid);
  CHECK(rejected({.window = 0}) == invalid);
  CHECK(rejected({.alpha = 0.0}) == invalid);
  CHECK(rejected({.alpha = 1.5}) == invalid);
  CHECK(rejected({.theta_min = 1.0, .theta_max = 1.0, .alpha = 1.0}) == "no exception");
}

TEST_CASE("gravac rejects invalid observations and keeps its state") {
  gravac_controller controller(trace_a_options());
  controller.next({10, 9, 9, 1, 100});
  const gravac_decision before = controller.decision();
  const std::string invalid = named(errc::invalid_argument);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (const gravac_observation& bad :
       {gravac_observation{-1, 0, 0, 1, 1}, gravac_observation{1, nan, 0, 1, 1}, gravac_observation{1, 0, inf, 1, 1},
        gravac_observation{1, 0, 0, -1, 1}, gravac_observation{1, 0, 0, inf, 1}}) {
    CHECK(thrown_by([&] { controller.next(bad); }) == invalid);
    CHECK(controller.decision() == before);
    CHECK(controller.steps() == 1);
  }
}

// Recomputes both CRCs of a GraVAC saved state after a test edited a field.
void reseal(std::vector<std::byte>& state) {
  constexpr std::size_t crc_offset = 74, header = 78;
  const auto put = [&](std::size_t at, std::uint32_t v) {
    for (std::size_t b = 0; b < 4; ++b) state[at + b] = static_cast<std::byte>((v >> (8 * b)) & 0xFFu);
  };
  put(crc_offset, crc32c(std::span<const std::byte>(state).first(crc_offset)));
  const std::size_t payload = state.size() - header - 4;
  put(header + payload, crc32c(std::span<const std::byte>(state).subspan(header, payload)));
}

TEST_CASE("gravac checkpoint: a restored controller decides exactly as the saved one") {
  // The search's trace, and the back-off's (whose window position runs on after the search).
  for (const bool back_off : {false, true}) {
    CAPTURE(back_off);
    const auto trace = back_off ? back_off_trace() : trace_a();
    const gravac_options options = back_off ? back_off_options() : trace_a_options();
    for (std::size_t cut = 0; cut <= trace.size(); ++cut) {
      CAPTURE(cut);
      gravac_controller original(options);
      for (std::size_t t = 0; t < cut; ++t) original.next(trace[t].observed);
      std::vector<std::byte> saved(original.saved_state_bytes());
      CHECK(original.save_state(saved) == saved.size());
      gravac_controller restored(options);
      restored.load_state(saved);
      CHECK(restored.decision() == original.decision());
      CHECK(restored.steps() == original.steps());
      std::vector<std::byte> again(restored.saved_state_bytes());
      restored.save_state(again);
      CHECK(again == saved);
      for (std::size_t t = cut; t < trace.size(); ++t)
        CHECK(restored.next(trace[t].observed) == original.next(trace[t].observed));
    }
  }
}

TEST_CASE("gravac checkpoint: damaged or foreign states are rejected by name and change nothing") {
  const auto trace = trace_a();
  gravac_controller source(trace_a_options());
  for (std::size_t t = 0; t < 4; ++t) source.next(trace[t].observed);
  std::vector<std::byte> saved(source.saved_state_bytes());
  source.save_state(saved);

  gravac_controller target(trace_a_options());
  target.next(trace[0].observed);
  const gravac_decision before = target.decision();
  const auto rejects = [&](std::vector<std::byte> bytes, errc code) {
    CHECK(thrown_by([&] { target.load_state(bytes); }) == named(code));
    CHECK(target.decision() == before);
    CHECK(target.steps() == 1);
  };
  rejects(std::vector<std::byte>(saved.begin(), saved.end() - 1), errc::truncated);
  rejects(std::vector<std::byte>(saved.begin(), saved.begin() + 40), errc::truncated);
  auto longer = saved;
  longer.push_back(std::byte{0});
  rejects(longer, errc::trailing_bytes);
  auto flipped = saved;
  flipped[100] ^= std::byte{1};
  rejects(flipped, errc::payload_checksum);
  flipped = saved;
  flipped[20] ^= std::byte{1};
  rejects(flipped, errc::header_checksum);
  flipped = saved;
  flipped[0] = std::byte{'X'};
  rejects(flipped, errc::bad_magic);
  flipped = saved;
  flipped[4] = std::byte{1};  // version 1: its options hash lacked back_off and gain_input
  rejects(flipped, errc::unsupported_version);
  // Fields no controller reaches, with valid CRCs.
  const auto edited = [&](std::size_t at, std::byte value) {
    auto bytes = saved;
    bytes[at] = value;
    reseal(bytes);
    return bytes;
  };
  rejects(edited(45, std::byte{2}), errc::malformed_payload);  // searching flag
  rejects(edited(41, std::byte{9}), errc::malformed_payload);  // step within the window ≥ W
  rejects(edited(40, std::byte{0x7F}), errc::malformed_payload);  // θ_cur: a huge float64
  rejects(edited(50, std::byte{5}), errc::malformed_payload);  // EWMA slot ≥ W
  rejects(edited(78 + 7, std::byte{0xFF}), errc::malformed_payload);  // a negative sample
  // A controller configured otherwise.
  auto options = trace_a_options();
  options.epsilon = 0.5;
  gravac_controller other(options);
  CHECK(thrown_by([&] { other.load_state(saved); }) == named(errc::parameter_mismatch));
  options = trace_a_options();
  options.window = 3;
  gravac_controller wider(options);
  CHECK(thrown_by([&] { wider.load_state(saved); }) == named(errc::parameter_mismatch));
  for (const auto& changed : {back_off_options(), [] {
                                auto o = trace_a_options();
                                o.gain_input = gravac_gain_input::gradient;
                                return o;
                              }()}) {
    gravac_controller differs(changed);
    CHECK(thrown_by([&] { differs.load_state(saved); }) == named(errc::parameter_mismatch));
  }
  std::vector<std::byte> small(saved.size() - 1);
  CHECK(thrown_by([&] { source.save_state(small); }) == named(errc::buffer_too_small));
}

}  // namespace
}  // namespace gradcomp::test
