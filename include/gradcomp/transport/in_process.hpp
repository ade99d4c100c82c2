#pragma once
/// @file
/// The in-process transport: P ranks that are threads of one process, for tests, the demo and
/// single-machine experiments. It satisfies `transport`, `transport_with_bitwise_or`,
/// `transport_with_point_to_point`, `transport_with_all_to_all` and `transport_with_deadline`.
///
/// Every collective publishes each rank's buffer, waits for all ranks, and lets each rank read
/// the others' buffers directly; reductions combine ranks 0, 1, …, P−1 in that order, so every
/// rank gets the same bits. Before combining, every rank checks that all ranks called the same
/// collective with the same element type, count and root (a root outside the group counts as a
/// disagreement, and so does an all-to-all of other than P buffers). A disagreement is a
/// programming error of the caller: every rank throws `errc::size_mismatch` and the group is
/// marked failed; so does a collective that some rank never makes because its body returned. When
/// any rank fails, the ranks waiting in or entering a collective throw `errc::peer_failed` instead
/// of hanging.
///
/// Point-to-point messages go through one mailbox per (source, destination) pair: `send_bytes`
/// copies the buffer into the mailbox and returns at once (a real transport may block instead),
/// and `recv_bytes` waits for the oldest message of its source. Calls that can never complete
/// fail instead of hanging: a receive from a rank whose body has returned with nothing left to
/// receive, or a state in which every rank still running waits (in a receive or a collective) and
/// at least one waits in a receive, makes the waiting ranks throw `errc::size_mismatch`.
///
/// **Deadlines.** A rank that is still running but stops calling (it computes, sleeps or waits on
/// something else) cannot be told from a slow one: each rank's `set_deadline` bounds its waits.
/// A collective waits for every rank to arrive until the deadline, then throws `errc::timeout`
/// naming the ranks that had not arrived; a receive throws it naming its source. Once all ranks
/// have arrived, a collective completes without waiting on any caller (the ranks only copy), so
/// the deadline bounds the arrival only and no rank leaves while another still reads its buffer.
/// A timeout leaves the group unable to go on (the abandoned collective can never complete): every
/// rank that enters a call afterwards throws `peer_failed`, while ranks already waiting keep
/// waiting until their own deadlines, each throwing `timeout` with its own view of who is missing.

#include <algorithm>
#include <condition_variable>
#include <deque>
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
#include <gradcomp/transport/deadline.hpp>
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
  all_to_all_bytes,
};

