#pragma once
/// @file
/// What the MPI and Gloo adapters share, so that both give the bits of the in-process transport:
/// the split of n elements into P contiguous blocks, the rank-order combine of the blocks a rank
/// receives, the element-wise operations of the in-process transport, and the queue of messages
/// a rank sends to itself.
///
/// A rank-ordered all-reduce over P ranks runs in three steps: an all-to-all(v) in which rank r
/// receives block r of every rank, a combine of those P blocks in rank order
/// (((x₀ ⊕ x₁) ⊕ x₂) ⊕ …), and an all-gather(v) of the combined blocks. Each rank sends and receives
/// about 2·n·(P−1)/P values, as a ring all-reduce does, and every element is combined in the same
/// order on every rank, whatever the library's own reduction order would be.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

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
      : parts_(parts),
        base_(n / static_cast<std::size_t>(parts)),
        extra_(n % static_cast<std::size_t>(parts)) {}

  /// Number of blocks P.
  [[nodiscard]] int parts() const noexcept { return parts_; }
  /// Elements in block `b`.
  [[nodiscard]] std::size_t count(int b) const noexcept { return base_ + (index(b) < extra_ ? std::size_t{1} : std::size_t{0}); }
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

/// Element-wise sum; unsigned types wrap, as the in-process transport's sum.
struct sum_op {
  template <class V>
  [[nodiscard]] V operator()(V a, V b) const noexcept {
    return static_cast<V>(a + b);
  }
};

/// Element-wise maximum as the in-process transport takes it: `a < b ? b : a` with the
/// accumulator `a`, so a NaN accumulated first stays and a later NaN is passed over, and of ±0 the
/// first is kept.
struct max_op {
  template <class V>
  [[nodiscard]] V operator()(V a, V b) const noexcept {
    return a < b ? b : a;
  }
};

/// Element-wise bitwise OR.
struct or_op {
  template <class V>
  [[nodiscard]] V operator()(V a, V b) const noexcept {
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

/// Rank `rank`'s step 1 and 2 of a rank-ordered reduction: `exchange(received)` must fill
/// `received`, P blocks of `split.count(rank)` elements, with block `rank` of every rank's input
/// in rank order (an all-to-all(v)); returns those blocks combined in rank order.
template <class V, class Op, class Exchange>
[[nodiscard]] std::vector<V> reduce_own_block(const block_split& split, int rank, Op op, Exchange&& exchange) {
  std::vector<V> received(split.count(rank) * static_cast<std::size_t>(split.parts()));
  std::forward<Exchange>(exchange)(std::span<V>(received));
  combine_in_rank_order(std::span<V>(received), split.parts(), op);
  received.resize(split.count(rank));
  return received;
}

/// Throws `invalid_argument` unless an all-to-all has one buffer per rank (`call` names it).
inline void require_one_buffer_per_rank(std::size_t buffers, int ranks, const char* call) {
  require(buffers == static_cast<std::size_t>(ranks), errc::invalid_argument, [&] {
    return std::string(call) + ": " + std::to_string(buffers) + " buffers, not one per rank (size() = " +
           std::to_string(ranks) + ")";
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
[[nodiscard]] std::vector<std::vector<std::byte>> cut_into(std::span<const std::byte> flat, std::span<const Count> sizes) {
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
