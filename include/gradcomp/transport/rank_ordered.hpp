#pragma once
/// @file
/// What the MPI, Gloo and NCCL adapters share, so that all give the bits of the in-process
/// transport: the rank-ordered reductions (`rank_ordered_reductions`, a CRTP base holding the
/// reductions, their argument checks and this documentation once), the split of n elements into P
/// contiguous blocks, the element-wise operations of the in-process transport, and the queue of
/// messages a rank sends to itself.
///
/// **The block scheme.** A rank-ordered all-reduce over P ranks runs in three steps: an
/// all-to-all(v) in which rank r receives block r of every rank, a combine of those P blocks in
/// rank order (((x₀ ⊕ x₁) ⊕ x₂) ⊕ …), and an all-gather(v) of the combined blocks (a gather(v) to
/// the root for `reduce_sum`; nothing more for `reduce_scatter_sum`, whose blocks are the output's).
/// Each rank sends and receives about 2·n·(P−1)/P values, as a ring all-reduce does, and every
/// element is combined in the same order on every rank, whatever the library's own reduction order
/// would be (MPI and Gloo promise none, NCCL's rings and trees split by channel and size). Unsigned
/// sums take the same path, although any order would do (Open MPI 4.1's AVX reductions saturate a
/// uint8 `MPI_SUM` at 255 instead of wrapping, open-mpi/ompi#8045).
///
/// **Arguments** a rank can check alone (a root outside the group, a reduce-scatter input that is
/// not size() blocks of the output) throw `errc::invalid_argument` before anything is sent; when
/// every rank passes the same arguments, as collectives require, every rank throws and none is
/// left waiting. Ranks that disagree on a collective's count or root are not detected (the
/// libraries report some such cases as `transport_failed`, others hang or time out).
///
/// **What an adapter supplies** (the base calls them through `Derived`, which befriends it):
///
/// - `static constexpr const char* transport_name` (for messages), `rank()`, `size()`;
/// - `exchange_blocks(span<const V> data, const block_split&, span<V> received, const char* call)`:
///   step 1, `received` (P blocks of this rank's block size) gets block rank() of every rank's
///   `data`, in rank order (the library's all-to-all(v));
/// - `gather_blocks(span<V> data, span<const V> mine, const block_split&, int root, const char* call)`:
///   step 3, every rank's combined block (`mine` on this rank) lands at its place in `data` of rank
///   `root`, or of every rank for `all_ranks`; the other ranks' `data` stays as it was;
/// - where the data is not host memory: `combine(span<V> blocks, int parts, Op)` (step 2, in place
///   into block 0), `block_scratch<V>(count)` (room for step 1) and `copy_block(from, to)`, which
///   default to host code here.
///
/// Errors of the library itself are the adapter's to map (`errc::transport_failed`, naming the
/// call and quoting the library's message).

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/core/config.hpp>
#include <gradcomp/core/error.hpp>

namespace gradcomp::detail {

/// The element types of the transports' reductions.
template <class V>
concept transport_value = std::same_as<V, float> || std::same_as<V, double> || std::same_as<V, std::uint8_t> ||
                          std::same_as<V, std::uint64_t>;

/// n elements split into P contiguous blocks, in rank order: block b holds ⌊n/P⌋ elements, plus
/// one for the first n mod P blocks, so some blocks are empty when n < P.
class block_split {
 public:
  /// @param n elements in all; @param parts number of blocks P ≥ 1.
  block_split(std::size_t n, int parts) noexcept
      : parts_(parts), base_(n / static_cast<std::size_t>(parts)), extra_(n % static_cast<std::size_t>(parts)) {}

  /// Number of blocks P.
  [[nodiscard]] int parts() const noexcept { return parts_; }
  /// Elements in block `b`.
  [[nodiscard]] std::size_t count(int b) const noexcept {
    return base_ + (index(b) < extra_ ? std::size_t{1} : std::size_t{0});
  }
  /// Index of the first element of block `b`.
  [[nodiscard]] std::size_t first(int b) const noexcept { return index(b) * base_ + std::min(index(b), extra_); }
  /// Elements in the largest block, ⌈n/P⌉.
  [[nodiscard]] std::size_t largest() const noexcept { return base_ + (extra_ > 0 ? std::size_t{1} : std::size_t{0}); }

 private:
  [[nodiscard]] static std::size_t index(int b) noexcept { return static_cast<std::size_t>(b); }

