#pragma once
/// @file
/// The in-process transport: P ranks that are threads of one process, for tests, the demo and
/// single-machine experiments. It satisfies `transport` and `transport_with_bitwise_or`.
///
/// Every collective publishes each rank's buffer, waits for all ranks, and lets each rank read
/// the others' buffers directly; reductions combine ranks 0, 1, …, P−1 in that order, so every
/// rank gets the same bits. Before combining, every rank checks that all ranks called the same
/// collective with the same element type, count and root (a root outside the group counts as a
/// disagreement). A disagreement is a programming error of the caller: every rank throws
/// `errc::size_mismatch` and the group is marked failed; so does a collective that some rank never
/// makes because its body returned. When any rank fails, the ranks waiting in or entering a
/// collective throw `errc::peer_failed` instead of hanging.

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <typeinfo>
#include <vector>

#include <gradcomp/core/error.hpp>
#include <gradcomp/transport/transport.hpp>

namespace gradcomp {

namespace detail {

/// The collectives of the in-process transport, recorded so that ranks can check they agree.
enum class in_process_collective : std::uint8_t {
  none,
  all_reduce_sum,
  all_reduce_max,
  all_reduce_or,
  reduce_sum,
  reduce_scatter_sum,
  broadcast,
  all_gather_bytes,
};

/// What the ranks of one in-process group share: a barrier that can be aborted, and one slot
/// per rank describing that rank's side of the current collective.
class in_process_shared {
 public:
  /// One rank's side of a collective.
  struct slot {
    const void* input = nullptr;        ///< The rank's input (or in-place) buffer.
    std::size_t count = 0;              ///< Elements in `input`.
    std::size_t result_count = 0;       ///< Elements the rank expects back (reduce-scatter).
    const std::type_info* type = nullptr;  ///< Element type.
    in_process_collective operation = in_process_collective::none;  ///< Which collective.
    int root = 0;                       ///< Root rank, where the collective has one.
  };

  explicit in_process_shared(int size) : size_(size), slots_(static_cast<std::size_t>(size)) {}

  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] slot& at(int rank) noexcept { return slots_[static_cast<std::size_t>(rank)]; }

  /// Waits until every rank arrives. @throws error `peer_failed` once the group is aborted, and
  /// `size_mismatch` when a rank has returned from its body while this one calls a collective.
  void arrive_and_wait() {
    std::unique_lock lock(mutex_);
    require_present();
    require_alive();
    const std::uint64_t generation = generation_;
    if (++waiting_ == size_) {
      waiting_ = 0;
      ++generation_;
      ready_.notify_all();
      return;
    }
    ready_.wait(lock, [&] { return generation_ != generation || aborted_ || departed_ > 0; });
    if (generation_ == generation) {
      require_present();
      require_alive();
    }
  }

  /// Records that a rank's body returned: a collective that other ranks still call can never
  /// complete, so they fail instead of waiting.
  void depart() noexcept {
    const std::lock_guard lock(mutex_);
    ++departed_;
    ready_.notify_all();
  }

  /// Marks the group failed and wakes every waiting rank.
  void abort() noexcept {
    const std::lock_guard lock(mutex_);
    aborted_ = true;
    ready_.notify_all();
  }

 private:
  void require_alive() const {
    detail::require(!aborted_, errc::peer_failed, "another rank of the in-process group failed");
  }

  void require_present() {
    if (departed_ == 0) return;
    aborted_ = true;
    ready_.notify_all();
    detail::fail(errc::size_mismatch, "a rank returned while others still called collectives: the ranks made different calls");
  }

  int size_;
  std::vector<slot> slots_;
  std::mutex mutex_;
  std::condition_variable ready_;
  int waiting_ = 0;
  std::uint64_t generation_ = 0;
  int departed_ = 0;
  bool aborted_ = false;
};

}  // namespace detail

