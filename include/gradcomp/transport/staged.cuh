#pragma once
/// @file
/// `staged_transport<X>`: a host transport (MPI, Gloo, in-process, a user's) made into a device
/// transport, so that a `cuda_executor` runs the compressed collectives over it. Every call copies
/// its device buffers into pinned host memory on the stream, runs the host transport's call there,
/// and copies the result back into device memory; the host transport's reductions, orders and
/// errors are unchanged, so the bits are the host transport's.
///
/// ```cpp
/// gradcomp::mpi_transport host(MPI_COMM_WORLD);
/// gradcomp::staged_transport<gradcomp::mpi_transport> t(host, stream);   // borrows both
/// const gradcomp::cuda_executor gpu{.stream = stream};                     // the same stream
/// gradcomp::compressed_all_reduce(gpu, t, codec, grad /*device span*/);
/// ```
///
/// **What is staged.** All payload: each call copies its input device → host (`cudaMemcpyAsync`
/// into pinned memory, then a wait for the stream) and its output host → device (queued; the next
/// call that writes the pinned memory waits for it first). The control plane
/// (`all_gather_control`, `all_reduce_max_control`) is the host transport's own calls on the
/// caller's host buffers, with no copy. Received buffers of the variable-size calls
/// (`all_gather_bytes`, `all_to_all_bytes`, `recv_bytes`, `sendrecv_bytes`) land in a device
/// buffer of the adapter, each on an 8-byte boundary, valid until its next call.
///
/// **Memory.** One pinned host buffer (`cudaMallocHost`) and one device buffer (stream-ordered),
/// each grown when a call needs more and reused across calls: steps of one size allocate nothing
/// after the first (the host transport may allocate in its own calls: MPI's and Gloo's
/// variable-size calls return vectors). CUDA-aware MPI, which could take device buffers directly,
/// is not used: a build of MPI may or may not be CUDA-aware, and the staging works with every one.
///
/// It has the host transport's capabilities: bitwise OR, point-to-point messages, an all-to-all and
/// deadlines where X has them. A deadline is the host transport's (`set_deadline` forwards it): the
/// adapter's own waits are for copies on its stream, which no peer can hold up. One object per rank, used by one thread at a time; the host transport and the
/// stream must outlive it, and it must be destroyed before the stream (its device buffer returns to
/// the pool on the stream). CUDA failures throw `errc::transport_failed`, naming the call; the host
/// transport's errors pass unchanged.

#include <gradcomp/cuda/config.cuh>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/core/error.hpp>
#include <gradcomp/core/memory_space.hpp>
#include <gradcomp/cuda/collective_memory.cuh>
#include <gradcomp/cuda/executor.cuh>
#include <gradcomp/transport/deadline.hpp>
#include <gradcomp/transport/rank_ordered.hpp>
#include <gradcomp/transport/received_bytes.hpp>
#include <gradcomp/transport/transport.hpp>

namespace gradcomp {

/// Host transport X taking device buffers through pinned host memory (this file's comment).
template <transport X>
  requires(memory_space_of<X> == memory_space::host)
class staged_transport {
  using device_memory = collective_memory<cuda_executor>;

 public:
  /// Every call takes device buffers.
  static constexpr memory_space memory = memory_space::device;

  /// Wraps `inner`, whose calls run on the host, for device buffers on `stream`. Allocates nothing.
  staged_transport(X& inner, cudaStream_t stream) : inner_(&inner), exec_{.stream = stream} {}
  staged_transport(const staged_transport&) = delete;
  staged_transport& operator=(const staged_transport&) = delete;
  /// Takes over `other`'s buffers.
  staged_transport(staged_transport&& other) noexcept
      : inner_(other.inner_),
        exec_(other.exec_),
        pinned_(std::exchange(other.pinned_, nullptr)),
        pinned_bytes_(std::exchange(other.pinned_bytes_, 0)),
        received_(std::move(other.received_)),
        layout_(std::move(other.layout_)) {}
  staged_transport& operator=(staged_transport&&) = delete;
  /// Frees the pinned host buffer (the device buffer returns to its pool on the stream).
  ~staged_transport() {
    if (pinned_ != nullptr) cudaFreeHost(pinned_);
  }

  /// This rank.
  [[nodiscard]] int rank() const { return inner_->rank(); }
  /// Number of ranks.
  [[nodiscard]] int size() const { return inner_->size(); }
  /// The stream the copies are queued on (a `cuda_executor` running a collective with this
  /// transport must use it too).
  [[nodiscard]] cudaStream_t stream() const noexcept { return exec_.native_stream(); }
  /// The host transport.
  [[nodiscard]] X& inner() noexcept { return *inner_; }

