#pragma once
/// @file
/// The Gloo transport: `gloo_transport` wraps a connected `gloo::Context` the user created and
/// satisfies `transport`, `transport_with_bitwise_or`, `transport_with_point_to_point`,
/// `transport_with_all_to_all` and `transport_with_deadline`. Opt-in: include this header only in a program that uses Gloo (it
/// includes Gloo's headers; link Gloo, for example CMake's `gloo` target from `find_package(Gloo)`).
///
/// ```cpp
/// auto device = gloo::transport::tcp::CreateDevice("127.0.0.1");
/// gloo::rendezvous::FileStore files("/shared/dir");
/// gloo::rendezvous::PrefixStore store("job-42", files);
/// auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
/// context->setTimeout(std::chrono::seconds(60));
/// context->connectFullMesh(store, device);
/// gradcomp::gloo_transport t(context);
/// t.all_reduce_sum(std::span<float>(grad));   // every rank: the rank-order sum
/// ```
///
/// Reductions give the bits of the in-process transport: sums, maxima, the OR, `reduce_sum` and
/// `reduce_scatter_sum` are the block scheme of rank_ordered.hpp (`rank_ordered_reductions`, whose
/// comment documents them and their argument checks), over `gloo::alltoallv` (step 1) and
/// `gloo::allgatherv` (`reduce_sum`: `gloo::gather` of the blocks, padded to ⌈n/P⌉, to the root).
///
/// Device data: this adapter takes host buffers. A `cuda_executor` reaches it through
/// `staged_transport<gloo_transport>` (transport/staged.cuh), which stages device buffers through
/// pinned host buffers.
///
/// Errors and deadlines (docs/transports.md §8): every Gloo operation and every wait of a
/// point-to-point message takes the time left until the transport's deadline (`set_deadline`) as
/// its timeout; without a deadline, the context's (`gloo::Context::setTimeout`, the user's), since
/// Gloo has no unbounded wait. A peer that is missing or stopped therefore surfaces at the deadline
/// (a peer whose process exited, as soon as its connection closes). An exception of Gloo once the
/// deadline has passed becomes `errc::timeout`, naming the call (and the peer of a point-to-point
/// message; Gloo's collectives do not say which rank is missing); any other exception of Gloo (an
/// I/O error, the context's own timeout, a failed enforcement) becomes `errc::transport_failed`.
/// Both quote Gloo's message. A rank whose wait times out closes all of the context's connections
/// (Gloo's reaction to an application timeout), so the other ranks waiting in the same call fail at
/// once, with `transport_failed` ("Connection closed by peer") where their own deadline has not
/// passed yet; the context cannot be used again: make a new one. A peer outside the group and an
/// all-to-all of other than size() buffers throw `errc::invalid_argument` before anything is sent.
///
/// Point-to-point messages go through Gloo's unbound buffers: a message is an 8-byte size header,
/// then its bytes (none for an empty message), both on one slot that Gloo's collectives never use.
/// A receive names its source, so messages of different pairs never mix, and messages from one
/// source arrive in the order sent. `send_bytes` returns once the message is written, which Gloo
/// does only into a receive the destination has posted, so it waits for that receive;
/// `sendrecv_bytes` posts its send before it receives, so a ring cannot deadlock. Messages to this
/// rank itself are kept by the transport and returned by the next `recv_bytes(rank())`, as in the
/// in-process transport.
///
/// The collectives use Gloo's default tag; do not run other Gloo operations on the same context
/// while a call of the transport runs. One object per rank, used by one thread at a time.

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/broadcast.h>
#include <gloo/context.h>
#include <gloo/gather.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <new>
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

/// One rank of a Gloo context. Move-only, so that the messages it keeps for itself stay with one
/// object; several transports may share a context if they never run at once.
class gloo_transport : public detail::rank_ordered_reductions<gloo_transport> {
  using reductions = detail::rank_ordered_reductions<gloo_transport>;
  friend reductions;

 public:
  /// Names the adapter in messages.
  static constexpr const char* transport_name = "gloo_transport";

  /// Wraps `context`, which must be connected (for example by `connectFullMesh`).
  /// @throws error `invalid_argument` for a null context.
  explicit gloo_transport(std::shared_ptr<gloo::Context> context) : context_(std::move(context)) {
    detail::require(context_ != nullptr, errc::invalid_argument, "gloo_transport: the context is null");
  }

  gloo_transport(const gloo_transport&) = delete;
  gloo_transport& operator=(const gloo_transport&) = delete;
  /// Takes over `other`'s context; `other` may then only be destroyed or assigned to.
  gloo_transport(gloo_transport&&) noexcept = default;
  /// Takes over `other`'s context.
  gloo_transport& operator=(gloo_transport&&) noexcept = default;