/// Rank `rank()` of an in-process group; one object per thread. Made by `in_process_group`.
class in_process_transport {
 public:
  /// This rank.
  [[nodiscard]] int rank() const noexcept { return rank_; }
  /// Number of ranks.
  [[nodiscard]] int size() const noexcept { return shared_->size(); }

  /// Element-wise sum over ranks (unsigned types wrap), in place on every rank.
  template <class V>
  void all_reduce_sum(std::span<V> data) {
    all_reduce(data, collective::all_reduce_sum, [](V a, V b) { return static_cast<V>(a + b); });
  }
  /// Element-wise maximum over ranks, in place on every rank.
  template <class V>
  void all_reduce_max(std::span<V> data) {
    all_reduce(data, collective::all_reduce_max, [](V a, V b) { return a < b ? b : a; });
  }
  /// Element-wise bitwise OR over ranks, in place on every rank.
  void all_reduce_or(std::span<std::uint8_t> data) {
    all_reduce(data, collective::all_reduce_or,
               [](std::uint8_t a, std::uint8_t b) { return static_cast<std::uint8_t>(a | b); });
  }

  /// Rank `root`'s `data` becomes the element-wise sum over ranks; other ranks' data is unchanged.
  template <class V>
  void reduce_sum(std::span<V> data, int root) {
    publish(data.data(), data.size(), data.size(), typeid(V), collective::reduce_sum, root);
    std::vector<V> total;
    if (rank_ == root) total = combine<V>(0, data.size(), [](V a, V b) { return static_cast<V>(a + b); });
    shared_->arrive_and_wait();
    if (rank_ == root) std::copy(total.begin(), total.end(), data.begin());
  }

  /// `in` holds size() blocks of `out.size()` values; `out` becomes the sum over ranks of block
  /// rank().
  template <class V>
  void reduce_scatter_sum(std::span<const V> in, std::span<V> out) {
    publish(in.data(), in.size(), out.size(), typeid(V), collective::reduce_scatter_sum, 0);
    require_agreement(in.size() == out.size() * static_cast<std::size_t>(size()),
                      "reduce_scatter_sum: the input is not size() blocks of the output");
    const std::vector<V> total =
        combine<V>(out.size() * static_cast<std::size_t>(rank_), out.size(), [](V a, V b) { return static_cast<V>(a + b); });
    shared_->arrive_and_wait();
    std::copy(total.begin(), total.end(), out.begin());
  }

  /// Every rank's `data` becomes rank `root`'s.
  void broadcast(std::span<std::byte> data, int root) {
    publish(data.data(), data.size(), data.size(), typeid(std::byte), collective::broadcast, root);
    if (rank_ != root) std::memcpy(data.data(), shared_->at(root).input, data.size());
    shared_->arrive_and_wait();
  }

  /// Every rank's byte buffer, in rank order; sizes may differ between ranks.
  [[nodiscard]] std::vector<std::vector<std::byte>> all_gather_bytes(std::span<const std::byte> mine) {
    publish(mine.data(), mine.size(), 0, typeid(std::byte), collective::all_gather_bytes, 0, false);
    std::vector<std::vector<std::byte>> all(static_cast<std::size_t>(size()));
    for (int p = 0; p < size(); ++p) {
      const auto& s = shared_->at(p);
      const auto* first = static_cast<const std::byte*>(s.input);
      all[static_cast<std::size_t>(p)].assign(first, first + s.count);
    }
    shared_->arrive_and_wait();
    return all;
  }

 private:
  friend class in_process_group;

  using collective = detail::in_process_collective;

  in_process_transport(std::shared_ptr<detail::in_process_shared> shared, int rank)
      : shared_(std::move(shared)), rank_(rank) {}