  /// Bounds the host transport's waits by `until` (its `set_deadline`).
  void set_deadline(const deadline& until)
    requires transport_with_deadline<X>
  {
    inner_->set_deadline(until);
  }
  /// The host transport's deadline.
  [[nodiscard]] deadline current_deadline() const
    requires transport_with_deadline<X>
  {
    return inner_->current_deadline();
  }

  /// The host transport's `all_reduce_sum` on a host copy of `data` (device memory).
  template <detail::transport_value V>
  void all_reduce_sum(std::span<V> data) {
    in_place(data, [&](std::span<V> host) { inner_->all_reduce_sum(host); });
  }
  /// The host transport's `all_reduce_max` on a host copy of `data`.
  template <detail::transport_value V>
  void all_reduce_max(std::span<V> data) {
    in_place(data, [&](std::span<V> host) { inner_->all_reduce_max(host); });
  }
  /// The host transport's `all_reduce_or` on a host copy of `data`.
  void all_reduce_or(std::span<std::uint8_t> data)
    requires transport_with_bitwise_or<X>
  {
    in_place(data, [&](std::span<std::uint8_t> host) { inner_->all_reduce_or(host); });
  }
  /// The host transport's `reduce_sum` on a host copy of `data`; only the root's comes back.
  template <detail::transport_value V>
  void reduce_sum(std::span<V> data, int root) {
    const std::span<V> host = to_pinned(std::span<const V>(data), 0);
    inner_->reduce_sum(host, root);
    if (root == rank()) to_device(std::span<const V>(host), data);
  }
  /// The host transport's `reduce_scatter_sum` on host copies of `in` and `out`.
  template <detail::transport_value V>
  void reduce_scatter_sum(std::span<const V> in, std::span<V> out) {
    const std::span<V> host = to_pinned(in, out.size());
    const std::span<V> host_out = host.subspan(in.size());
    inner_->reduce_scatter_sum(std::span<const V>(host.first(in.size())), host_out);
    to_device(std::span<const V>(host_out), out);
  }
  /// The host transport's `broadcast` on a host copy of `data`.
  void broadcast(std::span<std::byte> data, int root) {
    in_place(data, [&](std::span<std::byte> host) { inner_->broadcast(host, root); });
  }

  /// Every rank's device buffer, in rank order, in the adapter's device memory (valid until its
  /// next call, each buffer on an 8-byte boundary).
  [[nodiscard]] received_bytes all_gather_bytes(std::span<const std::byte> mine) {
    const auto received = inner_->all_gather_bytes(std::span<const std::byte>(to_pinned(mine, 0)));
    return deliver(received);
  }

  /// Buffer j of `to_each` (device memory) to rank j; the P buffers sent to this rank, in the
  /// adapter's device memory (valid until its next call, each on an 8-byte boundary).
  [[nodiscard]] received_bytes all_to_all_bytes(std::span<const std::span<const std::byte>> to_each)
    requires transport_with_all_to_all<X>
  {
    std::vector<std::uint64_t> sizes(to_each.size());
    for (std::size_t p = 0; p < sizes.size(); ++p) sizes[p] = to_each[p].size();
    layout_.assign(std::span<const std::uint64_t>(sizes));
    const std::span<std::byte> host = pinned(layout_.total());
    for (std::size_t p = 0; p < to_each.size(); ++p)
      copy(host.data() + layout_.offset(p), to_each[p].data(), to_each[p].size(), cudaMemcpyDeviceToHost);
    synchronize();
    std::vector<std::span<const std::byte>> staged(to_each.size());
    for (std::size_t p = 0; p < staged.size(); ++p)
      staged[p] = std::span<const std::byte>(host).subspan(layout_.offset(p), layout_.size(p));
    const auto received = inner_->all_to_all_bytes(std::span<const std::span<const std::byte>>(staged));
    return deliver(received);
  }

  /// The host transport's `send_bytes` of a host copy of `data` (device memory).
  void send_bytes(std::span<const std::byte> data, int dest)
    requires transport_with_point_to_point<X>
  {
    inner_->send_bytes(std::span<const std::byte>(to_pinned(data, 0)), dest);
  }
  /// The next buffer from `source`, in the adapter's device memory (valid until its next call).
  [[nodiscard]] std::span<const std::byte> recv_bytes(int source)
    requires transport_with_point_to_point<X>
  {
    const auto received = inner_->recv_bytes(source);
    return deliver_one(std::span<const std::byte>(received));
  }
  /// The host transport's `sendrecv_bytes` of a host copy of `data`; the received buffer in the
  /// adapter's device memory (valid until its next call).
  [[nodiscard]] std::span<const std::byte> sendrecv_bytes(std::span<const std::byte> data, int dest, int source)
    requires transport_with_point_to_point<X>
  {
    const auto received = inner_->sendrecv_bytes(std::span<const std::byte>(to_pinned(data, 0)), dest, source);
    return deliver_one(std::span<const std::byte>(received));
  }