  /// This rank.
  [[nodiscard]] int rank() const noexcept { return context_->rank; }
  /// Number of ranks.
  [[nodiscard]] int size() const noexcept { return context_->size; }

  /// Bounds the Gloo operations and waits of later calls by `until` (this file's comment);
  /// initially none, which leaves them to the context's timeout.
  void set_deadline(const deadline& until) noexcept { deadline_ = until; }
  /// The deadline of this transport's waits.
  [[nodiscard]] deadline current_deadline() const noexcept { return deadline_; }

  /// Element-wise bitwise OR over ranks, in place on every rank.
  /// @throws error `transport_failed`.
  void all_reduce_or(std::span<std::uint8_t> data) { all_reduce_in_rank_order(data, detail::or_op{}, "all_reduce_or"); }

  /// Every rank's `data` becomes rank `root`'s (`gloo::broadcast`).
  /// @throws error `invalid_argument` for a root outside the group; `transport_failed`.
  void broadcast(std::span<std::byte> data, int root) {
    const int from = member(root, "broadcast", "root");
    guarded("gloo::broadcast", [&] {
      gloo::BroadcastOptions options(context_);
      bound(options);
      options.setOutput(data.data(), data.size());
      options.setRoot(from);
      gloo::broadcast(options);
    });
  }

  /// Every rank's byte buffer, in rank order; sizes may differ between ranks. The sizes travel
  /// first (`gloo::allgather`), then the bytes (`gloo::allgatherv`).
  /// @throws error `transport_failed`.
  [[nodiscard]] std::vector<std::vector<std::byte>> all_gather_bytes(std::span<const std::byte> mine) {
    auto my_size = static_cast<std::uint64_t>(mine.size());
    std::vector<std::uint64_t> sizes(index(size()));
    guarded("gloo::allgather", [&] {
      gloo::AllgatherOptions options(context_);
      bound(options);
      options.setInput(&my_size, 1);
      options.setOutput(sizes.data(), sizes.size());
      gloo::allgather(options);
    });
    std::vector<std::size_t> counts(sizes.begin(), sizes.end());
    std::vector<std::size_t> firsts(counts.size());
    std::size_t total = 0;
    for (std::size_t p = 0; p < counts.size(); ++p) {
      firsts[p] = total;
      total += counts[p];
    }
    std::vector<std::byte> flat(total);
    std::copy(mine.begin(), mine.end(), flat.begin() + static_cast<std::ptrdiff_t>(firsts[index(rank())]));
    guarded("gloo::allgatherv", [&] {
      gloo::AllgathervOptions options(context_);  // in place: this rank's bytes are in `flat` already
      bound(options);
      options.setOutput(flat.data(), counts);
      gloo::allgatherv(options);
    });
    return detail::cut_into(std::span<const std::byte>(flat), std::span<const std::size_t>(counts));
  }

  /// Buffer j of `to_each` goes to rank j; returns the P buffers sent to this rank, buffer i from
  /// rank i; sizes may differ, empty buffers included. The sizes travel first (`gloo::alltoall`),
  /// then the bytes (`gloo::alltoallv`).
  /// @throws error `invalid_argument` for other than size() buffers (this rank, before anything
  ///         is sent); `transport_failed`.
  [[nodiscard]] std::vector<std::vector<std::byte>> all_to_all_bytes(
      std::span<const std::span<const std::byte>> to_each) {
    detail::require_one_buffer_per_rank(to_each.size(), size(), "gloo_transport::all_to_all_bytes");
    std::vector<std::uint64_t> sent_sizes(index(size()));
    for (std::size_t p = 0; p < sent_sizes.size(); ++p) sent_sizes[p] = to_each[p].size();
    std::vector<std::uint64_t> received_sizes(index(size()));
    guarded("gloo::alltoall", [&] {
      gloo::AlltoallOptions options(context_);
      bound(options);
      options.setInput(sent_sizes.data(), sent_sizes.size());
      options.setOutput(received_sizes.data(), received_sizes.size());
      gloo::alltoall(options);
    });
    std::vector<std::int64_t> sent_counts(sent_sizes.size());
    std::vector<std::int64_t> received_counts(received_sizes.size());
    std::size_t total = 0;
    for (std::size_t p = 0; p < sent_counts.size(); ++p) {
      sent_counts[p] = static_cast<std::int64_t>(sent_sizes[p]);
      received_counts[p] = static_cast<std::int64_t>(received_sizes[p]);
      total += static_cast<std::size_t>(received_sizes[p]);
    }
    const std::vector<std::byte> sent = detail::concatenated(to_each);
    std::vector<std::byte> received(total);
    alltoallv(sent.data(), std::move(sent_counts), received.data(), std::move(received_counts));
    return detail::cut_into(std::span<const std::byte>(received), std::span<const std::uint64_t>(received_sizes));
  }

