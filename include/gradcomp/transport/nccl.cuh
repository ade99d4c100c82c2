#pragma once
/// @file
/// The NCCL transport: `nccl_transport` wraps an NCCL communicator and a CUDA stream the user
/// created and satisfies `transport`, `transport_with_point_to_point` and
/// `transport_with_all_to_all` on host buffers, as the concepts require. Opt-in: include this
/// header only in a program that uses NCCL (it includes <nccl.h> and <cuda_runtime.h>, and holds
/// no device code; link the NCCL library and `CUDA::cudart`). It needs NCCL ≥ 2.13.
///
/// ```cpp
/// cudaSetDevice(local_rank);
/// ncclComm_t comm;                                // one process per GPU (ncclCommInitRank), or
/// ncclCommInitRank(&comm, size, id, rank);        // one thread per GPU (ncclCommInitAll)
/// cudaStream_t stream;
/// cudaStreamCreate(&stream);
/// {
///   gradcomp::nccl_transport t(comm, stream);     // borrows both
///   t.all_reduce_sum(std::span<float>(grad));      // a host buffer; every rank: the rank-order sum
/// }                                               // frees the transport's device buffer
/// cudaStreamDestroy(stream);
/// ncclCommDestroy(comm);
/// ```
///
/// Host buffers: every call copies its host buffers into a device buffer that the transport keeps
/// (on the communicator's device, grown by `cudaMalloc` when a call needs more than it holds, freed
/// by the destructor), runs NCCL on the user's stream, copies the result back and waits for the
/// stream (`cudaStreamSynchronize`), so that when a call returns its host buffers are final and
/// nothing reads them any more. A call makes the communicator's device current while it runs and
/// gives the caller's current device back; the stream must belong to that device. The device
/// buffer holds about twice the largest reduction (its n values and the P blocks this rank
/// combines), the sum of the ranks' buffers of the largest `all_gather_bytes`, or the two messages
/// of the largest `sendrecv_bytes`, or the buffers sent and received by the largest
/// `all_to_all_bytes`.
///
/// Reductions give the bits of the in-process transport: every element is combined in rank order,
/// ((x₀ ⊕ x₁) ⊕ x₂) ⊕ …, on every rank. `ncclAllReduce` promises no order (rings and trees, split
/// into chunks per channel, chosen by message size and topology), so sums, maxima, `reduce_sum`
/// and `reduce_scatter_sum` use the block scheme of rank_ordered.hpp: grouped `ncclSend` /
/// `ncclRecv` (NCCL's all-to-all) hand rank r block r of every rank, rank r combines them on the
/// host in rank order, and grouped `ncclSend` / `ncclRecv` return the combined blocks, which may
/// differ in size by one element, to every rank (to the root for `reduce_sum`). Each rank sends and
/// receives about 2·n·(P−1)/P values, as NCCL's ring all-reduce does.
///
/// No bitwise OR: NCCL's reductions (`ncclRedOp_t`) are sum, product, minimum, maximum, average and
/// pre-multiplied sum, with no bitwise operation and no user-defined operation that could supply
/// one. So this transport has no `all_reduce_or` and does not satisfy `transport_with_bitwise_or`,
/// as transport.hpp describes NCCL: schemes that need the OR (the bitmap index of lossless
/// homomorphic compression) take their summable fallback. The host-side combine of the block
/// scheme could OR, but the transport keeps to NCCL's capabilities, so that a scheme takes the same
/// path over this adapter as over NCCL's own reductions on device memory.
///
/// Errors: a failing CUDA or NCCL call throws `errc::transport_failed`, naming the call and quoting
/// `cudaGetErrorString` or `ncclGetErrorString` (with `ncclGetLastError`'s detail where NCCL gives
/// one). The communicator and the stream may then hold unfinished work: abort the communicator
/// (`ncclCommAbort`) and make a new one before going on. A blocking NCCL communicator has no
/// timeout, so a peer that never makes the matching call leaves this rank waiting. Arguments a rank
/// can check alone (a root or peer outside the group, a reduce-scatter input that is not size()
/// blocks of the output, an all-to-all of other than size() buffers) throw `errc::invalid_argument`
/// before anything is sent; when every rank passes the same arguments, as collectives require, every
/// rank throws and none is left waiting. Ranks that disagree on a collective's count or root are not
/// detected (NCCL then hangs or moves the wrong bytes). NCCL's counts are `size_t`: there is no int
/// limit.
///
/// Point-to-point messages carry any number of bytes: an 8-byte size header, then the bytes (none
/// for an empty message), each moved by `ncclSend` / `ncclRecv`, so the receiver knows the size
/// before it receives the bytes. `send_bytes` returns once NCCL has completed the send on the
/// stream, which may wait until the destination receives (NCCL buffers little, and the first
/// message between two ranks connects them), so two ranks must not both send first to each other;
/// `sendrecv_bytes` issues the send and the receive of the header, then those of the bytes, in one
/// NCCL group each, so a ring in which every rank sends to its successor and receives from its
/// predecessor cannot deadlock. Messages to this rank
/// itself are kept by the transport and returned by the next `recv_bytes(rank())`, as in the
/// in-process transport.
///
/// One object per rank, used by one thread at a time. With several GPUs in one process
/// (`ncclCommInitAll`), drive each communicator from its own thread: every call waits for its
/// peers' matching calls. The transport opens and closes its own NCCL groups: do not call it inside
/// the caller's `ncclGroupStart` / `ncclGroupEnd`, nor run other NCCL operations on the
/// communicator while a call runs.

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/core/error.hpp>
#include <gradcomp/transport/rank_ordered.hpp>
#include <gradcomp/transport/transport.hpp>