  int parts_;
  std::size_t base_;
  std::size_t extra_;
};

/// Element-wise sum; unsigned types wrap, as the in-process transport's sum. The operations are
/// host and device functions: the NCCL adapter combines on the device with the same arithmetic.
struct sum_op {
  template <class V>
  [[nodiscard]] GRADCOMP_HOST_DEVICE V operator()(V a, V b) const noexcept {
    return static_cast<V>(a + b);
  }
};

/// Element-wise maximum as the in-process transport takes it: `a < b ? b : a` with the
/// accumulator `a`, so a NaN accumulated first stays and a later NaN is passed over, and of ±0 the
/// first is kept.
struct max_op {
  template <class V>
  [[nodiscard]] GRADCOMP_HOST_DEVICE V operator()(V a, V b) const noexcept {
    return a < b ? b : a;
  }
};

/// Element-wise bitwise OR.
struct or_op {
  template <class V>
  [[nodiscard]] GRADCOMP_HOST_DEVICE V operator()(V a, V b) const noexcept {
    return static_cast<V>(a | b);
  }
};

/// `blocks` holds `parts` blocks of equal size, block p from rank p; block 0 becomes their
/// element-wise combination in rank order, ((b₀ ⊕ b₁) ⊕ b₂) ⊕ …
template <class V, class Op>
void combine_in_rank_order(std::span<V> blocks, int parts, Op op) noexcept {
  const std::size_t m = blocks.size() / static_cast<std::size_t>(parts);
  for (int p = 1; p < parts; ++p) {
    const V* in = blocks.data() + static_cast<std::size_t>(p) * m;
    for (std::size_t i = 0; i < m; ++i) blocks[i] = op(blocks[i], in[i]);
  }
}

/// `rank_ordered_reductions::gather_blocks`'s root when every rank receives every block.
inline constexpr int all_ranks = -1;

/// The rank-ordered reductions of an adapter `Derived` (CRTP), by the block scheme of this file's
/// comment, with their argument checks; `Derived` supplies the library's primitives.
template <class Derived>
class rank_ordered_reductions {
 public:
  /// Element-wise sum over ranks in rank order (unsigned types wrap), in place on every rank.
  /// @throws error `transport_failed`, or the adapter's own limits (MPI: `invalid_argument` when a
  ///         count exceeds its int).
  template <transport_value V>
  void all_reduce_sum(std::span<V> data) {
    all_reduce_in_rank_order(data, sum_op{}, "all_reduce_sum");
  }

  /// Element-wise maximum over ranks, `a < b ? b : a` in rank order as the in-process transport
  /// takes it (so NaN and ±0 come out alike), in place on every rank.
  /// @throws error as `all_reduce_sum`.
  template <transport_value V>
  void all_reduce_max(std::span<V> data) {
    all_reduce_in_rank_order(data, max_op{}, "all_reduce_max");
  }

  /// Rank `root`'s `data` becomes the element-wise sum over ranks in rank order; other ranks'
  /// data is unchanged.
  /// @throws error `invalid_argument` for a root outside the group; as `all_reduce_sum`.
  template <transport_value V>
  void reduce_sum(std::span<V> data, int root) {
    const int to = member(root, "reduce_sum", "root");
    const block_split split(data.size(), self().size());
    const std::span<V> mine = reduce_own_block(std::span<const V>(data), split, sum_op{}, "reduce_sum");
    self().gather_blocks(data, std::span<const V>(mine), split, to, "reduce_sum");
  }

  /// `in` holds size() blocks of `out.size()` values; `out` becomes the sum over ranks, in rank
  /// order, of block rank().
  /// @throws error `invalid_argument` when `in.size() ≠ size() · out.size()`; as `all_reduce_sum`.
  template <transport_value V>
  void reduce_scatter_sum(std::span<const V> in, std::span<V> out) {
    const auto ranks = static_cast<std::size_t>(self().size());
    require(in.size() == out.size() * ranks, errc::invalid_argument, [&] {
      return std::string(Derived::transport_name) + "::reduce_scatter_sum: the input holds " +
             std::to_string(in.size()) + " values, not size() = " + std::to_string(ranks) + " blocks of the output's " +
             std::to_string(out.size());
    });
    const block_split split(in.size(), self().size());
    const std::span<V> mine = reduce_own_block(in, split, sum_op{}, "reduce_scatter_sum");
    self().copy_block(std::span<const V>(mine), out);
  }

 protected:
  /// The block scheme of an all-reduce with `op`: step 1 and 2, then the combined blocks gathered
  /// into `data` on every rank.
  template <class V, class Op>
  void all_reduce_in_rank_order(std::span<V> data, Op op, const char* call) {
    const block_split split(data.size(), self().size());
    const std::span<V> mine = reduce_own_block(std::span<const V>(data), split, op, call);
    self().gather_blocks(data, std::span<const V>(mine), split, all_ranks, call);
  }

