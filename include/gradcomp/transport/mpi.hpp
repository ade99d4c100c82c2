#pragma once
/// @file
/// The MPI transport: `mpi_transport` wraps a communicator the user created and satisfies
/// `transport`, `transport_with_bitwise_or`, `transport_with_point_to_point`,
/// `transport_with_all_to_all` and `transport_with_deadline`. Opt-in: include this header only in a program that uses MPI (it includes <mpi.h>; link MPI, for example
/// CMake's `MPI::MPI_CXX`). It needs MPI 3.1 and a single thread per transport object.
///
/// ```cpp
/// MPI_Init(&argc, &argv);
/// {
///   gradcomp::mpi_transport t(MPI_COMM_WORLD);   // collective: duplicates the communicator
///   t.all_reduce_sum(std::span<float>(grad));     // every rank: the rank-order sum
/// }                                              // destroyed before MPI_Finalize
/// MPI_Finalize();
/// ```
///
/// The transport works on its own duplicate of the communicator (`MPI_Comm_dup`), so its messages
/// never match the user's, and sets `MPI_ERRORS_RETURN` on the duplicate only: a failing MPI call
/// throws `errc::transport_failed` with the call's name and MPI's error string instead of
/// aborting. The user's communicator and its error handler are left as they are.
///
/// Reductions give the bits of the in-process transport: sums, maxima, `reduce_sum` and
/// `reduce_scatter_sum` are the block scheme of rank_ordered.hpp (`rank_ordered_reductions`, whose
/// comment documents them and their argument checks), over `MPI_Ialltoallv` (step 1) and
/// `MPI_Iallgatherv` (`MPI_Igatherv` to the root for `reduce_sum`). Only the OR, where every
/// implementation agrees, is an `MPI_Iallreduce` (`MPI_BOR`).
///
/// MPI 3.1 counts and displacements are `int`: a call whose counts or displacements would exceed
/// `INT_MAX` throws `errc::invalid_argument` on every rank alike and sends nothing (but the sizes,
/// which `all_to_all_bytes` exchanges before the ranks agree on the verdict); it never truncates.
/// A peer outside the group and an all-to-all of other than size() buffers throw
/// `errc::invalid_argument` before anything is sent.
///
/// Device data: this adapter takes host buffers. A `cuda_executor` reaches it through
/// `staged_transport<mpi_transport>` (transport/staged.cuh), which stages device buffers through
/// pinned host buffers; CUDA-aware MPI is not used.
///
/// Point-to-point messages carry any number of bytes: `recv_bytes` probes for the size before
/// receiving. `send_bytes` may wait until the destination receives; `sendrecv_bytes` starts its send
/// before it receives, so a ring cannot deadlock. Messages to this rank itself are kept by the
/// transport and returned by the next `recv_bytes(rank())`, as in the in-process transport.
///
/// **Deadlines** (`set_deadline`; docs/transports.md §8). Every call is MPI's non-blocking
/// variant (`MPI_Ialltoallv`, `MPI_Iallgatherv`, `MPI_Igatherv`, `MPI_Iallreduce`, `MPI_Ibcast`,
/// `MPI_Iallgather`, `MPI_Ialltoall`, `MPI_Isend`, `MPI_Iprobe`, `MPI_Irecv`), completed by
/// `MPI_Test` polled against the deadline (`MPI_Wait` without one), so a rank that died or
/// stopped calling makes the others throw `errc::timeout` at the deadline. A collective cannot say
/// which rank is missing; a receive names its source. MPI cannot cancel a pending collective, and
/// without the fault-tolerance extension (ULFM) it cannot leave a dead rank out of a communicator.
/// After a timeout the transport therefore refuses every call (`transport_failed`), and the job
/// must end (`MPI_Abort`) or be restarted; a new communicator needs every rank, the missing one
/// included. The abandoned call may still complete later, so everything it reads or writes is the
/// transport's own memory (the caller's buffers are copied in and out), and that memory is kept
/// until the process exits. A killed peer may instead surface as an MPI error, which throws
/// `transport_failed` like any other (under Open MPI 4.1 on one node, by default `mpirun` ends the
/// whole job when a rank dies; with `--mca orte_enable_recovery 1` the others go on and time out).

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <gradcomp/core/error.hpp>
#include <gradcomp/transport/deadline.hpp>
#include <gradcomp/transport/rank_ordered.hpp>
#include <gradcomp/transport/transport.hpp>

