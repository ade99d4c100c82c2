// The special-values matrix of docs/design.md §8 as one table: every codec (top-k, threshold, random-k;
// float and double) against NaN, ±Inf, ±0, subnormals, all-zero blocks, the largest finite values,
// empty and single-element tensors, and a message declaring 2^40 elements. (-ffast-math, under
// which these outcomes could change, is refused at compile time: the refused_math_flags.* tests.)
#include <gradcomp/gradcomp.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <new>
#include <span>
#include <string>
#include <vector>

#include "support/errors.hpp"

// Largest single allocation since the last reset: decoders must not size anything from the
// message before checking it against the caller's cap.
namespace {
std::atomic<std::size_t> largest_allocation{0};
}  // namespace

void* operator new(std::size_t size) {
  std::size_t seen = largest_allocation.load();
  while (size > seen && !largest_allocation.compare_exchange_weak(seen, size)) {
  }
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
// The replacement operator new allocates with malloc, so free is the matching release; GCC's
// -Wmismatched-new-delete cannot see that.
#if defined(__GNUC__) && !defined(__clang__)
#  pragma GCC diagnostic push
#  pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#if defined(__GNUC__) && !defined(__clang__)
#  pragma GCC diagnostic pop
#endif

using namespace gradcomp;
using namespace gradcomp::test;

namespace {

// Bit-level classification, independent of the library's is_finite.
template <class T>
bool nonfinite_bits(T v) {
  if constexpr (sizeof(T) == 4) return (std::bit_cast<std::uint32_t>(v) & 0x7f800000u) == 0x7f800000u;
  else
    return (std::bit_cast<std::uint64_t>(v) & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
}
template <class T>
bool same_bits(T a, T b) {
  if constexpr (sizeof(T) == 4) return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
  else
    return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b);
}

enum class input {
  empty,
  single,
  all_zero,
  all_negative_zero,
  subnormals,
  largest_finite,
  all_nan,
  one_inf,
  one_negative_inf
};
const char* name(input i) {
  switch (i) {
    case input::empty: return "empty";
    case input::single: return "single";
    case input::all_zero: return "all_zero";
    case input::all_negative_zero: return "all_negative_zero";
    case input::subnormals: return "subnormals";
    case input::largest_finite: return "largest_finite";
    case input::all_nan: return "all_nan";
    case input::one_inf: return "one_inf";
    case input::one_negative_inf: return "one_negative_inf";
  }
  return "?";
}

template <class T>
std::vector<T> make(input kind) {
  constexpr std::size_t n = 64;
  switch (kind) {
    case input::empty: return {};
    case input::single: return {T{3.5}};
    case input::all_zero: return std::vector<T>(n, T{0});
    case input::all_negative_zero: return std::vector<T>(n, -T{0});
    case input::subnormals: {
      std::vector<T> x(n);
      for (std::size_t i = 0; i < n; ++i)
        x[i] = std::numeric_limits<T>::denorm_min() * static_cast<T>(i + 1) * (i % 2 == 0 ? T{1} : T{-1});
      return x;
    }
    case input::largest_finite: return std::vector<T>(n, std::numeric_limits<T>::max());
    case input::all_nan: return std::vector<T>(n, std::numeric_limits<T>::quiet_NaN());
    case input::one_inf:
    case input::one_negative_inf: {
      std::vector<T> x(n, T{1});
      x[5] = kind == input::one_inf ? std::numeric_limits<T>::infinity() : -std::numeric_limits<T>::infinity();
      return x;
    }
  }
  return {};
}

// What a codec does with an input: encode error, decode error, or a tensor whose every element
// is +0, -0 or an input value (times the codec's decode scale), never NaN or Inf. Scale 0 stands
// for a quantizer: finite values, exact +0 everywhere for an all-zero input.
enum class outcome { encode_rejected, decode_rejected, decoded };

struct result {
  outcome what = outcome::decoded;
  std::string error;
};

template <class Codec, class T>
result run(const Codec& codec, const std::vector<T>& x, double scale) {
  const cpu_executor cpu;
  std::vector<std::byte> message(codec.max_encoded_bytes(x.size()));
  std::vector<std::byte> ws(codec.workspace_bytes(cpu, x.size()));
  std::size_t bytes = 0;
  const std::string encode_error = thrown_by([&] { bytes = codec.encode(cpu, std::span<const T>(x), message, ws); });
  if (encode_error != "no exception") return {outcome::encode_rejected, encode_error};
  std::vector<T> out(x.size(), T{7});
  const std::string decode_error =
      thrown_by([&] { codec.decode(cpu, std::span<const std::byte>(message.data(), bytes), std::span<T>(out), ws); });
  if (decode_error != "no exception") {
    bool untouched = true;
    for (const T v : out) untouched = untouched && v == T{7};
    CHECK(untouched);
    return {outcome::decode_rejected, decode_error};
  }
  bool valid = true;
  bool all_zero = true;
  for (const T v : x) all_zero = all_zero && v == T{0};
  for (std::size_t i = 0; i < x.size(); ++i) {
    const T v = out[i];
    if (scale == 0.0) {  // a quantizer: any finite value, and exact +0 for an all-zero input
      valid = valid && !nonfinite_bits(v) && (!all_zero || same_bits(v, T{0}));
      continue;
    }
    const T expected = static_cast<T>(x[i] * static_cast<T>(scale));
    valid = valid && !nonfinite_bits(v) && (same_bits(v, T{0}) || same_bits(v, expected) || same_bits(v, -T{0}));
  }
  CHECK(valid);
  return {outcome::decoded, ""};
}

// One row of the matrix per (codec, input): the outcome the codec's documentation promises.
template <class T>
void check_matrix() {
  const topk_sparsifier<T> topk(sparsity{.density = 0.25});
  const threshold_sparsifier<T> threshold({.target = {.density = 0.25}});
  const randomk_sparsifier<T> randomk({.amount = {.density = 0.25}, .seed = 3});
  const randomk_sparsifier<T> randomk_raw({.amount = {.density = 0.25}, .seed = 3, .scaled = false});
  for (const input kind : {input::empty, input::single, input::all_zero, input::all_negative_zero, input::subnormals,
                           input::largest_finite, input::all_nan, input::one_inf, input::one_negative_inf}) {
    CAPTURE(std::string(name(kind)));
    const std::vector<T> x = make<T>(kind);
    const bool non_finite = kind == input::all_nan || kind == input::one_inf || kind == input::one_negative_inf;
    const outcome sparse_expected = non_finite ? outcome::encode_rejected : outcome::decoded;
    const result t = run(topk, x, 1.0);
    CHECK(t.what == sparse_expected);
    if (non_finite) CHECK(t.error == named(errc::non_finite_input));
    const result h = run(threshold, x, 1.0);
    CHECK(h.what == sparse_expected);
    if (non_finite) CHECK(h.error == named(errc::non_finite_input));

    // Uniform quantizers code every value: non-finite input is rejected at encode; everything else
    // decodes finitely (zero blocks to exact zeros, checked by run()).
    for (const int bits : {1, 4, 8}) {
      const result u = run(uniform_quantizer<T>({.bits = bits, .block = 16}), x, 0.0);
      CAPTURE(bits);
      CHECK(u.what == (non_finite ? outcome::encode_rejected : outcome::decoded));
      if (non_finite) CHECK(u.error == named(errc::non_finite_input));
    }

    const result composed =
        run(pipeline(topk_sparsifier<T>(sparsity{.density = 0.25}), uniform_quantizer<T>({.bits = 8})), x, 0.0);
    CHECK(composed.what == (non_finite ? outcome::encode_rejected : outcome::decoded));
    const result sign = run(sign_quantizer<T>({.block = 16}), x, 0.0);
    CHECK(sign.what == (non_finite ? outcome::encode_rejected : outcome::decoded));
    if (non_finite) CHECK(sign.error == named(errc::non_finite_input));
    // QSGD also rejects a bucket whose L2 norm overflows the value type (16 × the largest value).
    const result qsgd = run(qsgd_quantizer<T>({.levels = 7, .bucket = 16, .seed = 1}), x, 0.0);
    const bool norm_overflows = non_finite || kind == input::largest_finite;
    CHECK(qsgd.what == (norm_overflows ? outcome::encode_rejected : outcome::decoded));
    if (norm_overflows) CHECK(qsgd.error == named(errc::non_finite_input));

    // Random-k rejects a non-finite value only if it selects it; with 25% of 64 kept, all-NaN is
    // always selected. Scaled by n/k = 4, the largest finite values would overflow: the decoder
    // refuses to produce Inf. Unscaled, they pass through.
    const double scale = x.empty() ? 1.0 : static_cast<double>(x.size()) / static_cast<double>(randomk.k(x.size()));
    const result r = run(randomk, x, scale);
    const result raw = run(randomk_raw, x, 1.0);
    if (kind == input::all_nan) {
      CHECK(r.what == outcome::encode_rejected);
      CHECK(r.error == named(errc::non_finite_input));
    } else if (kind == input::largest_finite) {
      CHECK(r.what == outcome::decode_rejected);
      CHECK(r.error == named(errc::malformed_payload));
      CHECK(raw.what == outcome::decoded);
    } else if (!non_finite) {
      CHECK(r.what == outcome::decoded);
      CHECK(raw.what == outcome::decoded);
    } else {
      CHECK(r.what != outcome::decode_rejected);  // rejected at encode iff index 5 is selected
    }
  }
}

}  // namespace

TEST_CASE_TEMPLATE("special values: every codec meets its documented policy", T, float, double) { check_matrix<T>(); }

TEST_CASE("special values: a message declaring 2^40 elements is refused by the cap without a large allocation") {
  const topk_sparsifier<float> topk(sparsity{.k = 3});
  std::vector<std::byte> message(envelope::size + 8);
  write_envelope({codec_id::topk, value_dtype::float32, 1, 0, {}, std::uint64_t{1} << 40, 8, topk.params_hash(), 0},
                 message);
  std::vector<float> out(16);
  largest_allocation = 0;
  CHECK(thrown_by([&] {
          topk.decode(cpu_executor{}, message, std::span<float>(out), {}, {.max_elements = std::uint64_t{1} << 30});
        }) == named(errc::too_large));
  CHECK(largest_allocation.load() < 4096);
}
