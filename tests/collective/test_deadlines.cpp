// Deadlines of the in-process transport and of every compressed collective over it (their own
// executable, with a ctest TIMEOUT well above the deadlines they wait for): the deadline type, a
// rank that stops calling (each survivor throws `timeout` naming the missing rank, no earlier than
// its deadline and at most `deadline_margin` later, then the group refuses further calls), a rank
// that is only slow (no timeout), the caller's own deadline on the transport, and every entry point
// of the collectives with one of four ranks stalled in the middle of the call (deadline_checks.hpp).
#include <gradcomp/gradcomp.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <latch>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "collective/deadline_checks.hpp"
#include "support/errors.hpp"

namespace gradcomp::test {
namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

static_assert(transport_with_deadline<in_process_transport>);
static_assert(transport_with_deadline<stalling_transport<in_process_transport>>);
static_assert(!transport_with_deadline<collectives_only<in_process_transport>>);

TEST_CASE("deadline: none, after a timeout, already passed, the earlier of two, and a negative timeout refused") {
  const deadline none;
  CHECK(none.infinite());
  CHECK_FALSE(none.passed());
  CHECK(none.remaining() == infinite_timeout);
  CHECK(none.within() == "without a deadline");
  CHECK(deadline::after(infinite_timeout).infinite());
  CHECK(deadline::after(std::chrono::milliseconds::max() - 1ms).infinite());  // beyond the clock's range

  const auto before = deadline::clock::now();
  const deadline soon = deadline::after(250ms);
  CHECK_FALSE(soon.infinite());
  CHECK(soon.at() >= before + 250ms);
  CHECK(soon.at() <= deadline::clock::now() + 250ms);
  CHECK(soon.timeout() == 250ms);
  CHECK(soon.within() == "within 250 ms");
  CHECK(soon.remaining() <= 250ms);
  CHECK(soon.remaining() >= 1ms);
  CHECK(earlier(none, soon).at() == soon.at());
  CHECK(earlier(soon, none).at() == soon.at());
  CHECK(earlier(soon, deadline::after(10s)).at() == soon.at());

  const deadline now = deadline::after(0ms);
  CHECK(now.passed());
  CHECK(now.remaining() == 1ms);  // a library wait given it still ends after the deadline

  CHECK(thrown_by([] { (void)deadline::after(-1ms); }) == named(errc::invalid_argument));
  in_process_group(1).run([](in_process_transport& t) {
    std::vector<float> data(8, 1.0f);
    CHECK(thrown_by([&] {
            compressed_all_reduce(cpu_executor{}, t, mpc_codec<float>(), std::span<float>(data), {.timeout = -5ms});
          }) == named(errc::invalid_argument));
  });
}

TEST_CASE("poll_until: true as soon as done, false once the deadline passes, and a completion at the deadline counts") {
  int polls = 0;
  CHECK(poll_until(deadline::after(1s), [&] { return ++polls == 3; }));
  CHECK(polls == 3);
  const auto start = clock_type::now();
  CHECK_FALSE(poll_until(deadline::after(200ms), [] { return false; }));
  CHECK(seconds_since(start) >= 0.2);
  // The check after the deadline: done only then, still reported done.
  const deadline passed = deadline::after(0ms);
  CHECK(poll_until(passed, [&, first = true]() mutable {
    const bool done = !first;
    first = false;
    return done;
  }));
}

TEST_CASE(
    "in-process: a rank that stops calling makes each other rank throw timeout at its own deadline, naming it, and the group then refuses calls") {
  constexpr int P = 4;
  std::vector<std::string> what(P), after(P);
  std::vector<double> seconds(P, 0.0);
  std::latch survivors_done(P - 1), victim_done(1);
  in_process_group(P).run([&](in_process_transport& t) {
    const auto r = static_cast<std::size_t>(t.rank());
    if (t.rank() == P - 1) {  // stops calling until the others have given up
      survivors_done.wait();
      after[r] = thrown_by([&] {
        std::vector<float> x(4);
        t.all_reduce_sum(std::span<float>(x));
      });
      victim_done.count_down();
      return;
    }
    // Staggered deadlines: each rank waits for its own, none is woken by another's timeout.
    std::vector<float> x(4, 1.0f);
    const auto start = clock_type::now();
    t.set_deadline(deadline::after(std::chrono::milliseconds(400 + 200 * t.rank())));
    try {
      t.all_reduce_sum(std::span<float>(x));
    } catch (const error& e) {
      what[r] = e.what();
    }
    seconds[r] = seconds_since(start);
    after[r] = thrown_by([&] { (void)t.all_gather_bytes({}); });
    survivors_done.count_down();
    victim_done.wait();  // a rank that returns fails the calls of the others (size_mismatch)
  });
  for (int r = 0; r < P - 1; ++r) {
    CAPTURE(r);
    CAPTURE(what[static_cast<std::size_t>(r)]);
    CHECK(what[static_cast<std::size_t>(r)].find(
              "timeout: in_process_transport::all_reduce_sum: rank(s) 3 did not arrive within " +
              std::to_string(400 + 200 * r) + " ms") == 0);
    CHECK(seconds[static_cast<std::size_t>(r)] >= 0.4 + 0.2 * r);
    CHECK(seconds[static_cast<std::size_t>(r)] <= 0.4 + 0.2 * r + 2.0);
    CHECK(after[static_cast<std::size_t>(r)] == named(errc::peer_failed));
  }
  CHECK(after[P - 1] == named(errc::peer_failed));
}

TEST_CASE("in-process: a receive from a rank that never sends throws timeout naming it") {
  in_process_group(2).run([](in_process_transport& t) {
    if (t.rank() == 1) {
      std::this_thread::sleep_for(600ms);  // alive, but never sends
      return;
    }
    const auto start = clock_type::now();
    t.set_deadline(deadline::after(300ms));
    std::string what;
    try {
      (void)t.recv_bytes(1);
    } catch (const error& e) {
      CHECK(e.code() == errc::timeout);
      what = e.what();
    }
    CHECK(seconds_since(start) >= 0.3);
    CHECK(what == "timeout: in_process_transport::recv_bytes: rank 1 sent nothing to rank 0 within 300 ms");
  });
}

TEST_CASE("in-process: a slow rank within the deadline, or any delay without one, completes normally") {
  for (const auto timeout : {std::chrono::milliseconds(5000), infinite_timeout}) {
    CAPTURE(timeout.count());
    std::atomic<int> exact{0};
    in_process_group(3).run([&](in_process_transport& t) {
      if (t.rank() == 2) std::this_thread::sleep_for(300ms);
      std::vector<float> data(64, static_cast<float>(t.rank() + 1));
      compressed_all_reduce(cpu_executor{}, t, mpc_codec<float>(), std::span<float>(data), {.timeout = timeout});
      if (data == std::vector<float>(64, 6.0f)) ++exact;
      CHECK(t.current_deadline().infinite());  // the call gave the transport's deadline back
    });
    CHECK(exact.load() == 3);
  }
}

TEST_CASE("a collective keeps an earlier deadline the caller set on the transport, and gives it back afterwards") {
  std::latch both_done(2);  // a rank that returns fails the calls of the others (size_mismatch)
  in_process_group(2).run([&](in_process_transport& t) {
    const deadline mine = deadline::after(400ms);
    t.set_deadline(mine);
    std::vector<float> data(16, 1.0f);
    if (t.rank() == 1) {
      std::this_thread::sleep_for(1500ms);  // arrives after rank 0's deadline
      CHECK(thrown_by([&] { compressed_all_reduce(cpu_executor{}, t, mpc_codec<float>(), std::span<float>(data)); }) ==
            named(errc::peer_failed));
      both_done.arrive_and_wait();
      return;
    }
    const auto start = clock_type::now();
    std::string what;
    try {
      compressed_all_reduce(cpu_executor{}, t, mpc_codec<float>(), std::span<float>(data),
                            {.key = {.step = 2, .tensor_id = 5}});
    } catch (const error& e) {
      what = e.what();
    }
    CHECK(seconds_since(start) < 1.4);  // the caller's 400 ms, not the call's 10 minutes
    CHECK(what.find(
              "timeout: compressed_all_reduce (step 2, tensor 5): in_process_transport::all_gather_bytes: rank(s) 1 "
              "did not arrive within 400 ms") == 0);
    CHECK(t.current_deadline().at() == mine.at());
    both_done.arrive_and_wait();
  });
}

TEST_CASE(
    "deadlines of every compressed collective: one of 4 ranks stalls mid-call, every survivor throws timeout within deadline + margin, data and state unchanged") {
  constexpr int P = 4;
  for (const deadline_case c : every_deadline_case()) {
    CAPTURE(static_cast<int>(c));
    std::vector<deadline_outcome> outcomes(P);
    std::latch survivors_done(P - 1);
    std::latch all_done(P);
    in_process_group(P).run([&](in_process_transport& inner) {
      stalling_transport<in_process_transport> t(inner, P - 1, [&] { survivors_done.wait(); });
      auto& outcome = outcomes[static_cast<std::size_t>(t.rank())];
      try {
        outcome = run_deadline_case(t, c);
      } catch (const std::exception& e) {
        outcome.what = std::string("unexpected: ") + e.what();
      }
      if (t.rank() != P - 1) survivors_done.count_down();
      all_done.arrive_and_wait();  // nobody returns (which fails waiting ranks) before every rank is done
    });
    CHECK(outcomes[P - 1].stalled);
    double earliest = 1e9, latest = 0.0;
    for (int r = 0; r < P - 1; ++r) {
      const deadline_outcome& o = outcomes[static_cast<std::size_t>(r)];
      check_survivor(o, c, r, P);
      // The in-process barrier knows who is missing: the stalled rank (rings and receives name the
      // neighbour they wait on, which may itself wait on the stalled rank).
      const bool ring = c == deadline_case::all_reduce_ring_plan || c == deadline_case::reduce_scatter_ring_plan ||
                        c == deadline_case::ring_all_reduce || c == deadline_case::ring_reduce_scatter ||
                        c == deadline_case::send_recv;
      CHECK(o.what.find(ring ? "sent nothing to rank " + std::to_string(r) : std::string("rank(s) 3 did not arrive")) !=
            std::string::npos);
      earliest = std::min(earliest, o.seconds);
      latest = std::max(latest, o.seconds);
    }
    MESSAGE("case " << static_cast<int>(c) << ": the survivors threw after " << earliest << " to " << latest
                    << " s (timeout 1 s)");
  }
}

}  // namespace
}  // namespace gradcomp::test