  /// Sends `data` to rank `dest`, waiting until `dest` has posted the receive that takes it; a
  /// message to this rank itself is kept and returns at once.
  /// @throws error `invalid_argument` for a rank outside the group; `transport_failed`.
  void send_bytes(std::span<const std::byte> data, int dest) {
    const int to = member(dest, "send_bytes", "destination");
    if (to == rank()) {
      self_.post(data);
      return;
    }
    guarded(
        "send_bytes",
        [&] {
          outgoing message(*context_, data, to);
          message.wait(wait_limit());
        },
        " to rank " + std::to_string(to));
  }

  /// The next buffer that rank `source` sent to this rank, of any size, waiting for it if needed.
  /// @throws error `invalid_argument` for a rank outside the group; `size_mismatch` for a receive
  ///         from this rank itself with nothing sent to itself; `transport_failed`.
  [[nodiscard]] std::vector<std::byte> recv_bytes(int source) {
    const int from = member(source, "recv_bytes", "source");
    return from == rank() ? self_.take()
                          : guarded(
                                "recv_bytes", [&] { return receive(from); }, " from rank " + std::to_string(from));
  }

  /// Sends `data` to `dest` and receives the next buffer from `source` at once: the send is
  /// posted before the receive and waited for after it, so a ring in which every rank sends to its
  /// successor and receives from its predecessor cannot deadlock.
  /// @throws error as `send_bytes` and `recv_bytes`.
  [[nodiscard]] std::vector<std::byte> sendrecv_bytes(std::span<const std::byte> data, int dest, int source) {
    const int to = member(dest, "sendrecv_bytes", "destination");
    const int from = member(source, "sendrecv_bytes", "source");
    if (to == rank() || from == rank()) {  // one side is local: the send and the receive in turn cannot deadlock
      send_bytes(data, to);
      return recv_bytes(from);
    }
    return guarded(
        "sendrecv_bytes",
        [&] {
          outgoing message(*context_, data, to);
          std::vector<std::byte> received = receive(from);
          message.wait(wait_limit());
          return received;
        },
        " to rank " + std::to_string(to) + " and from rank " + std::to_string(from));
  }

 private:
  /// The slot of point-to-point messages: prefix 0x67 in the top byte, where Gloo's collectives
  /// use prefixes 0x01 to 0x08 (gloo/types.h) and its older algorithms small slot numbers.
  static constexpr std::uint64_t message_slot = std::uint64_t{0x67} << 56;

  /// A message being sent to another rank: its size header and its bytes, posted on construction.
  /// Destroying it before `wait` withdraws what was not sent yet.
  class outgoing {
   public:
    outgoing(gloo::Context& context, std::span<const std::byte> data, int to)
        : size_(data.size()),
          header_(context.createUnboundBuffer(&size_, sizeof size_)),
          // Gloo's buffers take a mutable pointer; a send only reads it.
          bytes_(data.empty() ? nullptr
                              : context.createUnboundBuffer(const_cast<std::byte*>(data.data()), data.size())) {
      header_->send(to, message_slot);
      if (bytes_) bytes_->send(to, message_slot);
    }
    outgoing(const outgoing&) = delete;
    outgoing& operator=(const outgoing&) = delete;
    ~outgoing() = default;

    /// Waits until the message is written into the destination's receive, each wait at most `limit`.
    void wait(std::chrono::milliseconds limit) {
      require_completed(header_->waitSend(limit) && (!bytes_ || bytes_->waitSend(limit)), "a send");
    }

   private:
    std::uint64_t size_;
    std::unique_ptr<gloo::transport::UnboundBuffer> header_;
    std::unique_ptr<gloo::transport::UnboundBuffer> bytes_;
  };

  [[nodiscard]] static std::size_t index(int r) noexcept { return static_cast<std::size_t>(r); }

  /// Gloo's wait calls return false when the operation was aborted.
  static void require_completed(bool completed, const char* what) {
    detail::require(completed, errc::transport_failed,
                    [&] { return std::string("gloo_transport: ") + what + " was aborted"; });
  }

  /// Runs `f`, turning Gloo's exceptions into `timeout` once the deadline has passed, else into
  /// `transport_failed`, with the call's name, `peers` (" to rank 2" for a point-to-point message;
  /// empty for a collective) and Gloo's message; gradcomp's own errors and allocation failures pass
  /// unchanged.
  template <class F>
  std::invoke_result_t<F> guarded(const char* call, F&& f, const std::string& peers = {}) const {
    try {
      return std::forward<F>(f)();
    } catch (const error&) {
      throw;
    } catch (const std::bad_alloc&) {
      throw;
    } catch (const std::exception& e) {
      if (deadline_.passed())
        detail::fail(errc::timeout, std::string("gloo_transport: ") + call + peers + " did not complete " +
                                        deadline_.within() + " (Gloo: " + e.what() +
                                        "); Gloo closed the context's connections: make a new context");
      detail::fail(errc::transport_failed, std::string("gloo_transport: ") + call + " failed: " + e.what() +
                                               (peers.empty() ? std::string() : " (" + peers.substr(1) + ")"));
    }
  }

