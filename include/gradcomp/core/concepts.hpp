#pragma once
/// @file
/// The concepts every gradcomp component is written against (docs/design.md §2).

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <utility>

#include <gradcomp/core/wire_envelope.hpp>

namespace gradcomp {

/// Where work runs: names itself and is cheap to copy (`cpu_executor`, `cuda_executor`).
template <class E>
concept executor = std::copyable<E> && requires {
  { E::name } -> std::convertible_to<std::string_view>;
};

/// The size contract of a codec: value type, wire id, and bounds the caller allocates from.
template <class C>
concept codec = requires(const C& c, std::uint64_t n) {
  typename C::value_type;
  { C::id } -> std::convertible_to<codec_id>;
  { c.max_encoded_bytes(n) } -> std::same_as<std::size_t>;
  { c.params_hash() } -> std::same_as<std::uint64_t>;
};

/// A codec that runs on executor `E`: reports the workspace it needs there, encodes into bytes
/// (returning the count written) and decodes or accumulates them into a dense buffer, all in
/// caller-provided memory.
template <class C, class E>
concept codec_for =
    codec<C> && executor<E> &&
    requires(const C& c, const E& e, std::uint64_t n, std::span<const typename C::value_type> grad,
             std::span<typename C::value_type> dense, std::span<std::byte> out, std::span<const std::byte> in,
             std::span<std::byte> ws, message_key key, decode_limits limits) {
      { c.workspace_bytes(e, n) } -> std::same_as<std::size_t>;
      { c.encode(e, grad, out, ws, key) } -> std::same_as<std::size_t>;
      c.decode(e, in, dense, ws, limits);
      c.decode_accumulate(e, in, dense, ws, limits);
    };

/// A codec that keeps a subset of the elements; `k(n)` is how many (or the target count).
template <class C>
concept sparsifier = codec<C> && requires(const C& c, std::uint64_t n) {
  { c.k(n) } -> std::same_as<std::uint64_t>;
};

/// A codec whose encodings combine by element-wise sum: `accumulate_encoded(e, acc, other)` turns
/// `acc` into the encoding of the sum of both inputs, so a plain SUM collective aggregates them.
template <class C, class E>
concept homomorphic = codec_for<C, E> && C::is_homomorphic &&
                      requires(const C& c, const E& e, std::span<std::byte> acc, std::span<const std::byte> other) {
                        c.accumulate_encoded(e, acc, other);
                      };

/// The state a stateful component keeps on executor E: what `make_state(e, n)` returns (host
/// memory on the CPU, device memory on the GPU).
template <class C, class E>
using state_type_of = decltype(std::declval<const C&>().make_state(std::declval<const E&>(), std::uint64_t{}));

/// A component with state across steps (error residuals, controller history): `make_state(e, n)`
/// creates it in executor memory, `save_state` writes it to (host) bytes and `load_state` restores
/// it.
template <class C, class E>
concept stateful = executor<E> && requires(const C& c, const E& e, std::uint64_t n) { c.make_state(e, n); } &&
                   requires(const C& c, const E& e, state_type_of<C, E>& state, std::span<std::byte> bytes,
                            std::span<const std::byte> saved) {
                     { c.save_state(e, state, bytes) } -> std::same_as<std::size_t>;
                     c.load_state(e, saved, state);
                   };

/// Measured statistics of one communication round, the input of a controller.
struct round_stats {
  std::uint64_t step = 0;                ///< The step measured.
  std::uint64_t dense_bytes = 0;         ///< Bytes the uncompressed gradient would have sent.
  std::uint64_t sent_bytes = 0;          ///< Bytes actually sent.
  double gradient_norm2 = 0.0;           ///< Squared L2 norm of the gradient (rank-aggregated).
  double compressed_norm2 = 0.0;         ///< Squared L2 norm of what was sent, decoded.
  double seconds = 0.0;                  ///< Wall time of the step.
  std::uint64_t samples = 0;             ///< Samples processed in the step.
};

/// A host-only policy that turns the statistics of a round into the next runtime parameters
/// (density, bits, which layers to compress). It never touches device memory.
template <class K>
concept controller = requires(K& k, const round_stats& stats) {
  typename K::parameters;
  { k.next(stats) } -> std::same_as<typename K::parameters>;
};

}  // namespace gradcomp
