#pragma once
/// @file
/// The NCCL transport: `nccl_transport` wraps an NCCL communicator and a CUDA stream the user
/// created and satisfies `transport`, `transport_with_point_to_point` and
/// `transport_with_all_to_all` and `transport_with_deadline` on **device buffers**
/// (`memory_space::device`): the compressed collectives run it with a `cuda_executor` on the same
/// stream. Opt-in: include this header only in a .cu file of a program that uses NCCL (it includes
/// <nccl.h> and the CUDA backend's kernels; link the NCCL library and `gradcomp::cuda`). It needs
/// NCCL ≥ 2.14 (non-blocking communicators).
///
/// ```cpp
/// cudaSetDevice(local_rank);
/// ncclComm_t comm;                                // one process per GPU (ncclCommInitRank), or
/// ncclCommInitRank(&comm, size, id, rank);        // one thread per GPU (ncclCommInitAll)
/// cudaStream_t stream;
/// cudaStreamCreate(&stream);
/// {
///   gradcomp::nccl_transport t(comm, stream);               // borrows both
///   const gradcomp::cuda_executor gpu{.stream = stream};    // the same stream
///   gradcomp::compressed_all_reduce(gpu, t, codec, state, grad /*device span*/, {.average = true});
/// }                                                         // frees the transport's device buffers
/// cudaStreamDestroy(stream);
/// ncclCommDestroy(comm);
/// ```
///
/// **Data path.** Every call queues its NCCL operations and kernels on the user's stream and reads
/// and writes device memory only: payload never crosses to the host. The host learns only small
/// words it must know to size the next step: the sizes of variable-size messages (one uint64 per
/// rank), and the control plane of the collectives (`all_gather_control` of the 40-byte agreement
/// record, `all_reduce_max_control` of a few status doubles), each staged through a small device
/// buffer. Every byte the transport copies from the device to the host goes through one function
/// and is counted: `host_copy_bytes()` (a test checks that a compressed all-reduce of 2^20 values
/// copies less than a kilobyte). A call returns once its work is queued, except where it needs
/// such words (it then waits for the stream); received buffers (`received_bytes`, `recv_bytes`)
/// live in the transport's device memory and stay valid until its next call. Because everything is
/// stream-ordered, device data passed to a call must not be changed by other streams until the
/// stream has done the call's work. With a deadline (below), every call also waits until the
/// stream has done its NCCL work before it returns.
///
/// **Memory.** The transport keeps grow-only device buffers, stream-ordered on its stream
/// (`cudaMallocAsync`; returned with `cudaFreeAsync` by the destructor, so destroy the transport
/// before its stream): room for the P blocks a reduction combines, the received bytes of the
/// largest variable-size call, and small buffers of size and control words. Steady-state steps
/// allocate nothing (but messages a rank sends itself, each copied into memory of its own). A call
/// makes the communicator's device current while it runs and gives the caller's current device
/// back; the stream must belong to that device.
///
/// **Reductions** give the bits of the in-process transport: sums, maxima, `reduce_sum` and
/// `reduce_scatter_sum` are the block scheme of rank_ordered.hpp (`rank_ordered_reductions`, whose
/// comment documents them and their argument checks). `ncclAllReduce` promises no order (rings and
/// trees, split into chunks per channel, chosen by message size and topology), so step 1 is grouped
/// `ncclSend` / `ncclRecv` (NCCL's all-to-all), step 2 a kernel that combines the P received blocks
/// in rank order on the device (cuda/detail/rank_order_combine.cuh), and step 3 grouped `ncclSend` /
/// `ncclRecv` of the combined blocks, which may differ in size by one element, to every rank (to the
/// root for `reduce_sum`). Each rank sends and receives about 2·n·(P−1)/P values, as NCCL's ring
/// all-reduce does.
///
/// No bitwise OR: NCCL's reductions (`ncclRedOp_t`) are sum, product, minimum, maximum, average and
/// pre-multiplied sum, with no bitwise operation and no user-defined operation that could supply
/// one. So this transport has no `all_reduce_or` and does not satisfy `transport_with_bitwise_or`:
/// schemes that need the OR (the bitmap index of lossless homomorphic compression) take their
/// summable fallback.
///
/// Host buffers are not taken: a host collective over NCCL would copy every payload through the
/// device and back. Use MPI or Gloo for host data (and `staged_transport` for the other direction).
///
/// Errors: a failing CUDA or NCCL call throws `errc::transport_failed`, naming the call and quoting
/// `cudaGetErrorString` or `ncclGetErrorString` (with `ncclGetLastError`'s detail where NCCL gives
/// one). The communicator and the stream may then hold unfinished work: abort the communicator
/// (`ncclCommAbort`) and make a new one before going on. A peer outside the group and an all-to-all
/// of other than size() buffers throw `errc::invalid_argument` before anything is sent. NCCL's
/// counts are `size_t`: there is no int limit.
///
/// **Deadlines** (`set_deadline`; docs/transports.md §8). NCCL has no timeout of its own: a peer
/// that never makes the matching call leaves this rank's kernels waiting on the GPU forever. With a
/// deadline, every call waits for its NCCL work by polling `cudaStreamQuery` and
/// `ncclCommGetAsyncError` against it; an NCCL call that returns `ncclInProgress` (a non-blocking
/// communicator) is polled likewise until the communicator's state leaves it. At the deadline the
/// transport aborts the communicator (`ncclCommAbort`, which ends its kernels and releases the
/// stream) and throws `errc::timeout` (NCCL does not say which rank is missing); an asynchronous
/// NCCL error does the same with `transport_failed`. The user's obligations: create the
/// communicator non-blocking (`ncclConfig_t::blocking = 0` with `ncclCommInitRankConfig`), since a
/// blocking one may block inside an NCCL call (connecting to a dead peer) before the deadline can
/// be checked; after such an error, never use nor destroy the aborted communicator (the transport
/// refuses every call with `transport_failed`), and build a new one among the ranks that remain
/// (a new unique id, through the job's own bootstrap). Without a deadline nothing is polled: calls
/// return once queued, as above.
///
/// Point-to-point messages carry any number of bytes: an 8-byte size header, then the bytes (none
/// for an empty message), each moved by `ncclSend` / `ncclRecv`, so the receiver knows the size
/// before it receives the bytes (it waits for the header). `sendrecv_bytes` issues the send and the
/// receive of the header, then those of the bytes, in one NCCL group each, so a ring in which every
/// rank sends to its successor and receives from its predecessor cannot deadlock. Messages to this
/// rank itself are copied into device memory of their own (stream-ordered) and returned by the next
/// `recv_bytes(rank())`, as in the in-process transport.
///
/// One object per rank, used by one thread at a time. With several GPUs in one process
/// (`ncclCommInitAll`), drive each communicator from its own thread: every call waits for its
/// peers' matching calls. The transport opens and closes its own NCCL groups: do not call it inside
/// the caller's `ncclGroupStart` / `ncclGroupEnd`, nor run other NCCL operations on the
/// communicator while a call runs.

