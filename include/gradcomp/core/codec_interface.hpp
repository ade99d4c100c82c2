#pragma once
/// @file
/// The executor-generic entry points every codec shares, written once: each forwards to
/// `backend<Codec, Executor>`, which the backend folders (`cpu/`, `cuda/`) specialise.

#include <cstddef>
#include <cstdint>
#include <span>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/concepts.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/memory_space.hpp>
#include <gradcomp/core/wire_envelope.hpp>

namespace gradcomp {

/// A codec that takes 16-bit gradients (`bf16`, `fp16`): it says so with a `static constexpr bool
/// takes_half_precision = true` (docs/half-precision.md lists them).
template <class Codec>
concept takes_half_precision_values = requires { requires Codec::takes_half_precision; };

/// Base of a codec `Codec` of `T` values (CRTP): workspace query, encode, decode and
/// decode_accumulate on any executor for which `backend<Codec, E>` exists. A codec of 16-bit
/// values also decodes into, and accumulates in, float32 (`compute_type<T>`).
template <class Codec, gradient_value T>
class codec_interface {
 public:
  /// Workspace bytes that encode and decode need on executor `e` for n elements.
  template <executor E>
  [[nodiscard]] std::size_t workspace_bytes(const E& e, std::uint64_t n) const {
    return backend<Codec, E>::workspace_bytes(self(), e, n);
  }

  /// Encodes `grad` into `out`, which must hold at least `max_encoded_bytes(grad.size())` bytes,
  /// using `ws` (at least `workspace_bytes(e, grad.size())` bytes) as scratch.
  /// @returns bytes written. @throws error `non_finite_input`, `buffer_too_small`, `workspace_too_small`.
  template <executor E>
  std::size_t encode(const E& e, std::span<const T> grad, std::span<std::byte> out, std::span<std::byte> ws,
                     message_key key = {}) const {
    require_value_type<E>();
    return backend<Codec, E>::encode(self(), e, grad, out, ws, key);
  }

  /// Decodes `message` into `out` (one value per element of the encoded tensor). Everything is
  /// validated first; on error `out` is untouched. @throws error naming what is wrong.
  template <executor E>
  void decode(const E& e, std::span<const std::byte> message, std::span<T> out, std::span<std::byte> ws,
              decode_limits limits = {}) const {
    require_value_type<E>();
    backend<Codec, E>::decode(self(), e, message, out, ws, limits, false);
  }

  /// A 16-bit codec's `decode` into float32: the decoded values without narrowing.
  template <executor E>
  void decode(const E& e, std::span<const std::byte> message, std::span<compute_type<T>> out, std::span<std::byte> ws,
              decode_limits limits = {}) const
    requires half_precision<T>
  {
    require_value_type<E>();
    backend<Codec, E>::decode(self(), e, message, out, ws, limits, false);
  }

  /// Adds the decoded `message` into `acc`, so that aggregating received messages needs no copy.
  /// Everything is validated first; on error `acc` is untouched. @throws error naming what is wrong.
  template <executor E>
  void decode_accumulate(const E& e, std::span<const std::byte> message, std::span<T> acc, std::span<std::byte> ws,
                         decode_limits limits = {}) const {
    require_value_type<E>();
    backend<Codec, E>::decode(self(), e, message, acc, ws, limits, true);
  }

  /// A 16-bit codec's `decode_accumulate` into a float32 accumulator: the way to sum many ranks'
  /// messages (docs/half-precision.md §3), narrowing once at the end.
  template <executor E>
  void decode_accumulate(const E& e, std::span<const std::byte> message, std::span<compute_type<T>> acc,
                         std::span<std::byte> ws, decode_limits limits = {}) const
    requires half_precision<T>
  {
    require_value_type<E>();
    backend<Codec, E>::decode(self(), e, message, acc, ws, limits, true);
  }

 protected:
  /// A compile error, rather than a deep one, for a codec or an executor that does not take
  /// 16-bit values yet (the host backends of the codecs that say so do); a codec's own entry points
  /// beyond this interface's call it too.
  template <executor E>
  static constexpr void require_value_type() noexcept {
    static_assert(!half_precision<T> || takes_half_precision_values<Codec>,
                  "this codec takes float and double gradients only so far; docs/half-precision.md lists the "
                  "codecs that take bf16 and fp16");
    static_assert(!half_precision<T> || memory_space_of<E> == memory_space::host,
                  "the CUDA backend takes float and double gradients only so far (docs/half-precision.md §5)");
  }

 private:
  [[nodiscard]] const Codec& self() const noexcept { return static_cast<const Codec&>(*this); }
};

}  // namespace gradcomp
