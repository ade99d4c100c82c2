// The dynamic sparsifier (TAGC): the exact threshold against a full-sort oracle, the table mode
// against a literal transcription of the reference's bisection, error feedback keyed by tensor id
// (the bit-exact invariant, order independence), failed steps leaving the state bit-identical, and
// the saved state (its documented layout, bit-identical continuation, every load error).
#include <gradcomp/sparsify/dynamic.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <gradcomp/core/crc32c.hpp>
#include <gradcomp/core/wire_envelope.hpp>

#include "support/data.hpp"
#include "support/errors.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

namespace {

/// The reference's table, typed in again from the paper's code (not taken from the library).
constexpr double reference_table[] = {1e-20, 1e-15, 1e-10, 1e-8, 1e-7, 2e-7, 5e-7, 1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5,
                                      1e-4,  2e-4,  5e-4,  1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1,  0.2,  0.5};
constexpr std::size_t table_size = sizeof(reference_table) / sizeof(reference_table[0]);

/// z = floor(f*·n) with the product in double, at most n.
std::uint64_t zeroed_oracle(double f, std::size_t n) {
  return std::min<std::uint64_t>(n, static_cast<std::uint64_t>(std::floor(f * static_cast<double>(n))));
}

/// |a| in ascending order: a full sort.
template <class T>
std::vector<T> sorted_magnitudes(const std::vector<T>& a) {
  std::vector<T> magnitudes(a.size());
  std::transform(a.begin(), a.end(), magnitudes.begin(), [](T v) { return std::fabs(v); });
  std::sort(magnitudes.begin(), magnitudes.end());
  return magnitudes;
}

/// Exact rule: the z-th smallest |a| (0-based) of the sorted magnitudes, +Inf when z = n.
template <class T>
T exact_threshold_oracle(const std::vector<T>& sorted, double f) {
  const std::uint64_t z = zeroed_oracle(f, sorted.size());
  if (z == sorted.size()) return std::numeric_limits<T>::infinity();
  return sorted[static_cast<std::size_t>(z)];
}

/// Table rule, transcribed from tagc.py: frac(t) is the fraction of |a| < t with t a float32 (here
/// T) after rounding, as a Python float quotient; idx = bisect.bisect_left(T, f, key=frac);
/// τ* = T[idx − 1] for idx > 0, nothing dropped (0) for idx = 0.
template <class T>
T table_threshold_oracle(const std::vector<T>& a, double f) {
  if (a.empty()) return T{0};
  const auto frac = [&](double t) {
    const T tt = static_cast<T>(t);
    std::size_t below = 0;
    for (const T v : a) below += std::fabs(v) < tt ? 1u : 0u;
    return static_cast<double>(below) / static_cast<double>(a.size());
  };
  std::size_t lo = 0, hi = table_size;  // bisect_left(a, x, lo=0, hi=len(a), *, key)
  while (lo < hi) {
    const std::size_t mid = (lo + hi) / 2;
    if (frac(reference_table[mid]) < f) lo = mid + 1;
    else
      hi = mid;
  }
  // frac grows with t, so bisect_left agrees with a linear scan for the first frac ≥ f.
  std::size_t scan = 0;
  while (scan < table_size && frac(reference_table[scan]) < f) ++scan;
  CHECK(scan == lo);
  return lo == 0 ? T{0} : static_cast<T>(reference_table[lo - 1]);
}

/// The dense ã of the rule "keep |a| ≥ τ": a where kept, +0 (compared by value) elsewhere.
template <class T>
std::vector<T> kept_oracle(const std::vector<T>& a, T tau, std::uint64_t& kept) {
  std::vector<T> out(a.size(), T{0});
  kept = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::fabs(a[i]) >= tau) {
      out[i] = a[i];
      ++kept;
    }
  }
  return out;
}

/// One step with a workspace sized as the sparsifier asks.
template <class T>
dynamic_result<T> step(const dynamic_sparsifier<T>& sp, dynamic_state<T>& state, std::uint64_t id,
                       const std::vector<T>& grad, std::vector<T>& out) {
  const cpu_executor cpu;
  out.assign(grad.size(), T{7});
  std::vector<std::byte> ws(sp.workspace_bytes(cpu, grad.size()));
  return sp.sparsify(cpu, state, id, std::span<const T>(grad), std::span<T>(out), ws);
}

template <class T>
T threshold_of(const dynamic_sparsifier<T>& sp, const std::vector<T>& a) {
  const cpu_executor cpu;
  std::vector<std::byte> ws(sp.workspace_bytes(cpu, a.size()));
  return sp.threshold(cpu, std::span<const T>(a), ws);
}