namespace gradcomp {

/// One rank of an NCCL communicator; one object per rank, used by one thread at a time.
/// Move-only: it owns its device buffer; the communicator and the stream stay the user's.
class nccl_transport : public detail::rank_ordered_reductions<nccl_transport> {
  using reductions = detail::rank_ordered_reductions<nccl_transport>;
  friend reductions;

 public:
  /// Names the adapter in messages.
  static constexpr const char* transport_name = "nccl_transport";

  /// Wraps `comm` and `stream`, which must outlive the transport (`stream` may be the default
  /// stream, 0, though a stream of its own keeps the copies off other work). Allocates nothing.
  /// @throws error `invalid_argument` for a null communicator; `transport_failed` when NCCL cannot
  ///         report the communicator's rank, size or device.
  nccl_transport(ncclComm_t comm, cudaStream_t stream) : comm_(comm), stream_(stream) {
    detail::require(comm_ != nullptr, errc::invalid_argument, "nccl_transport: the communicator is null");
    check(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
    check(ncclCommCount(comm_, &size_), "ncclCommCount");
    check(ncclCommCuDevice(comm_, &device_), "ncclCommCuDevice");
  }

  /// Frees the device buffer; the communicator and the stream are left to the user.
  ~nccl_transport() { release(); }

  nccl_transport(const nccl_transport&) = delete;
  nccl_transport& operator=(const nccl_transport&) = delete;

  /// Takes over `other`'s device buffer; `other` may then only be destroyed or assigned to.
  nccl_transport(nccl_transport&& other) noexcept
      : reductions(std::move(other)),
        comm_(std::exchange(other.comm_, nullptr)),
        stream_(other.stream_),
        rank_(other.rank_),
        size_(other.size_),
        device_(other.device_),
        buffer_(std::exchange(other.buffer_, nullptr)),
        capacity_(std::exchange(other.capacity_, 0)),
        self_(std::move(other.self_)) {}

  /// Frees this transport's device buffer and takes over `other`'s.
  nccl_transport& operator=(nccl_transport&& other) noexcept {
    if (this != &other) {
      release();
      reductions::operator=(std::move(other));
      comm_ = std::exchange(other.comm_, nullptr);
      stream_ = other.stream_;
      rank_ = other.rank_;
      size_ = other.size_;
      device_ = other.device_;
      buffer_ = std::exchange(other.buffer_, nullptr);
      capacity_ = std::exchange(other.capacity_, 0);
      self_ = std::move(other.self_);
    }
    return *this;
  }

  /// This rank.
  [[nodiscard]] int rank() const noexcept { return rank_; }
  /// Number of ranks.
  [[nodiscard]] int size() const noexcept { return size_; }

  /// Every rank's `data` becomes rank `root`'s (`ncclBroadcast`).
  /// @throws error `invalid_argument` for a root outside the group; `transport_failed`.
  void broadcast(std::span<std::byte> data, int root) {
    const int from = member(root, "broadcast", "root");
    if (data.empty()) return;  // every rank passes the same count: none calls NCCL
    const device_scope scope(device_);
    std::byte* buffer = device_buffer(data.size());
    if (rank_ == from) to_device(buffer, data);
    check(ncclBroadcast(buffer, buffer, data.size(), ncclUint8, from, comm_, stream_), "ncclBroadcast");
    if (rank_ != from) to_host(data, buffer);
    synchronize();
  }

  /// Every rank's byte buffer, in rank order; sizes may differ between ranks. The sizes travel
  /// first (`ncclAllGather` of one uint64 per rank), then the bytes (grouped `ncclSend` /
  /// `ncclRecv`, each buffer at its own size).
  /// @throws error `transport_failed`.
  [[nodiscard]] std::vector<std::vector<std::byte>> all_gather_bytes(std::span<const std::byte> mine) {
    const device_scope scope(device_);
    const auto my_size = static_cast<std::uint64_t>(mine.size());
    std::vector<std::uint64_t> sizes(index(size_));
    std::byte* gathered_sizes = device_buffer(sizes.size() * sizeof my_size);
    std::byte* my_slot = gathered_sizes + index(rank_) * sizeof my_size;
    to_device(my_slot, std::as_bytes(std::span(&my_size, 1)));
    check(ncclAllGather(my_slot, gathered_sizes, 1, ncclUint64, comm_, stream_), "ncclAllGather");
    to_host(std::as_writable_bytes(std::span(sizes)), gathered_sizes);
    synchronize();
    block_layout layout;
    for (const std::uint64_t s : sizes) layout.append(static_cast<std::size_t>(s));
    std::vector<std::byte> flat(layout.total);
    gather_bytes(std::span(flat), mine, layout, detail::all_ranks);
    return detail::cut_into(std::span<const std::byte>(flat), std::span<const std::size_t>(layout.counts));
  }

  /// Buffer j of `to_each` goes to rank j; returns the P buffers sent to this rank, buffer i from
  /// rank i; sizes may differ, empty buffers included. The sizes travel first (one uint64 to and
  /// from every rank), then the bytes, each in one group of `ncclSend` / `ncclRecv` (NCCL's
  /// all-to-all).
  /// @throws error `invalid_argument` for other than size() buffers (this rank, before anything
  ///         is sent); `transport_failed`.
  [[nodiscard]] std::vector<std::vector<std::byte>> all_to_all_bytes(std::span<const std::span<const std::byte>> to_each) {
    detail::require_one_buffer_per_rank(to_each.size(), size_, "nccl_transport::all_to_all_bytes");
    const device_scope scope(device_);
    std::vector<std::uint64_t> sent_sizes(index(size_));
    for (std::size_t p = 0; p < sent_sizes.size(); ++p) sent_sizes[p] = to_each[p].size();
    std::vector<std::uint64_t> received_sizes(index(size_));
    block_layout size_slots;
    for (std::size_t p = 0; p < sent_sizes.size(); ++p) size_slots.append(sizeof(std::uint64_t));
    std::byte* sizes = device_buffer(2 * aligned(size_slots.total));
    to_device(sizes, std::as_bytes(std::span(sent_sizes)));
    exchange(sizes, size_slots, sizes + aligned(size_slots.total), size_slots);
    to_host(std::as_writable_bytes(std::span(received_sizes)), sizes + aligned(size_slots.total));
    synchronize();
    block_layout sent;
    block_layout received;
    for (std::size_t p = 0; p < sent_sizes.size(); ++p) {
      sent.append(to_each[p].size());
      received.append(static_cast<std::size_t>(received_sizes[p]));
    }
    std::byte* in = device_buffer(aligned(sent.total) + received.total);
    std::byte* out = in + aligned(sent.total);
    for (std::size_t p = 0; p < to_each.size(); ++p) to_device(in + sent.firsts[p], to_each[p]);
    exchange(in, sent, out, received);
    std::vector<std::byte> flat(received.total);
    to_host(std::span(flat), out);
    synchronize();
    return detail::cut_into(std::span<const std::byte>(flat), std::span<const std::size_t>(received.counts));
  }

  /// Sends `data` to rank `dest`, which may wait until `dest` receives it; a message to this rank
  /// itself is kept and returns at once.
  /// @throws error `invalid_argument` for a rank outside the group; `transport_failed`.
  void send_bytes(std::span<const std::byte> data, int dest) {
    const int to = member(dest, "send_bytes", "destination");
    if (to == rank_) {
      self_.post(data);
      return;
    }
    static_cast<void>(transfer(data, to, no_peer));
  }

  /// The next buffer that rank `source` sent to this rank, of any size, waiting for it if needed.
  /// @throws error `invalid_argument` for a rank outside the group; `size_mismatch` for a receive
  ///         from this rank itself with nothing sent to itself; `transport_failed`.
  [[nodiscard]] std::vector<std::byte> recv_bytes(int source) {
    const int from = member(source, "recv_bytes", "source");
    return from == rank_ ? self_.take() : transfer({}, no_peer, from);
  }

  /// Sends `data` to `dest` and receives the next buffer from `source` at once: the header, then
  /// the bytes, are sent and received in one NCCL group each, so a ring in which every rank sends
  /// to its successor and receives from its predecessor cannot deadlock.
  /// @throws error as `send_bytes` and `recv_bytes`.
  [[nodiscard]] std::vector<std::byte> sendrecv_bytes(std::span<const std::byte> data, int dest, int source) {
    const int to = member(dest, "sendrecv_bytes", "destination");
    const int from = member(source, "sendrecv_bytes", "source");
    if (to == rank_ || from == rank_) {  // one side is local: the send and the receive in turn cannot deadlock
      send_bytes(data, to);
      return recv_bytes(from);
    }
    return transfer(data, to, from);
  }

 private:
  /// `transfer`'s peer when there is nothing to send, or nothing to receive.
  static constexpr int no_peer = -1;
  /// Alignment of the regions of the device buffer, which NCCL moves fastest when aligned.
  static constexpr std::size_t alignment = 256;

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

  /// Blocks of bytes laid out one after another in rank order: block p holds `counts[p]` bytes
  /// from byte `firsts[p]`.
  struct block_layout {
    std::vector<std::size_t> counts;
    std::vector<std::size_t> firsts;
    std::size_t total = 0;

    void append(std::size_t bytes) {
      counts.push_back(bytes);
      firsts.push_back(total);
      total += bytes;
    }
  };

  [[nodiscard]] static std::size_t index(int r) noexcept { return static_cast<std::size_t>(r); }

  /// `bytes` rounded up to the alignment of the buffer's regions.
  [[nodiscard]] static std::size_t aligned(std::size_t bytes) noexcept {
    return (bytes + alignment - 1) / alignment * alignment;
  }

  /// The blocks of `split`, of values of `width` bytes, in bytes.
  [[nodiscard]] static block_layout layout_of(const detail::block_split& split, std::size_t width) {
    block_layout layout;
    for (int b = 0; b < split.parts(); ++b) layout.append(split.count(b) * width);
    return layout;
  }

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
  /// last error where it has one, unless `rc` is success.
  void check(ncclResult_t rc, const char* call) const {
    if (rc == ncclSuccess) [[likely]]
      return;
    detail::fail(errc::transport_failed, [&] {
      std::string text = std::string("nccl_transport: ") + call + " failed: " + ncclGetErrorString(rc);
      const char* last = ncclGetLastError(comm_);
      if (last != nullptr && *last != '\0') text += std::string(" (") + last + ")";
      return text;
    });
  }

  /// The device buffer, grown to at least `bytes` (its contents are lost when it grows). Every call
  /// ends by synchronizing the stream, so no earlier call's work still uses the old buffer.
  [[nodiscard]] std::byte* device_buffer(std::size_t bytes) {
    if (bytes > capacity_) {
      check(cudaFree(std::exchange(buffer_, nullptr)), "cudaFree");
      capacity_ = 0;
      void* grown = nullptr;
      check(cudaMalloc(&grown, bytes), "cudaMalloc");
      buffer_ = static_cast<std::byte*>(grown);
      capacity_ = bytes;
    }
    return buffer_;
  }

  /// Queues the copy of `from` into device memory at `to`.
  void to_device(std::byte* to, std::span<const std::byte> from) {
    if (!from.empty()) check(cudaMemcpyAsync(to, from.data(), from.size(), cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
  }

  /// Queues the copy of device memory at `from` into `to`.
  void to_host(std::span<std::byte> to, const std::byte* from) {
    if (!to.empty()) check(cudaMemcpyAsync(to.data(), from, to.size(), cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
  }

  /// Waits until the stream has done everything queued on it.
  void synchronize() { check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

  /// Queues `bytes` bytes at `from` to rank `peer` (nothing for none, as the peer expects).
  void send(const std::byte* from, std::size_t bytes, int peer) {
    if (bytes > 0) check(ncclSend(from, bytes, ncclUint8, peer, comm_, stream_), "ncclSend");
  }

  /// Queues the receive of `bytes` bytes from rank `peer` into `to` (nothing for none).
  void receive(std::byte* to, std::size_t bytes, int peer) {
    if (bytes > 0) check(ncclRecv(to, bytes, ncclUint8, peer, comm_, stream_), "ncclRecv");
  }

  /// Runs `queue` (which issues sends and receives) inside one NCCL group, which is closed even
  /// when `queue` throws, so that NCCL progresses them together.
  template <class Queue>
  void grouped(Queue&& queue) {
    check(ncclGroupStart(), "ncclGroupStart");
    try {
      std::forward<Queue>(queue)();
    } catch (...) {
      ncclGroupEnd();
      throw;
    }
    check(ncclGroupEnd(), "ncclGroupEnd");
  }

  /// Step 1 of the block scheme: `received` (P blocks of this rank's block size) gets block
  /// rank() of every rank's `data`, in rank order (grouped sends and receives, this rank's own
  /// block included, as NCCL's all-to-all).
  template <class V>
  void exchange_blocks(std::span<const V> data, const detail::block_split& split, std::span<V> received, const char*) {
    const device_scope scope(device_);
    const block_layout blocks = layout_of(split, sizeof(V));
    const std::size_t mine = blocks.counts[index(rank_)];
    std::byte* in = device_buffer(aligned(data.size_bytes()) + received.size_bytes());
    std::byte* out = in + aligned(data.size_bytes());
    to_device(in, std::as_bytes(data));
    block_layout received_blocks;
    for (int p = 0; p < size_; ++p) received_blocks.append(mine);
    exchange(in, blocks, out, received_blocks);
    to_host(std::as_writable_bytes(received), out);
    synchronize();
  }

  /// Step 3 of the block scheme: the combined blocks to every rank (`all_ranks`) or to `root`.
  template <class V>
  void gather_blocks(std::span<V> data, std::span<const V> mine, const detail::block_split& split, int root, const char*) {
    const device_scope scope(device_);
    gather_bytes(std::as_writable_bytes(data), std::as_bytes(mine), layout_of(split, sizeof(V)), root);
  }

  /// Queues NCCL's all-to-all in one group, this rank included: block p of `sent` (device memory
  /// at `in`) goes to rank p, and block p of `received` (at `out`) comes from rank p.
  void exchange(const std::byte* in, const block_layout& sent, std::byte* out, const block_layout& received) {
    grouped([&] {
      for (int p = 0; p < size_; ++p) {
        send(in + sent.firsts[index(p)], sent.counts[index(p)], p);
        receive(out + received.firsts[index(p)], received.counts[index(p)], p);
      }
    });
  }

  /// The bytes of step 3 and of `all_gather_bytes`: this rank's block is `mine`,
  /// block rank() of `layout`; rank `root` (every rank for `all_ranks`) receives every block at its
  /// place in `out`, of `layout.total` bytes, the other ranks' `out` is left unchanged.
  void gather_bytes(std::span<std::byte> out, std::span<const std::byte> mine, const block_layout& layout, int root) {
    const auto receives = [root](int r) { return root == detail::all_ranks || r == root; };
    std::byte* blocks = device_buffer(layout.total);
    std::byte* my_block = blocks + layout.firsts[index(rank_)];
    to_device(my_block, mine);
    grouped([&] {
      for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        if (receives(p)) send(my_block, mine.size(), p);
        if (receives(rank_)) receive(blocks + layout.firsts[index(p)], layout.counts[index(p)], p);
      }
    });
    if (receives(rank_)) to_host(out, blocks);
    synchronize();
  }

  /// Sends `data` to `to` (unless `no_peer`) and receives the next message from `from` (unless
  /// `no_peer`), both at once: the size headers in one group, then the bytes in another.
  [[nodiscard]] std::vector<std::byte> transfer(std::span<const std::byte> data, int to, int from) {
    const device_scope scope(device_);
    const auto sent_size = static_cast<std::uint64_t>(data.size());
    std::uint64_t received_size = 0;
    std::byte* headers = device_buffer(2 * alignment);
    if (to != no_peer) to_device(headers, std::as_bytes(std::span(&sent_size, 1)));
    grouped([&] {
      if (to != no_peer) send(headers, sizeof sent_size, to);
      if (from != no_peer) receive(headers + alignment, sizeof received_size, from);
    });
    if (from != no_peer) to_host(std::as_writable_bytes(std::span(&received_size, 1)), headers + alignment);
    synchronize();
    std::vector<std::byte> received(static_cast<std::size_t>(received_size));
    std::byte* sent = device_buffer(aligned(data.size()) + received.size());
    to_device(sent, data);
    grouped([&] {
      if (to != no_peer) send(sent, data.size(), to);
      if (from != no_peer) receive(sent + aligned(data.size()), received.size(), from);
    });
    to_host(std::span(received), sent + aligned(data.size()));
    synchronize();
    return received;
  }

  /// Frees the device buffer on the communicator's device (errors ignored: nothing can be done).
  void release() noexcept {
    if (buffer_ == nullptr) return;
    int previous = 0;
    const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != device_ &&
                          cudaSetDevice(device_) == cudaSuccess;
    cudaFree(buffer_);
    if (switched) cudaSetDevice(previous);
    buffer_ = nullptr;
    capacity_ = 0;
  }

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  int rank_ = 0;
  int size_ = 0;
  int device_ = 0;
  std::byte* buffer_ = nullptr;
  std::size_t capacity_ = 0;
  detail::self_messages self_;
};

static_assert(transport<nccl_transport>);
static_assert(transport_with_point_to_point<nccl_transport>);
static_assert(transport_with_all_to_all<nccl_transport>);

}  // namespace gradcomp
