#pragma once
/// @file
/// What every stateful wrapper of a codec shares (error feedback, LoCo), written once: it holds
/// the inner codec, sends the inner codec's messages (so decoding forwards to it), and forwards
/// the stateful entry points to `backend<Wrapper, Executor>`.

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/concepts.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/wire_envelope.hpp>

namespace gradcomp {

/// Base of a stateful wrapper `Wrapper` of `Codec` with state `State` (CRTP).
template <class Wrapper, class Codec, class State>
class feedback_interface {
  static_assert(codec<Codec>, "a feedback wrapper wraps a gradcomp codec: Codec must model gradcomp::codec");

 public:
  using value_type = typename Codec::value_type;  ///< Element type of the gradient.
  /// Type of the carried error and of its arithmetic: float32 for a bf16 or fp16 gradient
  /// (docs/half-precision.md §5), the gradient's type otherwise.
  using error_type = compute_type<value_type>;
  using state_type = State;                       ///< State carried across steps on the CPU.
  /// State carried across steps on executor E (`state_type` on the CPU; device memory on the GPU).
  template <executor E>
  using state_type_on = typename backend<Wrapper, E>::state_type;
  static constexpr codec_id id = Codec::id;       ///< Messages are the inner codec's.

  /// The wrapped codec.
  [[nodiscard]] const Codec& inner() const noexcept { return inner_; }
  /// Largest message for n elements (the inner codec's).
  [[nodiscard]] std::size_t max_encoded_bytes(std::uint64_t n) const noexcept { return inner_.max_encoded_bytes(n); }
  /// The inner codec's `expected_encoded_bytes` (where it has one): the wrapper sends its messages.
  [[nodiscard]] std::size_t expected_encoded_bytes(std::uint64_t n) const noexcept
    requires requires(const Codec& c) { c.expected_encoded_bytes(n); }
  {
    return inner_.expected_encoded_bytes(n);
  }
  /// The inner codec's parameter hash, carried in every message and in the saved state.
  [[nodiscard]] std::uint64_t params_hash() const noexcept { return inner_.params_hash(); }

  /// Workspace bytes that `encode` and `decode` need on executor `e` for n elements.
  template <executor E>
  [[nodiscard]] std::size_t workspace_bytes(const E& e, std::uint64_t n) const {
    return backend<Wrapper, E>::workspace_bytes(self(), e, n);
  }
  /// A fresh state for n elements.
  template <executor E>
  [[nodiscard]] state_type_on<E> make_state(const E& e, std::uint64_t n) const {
    return backend<Wrapper, E>::make_state(self(), e, n);
  }
  /// One step: encodes `grad` with the carried state into `out` (at least `max_encoded_bytes(n)`
  /// bytes) and updates the state; `ws` holds at least `workspace_bytes(e, n)` bytes. On error the
  /// state is unchanged. @returns bytes written.
  /// @throws error `size_mismatch`, `non_finite_input`, `workspace_too_small`, or the inner codec's.
  template <executor E>
  std::size_t encode(const E& e, std::span<const value_type> grad, state_type_on<E>& state, std::span<std::byte> out,
                     std::span<std::byte> ws, message_key key = {}) const {
    return backend<Wrapper, E>::encode(self(), e, grad, state, out, ws, key);
  }
  /// Decodes a message (the inner codec's) into `out`; on error `out` is untouched.
  template <executor E>
  void decode(const E& e, std::span<const std::byte> message, std::span<value_type> out, std::span<std::byte> ws,
              decode_limits limits = {}) const {
    inner_.decode(e, message, out, ws, limits);
  }
  /// Adds a decoded message (the inner codec's) into `acc`; on error `acc` is untouched.
  template <executor E>
  void decode_accumulate(const E& e, std::span<const std::byte> message, std::span<value_type> acc,
                         std::span<std::byte> ws, decode_limits limits = {}) const {
    inner_.decode_accumulate(e, message, acc, ws, limits);
  }
  /// A 16-bit gradient's `decode` into float32 (the inner codec's).
  template <executor E>
  void decode(const E& e, std::span<const std::byte> message, std::span<error_type> out, std::span<std::byte> ws,
              decode_limits limits = {}) const
    requires half_precision<value_type>
  {
    inner_.decode(e, message, out, ws, limits);
  }
  /// A 16-bit gradient's `decode_accumulate` into a float32 accumulator (the inner codec's).
  template <executor E>
  void decode_accumulate(const E& e, std::span<const std::byte> message, std::span<error_type> acc,
                         std::span<std::byte> ws, decode_limits limits = {}) const
    requires half_precision<value_type>
  {
    inner_.decode_accumulate(e, message, acc, ws, limits);
  }
  /// Writes `state` into `bytes` (at least the wrapper's `saved_state_bytes(n)`). @returns bytes written.
  /// @throws error `buffer_too_small`.
  template <executor E>
  std::size_t save_state(const E& e, const state_type_on<E>& state, std::span<std::byte> bytes) const {
    return backend<Wrapper, E>::save_state(self(), e, state, bytes);
  }
  /// Writes the error `state` carries into the next step, one value per element: what the next
  /// `encode` adds to the gradient (error feedback: the residual; LoCo: the dequantized 8-bit
  /// error). With `set_carried_error` it re-lays a state when the elements of a tensor change,
  /// as when a framework rebuilds its gradient buckets. @throws error `size_mismatch`.
  template <executor E>
  void carried_error(const E& e, const state_type_on<E>& state, std::span<error_type> out) const {
    backend<Wrapper, E>::carried_error(self(), e, state, out);
  }
  /// Replaces the error `state` carries by `error` (one value per element; LoCo stores it in 8
  /// bits, so it reads back within half a quantization step). Step counters are kept.
  /// @throws error `size_mismatch`, `non_finite_input`; `state` is unchanged then.
  template <executor E>
  void set_carried_error(const E& e, std::span<const error_type> error, state_type_on<E>& state) const {
    backend<Wrapper, E>::set_carried_error(self(), e, error, state);
  }
  /// Restores `state` from saved bytes, checking everything before touching it.
  /// @throws error naming what is wrong with the bytes; `state` is unchanged then.
  template <executor E>
  void load_state(const E& e, std::span<const std::byte> bytes, state_type_on<E>& state) const {
    backend<Wrapper, E>::load_state(self(), e, bytes, state);
  }

 protected:
  /// A wrapper around `inner`.
  explicit feedback_interface(Codec inner) : inner_(std::move(inner)) {}

 private:
  [[nodiscard]] const Wrapper& self() const noexcept { return static_cast<const Wrapper&>(*this); }
  Codec inner_;
};

}  // namespace gradcomp