/// Bit patterns of a vector (equal vectors of patterns distinguish −0 from +0).
template <class T>
std::vector<typename float_traits<T>::bits_type> bits(const std::vector<T>& v) {
  std::vector<typename float_traits<T>::bits_type> b(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) b[i] = to_bits(v[i]);
  return b;
}

/// The whole state as comparable bit patterns.
template <class T>
std::map<std::uint64_t, std::vector<typename float_traits<T>::bits_type>> bits(const dynamic_state<T>& s) {
  std::map<std::uint64_t, std::vector<typename float_traits<T>::bits_type>> b;
  for (const auto& [id, r] : s.residuals) b[id] = bits(r);
  b[~std::uint64_t{0}] = {static_cast<typename float_traits<T>::bits_type>(s.steps)};
  return b;
}

/// out + R_new == g + R_old, bit for bit, element by element.
template <class T>
bool invariant_holds(const std::vector<T>& g, const std::vector<T>& r_old, const std::vector<T>& out,
                     const std::vector<T>& r_new) {
  for (std::size_t i = 0; i < g.size(); ++i) {
    const T before = g[i] + r_old[i];
    const T after = out[i] + r_new[i];
    if (to_bits(before) != to_bits(after)) return false;
  }
  return true;
}

template <class T>
std::vector<T> scaled_normal(std::size_t n, std::uint64_t seed, T scale) {
  std::vector<T> x = make_input<T>(input_kind::normal, n, seed);
  for (T& v : x) v = v * scale;
  return x;
}

template <class T>
std::vector<std::byte> saved(const dynamic_sparsifier<T>& sp, const dynamic_state<T>& state) {
  std::vector<std::byte> bytes(sp.saved_state_bytes(state));
  CHECK(sp.save_state(cpu_executor{}, state, bytes) == bytes.size());
  return bytes;
}

std::uint64_t u64_at(const std::vector<std::byte>& b, std::size_t at) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < 8; ++i) v |= std::uint64_t{std::to_integer<std::uint8_t>(b[at + i])} << (8 * i);
  return v;
}

void put_u32(std::vector<std::byte>& b, std::size_t at, std::uint32_t v) {
  REQUIRE(at + 4 <= b.size());
  detail::store_le<std::uint32_t>(b.data() + at, v);
}

void put_u64(std::vector<std::byte>& b, std::size_t at, std::uint64_t v) {
  REQUIRE(at + 8 <= b.size());
  detail::store_le<std::uint64_t>(b.data() + at, v);
}

/// Recomputes both CRCs of a saved state after a deliberate edit (header CRC at 33, entries from 37).
void reseal_saved_state(std::vector<std::byte>& b) {
  put_u32(b, 33, crc32c(std::span<const std::byte>(b.data(), 33)));
  const std::size_t entries = b.size() - 37 - 4;
  put_u32(b, b.size() - 4, crc32c(std::span<const std::byte>(b.data() + 37, entries)));
}

}  // namespace

TEST_CASE_TEMPLATE("dynamic exact threshold is the floor of f times n smallest magnitude of a full sort", T, float,
                   double) {
  const std::size_t sizes[] = {0, 1, 7, 1000, (1u << 16) + 1, (1u << 20) + 3};
  const double fractions[] = {0.0, 0.1, 0.5, 0.8, 0.999, 1.0};
  for (const std::size_t n : sizes) {
    for (const input_kind kind : all_input_kinds) {
      if (n > 100000 && kind != input_kind::normal && kind != input_kind::ties) continue;
      const std::vector<T> x = make_input<T>(kind, n, 77 + n);
      const std::vector<T> sorted = sorted_magnitudes(x);
      for (const double f : fractions) {
        CAPTURE(n);
        CAPTURE(name(kind));
        CAPTURE(f);
        const dynamic_sparsifier<T> sp({.zero_fraction = f});
        const T tau = exact_threshold_oracle(sorted, f);
        CHECK(to_bits(threshold_of(sp, x)) == to_bits(tau));

        // A first step of a new id has R = 0, so a = x + 0.
        std::vector<T> a(x);
        for (T& v : a) v = v + T{0};
        dynamic_state<T> state = sp.make_state(cpu_executor{});
        std::vector<T> out;
        const dynamic_result<T> r = step(sp, state, 5, x, out);
        std::uint64_t kept = 0;
        const std::vector<T> expected = kept_oracle(a, tau, kept);
        CHECK(to_bits(r.threshold) == to_bits(tau));
        CHECK(r.kept == kept);
        CHECK(out == expected);
        CHECK(r.zero_fraction == (n == 0 ? 0.0 : static_cast<double>(n - kept) / static_cast<double>(n)));
        // Ties at τ* are kept, so no more than z elements are dropped.
        CHECK(n - kept <= zeroed_oracle(f, n));
        CHECK(invariant_holds(x, std::vector<T>(n, T{0}), out, state.residuals.at(5)));
      }
    }
  }
}