  /// Gives a Gloo operation the time left until the deadline as its timeout (none: the context's).
  template <class Options>
  void bound(Options& options) const {
    if (!deadline_.infinite()) options.setTimeout(deadline_.remaining());
  }

  /// The limit of one wait of a point-to-point message: the time left until the deadline, or the
  /// context's timeout without one.
  [[nodiscard]] std::chrono::milliseconds wait_limit() const {
    return deadline_.infinite() ? context_->getTimeout() : deadline_.remaining();
  }

  /// Step 1 of the block scheme (`gloo::alltoallv`).
  template <class V>
  void exchange_blocks(std::span<const V> data, const detail::block_split& split, std::span<V> received, const char*) {
    std::vector<std::int64_t> sent_counts(index(size()));
    for (int b = 0; b < size(); ++b) sent_counts[index(b)] = static_cast<std::int64_t>(split.count(b));
    alltoallv(data.data(), std::move(sent_counts), received.data(),
              std::vector<std::int64_t>(index(size()), static_cast<std::int64_t>(split.count(rank()))));
  }

  /// Step 3 of the block scheme: `gloo::allgatherv` in place, or `gloo::gather` of the blocks padded
  /// to ⌈n/P⌉ (it takes blocks of one size) to `root`.
  template <class V>
  void gather_blocks(std::span<V> data, std::span<const V> mine, const detail::block_split& split, int root,
                     const char*) {
    if (root == detail::all_ranks) {
      std::copy(mine.begin(), mine.end(), data.begin() + static_cast<std::ptrdiff_t>(split.first(rank())));
      std::vector<std::size_t> counts(index(size()));
      for (int b = 0; b < size(); ++b) counts[index(b)] = split.count(b);
      guarded("gloo::allgatherv", [&] {
        gloo::AllgathervOptions options(context_);  // in place: this rank's block is in `data` already
        bound(options);
        options.setOutput(data.data(), counts);
        gloo::allgatherv(options);
      });
      return;
    }
    const std::size_t width = split.largest();
    std::vector<V> padded(width, V{0});
    std::copy(mine.begin(), mine.end(), padded.begin());
    std::vector<V> gathered(rank() == root ? width * index(size()) : 0);
    guarded("gloo::gather", [&] {
      gloo::GatherOptions options(context_);
      bound(options);
      options.setInput(padded.data(), width);
      if (rank() == root) options.setOutput(gathered.data(), gathered.size());
      options.setRoot(root);
      gloo::gather(options);
    });
    if (rank() != root) return;
    for (int b = 0; b < size(); ++b) {
      const auto at = gathered.begin() + static_cast<std::ptrdiff_t>(index(b) * width);
      std::copy(at, at + static_cast<std::ptrdiff_t>(split.count(b)),
                data.begin() + static_cast<std::ptrdiff_t>(split.first(b)));
    }
  }

  /// `gloo::alltoallv`: `sent_counts[p]` values from `in` (laid end to end) go to rank p, and
  /// `received_counts[p]` values from rank p arrive in `out` (laid end to end).
  template <class V>
  void alltoallv(const V* in, std::vector<std::int64_t> sent_counts, V* out,
                 std::vector<std::int64_t> received_counts) {
    guarded("gloo::alltoallv", [&] {
      gloo::AlltoallvOptions options(context_);
      bound(options);
      options.setInput(const_cast<V*>(in), std::move(sent_counts));  // read only
      options.setOutput(out, std::move(received_counts));
      gloo::alltoallv(options);
    });
  }

  /// Receives the next message from `from` (another rank): its size header, then its bytes.
  [[nodiscard]] std::vector<std::byte> receive(int from) {
    std::uint64_t size = 0;
    const auto header = context_->createUnboundBuffer(&size, sizeof size);
    header->recv(from, message_slot);
    require_completed(header->waitRecv(wait_limit()), "a receive");
    std::vector<std::byte> message(static_cast<std::size_t>(size));
    if (!message.empty()) {
      const auto bytes = context_->createUnboundBuffer(message.data(), message.size());
      bytes->recv(from, message_slot);
      require_completed(bytes->waitRecv(wait_limit()), "a receive");
    }
    return message;
  }

  std::shared_ptr<gloo::Context> context_;
  detail::self_messages self_;
  deadline deadline_{};
};

static_assert(transport_with_bitwise_or<gloo_transport>);
static_assert(transport_with_point_to_point<gloo_transport>);
static_assert(transport_with_all_to_all<gloo_transport>);
static_assert(transport_with_deadline<gloo_transport>);

}  // namespace gradcomp