  /// Publishes this rank's side, waits for every rank, and checks that all called the same
  /// collective (same type, count unless `same_count` is false, and root).
  void publish(const void* input, std::size_t count, std::size_t result_count, const std::type_info& type,
               collective op, int root, bool same_count = true) {
    auto& mine = shared_->at(rank_);
    mine = {input, count, result_count, &type, op, root};
    shared_->arrive_and_wait();
    bool agree = root >= 0 && root < size();
    for (int p = 0; p < size(); ++p) {
      const auto& s = shared_->at(p);
      agree = agree && s.operation == op && *s.type == type && s.root == root &&
              s.result_count == result_count && (!same_count || s.count == count);
    }
    require_agreement(agree, "the ranks called different collectives, types, counts or roots");
  }

  /// Throws on every rank alike (each sees the same slots) and marks the group failed.
  void require_agreement(bool agree, const char* what) {
    if (agree) return;
    shared_->abort();
    detail::fail(errc::size_mismatch, what);
  }

  /// Combines elements [first, first + count) of every rank's input in rank order.
  template <class V, class Op>
  [[nodiscard]] std::vector<V> combine(std::size_t first, std::size_t count, Op op) const {
    const auto* rank0 = static_cast<const V*>(shared_->at(0).input) + first;
    std::vector<V> acc(rank0, rank0 + count);
    for (int p = 1; p < size(); ++p) {
      const auto* in = static_cast<const V*>(shared_->at(p).input) + first;
      for (std::size_t i = 0; i < count; ++i) acc[i] = op(acc[i], in[i]);
    }
    return acc;
  }

  template <class V, class Op>
  void all_reduce(std::span<V> data, collective op, Op combine_op) {
    publish(data.data(), data.size(), data.size(), typeid(V), op, 0);
    const std::vector<V> result = combine<V>(0, data.size(), combine_op);
    shared_->arrive_and_wait();
    std::copy(result.begin(), result.end(), data.begin());
  }

  std::shared_ptr<detail::in_process_shared> shared_;
  int rank_;
};

/// A group of P in-process ranks. `run(body)` calls `body(transport)` on P threads, one per rank,
/// and returns when all have finished; a failure on any rank stops the others at their next
/// collective (`peer_failed`) and is rethrown by `run`. Each `run` starts with fresh state, so a
/// group can run again after a failure.
class in_process_group {
 public:
  /// @throws error `invalid_argument` unless size ≥ 1.
  explicit in_process_group(int size) : size_(size) {
    detail::require(size >= 1, errc::invalid_argument, "an in-process group needs at least one rank");
  }

  /// Number of ranks.
  [[nodiscard]] int size() const noexcept { return size_; }

  /// Runs `body(in_process_transport&)` on every rank and joins. Rethrows the failure of the
  /// lowest rank that failed for its own reason (not `peer_failed`), or else the lowest rank's.
  template <class Body>
  void run(Body&& body) const {
    auto shared = std::make_shared<detail::in_process_shared>(size_);
    std::vector<std::exception_ptr> failures(static_cast<std::size_t>(size_));
    std::vector<std::thread> threads;
    threads.reserve(failures.size());
    for (int r = 0; r < size_; ++r) {
      threads.emplace_back([r, &shared, &body, &failures] {
        in_process_transport t(shared, r);
        try {
          body(t);
          shared->depart();
        } catch (...) {
          failures[static_cast<std::size_t>(r)] = std::current_exception();
          shared->abort();
        }
      });
    }
    for (auto& thread : threads) thread.join();
    rethrow_first(failures);
  }

 private:
  static void rethrow_first(const std::vector<std::exception_ptr>& failures) {
    std::exception_ptr first;
    for (const auto& f : failures) {
      if (!f) continue;
      try {
        std::rethrow_exception(f);
      } catch (const error& e) {
        if (e.code() != errc::peer_failed) std::rethrow_exception(f);
      } catch (...) {
        std::rethrow_exception(f);
      }
      if (!first) first = f;
    }
    if (first) std::rethrow_exception(first);
  }

  int size_;
};

static_assert(transport_with_bitwise_or<in_process_transport>);

}  // namespace gradcomp