TEST_CASE_TEMPLATE("dynamic exact zero fraction equals floor of f times n over n without ties", T, float, double) {
  for (const std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{(1u << 16) + 1}}) {
    // Distinct magnitudes (i + 1)·10^-3 with mixed signs, shuffled.
    std::vector<T> x(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<T>(i + 1) * static_cast<T>(i % 3 == 0 ? -1e-3 : 1e-3);
    std::shuffle(x.begin(), x.end(), std::mt19937_64(5 + n));
    const std::vector<T> sorted = sorted_magnitudes(x);
    REQUIRE(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());  // no ties
    for (const double f : {0.0, 0.25, 0.7, 0.8, 0.95, 1.0}) {
      CAPTURE(n);
      CAPTURE(f);
      const dynamic_sparsifier<T> sp({.zero_fraction = f});
      dynamic_state<T> state;
      std::vector<T> out;
      const dynamic_result<T> r = step(sp, state, 0, x, out);
      const std::uint64_t z = zeroed_oracle(f, n);
      CHECK(sp.zeroed_count(n) == z);
      CHECK(r.kept == n - z);
      CHECK(r.zero_fraction == static_cast<double>(z) / static_cast<double>(n));
      CHECK(static_cast<std::uint64_t>(std::count(out.begin(), out.end(), T{0})) == z);
    }
  }
}

TEST_CASE_TEMPLATE("dynamic exact threshold stays exact when the sample misleads", T, float, double) {
  // The documented sample reads 64 values at the start of each 256th of a (n ≥ 2^16). Make those
  // values the smallest (or the largest) of the tensor, so the sampled window misses τ*.
  const std::size_t n = std::size_t{1} << 18;
  const std::size_t stride = n / 256;
  for (const bool sampled_small : {true, false}) {
    std::vector<T> x = make_input<T>(input_kind::normal, n, 31);
    for (std::size_t i = 0; i < n; ++i) {
      const bool in_sample = i % stride < 64;
      if (in_sample == sampled_small) x[i] = x[i] * static_cast<T>(1e-6);
      else
        x[i] = x[i] + static_cast<T>(x[i] < 0 ? -1 : 1);
    }
    const std::vector<T> sorted = sorted_magnitudes(x);
    for (const double f : {0.5, 0.8}) {
      CAPTURE(sampled_small);
      CAPTURE(f);
      const dynamic_sparsifier<T> sp({.zero_fraction = f});
      CHECK(to_bits(threshold_of(sp, x)) == to_bits(exact_threshold_oracle(sorted, f)));
    }
  }
}

TEST_CASE("dynamic zeroed count rounds the double product and caps at n") {
  CHECK(dynamic_sparsifier<float>({.zero_fraction = 0.7}).zeroed_count(10) == 7);
  CHECK(dynamic_sparsifier<float>({.zero_fraction = 0.8}).zeroed_count(5) == 4);
  CHECK(dynamic_sparsifier<float>({.zero_fraction = 0.8}).zeroed_count(7) == 5);
  CHECK(dynamic_sparsifier<float>({.zero_fraction = 1.0}).zeroed_count(~std::uint64_t{0}) == ~std::uint64_t{0});
  CHECK(dynamic_sparsifier<float>({.zero_fraction = 0.0}).zeroed_count(12345) == 0);
  CHECK(dynamic_sparsifier<float>({.zero_fraction = 0.5}).zeroed_count(0) == 0);
}

TEST_CASE_TEMPLATE("dynamic f star 0 keeps everything and 1 drops everything with signed zeros kept", T, float,
                   double) {
  const std::vector<T> x = {T{-0.0}, T{0.0}, T{3}, T{-2}, std::numeric_limits<T>::denorm_min(), static_cast<T>(-1e-3)};
  {
    const dynamic_sparsifier<T> keep_all({.zero_fraction = 0.0});
    dynamic_state<T> state;
    std::vector<T> out;
    const dynamic_result<T> r = step(keep_all, state, 1, x, out);
    CHECK(r.kept == x.size());
    CHECK(r.zero_fraction == 0.0);
    CHECK(r.threshold == T{0});
  }
  {
    const dynamic_sparsifier<T> drop_all({.zero_fraction = 1.0});
    dynamic_state<T> state;
    std::vector<T> out;
    const dynamic_result<T> r = step(drop_all, state, 1, x, out);
    CHECK(r.kept == 0);
    CHECK(r.zero_fraction == 1.0);
    CHECK(r.threshold == std::numeric_limits<T>::infinity());
    // Everything stays in the residual; out holds zeros of each element's sign.
    std::vector<T> a(x);
    for (T& v : a) v = v + T{0};
    CHECK(bits(state.residuals.at(1)) == bits(a));
    for (std::size_t i = 0; i < x.size(); ++i) {
      CHECK(out[i] == T{0});
      CHECK(std::signbit(out[i]) == std::signbit(a[i]));
    }
  }
}