namespace gradcomp {

/// One rank of an MPI communicator; one object per rank, used by one thread at a time.
/// Move-only: it owns a duplicate of the user's communicator.
class mpi_transport : public detail::rank_ordered_reductions<mpi_transport> {
  using reductions = detail::rank_ordered_reductions<mpi_transport>;
  friend reductions;

 public:
  /// Names the adapter in messages.
  static constexpr const char* transport_name = "mpi_transport";

  /// Duplicates `comm` (collective over `comm`: every rank constructs its transport together; a
  /// blocking `MPI_Comm_dup`, which no deadline bounds) and sets `MPI_ERRORS_RETURN` on the
  /// duplicate. MPI must be initialized.
  /// @throws error `transport_failed` when `MPI_Comm_dup` fails and `comm`'s error handler returns
  ///         (under the default `MPI_ERRORS_ARE_FATAL`, MPI aborts instead).
  explicit mpi_transport(MPI_Comm comm) {
    check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
    try {
      check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
      check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
      check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    } catch (...) {
      release();
      throw;
    }
  }

  /// Frees the duplicate communicator. Destroy every transport before `MPI_Finalize`: after it,
  /// the duplicate can no longer be freed (the destructor then leaves it).
  ~mpi_transport() { release(); }

  mpi_transport(const mpi_transport&) = delete;
  mpi_transport& operator=(const mpi_transport&) = delete;

  /// Takes over `other`'s communicator; `other` may then only be destroyed or assigned to.
  mpi_transport(mpi_transport&& other) noexcept
      : reductions(std::move(other)),
        comm_(std::exchange(other.comm_, MPI_COMM_NULL)),
        rank_(other.rank_),
        size_(other.size_),
        self_(std::move(other.self_)),
        deadline_(other.deadline_),
        abandoned_call_(std::move(other.abandoned_call_)),
        blocks_(std::move(other.blocks_)),
        staging_(std::move(other.staging_)) {}

  /// Frees this transport's communicator and takes over `other`'s.
  mpi_transport& operator=(mpi_transport&& other) noexcept {
    if (this != &other) {
      release();
      reductions::operator=(std::move(other));
      comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
      rank_ = other.rank_;
      size_ = other.size_;
      self_ = std::move(other.self_);
      deadline_ = other.deadline_;
      abandoned_call_ = std::move(other.abandoned_call_);
      blocks_ = std::move(other.blocks_);
      staging_ = std::move(other.staging_);
    }
    return *this;
  }

  /// This rank.
  [[nodiscard]] int rank() const noexcept { return rank_; }
  /// Number of ranks.
  [[nodiscard]] int size() const noexcept { return size_; }

  /// Bounds the waits of later calls by `until` (this file's comment); initially none.
  void set_deadline(const deadline& until) noexcept { deadline_ = until; }
  /// The deadline of this transport's waits.
  [[nodiscard]] deadline current_deadline() const noexcept { return deadline_; }

  /// Element-wise bitwise OR over ranks (`MPI_Iallreduce` with `MPI_BOR`), in place on every rank.
  /// @throws error `invalid_argument` when the count exceeds MPI's int; `timeout`; `transport_failed`.
  void all_reduce_or(std::span<std::uint8_t> data) {
    const int count = int_count(data.size(), "all_reduce_or");
    require_usable();
    call_memory memory;
    const std::span<std::uint8_t> mine = memory.copy(std::span<const std::uint8_t>(data));
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Iallreduce(MPI_IN_PLACE, mine.data(), count, MPI_UINT8_T, MPI_BOR, comm_, &request), "MPI_Iallreduce");
    complete(request, memory, "all_reduce_or", "MPI_Iallreduce");
    std::copy(mine.begin(), mine.end(), data.begin());
  }