#include <gradcomp/cuda/config.cuh>

#include <cuda_runtime.h>
#include <nccl.h>

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#  error "gradcomp/transport/nccl.cuh needs NCCL 2.14 or later (non-blocking communicators, ncclInProgress)"
#endif

#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/core/error.hpp>
#include <gradcomp/core/memory_space.hpp>
#include <gradcomp/cuda/collective_memory.cuh>
#include <gradcomp/cuda/executor.cuh>
#include <gradcomp/cuda/detail/rank_order_combine.cuh>
#include <gradcomp/transport/deadline.hpp>
#include <gradcomp/transport/rank_ordered.hpp>
#include <gradcomp/transport/received_bytes.hpp>
#include <gradcomp/transport/transport.hpp>

namespace gradcomp {

/// One rank of an NCCL communicator on device buffers; one object per rank, used by one thread at
/// a time. Move-only: it owns its device buffers; the communicator and the stream stay the user's.
class nccl_transport : public detail::rank_ordered_reductions<nccl_transport> {
  using reductions = detail::rank_ordered_reductions<nccl_transport>;
  friend reductions;
  using device_memory = collective_memory<cuda_executor>;

 public:
  /// Names the adapter in messages.
  static constexpr const char* transport_name = "nccl_transport";
  /// Every call takes device buffers.
  static constexpr memory_space memory = memory_space::device;