/// The name of an in-process collective, for messages.
[[nodiscard]] constexpr const char* name_of(in_process_collective op) noexcept {
  switch (op) {
    case in_process_collective::all_reduce_sum: return "all_reduce_sum";
    case in_process_collective::all_reduce_max: return "all_reduce_max";
    case in_process_collective::all_reduce_or: return "all_reduce_or";
    case in_process_collective::reduce_sum: return "reduce_sum";
    case in_process_collective::reduce_scatter_sum: return "reduce_scatter_sum";
    case in_process_collective::broadcast: return "broadcast";
    case in_process_collective::all_gather_bytes: return "all_gather_bytes";
    case in_process_collective::all_to_all_bytes: return "all_to_all_bytes";
    case in_process_collective::none: break;
  }
  return "a collective";
}

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

  explicit in_process_shared(int size)
      : size_(size),
        slots_(static_cast<std::size_t>(size)),
        mailboxes_(static_cast<std::size_t>(size) * static_cast<std::size_t>(size)),
        departed_ranks_(static_cast<std::size_t>(size), false),
        arrived_(static_cast<std::size_t>(size), false),
        receiving_from_(static_cast<std::size_t>(size), -1) {}

  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] slot& at(int rank) noexcept { return slots_[static_cast<std::size_t>(rank)]; }

  /// Waits until every rank arrives, at most until `until` (`op` names the collective in
  /// messages). @throws error `timeout` when `until` passes first, naming the ranks that had not
  /// arrived; `peer_failed` once the group is aborted or a rank timed out; `size_mismatch` when a
  /// rank has returned from its body while this one calls a collective.
  void arrive_and_wait(int rank, const deadline& until, in_process_collective op) {
    std::unique_lock lock(mutex_);
    require_present();
    require_alive();
    const std::uint64_t generation = generation_;
    arrived_[static_cast<std::size_t>(rank)] = true;
    if (++waiting_ == size_) {
      waiting_ = 0;
      ++generation_;
      std::fill(arrived_.begin(), arrived_.end(), false);
      ready_.notify_all();
      return;
    }
    if (deadlocked()) {
      --waiting_;
      fail_deadlock();
    }
    if (!wait(lock, until, [&] { return generation_ != generation || aborted_ || departed_ > 0; })) {
      --waiting_;  // stays marked as arrived: the others' messages name only the ranks that never came
      expired_ = true;
      fail(errc::timeout, [&] {
        std::string missing;
        for (int r = 0; r < size_; ++r)
          if (!arrived_[static_cast<std::size_t>(r)]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        return std::string("in_process_transport::") + name_of(op) + ": rank(s) " + missing + " did not arrive " +
               until.within() + "; rank " + std::to_string(rank) + " gave up";
      });
    }
    if (generation_ == generation) {
      require_present();
      require_alive();
    }
  }

  /// Records that rank `rank`'s body returned: a collective that other ranks still call, or a
  /// receive from it with nothing left to receive, can never complete, so they fail instead of
  /// waiting.
  void depart(int rank) noexcept {
    const std::lock_guard lock(mutex_);
    ++departed_;
    departed_ranks_[static_cast<std::size_t>(rank)] = true;
    if (deadlocked()) mismatched_ = aborted_ = true;
    ready_.notify_all();
  }

  /// Appends a copy of `data` to the mailbox from `source` to `dest`.
  /// @throws error `peer_failed` once the group is aborted.
  void post(int source, int dest, std::span<const std::byte> data) {
    std::vector<std::byte> message(data.begin(), data.end());
    const std::lock_guard lock(mutex_);
    require_alive();
    mailbox(source, dest).push_back(std::move(message));
    ready_.notify_all();
  }

  /// Waits for the oldest message from `source` to `dest`, at most until `until`, and removes it
  /// from the mailbox.
  /// @throws error `timeout` when `until` passes first; `size_mismatch` when it can never arrive
  /// (the source returned, or every rank still running waits); `peer_failed` once the group is
  /// aborted or a rank timed out.
  [[nodiscard]] std::vector<std::byte> take(int source, int dest, const deadline& until) {
    std::unique_lock lock(mutex_);
    auto& box = mailbox(source, dest);
    if (box.empty()) {
      require_alive();
      require_sender(source);
      int& waiting_on = receiving_from_[static_cast<std::size_t>(dest)];
      waiting_on = source;
      if (deadlocked()) {
        waiting_on = -1;
        fail_deadlock();
      }
      const bool woken = wait(lock, until, [&] {
        return !box.empty() || aborted_ || departed_ranks_[static_cast<std::size_t>(source)];
      });
      waiting_on = -1;
      if (!woken) {
        expired_ = true;
        fail(errc::timeout, [&] {
          return "in_process_transport::recv_bytes: rank " + std::to_string(source) + " sent nothing to rank " +
                 std::to_string(dest) + " " + until.within();
        });
      }
      if (box.empty()) {
        require_sender(source);
        require_alive();
      }
    }
    std::vector<std::byte> message = std::move(box.front());
    box.pop_front();
    return message;
  }

  /// Marks the group failed and wakes every waiting rank.
  void abort() noexcept {
    const std::lock_guard lock(mutex_);
    aborted_ = true;
    ready_.notify_all();
  }

 private:
  void require_alive() const {
    detail::require(!mismatched_, errc::size_mismatch,
                    "the ranks' calls can never complete: they made different calls");
    detail::require(!aborted_, errc::peer_failed, "another rank of the in-process group failed");
    detail::require(!expired_, errc::peer_failed,
                    "a rank of the in-process group timed out: the call it abandoned can never complete, so the group "
                    "cannot go on");
  }

  /// Waits on `ready_` until `woken()` or `until` passes; false when it passed first.
  template <class Woken>
  [[nodiscard]] bool wait(std::unique_lock<std::mutex>& lock, const deadline& until, Woken woken) {
    if (until.infinite()) {
      ready_.wait(lock, woken);
      return true;
    }
    return ready_.wait_until(lock, until.at(), woken);
  }

  /// True when no rank runs and one waits in a receive with nothing to receive: nothing can
  /// ever wake it. A rank counts as running when it is not in the barrier, has not returned, and
  /// does not wait in a receive whose mailbox is empty (a message posted to it wakes it).
  [[nodiscard]] bool deadlocked() noexcept {
    int blocked = waiting_ + departed_;
    bool receiving = false;
    for (int r = 0; r < size_; ++r) {
      const int source = receiving_from_[static_cast<std::size_t>(r)];
      if (source < 0) continue;
      if (!mailbox(source, r).empty()) return false;
      ++blocked;
      receiving = true;
    }
    return receiving && blocked == size_;
  }

  [[noreturn]] void fail_deadlock() {
    mismatched_ = aborted_ = true;
    ready_.notify_all();
    detail::fail(errc::size_mismatch,
                 "every running rank waits and one waits in a receive: the ranks made different calls");
  }

  void require_sender(int source) {
    if (!departed_ranks_[static_cast<std::size_t>(source)]) return;
    aborted_ = true;
    ready_.notify_all();
    detail::fail(errc::size_mismatch,
                 "a receive from a rank that returned without sending it: the ranks made different calls");
  }

  [[nodiscard]] std::deque<std::vector<std::byte>>& mailbox(int source, int dest) noexcept {
    return mailboxes_[static_cast<std::size_t>(source) * static_cast<std::size_t>(size_) +
                      static_cast<std::size_t>(dest)];
  }

  void require_present() {
    if (departed_ == 0) return;
    aborted_ = true;
    ready_.notify_all();
    detail::fail(errc::size_mismatch,
                 "a rank returned while others still called collectives: the ranks made different calls");
  }

  int size_;
  std::vector<slot> slots_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::vector<std::deque<std::vector<std::byte>>> mailboxes_;  // [source · size + dest]
  std::vector<bool> departed_ranks_;
  std::vector<bool> arrived_;        // per rank: in the barrier's current generation (or gave up there)
  std::vector<int> receiving_from_;  // per rank: the source it waits to receive from, or −1
  int waiting_ = 0;                  // ranks in the barrier
  std::uint64_t generation_ = 0;
  int departed_ = 0;
  bool aborted_ = false;
  bool mismatched_ = false;  // aborted because the calls can never complete
  bool expired_ = false;  // a rank timed out: no call can start (ranks already waiting are left to their deadlines)
};

}  // namespace detail

