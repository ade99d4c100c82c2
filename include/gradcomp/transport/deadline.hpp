#pragma once
/// @file
/// Deadlines of blocking waits (docs/transports.md §8): `deadline`, a point on the steady clock by
/// which a wait for peers gives up (or none); the timeouts of the collectives' options
/// (`default_collective_timeout`, `infinite_timeout`); and `poll_until`, the waiting loop of the
/// adapters whose libraries can only test whether an operation has completed (MPI's `MPI_Test`,
/// NCCL's stream and communicator queries).

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include <gradcomp/core/error.hpp>

namespace gradcomp {

/// The timeout of a collective call when its options name none: 10 minutes, long enough for any
/// step of a healthy job, short enough that a job whose peer died or stalled stops in the same
/// hour (PyTorch's process groups wait 10 or 30 minutes).
inline constexpr std::chrono::milliseconds default_collective_timeout = std::chrono::minutes(10);

/// A timeout that never passes: the call waits for its peers as long as the library does.
inline constexpr std::chrono::milliseconds infinite_timeout = std::chrono::milliseconds::max();

/// The point in time by which a blocking wait for peers gives up, or none. A transport holds one
/// (`set_deadline`); every wait of its calls ends there with `errc::timeout`. Cheap to copy.
class deadline {
 public:
  /// The steady clock the deadline is read on (never adjusted, unlike the system clock).
  using clock = std::chrono::steady_clock;

  /// No deadline: waits are unbounded.
  constexpr deadline() noexcept = default;

  /// `timeout` from now. `infinite_timeout`, or a timeout beyond the clock's range, gives no
  /// deadline; 0 gives one that has already passed (a wait then fails unless its peers are there).
  /// @throws error `invalid_argument` for a negative timeout.
  [[nodiscard]] static deadline after(std::chrono::milliseconds timeout) {
    detail::require(timeout.count() >= 0, errc::invalid_argument, [&] {
      return "a collective's timeout must not be negative (" + std::to_string(timeout.count()) +
             " ms); use infinite_timeout for none";
    });
    const clock::time_point now = clock::now();
    if (timeout == infinite_timeout ||
        timeout > std::chrono::duration_cast<std::chrono::milliseconds>(clock::time_point::max() - now))
      return {};
    deadline d;
    d.at_ = now + timeout;
    d.timeout_ = timeout;
    return d;
  }

  /// Whether there is no deadline.
  [[nodiscard]] bool infinite() const noexcept { return at_ == clock::time_point::max(); }
  /// When it passes (`clock::time_point::max()` for none).
  [[nodiscard]] clock::time_point at() const noexcept { return at_; }
  /// The timeout it was made from (`infinite_timeout` for none), for messages.
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  /// Whether it has passed.
  [[nodiscard]] bool passed() const noexcept { return !infinite() && clock::now() >= at_; }

  /// Time left, rounded up to whole milliseconds and at least 1 ms, so that a library wait given
  /// it never ends before the deadline (`infinite_timeout` for none).
  [[nodiscard]] std::chrono::milliseconds remaining() const noexcept {
    if (infinite()) return infinite_timeout;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(at_ - clock::now());
    return std::max(left, std::chrono::milliseconds(1));
  }

  /// The earlier of two deadlines.
  [[nodiscard]] friend deadline earlier(const deadline& a, const deadline& b) noexcept { return b.at_ < a.at_ ? b : a; }

  /// "within N ms", for messages.
  [[nodiscard]] std::string within() const {
    return infinite() ? std::string("without a deadline") : "within " + std::to_string(timeout_.count()) + " ms";
  }

 private:
  clock::time_point at_ = clock::time_point::max();
  std::chrono::milliseconds timeout_ = infinite_timeout;
};

/// Calls `done()` until it returns true (then returns true) or `until` passes (then false). It
/// checks `done()` once more after the deadline, so an operation that completed in time is never
/// reported late. For its first 5 ms it only yields between calls, as MPI's own waits spin: a
/// library that progresses only inside its calls (MPI) keeps its latency, and ranks that share a
/// core still run. After that it sleeps from 50 µs doubling up to 1 ms, so a long wait costs little
/// CPU and at most about 1 ms of latency.
template <class Done>
[[nodiscard]] bool poll_until(const deadline& until, Done&& done) {
  constexpr auto spinning = std::chrono::milliseconds(5);
  constexpr auto longest_pause = std::chrono::microseconds(1000);
  const auto start = deadline::clock::now();
  auto pause = std::chrono::microseconds(50);
  while (true) {
    if (done()) return true;
    if (until.passed()) return done();
    if (deadline::clock::now() - start < spinning) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, longest_pause);
  }
}

}  // namespace gradcomp