  /// Wraps `comm` and `stream`, which must outlive the transport. Allocates nothing.
  /// @throws error `invalid_argument` for a null communicator; `transport_failed` when NCCL cannot
  ///         report the communicator's rank, size or device.
  nccl_transport(ncclComm_t comm, cudaStream_t stream) : comm_(comm), exec_{.stream = stream} {
    detail::require(comm_ != nullptr, errc::invalid_argument, "nccl_transport: the communicator is null");
    check(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
    check(ncclCommCount(comm_, &size_), "ncclCommCount");
    check(ncclCommCuDevice(comm_, &device_), "ncclCommCuDevice");
  }

  nccl_transport(const nccl_transport&) = delete;
  nccl_transport& operator=(const nccl_transport&) = delete;
  /// Takes over `other`'s device buffers; `other` may then only be destroyed or assigned to.
  nccl_transport(nccl_transport&&) noexcept = default;
  /// Frees this transport's device buffers and takes over `other`'s.
  nccl_transport& operator=(nccl_transport&&) noexcept = default;
  /// Returns the device buffers to their pool on the stream; the communicator and the stream are
  /// left to the user.
  ~nccl_transport() = default;

  /// This rank.
  [[nodiscard]] int rank() const noexcept { return rank_; }
  /// Number of ranks.
  [[nodiscard]] int size() const noexcept { return size_; }
  /// The stream every call is queued on (a `cuda_executor` running a collective with this
  /// transport must use it too).
  [[nodiscard]] cudaStream_t stream() const noexcept { return exec_.native_stream(); }
  /// Bytes this transport has copied from the device to the host since it was made: size words
  /// and control-plane words only, never payload (this file's comment).
  [[nodiscard]] std::uint64_t host_copy_bytes() const noexcept { return host_copy_bytes_; }

  /// Bounds the waits of later calls by `until` (this file's comment); initially none.
  void set_deadline(const deadline& until) noexcept { deadline_ = until; }
  /// The deadline of this transport's waits.
  [[nodiscard]] deadline current_deadline() const noexcept { return deadline_; }

  /// Every rank's `data` (device memory) becomes rank `root`'s (`ncclBroadcast`, in place).
  /// @throws error `invalid_argument` for a root outside the group; `transport_failed`.
  void broadcast(std::span<std::byte> data, int root) {
    const int from = member(root, "broadcast", "root");
    if (data.empty()) return;  // every rank passes the same count: none calls NCCL
    require_usable();
    const device_scope scope(device_);
    check(ncclBroadcast(data.data(), data.data(), data.size(), ncclUint8, from, comm_, stream()), "ncclBroadcast");
    await("ncclBroadcast");
  }

  /// Every rank's device buffer, in rank order, in the transport's device memory (valid until its
  /// next call, each buffer on an 8-byte boundary); sizes may differ between ranks. The sizes
  /// travel first (`ncclAllGather` of one uint64 per rank, read by the host), then the bytes
  /// (grouped `ncclSend` / `ncclRecv`, each buffer at its own size; this rank's own copied).
  /// @throws error `transport_failed`.
  [[nodiscard]] received_bytes all_gather_bytes(std::span<const std::byte> mine) {
    const device_scope scope(device_);
    gather_sizes(mine.size());
    received_.resize(exec_, layout_.total());
    std::byte* const block = received_.span().data();
    device_memory::copy(exec_, mine, std::span<std::byte>(block + layout_.offset(index(rank_)), mine.size()));
    grouped([&] {
      for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        send(mine.data(), mine.size(), p);
        receive(block + layout_.offset(index(p)), layout_.size(index(p)), p);
      }
    });
    return layout_.view(received_.span());
  }

