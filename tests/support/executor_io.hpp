#pragma once
// Running codecs and stateful wrappers on any executor with host vectors at the interface, so that
// one test body runs on cpu_executor and cuda_executor alike. `executor_memory<E>` says how host
// vectors reach E's memory and come back: on the CPU they are used as they are; the CUDA tests
// specialise it (cuda/device_io.cuh) to copy them to device memory and back, in order on the
// executor's stream.
//
// Poison. Every buffer an operation must write before it reads (workspaces, outputs, the scratch
// half of a state) is handed over filled with the byte `poison_byte`, never with zeros, so that a
// kernel or loop that relies on memory it did not clear, or leaves part of an output unwritten,
// shows in the result. A test that needs zeros (a sum onto zeros, a zeroed deferred-error word)
// copies them in explicitly.
#include <gradcomp/core/concepts.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/wire_envelope.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "support/errors.hpp"

namespace gradcomp::test {

/// The byte that fills buffers handed to operations before they write them (0xA5A5A5A5 is a
/// negative float of about −2.9e−16, 0xA5A5A5A5A5A5A5A5 a negative double of about −2.5e−127:
/// finite values that no test input holds).
inline constexpr unsigned char poison_byte = 0xA5;

/// `count` values whose every byte is `poison_byte`, on the host.
template <class T>
std::vector<T> poisoned_values(std::size_t count) {
  std::vector<T> values(count);
  if (count > 0) std::memset(static_cast<void*>(values.data()), poison_byte, count * sizeof(T));
  return values;
}

/// Host vectors in executor E's memory: on the CPU, the vectors themselves.
template <class E>
struct executor_memory {
  /// E's copy of `host`.
  template <class T>
  static std::vector<T> copy_in(const E&, const std::vector<T>& host) {
    return host;
  }
  /// Fills `buffer` with `poison_byte`.
  template <class T>
  static void poison(const E&, std::span<T> buffer) {
    if (!buffer.empty()) std::memset(static_cast<void*>(buffer.data()), poison_byte, buffer.size_bytes());
  }
  /// `count` values in E's memory, every byte `poison_byte`.
  template <class T>
  static std::vector<T> poisoned(const E&, std::size_t count) {
    return poisoned_values<T>(count);
  }
  /// The buffer as a span.
  template <class T>
  static std::span<T> span(std::vector<T>& buffer) {
    return std::span<T>(buffer);
  }
  /// The first `count` elements of a buffer, on the host (after E's queued work).
  template <class T>
  static std::vector<T> copy_out(const E&, const std::vector<T>& buffer, std::size_t count) {
    return {buffer.begin(), buffer.begin() + static_cast<std::ptrdiff_t>(count)};
  }
};

/// What an operation gave: `thrown_by`'s text ("no exception", or the named error), and the output
/// buffer afterwards.
template <class V>
struct outcome {
  std::string status;
  std::vector<V> output;

  friend bool operator==(const outcome&, const outcome&) = default;
};

/// Encodes `x` on `exec` into a buffer of `max_encoded_bytes` pre-filled with 0xAB bytes: what
/// happened, and the buffer afterwards (on success, exactly the message).
template <class E, class Codec, class T>
outcome<std::byte> encode_outcome_on(const E& exec, const Codec& codec, const std::vector<T>& x, message_key key = {}) {
  using memory = executor_memory<E>;
  auto g = memory::copy_in(exec, x);
  auto out = memory::copy_in(exec, std::vector<std::byte>(codec.max_encoded_bytes(x.size()), std::byte{0xAB}));
  auto ws = memory::template poisoned<std::byte>(exec, codec.workspace_bytes(exec, x.size()));
  std::size_t size = codec.max_encoded_bytes(x.size());
  const std::string status = thrown_by([&] {
    size = codec.encode(exec, std::span<const T>(memory::span(g)), memory::span(out), memory::span(ws), key);
  });
  return {status, memory::copy_out(exec, out, status == "no exception" ? size : codec.max_encoded_bytes(x.size()))};
}

/// Encodes `x` on `exec` and returns exactly the message (the encode must succeed).
template <class E, class Codec, class T>
std::vector<std::byte> encode_on(const E& exec, const Codec& codec, const std::vector<T>& x, message_key key = {}) {
  outcome<std::byte> result = encode_outcome_on(exec, codec, x, key);
  REQUIRE(result.status == "no exception");
  return result.output;
}

/// Decodes `message` on `exec` into (or, with `accumulate`, onto) a copy of `into`: what happened,
/// and the output afterwards.
template <class E, class Codec, class T = typename Codec::value_type>
outcome<T> decode_outcome_on(const E& exec, const Codec& codec, const std::vector<std::byte>& message,
                             const std::vector<T>& into, bool accumulate = false, decode_limits limits = {}) {
  using memory = executor_memory<E>;
  auto m = memory::copy_in(exec, message);
  auto out = memory::copy_in(exec, into);
  auto ws = memory::template poisoned<std::byte>(exec, codec.workspace_bytes(exec, into.size()));
  const std::span<const std::byte> bytes(memory::span(m));
  const std::string status = thrown_by([&] {
    if (accumulate) codec.decode_accumulate(exec, bytes, memory::span(out), memory::span(ws), limits);
    else
      codec.decode(exec, bytes, memory::span(out), memory::span(ws), limits);
  });
  return {status, memory::copy_out(exec, out, into.size())};
}

/// Decodes `message` on `exec` into (or onto) a copy of `into` and returns the values (the decode
/// must succeed).
template <class E, class Codec, class T = typename Codec::value_type>
std::vector<T> decode_on(const E& exec, const Codec& codec, const std::vector<std::byte>& message,
                         const std::vector<T>& into, bool accumulate = false, decode_limits limits = {}) {
  outcome<T> result = decode_outcome_on(exec, codec, message, into, accumulate, limits);
  REQUIRE(result.status == "no exception");
  return result.output;
}

/// Bit patterns of values, so that comparisons tell −0 from +0 and NaN payloads apart.
template <class T>
std::vector<typename float_traits<T>::bits_type> bit_patterns(const std::vector<T>& values) {
  std::vector<typename float_traits<T>::bits_type> bits(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) bits[i] = to_bits(values[i]);
  return bits;
}

/// A stateful wrapper (error feedback, LoCo) stepped on executor E: its state lives in E's
/// memory; gradients go in and messages, carried errors and saved states come out as host vectors.
template <class E, class Wrapper>
class stepper {
 public:
  using T = typename Wrapper::value_type;
  using memory = executor_memory<E>;