  /// The control plane: the host transport's `all_gather_bytes` of a host buffer, no copy to or
  /// from the device.
  [[nodiscard]] std::vector<std::vector<std::byte>> all_gather_control(std::span<const std::byte> mine) {
    const auto gathered = inner_->all_gather_bytes(mine);
    std::vector<std::vector<std::byte>> out(gathered.size());
    for (std::size_t p = 0; p < out.size(); ++p) {
      const std::span<const std::byte> buffer(gathered[p]);
      out[p].assign(buffer.begin(), buffer.end());
    }
    return out;
  }
  /// The control plane: the host transport's `all_reduce_max` of host doubles, no copy.
  void all_reduce_max_control(std::span<double> words) { inner_->all_reduce_max(words); }

 private:
  /// Throws `transport_failed`, with the call's name and CUDA's error string, unless `rc` is success.
  static void check(cudaError_t rc, const char* call) {
    if (rc == cudaSuccess) [[likely]]
      return;
    detail::fail(errc::transport_failed, [&] {
      return std::string("staged_transport: ") + call + " failed: " + cudaGetErrorString(rc) + " (" +
             cudaGetErrorName(rc) + ")";
    });
  }

  void synchronize() { check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize"); }

  void copy(void* to, const void* from, std::size_t bytes, cudaMemcpyKind kind) {
    if (bytes > 0) check(cudaMemcpyAsync(to, from, bytes, kind, stream()), "cudaMemcpyAsync");
  }

  /// The pinned buffer, at least `bytes` long (grown by `cudaMallocHost` when needed), once the
  /// stream has finished every copy queued from or to it, so the host may write it.
  [[nodiscard]] std::span<std::byte> pinned(std::size_t bytes) {
    synchronize();
    if (bytes > pinned_bytes_) {
      check(cudaFreeHost(std::exchange(pinned_, nullptr)), "cudaFreeHost");
      pinned_bytes_ = 0;
      void* grown = nullptr;
      check(cudaMallocHost(&grown, bytes), "cudaMallocHost");
      pinned_ = static_cast<std::byte*>(grown);
      pinned_bytes_ = bytes;
    }
    return {pinned_, bytes};
  }

  /// A host copy of `data` (device memory) in the pinned buffer, with room for `extra` more values
  /// after it; waits for the copy.
  template <class V>
  [[nodiscard]] std::span<V> to_pinned(std::span<const V> data, std::size_t extra) {
    const std::span<std::byte> host = pinned((data.size() + extra) * sizeof(V));
    copy(host.data(), data.data(), data.size_bytes(), cudaMemcpyDeviceToHost);
    synchronize();
    return {reinterpret_cast<V*>(host.data()), data.size() + extra};
  }

  /// Queues the copy of `host` (pinned) back into `data` (device memory).
  template <class V>
  void to_device(std::span<const V> host, std::span<V> data) {
    copy(data.data(), host.data(), host.size_bytes(), cudaMemcpyHostToDevice);
  }

  /// `operation(host)` on a host copy of `data`, then the result back into `data`.
  template <class V, class Operation>
  void in_place(std::span<V> data, Operation operation) {
    const std::span<V> host = to_pinned(std::span<const V>(data), 0);
    operation(host);
    to_device(std::span<const V>(host), data);
  }

  /// The buffers the host transport returned (`received_buffers`), laid out in the pinned buffer
  /// on 8-byte boundaries and copied into the device buffer; their view.
  template <class Received>
  [[nodiscard]] received_bytes deliver(const Received& received) {
    std::vector<std::uint64_t> sizes(received.size());
    for (std::size_t p = 0; p < sizes.size(); ++p) sizes[p] = std::span<const std::byte>(received[p]).size();
    layout_.assign(std::span<const std::uint64_t>(sizes));
    const std::span<std::byte> host = pinned(layout_.total());
    for (std::size_t p = 0; p < sizes.size(); ++p) {
      const std::span<const std::byte> buffer(received[p]);
      if (!buffer.empty()) std::memcpy(host.data() + layout_.offset(p), buffer.data(), buffer.size());
    }
    received_.resize(exec_, layout_.total());
    copy(received_.span().data(), host.data(), layout_.total(), cudaMemcpyHostToDevice);
    return layout_.view(received_.span());
  }

  /// One received buffer, delivered as `deliver` does.
  [[nodiscard]] std::span<const std::byte> deliver_one(std::span<const std::byte> received) {
    const std::span<const std::byte> one[1] = {received};
    return deliver(std::span<const std::span<const std::byte>>(one))[0];
  }

  X* inner_;
  cuda_executor exec_;
  std::byte* pinned_ = nullptr;
  std::size_t pinned_bytes_ = 0;
  device_memory::buffer<std::byte> received_;
  detail::received_layout layout_;
};

}  // namespace gradcomp