  /// Buffer j of `to_each` (device memory) goes to rank j; returns the P buffers sent to this rank,
  /// buffer i from rank i, in the transport's device memory (valid until its next call, each on an
  /// 8-byte boundary); sizes may differ, empty buffers included. The sizes travel first (one uint64
  /// to and from every rank, read by the host), then the bytes, in one group of `ncclSend` /
  /// `ncclRecv` (NCCL's all-to-all) straight from the buffers of `to_each`.
  /// @throws error `invalid_argument` for other than size() buffers (this rank, before anything
  ///         is sent); `transport_failed`.
  [[nodiscard]] received_bytes all_to_all_bytes(std::span<const std::span<const std::byte>> to_each) {
    detail::require_one_buffer_per_rank(to_each.size(), size_, "nccl_transport::all_to_all_bytes");
    const device_scope scope(device_);
    words_.resize(index(size_));
    for (std::size_t p = 0; p < words_.size(); ++p) words_[p] = to_each[p].size();
    sizes_.resize(exec_, 2 * words_.size());
    const std::span<std::uint64_t> sent = sizes_.span().first(words_.size());
    const std::span<std::uint64_t> received = sizes_.span().subspan(words_.size());
    device_memory::from_host(exec_, std::as_bytes(std::span<const std::uint64_t>(words_)),
                             std::as_writable_bytes(sent));
    grouped([&] {
      for (int p = 0; p < size_; ++p) {
        send(sent.data() + p, sizeof(std::uint64_t), p);
        receive(received.data() + p, sizeof(std::uint64_t), p);
      }
    });
    to_host(std::as_writable_bytes(std::span<std::uint64_t>(words_)),
            std::as_bytes(std::span<const std::uint64_t>(received)));
    layout_.assign(std::span<const std::uint64_t>(words_));
    received_.resize(exec_, layout_.total());
    std::byte* const block = received_.span().data();
    grouped([&] {
      for (int p = 0; p < size_; ++p) {
        send(to_each[index(p)].data(), to_each[index(p)].size(), p);
        receive(block + layout_.offset(index(p)), layout_.size(index(p)), p);
      }
    });
    return layout_.view(received_.span());
  }

  /// Queues the send of `data` (device memory) to rank `dest`; a message to this rank itself is
  /// copied and returns at once.
  /// @throws error `invalid_argument` for a rank outside the group; `transport_failed`.
  void send_bytes(std::span<const std::byte> data, int dest) {
    const int to = member(dest, "send_bytes", "destination");
    if (to == rank_) {
      post_to_self(data);
      return;
    }
    static_cast<void>(transfer(data, to, no_peer));
  }

  /// The next buffer that rank `source` sent to this rank, of any size, in the transport's device
  /// memory (valid until its next call); waits for its size.
  /// @throws error `invalid_argument` for a rank outside the group; `size_mismatch` for a receive
  ///         from this rank itself with nothing sent to itself; `transport_failed`.
  [[nodiscard]] std::span<const std::byte> recv_bytes(int source) {
    const int from = member(source, "recv_bytes", "source");
    return from == rank_ ? take_from_self() : transfer({}, no_peer, from);
  }

  /// Sends `data` to `dest` and receives the next buffer from `source` at once: the header, then
  /// the bytes, are sent and received in one NCCL group each, so a ring in which every rank sends
  /// to its successor and receives from its predecessor cannot deadlock. The received buffer is in
  /// the transport's device memory, valid until its next call.
  /// @throws error as `send_bytes` and `recv_bytes`.
  [[nodiscard]] std::span<const std::byte> sendrecv_bytes(std::span<const std::byte> data, int dest, int source) {
    const int to = member(dest, "sendrecv_bytes", "destination");
    const int from = member(source, "sendrecv_bytes", "source");
    if (to == rank_ || from == rank_) {  // one side is local: the send and the receive in turn cannot deadlock
      send_bytes(data, to);
      return recv_bytes(from);
    }
    return transfer(data, to, from);
  }