  /// Every rank's `data` becomes rank `root`'s (`MPI_Ibcast`).
  /// @throws error `invalid_argument` for a root outside the group or more than INT_MAX bytes;
  ///         `timeout`; `transport_failed`.
  void broadcast(std::span<std::byte> data, int root) {
    const int from = member(root, "broadcast", "root");
    const int count = int_count(data.size(), "broadcast");
    require_usable();
    call_memory memory;
    const std::span<std::byte> staged = memory.copy(std::span<const std::byte>(data));
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Ibcast(staged.data(), count, MPI_BYTE, from, comm_, &request), "MPI_Ibcast");
    complete(request, memory, "broadcast", "MPI_Ibcast");
    std::copy(staged.begin(), staged.end(), data.begin());
  }

  /// Every rank's byte buffer, in rank order; sizes may differ between ranks. The sizes travel
  /// first (`MPI_Iallgather`), then the bytes (`MPI_Iallgatherv`).
  /// @throws error `invalid_argument` (on every rank) when the buffers hold more than INT_MAX
  ///         bytes together; `timeout`; `transport_failed`.
  [[nodiscard]] std::vector<std::vector<std::byte>> all_gather_bytes(std::span<const std::byte> mine) {
    require_usable();
    call_memory memory;
    const std::span<std::uint64_t> my_size = memory.make<std::uint64_t>(1);
    my_size[0] = mine.size();
    const std::span<std::uint64_t> sizes = memory.make<std::uint64_t>(index(size_));
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Iallgather(my_size.data(), 1, MPI_UINT64_T, sizes.data(), 1, MPI_UINT64_T, comm_, &request),
          "MPI_Iallgather");
    complete(request, memory, "all_gather_bytes", "MPI_Iallgather");
    detail::require(fits_int(sizes), errc::invalid_argument, [] {
      return "mpi_transport::all_gather_bytes: the ranks' buffers hold more than INT_MAX = " + std::to_string(INT_MAX) +
             " bytes together, more than MPI 3.1's int counts and displacements address";
    });
    const int_blocks blocks = int_blocks_of(sizes, memory);
    const std::span<const std::byte> sent = memory.copy(mine);
    const std::span<std::byte> flat = memory.make<std::byte>(static_cast<std::size_t>(total_of(sizes)));
    check(MPI_Iallgatherv(sent.data(), blocks.counts[index(rank_)], MPI_BYTE, flat.data(), blocks.counts.data(),
                          blocks.firsts.data(), MPI_BYTE, comm_, &request),
          "MPI_Iallgatherv");
    complete(request, memory, "all_gather_bytes", "MPI_Iallgatherv");
    return detail::cut_into(std::span<const std::byte>(flat), std::span<const int>(blocks.counts));
  }

  /// Buffer j of `to_each` goes to rank j; returns the P buffers sent to this rank, buffer i from
  /// rank i; sizes may differ, empty buffers included. The sizes travel first (`MPI_Ialltoall`),
  /// then a verdict on MPI's int limits (`MPI_Iallreduce`, as each rank sees only its own sizes),
  /// then the bytes (`MPI_Ialltoallv`).
  /// @throws error `invalid_argument` for other than size() buffers (this rank, before anything
  ///         is sent), and on every rank alike when the bytes some rank sends or receives exceed
  ///         INT_MAX together; `timeout`; `transport_failed`.
  [[nodiscard]] std::vector<std::vector<std::byte>> all_to_all_bytes(
      std::span<const std::span<const std::byte>> to_each) {
    detail::require_one_buffer_per_rank(to_each.size(), size_, "mpi_transport::all_to_all_bytes");
    require_usable();
    call_memory memory;
    const std::span<std::uint64_t> sent_sizes = memory.make<std::uint64_t>(index(size_));
    for (std::size_t p = 0; p < sent_sizes.size(); ++p) sent_sizes[p] = to_each[p].size();
    const std::span<std::uint64_t> received_sizes = memory.make<std::uint64_t>(index(size_));
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Ialltoall(sent_sizes.data(), 1, MPI_UINT64_T, received_sizes.data(), 1, MPI_UINT64_T, comm_, &request),
          "MPI_Ialltoall");
    complete(request, memory, "all_to_all_bytes", "MPI_Ialltoall");
    const std::span<int> fits = memory.make<int>(1);
    fits[0] = fits_int(sent_sizes) && fits_int(received_sizes) ? 1 : 0;
    check(MPI_Iallreduce(MPI_IN_PLACE, fits.data(), 1, MPI_INT, MPI_MIN, comm_, &request), "MPI_Iallreduce");
    complete(request, memory, "all_to_all_bytes", "MPI_Iallreduce");
    detail::require(fits[0] == 1, errc::invalid_argument, [] {
      return "mpi_transport::all_to_all_bytes: a rank sends or receives more than INT_MAX = " +
             std::to_string(INT_MAX) + " bytes together, more than MPI 3.1's int counts and displacements address";
    });
    const int_blocks sent = int_blocks_of(sent_sizes, memory);
    const int_blocks received = int_blocks_of(received_sizes, memory);
    const std::span<const std::byte> flat_sent = memory.copy(std::span<const std::byte>(detail::concatenated(to_each)));
    const std::span<std::byte> flat_received =
        memory.make<std::byte>(static_cast<std::size_t>(total_of(received_sizes)));
    check(MPI_Ialltoallv(flat_sent.data(), sent.counts.data(), sent.firsts.data(), MPI_BYTE, flat_received.data(),
                         received.counts.data(), received.firsts.data(), MPI_BYTE, comm_, &request),
          "MPI_Ialltoallv");
    complete(request, memory, "all_to_all_bytes", "MPI_Ialltoallv");
    return detail::cut_into(std::span<const std::byte>(flat_received), std::span<const int>(received.counts));
  }

  /// Sends `data` to rank `dest` (`MPI_Isend`, completed when MPI has taken the message, which may
  /// wait until `dest` receives it); a message to this rank itself is kept and returns at once.
  /// @throws error `invalid_argument` for a rank outside the group or more than INT_MAX bytes;
  ///         `timeout` naming `dest`; `transport_failed`.
  void send_bytes(std::span<const std::byte> data, int dest) {
    const int to = member(dest, "send_bytes", "destination");
    const int count = int_count(data.size(), "send_bytes");
    if (to == rank_) {
      self_.post(data);
      return;
    }
    require_usable();
    call_memory memory;
    MPI_Request request = start_send(data, count, to, memory);
    complete(request, memory, "send_bytes", "MPI_Isend", to);
  }

  /// The next buffer that rank `source` sent to this rank, of any size, waiting for it if needed.
  /// @throws error `invalid_argument` for a rank outside the group; `size_mismatch` for a receive
  ///         from this rank itself with nothing sent to itself; `timeout` naming `source`;
  ///         `transport_failed`.
  [[nodiscard]] std::vector<std::byte> recv_bytes(int source) {
    const int from = member(source, "recv_bytes", "source");
    if (from == rank_) return self_.take();
    require_usable();
    call_memory memory;
    return receive(from, memory, "recv_bytes");
  }

  /// Sends `data` to `dest` and receives the next buffer from `source` at once: the send is
  /// started (`MPI_Isend`) before the receive and completed after it, so a ring in which every rank
  /// sends to its successor and receives from its predecessor cannot deadlock.
  /// @throws error as `send_bytes` and `recv_bytes`.
  [[nodiscard]] std::vector<std::byte> sendrecv_bytes(std::span<const std::byte> data, int dest, int source) {
    const int to = member(dest, "sendrecv_bytes", "destination");
    const int from = member(source, "sendrecv_bytes", "source");
    if (to == rank_ || from == rank_) {  // one side is local: the send and the receive in turn cannot deadlock
      send_bytes(data, to);
      return recv_bytes(from);
    }
    const int count = int_count(data.size(), "sendrecv_bytes");
    require_usable();
    call_memory memory;  // the send's copy stays with the receive's memory if the receive times out
    MPI_Request request = start_send(data, count, to, memory);
    std::vector<std::byte> received = receive(from, memory, "sendrecv_bytes");
    complete(request, memory, "sendrecv_bytes", "MPI_Isend", to);
    return received;
  }

 private:
  /// The tag of point-to-point messages on the transport's own communicator.
  static constexpr int message_tag = 0;
  /// `complete`'s peer when the call is a collective, which cannot say who is missing.
  static constexpr int no_peer = -1;

  /// The memory of one call's pending MPI operations: the buffers they read and write and their
  /// count arrays, which MPI may use until they complete. Held by the call until then; a call
  /// abandoned at its deadline hands it to `abandon`, which keeps it until the process exits.
  class call_memory {
   public:
    /// Room for `count` values of V (contents unspecified), held here.
    template <class V>
    [[nodiscard]] std::span<V> make(std::size_t count) {
      return typed<V>(hold(std::shared_ptr<std::byte[]>(new std::byte[std::max<std::size_t>(count * sizeof(V), 1)])),
                      count);
    }
    /// A copy of `from`, held here.
    template <class V>
    [[nodiscard]] std::span<V> copy(std::span<const V> from) {
      const std::span<V> to = make<V>(from.size());
      std::copy(from.begin(), from.end(), to.begin());
      return to;
    }
    /// Holds `block` (new, or a buffer the transport reuses across calls) for this call.
    std::byte* hold(std::shared_ptr<std::byte[]> block) {
      blocks_.push_back(std::move(block));
      return blocks_.back().get();
    }
    /// Gives the memory up to the process: MPI may write it until the process exits. (Out of
    /// memory here terminates: freeing it could let MPI write into memory reused since.)
    void abandon() noexcept {
      static std::mutex guard;
      static auto* kept = new std::vector<std::shared_ptr<std::byte[]>>();  // never freed, reachable until exit
      const std::lock_guard lock(guard);
      kept->insert(kept->end(), blocks_.begin(), blocks_.end());
    }

   private:
    template <class V>
    [[nodiscard]] static std::span<V> typed(std::byte* bytes, std::size_t count) noexcept {
      return {reinterpret_cast<V*>(bytes), count};  // storage for any V (implicit objects)
    }
    std::vector<std::shared_ptr<std::byte[]>> blocks_;
  };

  /// The blocks of a block_split as MPI's int counts and displacements (in a call's memory).
  struct int_blocks {
    std::span<int> counts;
    std::span<int> firsts;
  };

  /// A grow-only buffer of the transport, reused across calls; a call that uses it holds it in its
  /// memory (`call_memory::hold`), so that a timeout leaves it to MPI and the next call grows anew.
  struct reused_buffer {
    std::shared_ptr<std::byte[]> block;
    std::size_t bytes = 0;

    /// At least `count` values of V.
    template <class V>
    [[nodiscard]] std::span<V> of(std::size_t count) {
      if (!block || count * sizeof(V) > bytes) {
        block = std::shared_ptr<std::byte[]>(new std::byte[std::max<std::size_t>(count * sizeof(V), 1)]);
        bytes = count * sizeof(V);
      }
      return {reinterpret_cast<V*>(block.get()), count};  // storage for any V (implicit objects)
    }
  };

  template <class V>
  [[nodiscard]] static MPI_Datatype datatype() noexcept {
    if constexpr (std::is_same_v<V, float>) return MPI_FLOAT;
    else if constexpr (std::is_same_v<V, double>)
      return MPI_DOUBLE;
    else if constexpr (std::is_same_v<V, std::uint8_t>)
      return MPI_UINT8_T;
    else
      return MPI_UINT64_T;
  }

  [[nodiscard]] static std::size_t index(int r) noexcept { return static_cast<std::size_t>(r); }

  /// Throws `transport_failed`, with the call's name and MPI's error string, unless `rc` is success.
  static void check(int rc, const char* call) {
    if (rc == MPI_SUCCESS) [[likely]]
      return;
    detail::fail(errc::transport_failed, [&] {
      char text[MPI_MAX_ERROR_STRING] = {};
      int length = 0;
      const bool named = MPI_Error_string(rc, text, &length) == MPI_SUCCESS && length > 0;
      return std::string("mpi_transport: ") + call + " failed: " +
             (named ? std::string(text, static_cast<std::size_t>(length)) : "MPI error " + std::to_string(rc));
    });
  }

  /// Throws `transport_failed` once a call has timed out (this file's comment).
  void require_usable() const {
    detail::require(abandoned_call_.empty(), errc::transport_failed, [&] {
      return "mpi_transport: unusable since " + abandoned_call_ +
             " timed out: MPI cannot cancel the pending call, so end the job (MPI_Abort) or restart it";
    });
  }

  /// Waits for `request` until the deadline (`MPI_Test` polled; `MPI_Wait` without one). On a
  /// timeout, hands `memory` to the process, marks the transport unusable and throws `timeout`
  /// naming `call`, `mpi_call` and `peer` (`no_peer` for a collective). An MPI error while the
  /// request is pending also hands the memory over, then throws `transport_failed`.
  void complete(MPI_Request& request, call_memory& memory, const char* call, const char* mpi_call, int peer = no_peer) {
    bool done = false;
    try {
      if (deadline_.infinite()) {
        check(MPI_Wait(&request, MPI_STATUS_IGNORE), mpi_call);
        return;
      }
      done = poll_until(deadline_, [&] {
        int flag = 0;
        check(MPI_Test(&request, &flag, MPI_STATUS_IGNORE), mpi_call);
        return flag != 0;
      });
    } catch (...) {
      abandon(memory);
      throw;
    }
    if (done) return;
    abandon(memory);
    time_out(call, [&] {
      if (peer == no_peer)
        return std::string(mpi_call) + " did not complete " + deadline_.within() +
               ": a rank died or stopped calling (MPI does not say which)";
      const std::string who = "rank " + std::to_string(peer);
      return std::string(mpi_call) + " with " + who + " did not complete " + deadline_.within() + ": " + who +
             " died or stopped calling";
    });
  }

  /// Gives `memory` of a call that may still be pending up to the process, and lets go of the
  /// reused buffers it may hold, so that no later call writes into them.
  void abandon(call_memory& memory) noexcept {
    memory.abandon();
    blocks_ = {};
    staging_ = {};
  }

  /// Marks the transport unusable and throws `timeout`: "mpi_transport::`call`: `what()`; …".
  template <class What>
  [[noreturn]] void time_out(const char* call, What&& what) {
    abandoned_call_ = call;
    detail::fail(errc::timeout, std::string("mpi_transport::") + call + ": " + what() +
                                    "; the transport is unusable now (MPI cannot cancel the pending call)");
  }

  /// Throws `invalid_argument` unless MPI's int counts and displacements can address `n` elements.
  static void require_fits(bool fits, std::uint64_t n, const char* call) {
    detail::require(fits, errc::invalid_argument, [&] {
      return std::string("mpi_transport::") + call + ": " + std::to_string(n) +
             " elements exceed what MPI 3.1's int counts and displacements address (INT_MAX = " +
             std::to_string(INT_MAX) + "); split the buffer";
    });
  }

  /// `n` as MPI's int count. @throws error `invalid_argument` above INT_MAX.
  [[nodiscard]] static int int_count(std::size_t n, const char* call) {
    require_fits(n <= INT_MAX, n, call);
    return static_cast<int>(n);
  }

  /// The blocks of `split` (of `n` elements) as MPI's counts and displacements; the largest
  /// receive displacement of the all-to-all, (P − 1)·⌈n/P⌉, must fit too. Every rank computes the same, so every rank
  /// throws alike. @throws error `invalid_argument` when they exceed INT_MAX.
  [[nodiscard]] int_blocks int_blocks_of(const detail::block_split& split, std::size_t n, const char* call,
                                         call_memory& memory) const {
    require_fits(n <= INT_MAX && split.largest() * index(size_ - 1) <= INT_MAX, n, call);
    const int_blocks blocks{memory.make<int>(index(size_)), memory.make<int>(index(size_))};
    for (int b = 0; b < size_; ++b) {
      blocks.counts[index(b)] = static_cast<int>(split.count(b));
      blocks.firsts[index(b)] = static_cast<int>(split.first(b));
    }
    return blocks;
  }

  /// The sum of `sizes`, or INT_MAX + 1 once it exceeds INT_MAX (it cannot wrap).
  [[nodiscard]] static std::uint64_t total_of(std::span<const std::uint64_t> sizes) noexcept {
    std::uint64_t total = 0;
    for (const std::uint64_t s : sizes)
      total = total <= INT_MAX && s <= INT_MAX - total ? total + s : std::uint64_t{INT_MAX} + 1;
    return total;
  }

  /// Whether MPI's int counts and displacements address buffers of `sizes` bytes laid end to end.
  [[nodiscard]] static bool fits_int(std::span<const std::uint64_t> sizes) noexcept {
    return total_of(sizes) <= INT_MAX;
  }

  /// Buffers of `sizes` bytes laid end to end as MPI's int counts and displacements; `fits_int(sizes)`.
  [[nodiscard]] static int_blocks int_blocks_of(std::span<const std::uint64_t> sizes, call_memory& memory) {
    const int_blocks blocks{memory.make<int>(sizes.size()), memory.make<int>(sizes.size())};
    int first = 0;
    for (std::size_t p = 0; p < sizes.size(); ++p) {
      blocks.counts[p] = static_cast<int>(sizes[p]);
      blocks.firsts[p] = first;
      first += blocks.counts[p];
    }
    return blocks;
  }

  /// Room for step 1 of the block scheme, in the transport's reused buffer `blocks_` (held by the
  /// exchange and the gather that use it).
  template <class V>
  [[nodiscard]] std::span<V> block_scratch(std::size_t count) {
    return blocks_.of<V>(count);
  }

  /// Step 1 of the block scheme (`MPI_Ialltoallv`), from a copy of `data` into `received`.
  template <class V>
  void exchange_blocks(std::span<const V> data, const detail::block_split& split, std::span<V> received,
                       const char* call) {
    require_usable();
    call_memory memory;
    const int_blocks blocks = int_blocks_of(split, data.size(), call, memory);
    const int m = blocks.counts[index(rank_)];
    const int_blocks from_each{memory.make<int>(index(size_)), memory.make<int>(index(size_))};
    for (int p = 0; p < size_; ++p) {
      from_each.counts[index(p)] = m;
      from_each.firsts[index(p)] = p * m;
    }
    const std::span<V> sent = staging_.of<V>(data.size());
    std::copy(data.begin(), data.end(), sent.begin());
    memory.hold(staging_.block);
    memory.hold(blocks_.block);  // `received` lies in it
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Ialltoallv(sent.data(), blocks.counts.data(), blocks.firsts.data(), datatype<V>(), received.data(),
                         from_each.counts.data(), from_each.firsts.data(), datatype<V>(), comm_, &request),
          "MPI_Ialltoallv");
    complete(request, memory, call, "MPI_Ialltoallv");
  }

  /// Step 3 of the block scheme: `MPI_Iallgatherv`, or `MPI_Igatherv` to `root`, of `mine` (in the
  /// scratch) into the transport's staging buffer, then into `data` where it is received.
  template <class V>
  void gather_blocks(std::span<V> data, std::span<const V> mine, const detail::block_split& split, int root,
                     const char* call) {
    require_usable();
    call_memory memory;
    const int_blocks blocks = int_blocks_of(split, data.size(), call, memory);
    const bool receives = root == detail::all_ranks || root == rank_;
    const std::span<V> gathered = staging_.of<V>(data.size());
    memory.hold(staging_.block);
    memory.hold(blocks_.block);  // `mine` lies in it
    MPI_Request request = MPI_REQUEST_NULL;
    if (root == detail::all_ranks)
      check(MPI_Iallgatherv(mine.data(), blocks.counts[index(rank_)], datatype<V>(), gathered.data(),
                            blocks.counts.data(), blocks.firsts.data(), datatype<V>(), comm_, &request),
            "MPI_Iallgatherv");
    else
      check(MPI_Igatherv(mine.data(), blocks.counts[index(rank_)], datatype<V>(), gathered.data(), blocks.counts.data(),
                         blocks.firsts.data(), datatype<V>(), root, comm_, &request),
            "MPI_Igatherv");
    complete(request, memory, call, root == detail::all_ranks ? "MPI_Iallgatherv" : "MPI_Igatherv");
    if (receives) std::copy(gathered.begin(), gathered.end(), data.begin());
  }

  /// Starts sending a copy of `data` (`count` bytes) to `to`, held by `memory`.
  [[nodiscard]] MPI_Request start_send(std::span<const std::byte> data, int count, int to, call_memory& memory) {
    const std::span<const std::byte> sent = memory.copy(data);
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Isend(sent.data(), count, MPI_BYTE, to, message_tag, comm_, &request), "MPI_Isend");
    return request;
  }

  /// Receives the next message from `from` (another rank), of the size it has: `MPI_Iprobe`
  /// polled until it arrives or the deadline passes, then `MPI_Irecv` into `memory`.
  [[nodiscard]] std::vector<std::byte> receive(int from, call_memory& memory, const char* call) {
    MPI_Status status;
    int arrived = 0;
    const auto probe = [&] {
      check(MPI_Iprobe(from, message_tag, comm_, &arrived, &status), "MPI_Iprobe");
      return arrived != 0;
    };
    bool found = true;
    try {
      if (deadline_.infinite()) check(MPI_Probe(from, message_tag, comm_, &status), "MPI_Probe");
      else
        found = poll_until(deadline_, probe);
    } catch (...) {
      abandon(memory);
      throw;
    }
    if (!found) {
      abandon(memory);
      time_out(call, [&] { return "rank " + std::to_string(from) + " sent nothing " + deadline_.within(); });
    }
    int count = 0;
    check(MPI_Get_count(&status, MPI_BYTE, &count), "MPI_Get_count");
    const std::span<std::byte> bytes = memory.make<std::byte>(static_cast<std::size_t>(count));
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Irecv(bytes.data(), count, MPI_BYTE, from, message_tag, comm_, &request), "MPI_Irecv");
    complete(request, memory, call, "MPI_Irecv", from);
    return {bytes.begin(), bytes.end()};
  }

  /// Frees the communicator unless it was moved away or MPI is finalized.
  void release() noexcept {
    if (comm_ == MPI_COMM_NULL) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized == 0) MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 0;
  detail::self_messages self_;
  deadline deadline_{};
  std::string abandoned_call_;  ///< The call that timed out (empty: none); the transport refuses calls after it.
  reused_buffer blocks_;  ///< Step 1's received blocks (the block scratch).
  reused_buffer staging_;  ///< A copy of the caller's data (step 1) or the gathered blocks (step 3).
};

static_assert(transport_with_bitwise_or<mpi_transport>);
static_assert(transport_with_point_to_point<mpi_transport>);
static_assert(transport_with_all_to_all<mpi_transport>);
static_assert(transport_with_deadline<mpi_transport>);

}  // namespace gradcomp