TEST_CASE_TEMPLATE("dynamic handles empty tensors in both modes", T, float, double) {
  const std::vector<T> empty;
  for (const dynamic_threshold_mode mode : {dynamic_threshold_mode::exact, dynamic_threshold_mode::tagc_table}) {
    const dynamic_sparsifier<T> sp({.zero_fraction = 0.8, .mode = mode});
    dynamic_state<T> state;
    std::vector<T> out;
    const dynamic_result<T> r = step(sp, state, 9, empty, out);
    CHECK(r.kept == 0);
    CHECK(r.zero_fraction == 0.0);
    CHECK(r.threshold == (mode == dynamic_threshold_mode::exact ? std::numeric_limits<T>::infinity() : T{0}));
    CHECK(state.residuals.at(9).empty());
    CHECK(state.steps == 1);
  }
}

TEST_CASE_TEMPLATE("dynamic table mode reproduces the reference bisection", T, float, double) {
  const double scales[] = {1e-22, 1e-12, 1e-6, 1e-3, 1.0, 10.0};
  const double fractions[] = {0.0, 0.3, 0.8, 0.99, 1.0};
  for (const std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{(1u << 16) + 1}}) {
    for (const double scale : scales) {
      for (const input_kind kind : all_input_kinds) {
        if (n > 1000 && kind != input_kind::normal) continue;
        std::vector<T> x = make_input<T>(kind, n, 300 + n);
        for (T& v : x) v = static_cast<T>(v * static_cast<T>(scale));
        for (const double f : fractions) {
          CAPTURE(n);
          CAPTURE(scale);
          CAPTURE(name(kind));
          CAPTURE(f);
          const dynamic_sparsifier<T> sp({.zero_fraction = f, .mode = dynamic_threshold_mode::tagc_table});
          const T tau = table_threshold_oracle(x, f);
          CHECK(to_bits(threshold_of(sp, x)) == to_bits(tau));
          dynamic_state<T> state;
          std::vector<T> out;
          const dynamic_result<T> r = step(sp, state, 2, x, out);
          std::vector<T> a(x);
          for (T& v : a) v = v + T{0};
          std::uint64_t kept = 0;
          CHECK(out == kept_oracle(a, tau, kept));
          CHECK(r.kept == kept);
          CHECK(to_bits(r.threshold) == to_bits(tau));
        }
      }
    }
  }
}

TEST_CASE("dynamic table mode compares in float32 after rounding the table values") {
  // float(1e-4) lies below 1e-4: in float32 it is not below the threshold, in double it would be.
  const float t = static_cast<float>(1e-4);
  REQUIRE(static_cast<double>(t) < 1e-4);
  std::vector<float> x = {1e-9f, -1e-9f, 1e-9f, 1e-9f, t, -t, t, t, t, 1.0f};
  const dynamic_sparsifier<float> sp({.zero_fraction = 0.5, .mode = dynamic_threshold_mode::tagc_table});
  // frac(1e-4f) = 0.4 < 0.5 and frac(2e-4f) = 0.9: idx = 14, τ* = 1e-4f. A double comparison would
  // give frac(1e-4) = 0.9 and τ* = 5e-5.
  CHECK(threshold_of(sp, x) == t);
  dynamic_state<float> state;
  std::vector<float> out;
  const dynamic_result<float> r = step(sp, state, 0, x, out);
  CHECK(r.kept == 6);
  CHECK(r.zero_fraction == doctest::Approx(0.4));
  // Steps of the table: idx = 0 drops nothing, idx = 25 uses 0.5.
  CHECK(threshold_of(dynamic_sparsifier<float>({.zero_fraction = 0.8, .mode = dynamic_threshold_mode::tagc_table}),
                     std::vector<float>(10, 1e-30f)) == 0.0f);
  CHECK(threshold_of(dynamic_sparsifier<float>({.zero_fraction = 0.8, .mode = dynamic_threshold_mode::tagc_table}),
                     std::vector<float>(10, 3.0f)) == 0.5f);
}