  /// `r` if it is a rank of the group. @throws error `invalid_argument` otherwise.
  [[nodiscard]] int member(int r, const char* call, const char* role) const {
    const int ranks = static_cast<const Derived&>(*this).size();
    require(r >= 0 && r < ranks, errc::invalid_argument, [&] {
      return std::string(Derived::transport_name) + "::" + call + ": " + role + " " + std::to_string(r) +
             " is outside the group of " + std::to_string(ranks) + " ranks";
    });
    return r;
  }

  /// Step 2 on the host: block 0 of `blocks` becomes the P blocks combined in rank order.
  template <class V, class Op>
  void combine(std::span<V> blocks, int parts, Op op) {
    combine_in_rank_order(blocks, parts, op);
  }

  /// Host room for `count` values of step 1, kept and reused across calls (grow-only).
  template <class V>
  [[nodiscard]] std::span<V> block_scratch(std::size_t count) {
    const std::size_t bytes = count * sizeof(V);
    if (bytes > scratch_bytes_) {
      scratch_ = std::make_unique_for_overwrite<std::byte[]>(bytes);  // storage for any V (implicit objects)
      scratch_bytes_ = bytes;
    }
    return {reinterpret_cast<V*>(scratch_.get()), count};
  }

  /// `to` becomes `from` (host memory).
  template <class V>
  void copy_block(std::span<const V> from, std::span<V> to) {
    std::copy(from.begin(), from.end(), to.begin());
  }

 private:
  [[nodiscard]] Derived& self() noexcept { return static_cast<Derived&>(*this); }

  /// Steps 1 and 2: this rank's block of every rank's `data`, combined in rank order (a span of the
  /// adapter's scratch, valid until its next call).
  template <class V, class Op>
  [[nodiscard]] std::span<V> reduce_own_block(std::span<const V> data, const block_split& split, Op op,
                                              const char* call) {
    const int rank = self().rank();
    const std::span<V> received =
        self().template block_scratch<V>(split.count(rank) * static_cast<std::size_t>(split.parts()));
    self().exchange_blocks(data, split, received, call);
    self().combine(received, split.parts(), op);
    return received.first(split.count(rank));
  }

  std::unique_ptr<std::byte[]> scratch_;
  std::size_t scratch_bytes_ = 0;
};

/// Throws `invalid_argument` unless an all-to-all has one buffer per rank (`call` names it).
inline void require_one_buffer_per_rank(std::size_t buffers, int ranks, const char* call) {
  require(buffers == static_cast<std::size_t>(ranks), errc::invalid_argument, [&] {
    return std::string(call) + ": " + std::to_string(buffers) +
           " buffers, not one per rank (size() = " + std::to_string(ranks) + ")";
  });
}

/// The byte buffers `buffers`, one after another, as the libraries' all-to-all(v) sends them.
[[nodiscard]] inline std::vector<std::byte> concatenated(std::span<const std::span<const std::byte>> buffers) {
  std::size_t total = 0;
  for (const auto& b : buffers) total += b.size();
  std::vector<std::byte> flat;
  flat.reserve(total);
  for (const auto& b : buffers) flat.insert(flat.end(), b.begin(), b.end());
  return flat;
}

/// `flat` cut into consecutive buffers of `sizes[p]` bytes (which add up to at most its size), as
/// the libraries' all-gather(v) and all-to-all(v) receive them.
template <class Count>
[[nodiscard]] std::vector<std::vector<std::byte>> cut_into(std::span<const std::byte> flat,
                                                           std::span<const Count> sizes) {
  std::vector<std::vector<std::byte>> buffers(sizes.size());
  std::size_t first = 0;
  for (std::size_t p = 0; p < buffers.size(); ++p) {
    const auto count = static_cast<std::size_t>(sizes[p]);
    buffers[p].assign(flat.begin() + static_cast<std::ptrdiff_t>(first),
                      flat.begin() + static_cast<std::ptrdiff_t>(first + count));
    first += count;
  }
  return buffers;
}

/// The messages a rank sends to itself, kept in order until it receives them. A library pair
/// joins two different ranks, so the adapters deliver a rank's messages to itself here; a send
/// to itself returns at once, as in the in-process transport.
class self_messages {
 public:
  /// Appends a copy of `data`.
  void post(std::span<const std::byte> data) { queue_.emplace_back(data.begin(), data.end()); }

  /// The oldest message. @throws error `size_mismatch` when there is none: no other rank can send
  /// it, so the receive could never complete.
  [[nodiscard]] std::vector<std::byte> take() {
    require(!queue_.empty(), errc::size_mismatch,
            "a receive from this rank itself with nothing sent to itself: it can never complete");
    std::vector<std::byte> message = std::move(queue_.front());
    queue_.erase(queue_.begin());
    return message;
  }

 private:
  std::vector<std::vector<std::byte>> queue_;  // oldest first; a vector, so moving it cannot throw
};

}  // namespace gradcomp::detail
