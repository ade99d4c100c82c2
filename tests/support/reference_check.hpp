#pragma once
// The fast host backends checked against the specification: every cpu_executor setting (each
// max_simd level, streamed stores off and always on) must write the bytes reference_executor
// writes, fail with the same error where it fails, and decode the reference's message to the same
// bits. One body per property, run over the executors.
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/core/wire_envelope.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "support/data.hpp"
#include "support/executor_io.hpp"

namespace gradcomp::test {

/// cpu_executor at every max_simd level (lowered to what this CPU runs: `simd()` names it), with
/// streamed stores off, and at the baseline and the widest level with every output streamed.
inline std::vector<cpu_executor> cpu_settings() {
  return {{.max_simd = cpu_simd::baseline, .streaming_store_bytes = SIZE_MAX},
          {.max_simd = cpu_simd::avx2, .streaming_store_bytes = SIZE_MAX},
          {.max_simd = cpu_simd::avx512, .streaming_store_bytes = SIZE_MAX},
          {.max_simd = cpu_simd::baseline, .streaming_store_bytes = 0},
          {.max_simd = cpu_simd::avx512, .streaming_store_bytes = 0}};
}

/// Element counts every comparison covers: empty, one, odd, around a 32-value kernel step and a
/// 256-value block, and a size with a ragged tail.
inline constexpr std::size_t edge_sizes[] = {0, 1, 2, 7, 31, 32, 33, 255, 256, 257, 1000, 4099};

/// Decodes `message` onto a copy of `before` (added to it with `accumulate`) on the reference and
/// on the CPU: both must throw `code` and leave the output as it was.
template <class Codec, class T>
void check_decode_refused_untouched(const Codec& codec, const std::vector<std::byte>& message,
                                    const std::vector<T>& before, errc code, bool accumulate = false) {
  for (const auto& result : {decode_outcome_on(reference_executor{}, codec, message, before, accumulate),
                             decode_outcome_on(cpu_executor{}, codec, message, before, accumulate)}) {
    CHECK(result.status == named(code));
    CHECK(bit_patterns(result.output) == bit_patterns(before));
  }
}

/// Whether an encode that failed left a message that decodes (it must not).
inline bool holds_valid_envelope(const std::vector<std::byte>& bytes) {
  return thrown_by([&] { (void)parse_envelope(bytes); }) == "no exception";
}

/// Encodes `x` on the reference and on every cpu setting: the same outcome (the same bytes, or the
/// same named error and no valid message left); then decodes the reference's message on each, plain
/// and accumulated onto `x`, to the same bits. Returns the reference's message (empty on error).
template <class Codec, class T>
std::vector<std::byte> check_same_as_reference(const Codec& codec, const std::vector<T>& x, message_key key) {
  const reference_executor ref;
  const outcome<std::byte> expected = encode_outcome_on(ref, codec, x, key);
  const bool encoded = expected.status == "no exception";
  if (!encoded) CHECK_FALSE(holds_valid_envelope(expected.output));
  outcome<T> decoded, accumulated;
  if (encoded) {
    decoded = decode_outcome_on(ref, codec, expected.output, poisoned_values<T>(x.size()));
    accumulated = decode_outcome_on(ref, codec, expected.output, x, true);
    CHECK(decoded.status == "no exception");
    CHECK(accumulated.status == "no exception");
  }
  for (const cpu_executor& cpu : cpu_settings()) {
    CAPTURE(static_cast<int>(cpu.simd()));
    CAPTURE(cpu.streaming_store_bytes);
    const outcome<std::byte> got = encode_outcome_on(cpu, codec, x, key);
    CHECK(got.status == expected.status);
    if (!encoded) {
      CHECK_FALSE(holds_valid_envelope(got.output));
      continue;
    }
    CHECK(got.output == expected.output);
    const outcome<T> d = decode_outcome_on(cpu, codec, expected.output, poisoned_values<T>(x.size()));
    CHECK(d.status == decoded.status);
    CHECK(bit_patterns(d.output) == bit_patterns(decoded.output));
    const outcome<T> a = decode_outcome_on(cpu, codec, expected.output, x, true);
    CHECK(a.status == accumulated.status);
    CHECK(bit_patterns(a.output) == bit_patterns(accumulated.output));
  }
  return encoded ? expected.output : std::vector<std::byte>{};
}

/// check_same_as_reference over every input kind of support/data.hpp and every edge size (a
/// 16-bit codec's inputs rounded from the float32 ones, `make_half_input`).
template <class Codec>
void check_inputs_same_as_reference(const Codec& codec, message_key key = {.step = 3, .tensor_id = 7}) {
  using T = typename Codec::value_type;
  for (const input_kind kind : all_input_kinds) {
    for (const std::size_t n : edge_sizes) {
      CAPTURE(name(kind));
      CAPTURE(n);
      if constexpr (half_precision<T>) (void)check_same_as_reference(codec, make_half_input<T>(kind, n, 1000 + n), key);
      else
        (void)check_same_as_reference(codec, make_input<T>(kind, n, 1000 + n), key);
    }
  }
}

/// A shared-scale codec's `encode_shared` of x as rank 2, with agreed maxima 1.5 times x's own:
/// every cpu_executor setting writes the reference's bytes.
template <class Codec>
void check_encode_shared_same_as_reference(const Codec& codec, const std::vector<typename Codec::value_type>& x) {
  using T = typename Codec::value_type;
  using M = compute_type<T>;
  std::vector<M> agreed(codec.block_count(x.size()));
  codec.block_maxima(reference_executor{}, std::span<const T>(x), std::span<M>(agreed));
  for (M& m : agreed) m *= M{1.5};
  const auto shared_on = [&](const auto& exec) {
    std::vector<std::byte> out(codec.max_encoded_bytes(x.size()));
    codec.encode_shared(exec, std::span<const T>(x), std::span<const M>(agreed), out, {}, {.step = 5}, 2);
    return out;
  };
  const std::vector<std::byte> expected = shared_on(reference_executor{});
  for (const cpu_executor& cpu : cpu_settings()) CHECK(shared_on(cpu) == expected);
}

/// NaN, +Inf and −Inf at the first, a middle and the last element: every executor rejects them
/// alike (check_same_as_reference expects the reference to throw `non_finite_input` here). A
/// 16-bit codec gets the same values narrowed, in its rounded inputs.
template <class Codec>
void check_non_finite_same_as_reference(const Codec& codec, std::size_t n = 1000) {
  using T = typename Codec::value_type;
  using C = compute_type<T>;
  for (const C special :
       {std::numeric_limits<C>::quiet_NaN(), std::numeric_limits<C>::infinity(), -std::numeric_limits<C>::infinity()}) {
    for (const std::size_t at : {std::size_t{0}, n / 2 + 1, n - 1}) {
      std::vector<T> x;
      if constexpr (half_precision<T>) {
        x = make_half_input<T>(input_kind::normal, n, 5);
        x[at] = narrow<T>(special);
      } else {
        x = make_input<T>(input_kind::normal, n, 5);
        x[at] = special;
      }
      CAPTURE(at);
      CAPTURE(special);
      const outcome<std::byte> ref = encode_outcome_on(reference_executor{}, codec, x, {.step = 1});
      CHECK(ref.status == named(errc::non_finite_input));
      (void)check_same_as_reference(codec, x, {.step = 1});
    }
  }
}

/// What decoding `message` into n values does on the reference ("no exception" or the named
/// error); CHECKs that every cpu setting does the same, so that decoders reject alike.
template <class Codec>
std::string decode_status_everywhere(const Codec& codec, const std::vector<std::byte>& message, std::size_t n,
                                     decode_limits limits = {}) {
  using T = typename Codec::value_type;
  const std::string expected =
      decode_outcome_on(reference_executor{}, codec, message, poisoned_values<T>(n), false, limits).status;
  for (const cpu_executor& cpu : cpu_settings()) {
    CAPTURE(static_cast<int>(cpu.simd()));
    CHECK(decode_outcome_on(cpu, codec, message, poisoned_values<T>(n), false, limits).status == expected);
  }
  return expected;
}

/// A stateful wrapper (error feedback, LoCo) stepped `steps` times on the reference and on every
/// cpu setting with the same gradients and keys: after every step the same message (or the same
/// named error, with no valid message left), the same carried error bit for bit and the same saved
/// state. Gradients are N(0, 1e-3) times `scale` (ties at every third step when `scale` is 1); at
/// step `nan_step` (if < steps) one value is NaN, which every executor rejects leaving its state.
template <class Wrapper>
void check_steps_same_as_reference(const Wrapper& wrapper, std::size_t n, std::uint64_t steps, double scale = 1.0,
                                   std::uint64_t nan_step = UINT64_MAX) {
  using T = typename Wrapper::value_type;
  stepper<reference_executor, Wrapper> ref({}, wrapper, n);
  std::vector<stepper<cpu_executor, Wrapper>> cpus;
  for (const cpu_executor& cpu : cpu_settings()) cpus.emplace_back(cpu, wrapper, n);
  for (std::uint64_t t = 0; t < steps; ++t) {
    CAPTURE(t);
    std::vector<T> g = make_input<T>(t % 3 == 2 && scale == 1.0 ? input_kind::ties : input_kind::normal, n, 500 + t);
    for (T& v : g) v = static_cast<T>(static_cast<double>(v) * scale);
    if (t == nan_step && n > 0) g[n / 2] = std::numeric_limits<T>::quiet_NaN();
    const message_key key{.step = t, .tensor_id = 4};
    const outcome<std::byte> expected = ref.try_step(g, key);
    if (t == nan_step && n > 0) CHECK(expected.status == named(errc::non_finite_input));
    const bool encoded = expected.status == "no exception";
    if (!encoded) CHECK_FALSE(holds_valid_envelope(expected.output));
    for (std::size_t c = 0; c < cpus.size(); ++c) {
      CAPTURE(c);
      const outcome<std::byte> got = cpus[c].try_step(g, key);
      CHECK(got.status == expected.status);
      if (encoded) CHECK(got.output == expected.output);
      else
        CHECK_FALSE(holds_valid_envelope(got.output));
      CHECK(bit_patterns(cpus[c].carried_error()) == bit_patterns(ref.carried_error()));
      CHECK(cpus[c].save() == ref.save());
    }
  }
}

}  // namespace gradcomp::test
