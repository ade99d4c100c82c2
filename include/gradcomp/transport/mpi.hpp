#pragma once
/// @file
/// The MPI transport: `mpi_transport` wraps a communicator the user created and satisfies
/// `transport`, `transport_with_bitwise_or`, `transport_with_point_to_point` and
/// `transport_with_all_to_all`. Opt-in: include
/// this header only in a program that uses MPI (it includes <mpi.h>; link MPI, for example
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
/// comment documents them and their argument checks), over `MPI_Alltoallv` (step 1) and
/// `MPI_Allgatherv` (`MPI_Gatherv` to the root for `reduce_sum`). Only the OR, where every
/// implementation agrees, is an `MPI_Allreduce` (`MPI_BOR`).
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
/// Point-to-point messages carry any number of bytes: `recv_bytes` probes for the size
/// (`MPI_Probe`, `MPI_Get_count`) before receiving. `send_bytes` is `MPI_Send`, which may wait until
/// the destination receives; `sendrecv_bytes` starts an `MPI_Isend` before it receives, so a ring
/// cannot deadlock. Messages to this rank itself are kept by the transport and returned by the
/// next `recv_bytes(rank())`, as in the in-process transport.

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <gradcomp/core/error.hpp>
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

  /// Duplicates `comm` (collective over `comm`: every rank constructs its transport together) and
  /// sets `MPI_ERRORS_RETURN` on the duplicate. MPI must be initialized.
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
        self_(std::move(other.self_)) {}

  /// Frees this transport's communicator and takes over `other`'s.
  mpi_transport& operator=(mpi_transport&& other) noexcept {
    if (this != &other) {
      release();
      reductions::operator=(std::move(other));
      comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
      rank_ = other.rank_;
      size_ = other.size_;
      self_ = std::move(other.self_);
    }
    return *this;
  }

  /// This rank.
  [[nodiscard]] int rank() const noexcept { return rank_; }
  /// Number of ranks.
  [[nodiscard]] int size() const noexcept { return size_; }

  /// Element-wise bitwise OR over ranks (`MPI_BOR`), in place on every rank.
  /// @throws error `invalid_argument` when the count exceeds MPI's int; `transport_failed`.
  void all_reduce_or(std::span<std::uint8_t> data) {
    check(MPI_Allreduce(MPI_IN_PLACE, data.data(), int_count(data.size(), "all_reduce_or"), MPI_UINT8_T, MPI_BOR, comm_),
          "MPI_Allreduce");
  }

  /// Every rank's `data` becomes rank `root`'s (`MPI_Bcast`).
  /// @throws error `invalid_argument` for a root outside the group or more than INT_MAX bytes;
  ///         `transport_failed`.
  void broadcast(std::span<std::byte> data, int root) {
    const int from = member(root, "broadcast", "root");
    check(MPI_Bcast(data.data(), int_count(data.size(), "broadcast"), MPI_BYTE, from, comm_), "MPI_Bcast");
  }

  /// Every rank's byte buffer, in rank order; sizes may differ between ranks. The sizes travel
  /// first (`MPI_Allgather`), then the bytes (`MPI_Allgatherv`).
  /// @throws error `invalid_argument` (on every rank) when the buffers hold more than INT_MAX
  ///         bytes together; `transport_failed`.
  [[nodiscard]] std::vector<std::vector<std::byte>> all_gather_bytes(std::span<const std::byte> mine) {
    const auto my_size = static_cast<std::uint64_t>(mine.size());
    std::vector<std::uint64_t> sizes(index(size_));
    check(MPI_Allgather(&my_size, 1, MPI_UINT64_T, sizes.data(), 1, MPI_UINT64_T, comm_), "MPI_Allgather");
    detail::require(fits_int(sizes), errc::invalid_argument, [] {
      return "mpi_transport::all_gather_bytes: the ranks' buffers hold more than INT_MAX = " + std::to_string(INT_MAX) +
             " bytes together, more than MPI 3.1's int counts and displacements address";
    });
    const int_blocks blocks = int_blocks_of(sizes);
    std::vector<std::byte> flat(static_cast<std::size_t>(total_of(sizes)));
    check(MPI_Allgatherv(mine.data(), blocks.counts[index(rank_)], MPI_BYTE, flat.data(), blocks.counts.data(),
                         blocks.firsts.data(), MPI_BYTE, comm_),
          "MPI_Allgatherv");
    return detail::cut_into(std::span<const std::byte>(flat), std::span<const int>(blocks.counts));
  }

  /// Buffer j of `to_each` goes to rank j; returns the P buffers sent to this rank, buffer i from
  /// rank i; sizes may differ, empty buffers included. The sizes travel first (`MPI_Alltoall`),
  /// then a verdict on MPI's int limits (`MPI_Allreduce`, as each rank sees only its own sizes),
  /// then the bytes (`MPI_Alltoallv`).
  /// @throws error `invalid_argument` for other than size() buffers (this rank, before anything
  ///         is sent), and on every rank alike when the bytes some rank sends or receives exceed
  ///         INT_MAX together; `transport_failed`.
  [[nodiscard]] std::vector<std::vector<std::byte>> all_to_all_bytes(std::span<const std::span<const std::byte>> to_each) {
    detail::require_one_buffer_per_rank(to_each.size(), size_, "mpi_transport::all_to_all_bytes");
    std::vector<std::uint64_t> sent_sizes(index(size_));
    for (std::size_t p = 0; p < sent_sizes.size(); ++p) sent_sizes[p] = to_each[p].size();
    std::vector<std::uint64_t> received_sizes(index(size_));
    check(MPI_Alltoall(sent_sizes.data(), 1, MPI_UINT64_T, received_sizes.data(), 1, MPI_UINT64_T, comm_),
          "MPI_Alltoall");
    int fits = fits_int(sent_sizes) && fits_int(received_sizes) ? 1 : 0;
    check(MPI_Allreduce(MPI_IN_PLACE, &fits, 1, MPI_INT, MPI_MIN, comm_), "MPI_Allreduce");
    detail::require(fits == 1, errc::invalid_argument, [] {
      return "mpi_transport::all_to_all_bytes: a rank sends or receives more than INT_MAX = " + std::to_string(INT_MAX) +
             " bytes together, more than MPI 3.1's int counts and displacements address";
    });
    const int_blocks sent = int_blocks_of(sent_sizes);
    const int_blocks received = int_blocks_of(received_sizes);
    const std::vector<std::byte> flat_sent = detail::concatenated(to_each);
    std::vector<std::byte> flat_received(static_cast<std::size_t>(total_of(received_sizes)));
    check(MPI_Alltoallv(flat_sent.data(), sent.counts.data(), sent.firsts.data(), MPI_BYTE, flat_received.data(),
                        received.counts.data(), received.firsts.data(), MPI_BYTE, comm_),
          "MPI_Alltoallv");
    return detail::cut_into(std::span<const std::byte>(flat_received), std::span<const int>(received.counts));
  }

  /// Sends `data` to rank `dest` (`MPI_Send`, which may wait until `dest` receives it); a message
  /// to this rank itself is kept and returns at once.
  /// @throws error `invalid_argument` for a rank outside the group or more than INT_MAX bytes;
  ///         `transport_failed`.
  void send_bytes(std::span<const std::byte> data, int dest) {
    const int to = member(dest, "send_bytes", "destination");
    if (to == rank_) {
      self_.post(data);
      return;
    }
    check(MPI_Send(data.data(), int_count(data.size(), "send_bytes"), MPI_BYTE, to, message_tag, comm_), "MPI_Send");
  }

  /// The next buffer that rank `source` sent to this rank, of any size, waiting for it if needed.
  /// @throws error `invalid_argument` for a rank outside the group; `size_mismatch` for a receive
  ///         from this rank itself with nothing sent to itself; `transport_failed`.
  [[nodiscard]] std::vector<std::byte> recv_bytes(int source) {
    const int from = member(source, "recv_bytes", "source");
    return from == rank_ ? self_.take() : receive(from);
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
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Isend(data.data(), int_count(data.size(), "sendrecv_bytes"), MPI_BYTE, to, message_tag, comm_, &request),
          "MPI_Isend");
    std::vector<std::byte> received;
    try {
      received = receive(from);
    } catch (...) {
      // `data` must not be read after this call returns: retire the send before rethrowing.
      MPI_Cancel(&request);
      MPI_Wait(&request, MPI_STATUS_IGNORE);
      throw;
    }
    check(MPI_Wait(&request, MPI_STATUS_IGNORE), "MPI_Wait");
    return received;
  }

 private:
  /// The tag of point-to-point messages on the transport's own communicator.
  static constexpr int message_tag = 0;

  /// The blocks of a block_split as MPI's int counts and displacements.
  struct int_blocks {
    std::vector<int> counts;
    std::vector<int> firsts;
  };

  template <class V>
  [[nodiscard]] static MPI_Datatype datatype() noexcept {
    if constexpr (std::is_same_v<V, float>) return MPI_FLOAT;
    else if constexpr (std::is_same_v<V, double>) return MPI_DOUBLE;
    else if constexpr (std::is_same_v<V, std::uint8_t>) return MPI_UINT8_T;
    else return MPI_UINT64_T;
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
  [[nodiscard]] int_blocks int_blocks_of(const detail::block_split& split, std::size_t n, const char* call) const {
    require_fits(n <= INT_MAX && split.largest() * index(size_ - 1) <= INT_MAX, n, call);
    int_blocks blocks{std::vector<int>(index(size_)), std::vector<int>(index(size_))};
    for (int b = 0; b < size_; ++b) {
      blocks.counts[index(b)] = static_cast<int>(split.count(b));
      blocks.firsts[index(b)] = static_cast<int>(split.first(b));
    }
    return blocks;
  }

  /// The sum of `sizes`, or INT_MAX + 1 once it exceeds INT_MAX (it cannot wrap).
  [[nodiscard]] static std::uint64_t total_of(const std::vector<std::uint64_t>& sizes) noexcept {
    std::uint64_t total = 0;
    for (const std::uint64_t s : sizes)
      total = total <= INT_MAX && s <= INT_MAX - total ? total + s : std::uint64_t{INT_MAX} + 1;
    return total;
  }

  /// Whether MPI's int counts and displacements address buffers of `sizes` bytes laid end to end.
  [[nodiscard]] static bool fits_int(const std::vector<std::uint64_t>& sizes) noexcept { return total_of(sizes) <= INT_MAX; }

  /// Buffers of `sizes` bytes laid end to end as MPI's int counts and displacements; `fits_int(sizes)`.
  [[nodiscard]] static int_blocks int_blocks_of(const std::vector<std::uint64_t>& sizes) {
    int_blocks blocks{std::vector<int>(sizes.size()), std::vector<int>(sizes.size())};
    int first = 0;
    for (std::size_t p = 0; p < sizes.size(); ++p) {
      blocks.counts[p] = static_cast<int>(sizes[p]);
      blocks.firsts[p] = first;
      first += blocks.counts[p];
    }
    return blocks;
  }

  /// Step 1 of the block scheme (`MPI_Alltoallv`).
  template <class V>
  void exchange_blocks(std::span<const V> data, const detail::block_split& split, std::span<V> received, const char* call) {
    const int_blocks blocks = int_blocks_of(split, data.size(), call);
    const int m = blocks.counts[index(rank_)];
    std::vector<int> received_counts(index(size_), m);
    std::vector<int> received_firsts(index(size_));
    for (int p = 0; p < size_; ++p) received_firsts[index(p)] = p * m;
    check(MPI_Alltoallv(data.data(), blocks.counts.data(), blocks.firsts.data(), datatype<V>(), received.data(),
                        received_counts.data(), received_firsts.data(), datatype<V>(), comm_),
          "MPI_Alltoallv");
  }

  /// Step 3 of the block scheme, in place: `MPI_Allgatherv`, or `MPI_Gatherv` to `root`.
  template <class V>
  void gather_blocks(std::span<V> data, std::span<const V> mine, const detail::block_split& split, int root,
                     const char* call) {
    const int_blocks blocks = int_blocks_of(split, data.size(), call);
    const bool receives = root == detail::all_ranks || root == rank_;
    if (receives) std::copy(mine.begin(), mine.end(), data.begin() + static_cast<std::ptrdiff_t>(split.first(rank_)));
    if (root == detail::all_ranks) {
      check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data.data(), blocks.counts.data(), blocks.firsts.data(),
                           datatype<V>(), comm_),
            "MPI_Allgatherv");
      return;
    }
    check(MPI_Gatherv(receives ? MPI_IN_PLACE : mine.data(), blocks.counts[index(rank_)], datatype<V>(), data.data(),
                      blocks.counts.data(), blocks.firsts.data(), datatype<V>(), root, comm_),
          "MPI_Gatherv");
  }

  /// Receives the next message from `from` (another rank), of the size it has.
  [[nodiscard]] std::vector<std::byte> receive(int from) {
    MPI_Status status;
    check(MPI_Probe(from, message_tag, comm_, &status), "MPI_Probe");
    int count = 0;
    check(MPI_Get_count(&status, MPI_BYTE, &count), "MPI_Get_count");
    std::vector<std::byte> message(static_cast<std::size_t>(count));
    check(MPI_Recv(message.data(), count, MPI_BYTE, from, message_tag, comm_, MPI_STATUS_IGNORE), "MPI_Recv");
    return message;
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
};

static_assert(transport_with_bitwise_or<mpi_transport>);
static_assert(transport_with_point_to_point<mpi_transport>);
static_assert(transport_with_all_to_all<mpi_transport>);

}  // namespace gradcomp
