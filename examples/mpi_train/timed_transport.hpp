#pragma once
// A transport that forwards every call to another one and adds up the time spent inside them, so
// that a rank can tell its compression time (the rest of a collective) from its communication.
// Time is this thread's CPU time (POSIX CLOCK_THREAD_CPUTIME_ID), so that ranks sharing cores do
// not count the time they wait for a core as compression.
#include <gradcomp/transport/transport.hpp>

#include <time.h>

#include <chrono>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

namespace train {

/// The CPU time of the calling thread, as a std::chrono clock.
struct thread_cpu_clock {
  using duration = std::chrono::nanoseconds;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<thread_cpu_clock>;
  static constexpr bool is_steady = true;
  static time_point now() noexcept {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return time_point(duration(static_cast<rep>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec));
  }
};

template <gradcomp::transport X>
class timed_transport {
 public:
  using clock = thread_cpu_clock;

  explicit timed_transport(X& inner) : inner_(inner) {}

  [[nodiscard]] int rank() const { return inner_.rank(); }
  [[nodiscard]] int size() const { return inner_.size(); }

  /// Time spent inside the wrapped transport's calls since construction.
  [[nodiscard]] clock::duration communication() const noexcept { return spent_; }

  template <class V>
  void all_reduce_sum(std::span<V> d) {
    timed([&] { inner_.all_reduce_sum(d); });
  }
  template <class V>
  void all_reduce_max(std::span<V> d) {
    timed([&] { inner_.all_reduce_max(d); });
  }
  template <class V>
  void reduce_sum(std::span<V> d, int root) {
    timed([&] { inner_.reduce_sum(d, root); });
  }
  template <class V>
  void reduce_scatter_sum(std::span<const V> in, std::span<V> out) {
    timed([&] { inner_.reduce_scatter_sum(in, out); });
  }
  void broadcast(std::span<std::byte> d, int root) {
    timed([&] { inner_.broadcast(d, root); });
  }
  std::vector<std::vector<std::byte>> all_gather_bytes(std::span<const std::byte> mine) {
    return timed([&] { return inner_.all_gather_bytes(mine); });
  }
  std::vector<std::vector<std::byte>> all_to_all_bytes(std::span<const std::span<const std::byte>> to_each)
    requires gradcomp::transport_with_all_to_all<X>
  {
    return timed([&] { return inner_.all_to_all_bytes(to_each); });
  }
  void all_reduce_or(std::span<std::uint8_t> d)
    requires gradcomp::transport_with_bitwise_or<X>
  {
    timed([&] { inner_.all_reduce_or(d); });
  }
  void send_bytes(std::span<const std::byte> d, int dest)
    requires gradcomp::transport_with_point_to_point<X>
  {
    timed([&] { inner_.send_bytes(d, dest); });
  }
  std::vector<std::byte> recv_bytes(int source)
    requires gradcomp::transport_with_point_to_point<X>
  {
    return timed([&] { return inner_.recv_bytes(source); });
  }
  std::vector<std::byte> sendrecv_bytes(std::span<const std::byte> d, int dest, int source)
    requires gradcomp::transport_with_point_to_point<X>
  {
    return timed([&] { return inner_.sendrecv_bytes(d, dest, source); });
  }

 private:
  template <class F>
  decltype(auto) timed(F&& f) {
    const auto started = clock::now();
    struct add_on_exit {
      clock::duration& total;
      clock::time_point started;
      ~add_on_exit() { total += clock::now() - started; }
    } guard{spent_, started};
    return f();
  }

  X& inner_;
  clock::duration spent_{};
};

}  // namespace train