TEST_CASE_TEMPLATE("dynamic error feedback keeps out plus new residual equal to gradient plus old residual bit for bit",
                   T, float, double) {
  for (const dynamic_threshold_mode mode : {dynamic_threshold_mode::exact, dynamic_threshold_mode::tagc_table}) {
    for (const input_kind kind : all_input_kinds) {
      CAPTURE(name(kind));
      const dynamic_sparsifier<T> sp({.zero_fraction = 0.8, .mode = mode});
      dynamic_state<T> state;
      const std::uint64_t ids[] = {11, 3, 7};
      const std::size_t sizes[] = {1000, 7, (1u << 16) + 1};
      for (std::uint64_t t = 0; t < 4; ++t) {
        for (std::size_t j = 0; j < 3; ++j) {
          const std::vector<T> g = make_input<T>(kind, sizes[j], 1000 * t + j);
          const std::vector<T> r_old =
              state.residuals.count(ids[j]) ? state.residuals.at(ids[j]) : std::vector<T>(sizes[j], T{0});
          std::vector<T> out;
          step(sp, state, ids[j], g, out);
          CHECK(invariant_holds(g, r_old, out, state.residuals.at(ids[j])));
        }
      }
      CHECK(state.steps == 12);
      CHECK(state.residuals.size() == 3);
    }
  }
}

TEST_CASE_TEMPLATE("dynamic residuals are keyed by tensor id so call order does not matter", T, float, double) {
  const dynamic_sparsifier<T> sp({.zero_fraction = 0.8});
  const std::uint64_t ids[] = {40, 2, 1000000007ull};
  const std::size_t sizes[] = {513, 64, 2048};
  const std::size_t order_a[] = {0, 1, 2}, order_b[] = {2, 0, 1};
  dynamic_state<T> a, b;
  for (std::uint64_t t = 0; t < 5; ++t) {
    std::map<std::uint64_t, std::vector<T>> out_a, out_b;
    // Order b also changes from step to step.
    const std::size_t rotate = static_cast<std::size_t>(t % 3);
    for (std::size_t k = 0; k < 3; ++k) {
      const std::size_t j = order_a[k];
      step(sp, a, ids[j], make_input<T>(input_kind::normal, sizes[j], 10 * t + j), out_a[ids[j]]);
    }
    for (std::size_t k = 0; k < 3; ++k) {
      const std::size_t j = order_b[(k + rotate) % 3];
      step(sp, b, ids[j], make_input<T>(input_kind::normal, sizes[j], 10 * t + j), out_b[ids[j]]);
    }
    for (const std::uint64_t id : ids) CHECK(bits(out_a[id]) == bits(out_b[id]));
  }
  CHECK(bits(a) == bits(b));
  // Later steps really use the residual: the state differs from one holding a single step.
  dynamic_state<T> once;
  std::vector<T> out;
  step(sp, once, ids[0], make_input<T>(input_kind::normal, sizes[0], 40), out);
  CHECK(bits(once.residuals.at(ids[0])) != bits(a.residuals.at(ids[0])));
}

TEST_CASE_TEMPLATE("dynamic rejects NaN and Inf and keeps the state bit-identical", T, float, double) {
  for (const dynamic_threshold_mode mode : {dynamic_threshold_mode::exact, dynamic_threshold_mode::tagc_table}) {
    const dynamic_sparsifier<T> sp({.zero_fraction = 0.8, .mode = mode});
    const cpu_executor cpu;
    const std::size_t n = 1000;
    dynamic_state<T> state;
    std::vector<T> out;
    for (std::uint64_t t = 0; t < 3; ++t) step(sp, state, 1, make_input<T>(input_kind::normal, n, t), out);
    const auto before = bits(state);
    std::vector<std::byte> ws(sp.workspace_bytes(cpu, n));
    const T specials[] = {std::numeric_limits<T>::quiet_NaN(), -std::numeric_limits<T>::quiet_NaN(),
                          std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity()};
    for (const T special : specials) {
      CAPTURE(special);
      std::vector<T> g = make_input<T>(input_kind::normal, n, 9);
      g[123] = special;
      std::vector<T> o(n);
      for (const std::uint64_t id : {std::uint64_t{1}, std::uint64_t{2}}) {  // known id, and a new one
        CHECK(thrown_by([&] { sp.sparsify(cpu, state, id, std::span<const T>(g), std::span<T>(o), ws); }) ==
              named(errc::non_finite_input));
        CHECK(bits(state) == before);
      }
      CHECK(thrown_by([&] { (void)sp.threshold(cpu, std::span<const T>(g), ws); }) == named(errc::non_finite_input));
    }
    // g + R overflowing is rejected the same way.
    state.residuals.at(1)[5] = std::numeric_limits<T>::max();
    const auto with_large = bits(state);
    std::vector<T> g = make_input<T>(input_kind::normal, n, 9);
    g[5] = std::numeric_limits<T>::max();
    std::vector<T> o(n);
    CHECK(thrown_by([&] { sp.sparsify(cpu, state, 1, std::span<const T>(g), std::span<T>(o), ws); }) ==
          named(errc::non_finite_input));
    CHECK(bits(state) == with_large);
  }
}