  /// The control plane: every rank's small host buffer, in rank order, on the host: staged into
  /// the control buffer, all-gathered as `all_gather_bytes` does, copied to the host (counted).
  /// @throws error `transport_failed`.
  [[nodiscard]] std::vector<std::vector<std::byte>> all_gather_control(std::span<const std::byte> mine) {
    const device_scope scope(device_);
    control_.resize(exec_, (mine.size() + sizeof(std::uint64_t) - 1) / sizeof(std::uint64_t));
    const std::span<std::byte> staged = std::as_writable_bytes(control_.span()).first(mine.size());
    device_memory::from_host(exec_, mine, staged);
    const received_bytes gathered = all_gather_bytes(staged);
    std::vector<std::byte> flat(gathered.block.size());
    to_host(std::span<std::byte>(flat), gathered.block);
    std::vector<std::vector<std::byte>> out(gathered.size());
    for (std::size_t p = 0; p < out.size(); ++p) {
      const auto first = flat.begin() + static_cast<std::ptrdiff_t>(gathered.offsets[p]);
      out[p].assign(first, first + static_cast<std::ptrdiff_t>(gathered.sizes[p]));
    }
    return out;
  }

  /// The control plane: the element-wise maximum over ranks of a few host doubles, in place (the
  /// block scheme on a device copy in the control buffer, copied back and counted).
  /// @throws error `transport_failed`.
  void all_reduce_max_control(std::span<double> words) {
    const device_scope scope(device_);
    control_.resize(exec_, words.size());
    const std::span<double> staged(reinterpret_cast<double*>(control_.span().data()), words.size());
    device_memory::from_host(exec_, std::as_bytes(std::span<const double>(words)), std::as_writable_bytes(staged));
    all_reduce_in_rank_order(staged, detail::max_op{}, "all_reduce_max_control");
    to_host(std::as_writable_bytes(words), std::as_bytes(std::span<const double>(staged)));
  }

 private:
  /// `transfer`'s peer when there is nothing to send, or nothing to receive.
  static constexpr int no_peer = -1;

  /// Makes a device current while it lives and gives the caller's current device back.
  class device_scope {
   public:
    explicit device_scope(int device) {
      check(cudaGetDevice(&previous_), "cudaGetDevice");
      if (previous_ == device) return;
      check(cudaSetDevice(device), "cudaSetDevice");
      switched_ = true;
    }
    ~device_scope() {
      if (switched_) cudaSetDevice(previous_);
    }
    device_scope(const device_scope&) = delete;
    device_scope& operator=(const device_scope&) = delete;

   private:
    int previous_ = 0;
    bool switched_ = false;
  };

  [[nodiscard]] static std::size_t index(int r) noexcept { return static_cast<std::size_t>(r); }

  /// Throws `transport_failed`, with the call's name and CUDA's error string, unless `rc` is success.
  static void check(cudaError_t rc, const char* call) {
    if (rc == cudaSuccess) [[likely]]
      return;
    detail::fail(errc::transport_failed, [&] {
      return std::string("nccl_transport: ") + call + " failed: " + cudaGetErrorString(rc) + " (" +
             cudaGetErrorName(rc) + ")";
    });
  }

  /// Throws `transport_failed`, with the call's name, NCCL's error string and NCCL's detail of the
  /// last error where it has one, unless `rc` is success. `ncclInProgress` (a non-blocking
  /// communicator) is first polled until the communicator's state leaves it (`settle`).
  void check(ncclResult_t rc, const char* call) {
    if (rc == ncclInProgress) rc = settle(call);
    if (rc == ncclSuccess) [[likely]]
      return;
    detail::fail(errc::transport_failed, [&] { return nccl_failure(rc, call); });
  }