  /// A new state for n values; the half of it that a step writes before reading (error
  /// feedback's `next`, "contents unspecified") poisoned.
  stepper(E exec, const Wrapper& wrapper, std::size_t n)
      : exec_(exec), wrapper_(wrapper), n_(n), state_(wrapper.make_state(exec, n)) {
    if constexpr (requires { state_.next; }) memory::poison(exec_, memory::span(state_.next));
  }

  /// One step on `g`: the message, or the named error thrown and what the failed step left in a
  /// message buffer pre-filled with 0xAB bytes.
  outcome<std::byte> try_step(const std::vector<T>& g, message_key key) {
    auto grad = memory::copy_in(exec_, g);
    auto out = memory::copy_in(exec_, std::vector<std::byte>(wrapper_.max_encoded_bytes(n_), std::byte{0xAB}));
    auto ws = memory::template poisoned<std::byte>(exec_, wrapper_.workspace_bytes(exec_, n_));
    std::size_t size = wrapper_.max_encoded_bytes(n_);
    const std::string status = thrown_by([&] {
      size = wrapper_.encode(exec_, std::span<const T>(memory::span(grad)), state_, memory::span(out), memory::span(ws),
                             key);
    });
    return {status, memory::copy_out(exec_, out, status == "no exception" ? size : wrapper_.max_encoded_bytes(n_))};
  }

  /// One step that must succeed: the message.
  std::vector<std::byte> step(const std::vector<T>& g, message_key key) {
    outcome<std::byte> result = try_step(g, key);
    REQUIRE(result.status == "no exception");
    return result.output;
  }

  /// The error the state carries into the next step.
  std::vector<T> carried_error() const {
    auto out = memory::template poisoned<T>(exec_, n_);
    wrapper_.carried_error(exec_, state_, memory::span(out));
    return memory::copy_out(exec_, out, n_);
  }

  /// Replaces the carried error: what `thrown_by` says of it.
  std::string set_carried_error(const std::vector<T>& values) {
    auto in = memory::copy_in(exec_, values);
    return thrown_by([&] { wrapper_.set_carried_error(exec_, std::span<const T>(memory::span(in)), state_); });
  }

  /// The saved state's bytes.
  std::vector<std::byte> save() const {
    std::vector<std::byte> bytes(wrapper_.saved_state_bytes(n_));
    bytes.resize(wrapper_.save_state(exec_, state_, std::span<std::byte>(bytes)));
    return bytes;
  }

  /// Restores saved bytes: what `thrown_by` says of it.
  std::string load(const std::vector<std::byte>& bytes) {
    return thrown_by([&] { wrapper_.load_state(exec_, std::span<const std::byte>(bytes), state_); });
  }

  /// The state itself (its step counters, and the backend's buffers).
  [[nodiscard]] const state_type_of<Wrapper, E>& state() const noexcept { return state_; }

 private:
  E exec_;
  const Wrapper& wrapper_;
  std::size_t n_;
  state_type_of<Wrapper, E> state_;
};

}  // namespace gradcomp::test