TEST_CASE_TEMPLATE("dynamic names size errors and a short workspace and keeps the state", T, float, double) {
  const dynamic_sparsifier<T> sp;
  const cpu_executor cpu;
  dynamic_state<T> state;
  std::vector<T> out;
  step(sp, state, 4, make_input<T>(input_kind::normal, 100, 1), out);
  const auto before = bits(state);
  const std::vector<T> g = make_input<T>(input_kind::normal, 101, 2);
  std::vector<T> o(101);
  std::vector<std::byte> ws(sp.workspace_bytes(cpu, 101));
  CHECK(thrown_by([&] { sp.sparsify(cpu, state, 4, std::span<const T>(g), std::span<T>(o), ws); }) ==
        named(errc::size_mismatch));
  std::vector<T> short_out(100);
  CHECK(thrown_by([&] { sp.sparsify(cpu, state, 5, std::span<const T>(g), std::span<T>(short_out), ws); }) ==
        named(errc::size_mismatch));
  std::vector<std::byte> small(sp.workspace_bytes(cpu, 101) / 2);
  CHECK(thrown_by([&] { sp.sparsify(cpu, state, 5, std::span<const T>(g), std::span<T>(o), small); }) ==
        named(errc::workspace_too_small));
  CHECK(bits(state) == before);
  // The same size under another id is a new tensor.
  CHECK(thrown_by([&] { sp.sparsify(cpu, state, 5, std::span<const T>(g), std::span<T>(o), ws); }) == "no exception");
  CHECK(state.residuals.at(5).size() == 101);
}

TEST_CASE_TEMPLATE("dynamic runs in place when out is the gradient", T, float, double) {
  const dynamic_sparsifier<T> sp;
  const cpu_executor cpu;
  dynamic_state<T> copy_state, in_place_state;
  for (std::uint64_t t = 0; t < 3; ++t) {
    const std::vector<T> g = make_input<T>(input_kind::normal, 4097, t);
    std::vector<T> out;
    const dynamic_result<T> r = step(sp, copy_state, 0, g, out);
    std::vector<T> buffer(g);
    std::vector<std::byte> ws(sp.workspace_bytes(cpu, g.size()));
    const dynamic_result<T> s =
        sp.sparsify(cpu, in_place_state, 0, std::span<const T>(buffer), std::span<T>(buffer), ws);
    CHECK(bits(buffer) == bits(out));
    CHECK(r.kept == s.kept);
  }
  CHECK(bits(copy_state) == bits(in_place_state));
}

TEST_CASE("dynamic parameters are validated") {
  const double bad[] = {-0.1, 1.0000001, std::numeric_limits<double>::quiet_NaN(),
                        std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()};
  for (const double f : bad) {
    CAPTURE(f);
    CHECK(thrown_by([&] { dynamic_sparsifier<float> sp({.zero_fraction = f}); }) == named(errc::invalid_argument));
    dynamic_sparsifier<float> sp;
    CHECK(thrown_by([&] { sp.set_params({.zero_fraction = f}); }) == named(errc::invalid_argument));
    CHECK(sp.params().zero_fraction == 0.8);
  }
  CHECK(thrown_by([] { dynamic_sparsifier<float> sp({.mode = static_cast<dynamic_threshold_mode>(2)}); }) ==
        named(errc::invalid_argument));
  CHECK(thrown_by([] { dynamic_sparsifier<double> sp({.zero_fraction = 0.0}); }) == "no exception");
  CHECK(thrown_by([] { dynamic_sparsifier<double> sp({.zero_fraction = 1.0}); }) == "no exception");
}