  /// "nccl_transport: `call` failed: …", with NCCL's detail of the last error where it has one.
  [[nodiscard]] std::string nccl_failure(ncclResult_t rc, const char* call) const {
    std::string text = std::string("nccl_transport: ") + call + " failed: " + ncclGetErrorString(rc);
    const char* last = ncclGetLastError(comm_);
    if (last != nullptr && *last != '\0') text += std::string(" (") + last + ")";
    return text;
  }

  /// Throws `transport_failed` once the transport has aborted the communicator.
  void require_usable() const {
    detail::require(aborted_after_.empty(), errc::transport_failed, [&] {
      return "nccl_transport: the communicator was aborted after " + aborted_after_ +
             "; make a new one among the ranks that remain (this file's comment)";
    });
  }

  /// Aborts the communicator after `what` (`ncclCommAbort`: its kernels end, the stream is
  /// released) and marks the transport unusable.
  void abort_communicator(const std::string& what) {
    aborted_after_ = what;
    static_cast<void>(ncclCommAbort(comm_));
  }

  /// The communicator's state once it leaves `ncclInProgress`, polled against the deadline; at
  /// the deadline the communicator is aborted and `timeout` thrown.
  [[nodiscard]] ncclResult_t settle(const char* call) {
    ncclResult_t state = ncclInProgress;
    const bool settled = poll_until(deadline_, [&] {
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) state = ncclInternalError;
      return state != ncclInProgress;
    });
    if (!settled) time_out(call);
    return state;
  }

  /// With a deadline: waits until the stream has run everything queued so far (`call`'s NCCL work
  /// last), polling the stream and the communicator's asynchronous error; at the deadline, or on an
  /// asynchronous error, aborts the communicator and throws `timeout` or `transport_failed`.
  /// Without a deadline: returns at once (the work runs in stream order).
  void await(const char* call) {
    if (deadline_.infinite()) return;
    ncclResult_t async = ncclSuccess;
    cudaError_t stream_state = cudaSuccess;
    const bool done = poll_until(deadline_, [&] {
      if (ncclCommGetAsyncError(comm_, &async) != ncclSuccess) async = ncclInternalError;
      if (async != ncclSuccess && async != ncclInProgress) return true;
      stream_state = cudaStreamQuery(stream());
      return stream_state != cudaErrorNotReady;
    });
    if (!done) time_out(call);
    if (async != ncclSuccess && async != ncclInProgress) {
      std::string text = nccl_failure(async, call);
      abort_communicator(std::string(call) + "'s asynchronous error");
      detail::fail(errc::transport_failed, text + "; the communicator was aborted");
    }
    check(stream_state, "cudaStreamQuery");
  }

  /// Aborts the communicator and throws `timeout`: `call`'s work did not complete by the deadline.
  [[noreturn]] void time_out(const char* call) {
    abort_communicator(std::string(call) + " timed out");
    detail::fail(errc::timeout, std::string("nccl_transport: ") + call + " did not complete " + deadline_.within() +
                                    ": a rank died or stopped calling (NCCL does not say which); the communicator "
                                    "was aborted (ncclCommAbort): make a new one");
  }

  /// Waits for the stream: `await` with a deadline, else `cudaStreamSynchronize`.
  void synchronize() {
    if (deadline_.infinite()) check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
    else
      await("the copy to the host");
  }

  /// The one device-to-host copy of the transport: `from` (device) into `to` (host), waited for and
  /// counted in `host_copy_bytes()`.
  void to_host(std::span<std::byte> to, std::span<const std::byte> from) {
    if (to.empty()) return;
    check(cudaMemcpyAsync(to.data(), from.data(), to.size(), cudaMemcpyDeviceToHost, stream()), "cudaMemcpyAsync");
    synchronize();
    host_copy_bytes_ += to.size();
  }

  /// Queues `bytes` bytes at `from` to rank `peer` (nothing for none, as the peer expects).
  void send(const void* from, std::size_t bytes, int peer) {
    if (bytes > 0) check(ncclSend(from, bytes, ncclUint8, peer, comm_, stream()), "ncclSend");
  }

