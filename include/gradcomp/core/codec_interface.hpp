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
#include <gradcomp/core/wire_envelope.hpp>

namespace gradcomp {

/// Base of a codec `Codec` of `T` values (CRTP): workspace query, encode, decode and
/// decode_accumulate on any executor for which `backend<Codec, E>` exists.
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
    return backend<Codec, E>::encode(self(), e, grad, out, ws, key);
  }

  /// Decodes `message` into `out` (one value per element of the encoded tensor). Everything is
  /// validated first; on error `out` is untouched. @throws error naming what is wrong.
  template <executor E>
  void decode(const E& e, std::span<const std::byte> message, std::span<T> out, std::span<std::byte> ws,
              decode_limits limits = {}) const {
    backend<Codec, E>::decode(self(), e, message, out, ws, limits, false);
  }

  /// Adds the decoded `message` into `acc`, so that aggregating received messages needs no copy.
  /// Everything is validated first; on error `acc` is untouched. @throws error naming what is wrong.
  template <executor E>
  void decode_accumulate(const E& e, std::span<const std::byte> message, std::span<T> acc, std::span<std::byte> ws,
                         decode_limits limits = {}) const {
    backend<Codec, E>::decode(self(), e, message, acc, ws, limits, true);
  }

 private:
  [[nodiscard]] const Codec& self() const noexcept { return static_cast<const Codec&>(*this); }
};

}  // namespace gradcomp