TEST_CASE_TEMPLATE("dynamic saved state follows the documented layout and continues bit-identically", T, float,
                   double) {
  const dynamic_sparsifier<T> sp({.zero_fraction = 0.8});
  const cpu_executor cpu;
  dynamic_state<T> state;
  const std::uint64_t ids[] = {9, 2, 500};
  const std::size_t sizes[] = {33, 1000, 0};
  std::vector<T> out;
  for (std::uint64_t t = 0; t < 3; ++t)
    for (std::size_t j = 0; j < 3; ++j)
      step(sp, state, ids[j], make_input<T>(input_kind::normal, sizes[j], t + j), out);

  const std::vector<std::byte> bytes = saved(sp, state);
  CHECK(bytes.size() == 37 + 3 * 16 + (33 + 1000) * sizeof(T) + 4);
  CHECK(std::memcmp(bytes.data(), "GCDS", 4) == 0);
  CHECK(std::to_integer<int>(bytes[4]) == 1);
  CHECK(std::to_integer<int>(bytes[6]) == 0);
  CHECK(std::to_integer<int>(bytes[8]) == (sizeof(T) == 4 ? 1 : 2));
  CHECK(u64_at(bytes, 9) == 1033);
  CHECK(u64_at(bytes, 17) == 3);
  CHECK(u64_at(bytes, 25) == 9);
  // Entries in ascending id order: 2 (1000 values), 9 (33 values), 500 (none).
  CHECK(u64_at(bytes, 37) == 2);
  CHECK(u64_at(bytes, 45) == 1000);
  T first = 0;
  std::memcpy(&first, bytes.data() + 53, sizeof(T));
  CHECK(to_bits(first) == to_bits(state.residuals.at(2)[0]));
  const std::size_t second = 53 + 1000 * sizeof(T);
  CHECK(u64_at(bytes, second) == 9);
  CHECK(u64_at(bytes, second + 8) == 33);
  CHECK(u64_at(bytes, second + 16 + 33 * sizeof(T)) == 500);

  dynamic_state<T> restored;
  restored.residuals[77] = {T{1}};  // replaced, not merged
  sp.load_state(cpu, bytes, restored);
  CHECK(bits(restored) == bits(state));
  for (std::uint64_t t = 3; t < 6; ++t) {
    for (std::size_t j = 0; j < 3; ++j) {
      const std::vector<T> g = make_input<T>(input_kind::normal, sizes[j], t + j);
      std::vector<T> out_a, out_b;
      const dynamic_result<T> ra = step(sp, state, ids[j], g, out_a);
      const dynamic_result<T> rb = step(sp, restored, ids[j], g, out_b);
      CHECK(bits(out_a) == bits(out_b));
      CHECK(to_bits(ra.threshold) == to_bits(rb.threshold));
    }
  }
  CHECK(bits(restored) == bits(state));
  // An empty state round-trips too.
  dynamic_state<T> empty;
  const std::vector<std::byte> empty_bytes = saved(sp, empty);
  CHECK(empty_bytes.size() == 41);
  sp.load_state(cpu, empty_bytes, restored);
  CHECK(restored.residuals.empty());
  CHECK(restored.steps == 0);
}

TEST_CASE("dynamic load state names every error and leaves the state unchanged") {
  const dynamic_sparsifier<float> sp;
  const cpu_executor cpu;
  dynamic_state<float> state;
  std::vector<float> out;
  step(sp, state, 3, make_input<float>(input_kind::normal, 10, 1), out);
  step(sp, state, 8, make_input<float>(input_kind::normal, 6, 2), out);
  const std::vector<std::byte> good = saved(sp, state);
  dynamic_state<float> target;
  step(sp, target, 1, make_input<float>(input_kind::normal, 4, 3), out);
  const auto before = bits(target);

  const auto fails = [&](std::vector<std::byte> bytes, errc expected) {
    CHECK(thrown_by([&] { sp.load_state(cpu, bytes, target); }) == named(expected));
    CHECK(bits(target) == before);
  };
  fails(std::vector<std::byte>(good.begin(), good.begin() + 36), errc::truncated);
  {
    auto b = good;
    b[0] = std::byte{'X'};
    fails(b, errc::bad_magic);
  }
  {
    auto b = good;
    b[4] = std::byte{2};
    fails(b, errc::unsupported_version);
  }
  {
    auto b = good;
    b[20] ^= std::byte{1};
    fails(b, errc::header_checksum);
  }
  {
    auto b = good;
    b[6] = std::byte{1};
    reseal_saved_state(b);
    fails(b, errc::codec_mismatch);
  }
  {
    std::vector<std::byte> b(dynamic_sparsifier<double>::saved_state_bytes(dynamic_state<double>{}));
    dynamic_sparsifier<double>().save_state(cpu, dynamic_state<double>{}, b);
    fails(b, errc::dtype_mismatch);
  }
  {
    auto b = good;
    put_u64(b, 17, ~std::uint64_t{0});  // more tensors than the bytes could hold
    reseal_saved_state(b);
    fails(b, errc::truncated);
  }
  fails(std::vector<std::byte>(good.begin(), good.end() - 1), errc::truncated);
  {
    auto b = good;
    b.push_back(std::byte{0});
    fails(b, errc::trailing_bytes);
  }
  {
    auto b = good;
    b[60] ^= std::byte{1};
    fails(b, errc::payload_checksum);
  }
  {
    auto b = good;  // ids 3 then 8: make the second 3
    put_u64(b, 37 + 16 + 10 * 4, 3);
    reseal_saved_state(b);
    fails(b, errc::malformed_payload);
  }
  {
    auto b = good;  // the first entry claims all 20 value slots, leaving no room for the second head
    put_u64(b, 45, 20);
    reseal_saved_state(b);
    fails(b, errc::malformed_payload);
  }
  {
    auto b = good;  // the first entry claims 21 values, more than the entries hold
    put_u64(b, 45, 21);
    reseal_saved_state(b);
    fails(b, errc::malformed_payload);
  }
  {
    dynamic_state<float> one;  // one tensor of 2 values whose entry claims 1: 4 bytes left over
    step(sp, one, 5, make_input<float>(input_kind::normal, 2, 4), out);
    auto b = saved(sp, one);
    put_u64(b, 45, 1);
    reseal_saved_state(b);
    fails(b, errc::malformed_payload);
  }
  std::vector<std::byte> small(good.size() - 1);
  CHECK(thrown_by([&] { sp.save_state(cpu, state, small); }) == named(errc::buffer_too_small));
}