  /// Queues the receive of `bytes` bytes from rank `peer` into `to` (nothing for none).
  void receive(void* to, std::size_t bytes, int peer) {
    if (bytes > 0) check(ncclRecv(to, bytes, ncclUint8, peer, comm_, stream()), "ncclRecv");
  }

  /// Runs `queue` (which issues sends and receives) inside one NCCL group, which is closed even
  /// when `queue` throws, so that NCCL progresses them together; with a deadline, waits for them.
  template <class Queue>
  void grouped(Queue&& queue) {
    require_usable();
    check(ncclGroupStart(), "ncclGroupStart");
    try {
      std::forward<Queue>(queue)();
    } catch (...) {
      ncclGroupEnd();
      throw;
    }
    check(ncclGroupEnd(), "ncclGroupEnd");
    await("the grouped ncclSend/ncclRecv");
  }

  /// Every rank's size word, all-gathered (`ncclAllGather`) and read by the host into `layout_`.
  void gather_sizes(std::size_t mine) {
    const std::uint64_t my_size = mine;
    sizes_.resize(exec_, index(size_));
    const std::span<std::uint64_t> sizes = sizes_.span();
    device_memory::from_host(exec_, std::as_bytes(std::span<const std::uint64_t>(&my_size, 1)),
                             std::as_writable_bytes(sizes.subspan(index(rank_), 1)));
    require_usable();
    check(ncclAllGather(sizes.data() + rank_, sizes.data(), 1, ncclUint64, comm_, stream()), "ncclAllGather");
    await("ncclAllGather");
    words_.resize(index(size_));
    to_host(std::as_writable_bytes(std::span<std::uint64_t>(words_)),
            std::as_bytes(std::span<const std::uint64_t>(sizes)));
    layout_.assign(std::span<const std::uint64_t>(words_));
  }

  // ---- the primitives of rank_ordered_reductions, on device memory ----

  /// Room for step 1 (grow-only, stream-ordered; uint64 words, so any value type lies aligned).
  template <class V>
  [[nodiscard]] std::span<V> block_scratch(std::size_t count) {
    blocks_.resize(exec_, (count * sizeof(V) + sizeof(std::uint64_t) - 1) / sizeof(std::uint64_t));
    return {reinterpret_cast<V*>(blocks_.span().data()), count};
  }

  /// Step 1: `received` (P blocks of this rank's block size) gets block rank() of every rank's
  /// `data`, in rank order (grouped sends and receives, this rank's own block included).
  template <class V>
  void exchange_blocks(std::span<const V> data, const detail::block_split& split, std::span<V> received, const char*) {
    const device_scope scope(device_);
    const std::size_t mine = split.count(rank_);
    grouped([&] {
      for (int p = 0; p < size_; ++p) {
        send(data.data() + split.first(p), split.count(p) * sizeof(V), p);
        receive(received.data() + index(p) * mine, mine * sizeof(V), p);
      }
    });
  }

  /// Step 2 on the device, in rank order.
  template <class V, class Op>
  void combine(std::span<V> blocks, int parts, Op op) {
    detail::cuda::combine_in_rank_order(exec_, blocks, parts, op);
  }

  /// `to` becomes `from` (device to device).
  template <class V>
  void copy_block(std::span<const V> from, std::span<V> to) {
    device_memory::copy(exec_, from, to);
  }