/// Rank `rank()` of an in-process group; one object per thread. Made by `in_process_group`.
class in_process_transport {
 public:
  /// This rank.
  [[nodiscard]] int rank() const noexcept { return rank_; }
  /// Number of ranks.
  [[nodiscard]] int size() const noexcept { return shared_->size(); }

  /// Bounds this rank's later waits (for the other ranks to arrive in a collective, for a message
  /// in a receive) by `until`; a wait that reaches it throws `errc::timeout`. Initially none.
  void set_deadline(const deadline& until) noexcept { deadline_ = until; }
  /// The deadline of this rank's waits.
  [[nodiscard]] deadline current_deadline() const noexcept { return deadline_; }

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
    depart_together();
    if (rank_ == root) std::copy(total.begin(), total.end(), data.begin());
  }

  /// `in` holds size() blocks of `out.size()` values; `out` becomes the sum over ranks of block
  /// rank().
  template <class V>
  void reduce_scatter_sum(std::span<const V> in, std::span<V> out) {
    publish(in.data(), in.size(), out.size(), typeid(V), collective::reduce_scatter_sum, 0);
    require_agreement(in.size() == out.size() * static_cast<std::size_t>(size()),
                      "reduce_scatter_sum: the input is not size() blocks of the output");
    const std::vector<V> total = combine<V>(out.size() * static_cast<std::size_t>(rank_), out.size(),
                                            [](V a, V b) { return static_cast<V>(a + b); });
    depart_together();
    std::copy(total.begin(), total.end(), out.begin());
  }

  /// Every rank's `data` becomes rank `root`'s.
  void broadcast(std::span<std::byte> data, int root) {
    publish(data.data(), data.size(), data.size(), typeid(std::byte), collective::broadcast, root);
    if (rank_ != root && !data.empty()) std::memcpy(data.data(), shared_->at(root).input, data.size());
    depart_together();
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
    depart_together();
    return all;
  }

  /// Buffer j of `to_each` goes to rank j; returns the P buffers sent to this rank, buffer i from
  /// rank i. Sizes may differ, empty buffers included.
  /// @throws error `size_mismatch` on every rank when some rank passes other than size() buffers.
  [[nodiscard]] std::vector<std::vector<std::byte>> all_to_all_bytes(
      std::span<const std::span<const std::byte>> to_each) {
    publish(to_each.data(), to_each.size(), 0, typeid(std::span<const std::byte>), collective::all_to_all_bytes, 0);
    require_agreement(to_each.size() == static_cast<std::size_t>(size()), "all_to_all_bytes: not size() buffers");
    std::vector<std::vector<std::byte>> received(static_cast<std::size_t>(size()));
    for (int p = 0; p < size(); ++p) {
      const auto& sent = static_cast<const std::span<const std::byte>*>(shared_->at(p).input)[rank_];
      received[static_cast<std::size_t>(p)].assign(sent.begin(), sent.end());
    }
    depart_together();
    return received;
  }

  /// Sends a copy of `data` to rank `dest`; returns without waiting for the receive.
  /// @throws error `invalid_argument` for a rank outside the group, `peer_failed` once the group failed.
  void send_bytes(std::span<const std::byte> data, int dest) { shared_->post(rank_, peer(dest), data); }

  /// The oldest buffer that rank `source` sent to this rank, waiting for it if needed.
  /// @throws error `invalid_argument` for a rank outside the group; `timeout` when the deadline
  /// passes first; `size_mismatch` when it can never arrive; `peer_failed` once the group failed.
  [[nodiscard]] std::vector<std::byte> recv_bytes(int source) { return shared_->take(peer(source), rank_, deadline_); }

  /// Sends `data` to `dest`, then receives from `source`.
  [[nodiscard]] std::vector<std::byte> sendrecv_bytes(std::span<const std::byte> data, int dest, int source) {
    send_bytes(data, dest);
    return recv_bytes(source);
  }

 private:
  friend class in_process_group;

  using collective = detail::in_process_collective;

  in_process_transport(std::shared_ptr<detail::in_process_shared> shared, int rank)
      : shared_(std::move(shared)), rank_(rank) {}

  [[nodiscard]] int peer(int r) const {
    detail::require(r >= 0 && r < size(), errc::invalid_argument, "in-process transport: peer rank outside the group");
    return r;
  }

  /// Publishes this rank's side, waits for every rank (until the deadline), and checks that all
  /// called the same collective (same type, count unless `same_count` is false, and root).
  void publish(const void* input, std::size_t count, std::size_t result_count, const std::type_info& type,
               collective op, int root, bool same_count = true) {
    auto& mine = shared_->at(rank_);
    mine = {input, count, result_count, &type, op, root};
    shared_->arrive_and_wait(rank_, deadline_, op);
    bool agree = root >= 0 && root < size();
    for (int p = 0; p < size(); ++p) {
      const auto& s = shared_->at(p);
      agree = agree && s.operation == op && *s.type == type && s.root == root && s.result_count == result_count &&
              (!same_count || s.count == count);
    }
    require_agreement(agree, "the ranks called different collectives, types, counts or roots");
  }

  /// The second barrier of a collective: nobody leaves (and frees or refills its buffer) before
  /// every rank has read the others'. Every rank passed the first barrier and only copies since,
  /// so this wait cannot be prolonged by a caller and takes no deadline.
  void depart_together() { shared_->arrive_and_wait(rank_, deadline{}, collective::none); }

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
    depart_together();
    std::copy(result.begin(), result.end(), data.begin());
  }

  std::shared_ptr<detail::in_process_shared> shared_;
  int rank_;
  deadline deadline_{};
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
          shared->depart(r);
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
static_assert(transport_with_point_to_point<in_process_transport>);
static_assert(transport_with_all_to_all<in_process_transport>);
static_assert(transport_with_deadline<in_process_transport>);

}  // namespace gradcomp