TEST_CASE_TEMPLATE("dynamic: every cpu setting gives the reference's thresholds, outputs, residuals and saved bytes", T,
                   float, double) {
  // The reference (one nth_element over the keys) against the CPU's sampled window and radix
  // selection, over several steps of error feedback, in place on the CPU, both rules, sizes below
  // and above the sampled path (2^16), ties, signed zeros and subnormals.
  const reference_executor ref;
  std::vector<cpu_executor> cpus = {cpu_executor{.max_simd = cpu_simd::baseline}, cpu_executor{}};
  for (const dynamic_threshold_mode mode : {dynamic_threshold_mode::exact, dynamic_threshold_mode::tagc_table}) {
    for (const double f : {0.0, 0.5, 0.95, 1.0}) {
      for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{257}, std::size_t{70000}}) {
        for (const input_kind kind : all_input_kinds) {
          CAPTURE(static_cast<int>(mode));
          CAPTURE(f);
          CAPTURE(n);
          CAPTURE(std::string(name(kind)));
          const dynamic_sparsifier<T> sp({.zero_fraction = f, .mode = mode});
          auto expected_state = sp.make_state(ref);
          std::vector<dynamic_state<T>> states(cpus.size());
          std::vector<std::byte> ref_ws(sp.workspace_bytes(ref, n));
          for (std::uint64_t step = 0; step < 3; ++step) {
            const std::vector<T> g = make_input<T>(kind, n, 100 * step + n);
            std::vector<T> expected(n);
            const dynamic_result<T> want =
                sp.sparsify(ref, expected_state, 4, std::span<const T>(g), std::span<T>(expected), ref_ws);
            std::vector<std::byte> cpu_ws(sp.workspace_bytes(cpus[0], n));
            CHECK(to_bits(sp.threshold(ref, std::span<const T>(g), ref_ws)) ==
                  to_bits(sp.threshold(cpus[0], std::span<const T>(g), cpu_ws)));
            for (std::size_t c = 0; c < cpus.size(); ++c) {
              CAPTURE(c);
              std::vector<T> inplace = g;
              std::vector<std::byte> ws(sp.workspace_bytes(cpus[c], n));
              const dynamic_result<T> got =
                  sp.sparsify(cpus[c], states[c], 4, std::span<const T>(inplace), std::span<T>(inplace), ws);
              CHECK(to_bits(got.threshold) == to_bits(want.threshold));
              CHECK(got.kept == want.kept);
              CHECK(bitwise_equal(inplace, expected));
              CHECK(bitwise_equal(states[c].residuals[4], expected_state.residuals[4]));
            }
          }
          std::vector<std::byte> saved(sp.saved_state_bytes(expected_state)), cpu_saved(saved.size());
          REQUIRE(sp.save_state(ref, expected_state, saved) == saved.size());
          REQUIRE(sp.save_state(cpus[1], states[1], cpu_saved) == saved.size());
          CHECK(saved == cpu_saved);
        }
      }
    }
  }
}

TEST_CASE_TEMPLATE("dynamic: the reference rejects NaN and Inf as the cpu does, state untouched", T, float, double) {
  const reference_executor ref;
  for (const dynamic_threshold_mode mode : {dynamic_threshold_mode::exact, dynamic_threshold_mode::tagc_table}) {
    const dynamic_sparsifier<T> sp({.zero_fraction = 0.9, .mode = mode});
    std::vector<T> g = make_input<T>(input_kind::normal, 1000, 3);
    auto state = sp.make_state(ref);
    std::vector<T> out(g.size());
    std::vector<std::byte> ws(sp.workspace_bytes(ref, g.size()));
    (void)sp.sparsify(ref, state, 1, std::span<const T>(g), std::span<T>(out), ws);
    const std::vector<T> residual = state.residuals[1];
    g[500] = std::numeric_limits<T>::quiet_NaN();
    CHECK(thrown_by([&] { (void)sp.sparsify(ref, state, 1, std::span<const T>(g), std::span<T>(out), ws); }) ==
          named(errc::non_finite_input));
    CHECK(bitwise_equal(state.residuals[1], residual));
    CHECK(state.steps == 1);
  }
}