  /// Step 3: every rank's combined block lands at its place in `data` of every rank
  /// (`all_ranks`) or of `root` (grouped sends and receives; this rank's own block copied).
  template <class V>
  void gather_blocks(std::span<V> data, std::span<const V> mine, const detail::block_split& split, int root,
                     const char*) {
    const device_scope scope(device_);
    const auto receives = [root](int r) { return root == detail::all_ranks || r == root; };
    if (receives(rank_)) device_memory::copy(exec_, mine, data.subspan(split.first(rank_), split.count(rank_)));
    grouped([&] {
      for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        if (receives(p)) send(mine.data(), mine.size() * sizeof(V), p);
        if (receives(rank_)) receive(data.data() + split.first(p), split.count(p) * sizeof(V), p);
      }
    });
  }

  // ---- point-to-point ----

  /// Sends `data` to `to` (unless `no_peer`) and receives the next message from `from` (unless
  /// `no_peer`) into `received_`, both at once: the size headers in one group (the received one
  /// read by the host), then the bytes in another.
  [[nodiscard]] std::span<const std::byte> transfer(std::span<const std::byte> data, int to, int from) {
    const device_scope scope(device_);
    const std::uint64_t sent_size = data.size();
    sizes_.resize(exec_, 2);
    const std::span<std::uint64_t> headers = sizes_.span();
    if (to != no_peer)
      device_memory::from_host(exec_, std::as_bytes(std::span<const std::uint64_t>(&sent_size, 1)),
                               std::as_writable_bytes(headers.first(1)));
    grouped([&] {
      if (to != no_peer) send(headers.data(), sizeof(std::uint64_t), to);
      if (from != no_peer) receive(headers.data() + 1, sizeof(std::uint64_t), from);
    });
    std::uint64_t received_size = 0;
    if (from != no_peer)
      to_host(std::as_writable_bytes(std::span<std::uint64_t>(&received_size, 1)),
              std::as_bytes(std::span<const std::uint64_t>(headers.subspan(1, 1))));
    received_.resize(exec_, static_cast<std::size_t>(received_size));
    std::byte* const block = received_.span().data();
    grouped([&] {
      if (to != no_peer) send(data.data(), data.size(), to);
      if (from != no_peer) receive(block, static_cast<std::size_t>(received_size), from);
    });
    return std::span<const std::byte>(received_.span());
  }

  /// Keeps a device copy of `data` for the next `recv_bytes(rank())`.
  void post_to_self(std::span<const std::byte> data) {
    self_.emplace_back(exec_, data.size());
    device_memory::copy(exec_, data, self_.back().span());
  }

  /// The oldest message this rank sent itself, kept until the next call.
  /// @throws error `size_mismatch` when there is none: no other rank can send it.
  [[nodiscard]] std::span<const std::byte> take_from_self() {
    detail::require(!self_.empty(), errc::size_mismatch,
                    "a receive from this rank itself with nothing sent to itself: it can never complete");
    taken_ = std::move(self_.front());
    self_.pop_front();
    return std::span<const std::byte>(taken_.span());
  }

  ncclComm_t comm_ = nullptr;
  cuda_executor exec_{};
  int rank_ = 0;
  int size_ = 0;
  int device_ = 0;
  device_memory::buffer<std::uint64_t> blocks_;     ///< Step 1's received blocks.
  device_memory::buffer<std::byte> received_;       ///< The received bytes of the last variable-size call.
  device_memory::buffer<std::uint64_t> sizes_;      ///< Size words of variable-size messages.
  device_memory::buffer<std::uint64_t> control_;    ///< Control-plane data staged on the device.
  std::deque<device_memory::buffer<std::byte>> self_;  ///< Messages to this rank itself, oldest first.
  device_memory::buffer<std::byte> taken_;          ///< The last message taken from `self_`.
  detail::received_layout layout_;                  ///< Where the buffers of `received_` lie.
  std::vector<std::uint64_t> words_;                ///< Host copies of size words.
  std::uint64_t host_copy_bytes_ = 0;
  deadline deadline_{};
  std::string aborted_after_;                       ///< Why the communicator was aborted (empty: it was not).
};

static_assert(transport<nccl_transport>);
static_assert(transport_with_point_to_point<nccl_transport>);
static_assert(transport_with_all_to_all<nccl_transport>);
static_assert(transport_with_deadline<nccl_transport>);
static_assert(!transport_with_bitwise_or<nccl_transport>);
static_assert(memory_space_of<nccl_transport> == memory_space::device);

}  // namespace gradcomp
