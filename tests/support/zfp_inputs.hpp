#pragma once
// Seeded float inputs for the ZFP fixed-rate tests: the distributions the codec is checked on
// against its oracle here and against libzfp (tests/lossless/test_zfp_fixed_rate_libzfp.cpp).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace gradcomp::test {

/// Kinds of ZFP test input.
enum class zfp_input { normal, narrow, mixed, smooth, zeros, signed_zeros };

inline constexpr zfp_input all_zfp_inputs[] = {zfp_input::normal, zfp_input::narrow, zfp_input::mixed,
                                               zfp_input::smooth, zfp_input::zeros,  zfp_input::signed_zeros};

/// n values of the kind: N(0, 1); N(0, 10⁻³); N(0, 1) times 2^k with k uniform in [−40, 40] per
/// value (blocks of wildly mixed magnitudes, with many values far below their block's largest);
/// a sine sampled finely (neighbours alike); all +0; ±0 among values of one magnitude.
inline std::vector<float> zfp_test_input(zfp_input kind, std::size_t n, std::uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_int_distribution<int> exponent(-40, 40);
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    switch (kind) {
      case zfp_input::normal: x[i] = static_cast<float>(normal(engine)); break;
      case zfp_input::narrow: x[i] = static_cast<float>(1e-3 * normal(engine)); break;
      case zfp_input::mixed: x[i] = static_cast<float>(std::ldexp(normal(engine), exponent(engine))); break;
      case zfp_input::smooth:
        x[i] = static_cast<float>(std::sin(0.01 * static_cast<double>(i) + static_cast<double>(seed)));
        break;
      case zfp_input::zeros: x[i] = 0.0f; break;
      case zfp_input::signed_zeros: {
        const auto r = engine() % 3;
        x[i] = r == 0 ? 0.0f : (r == 1 ? -0.0f : 0.75f);
        break;
      }
    }
  }
  return x;
}

/// n values at both ends of the float range, alternating by block of 4: magnitudes below 2^−98
/// (where libzfp's float cast overflows; subnormals among them) and in [2^126, 2^127) (blocks
/// whose decoded values may reach ±Inf), random signs; all finite.
inline std::vector<float> zfp_extreme_input(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::uniform_real_distribution<double> mantissa(1.0, 2.0);
  std::uniform_int_distribution<int> tiny_exponent(-149, -99);
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double m = mantissa(engine);
    const int e = (i / 4) % 2 == 0 ? tiny_exponent(engine) : 126;
    const double sign = engine() % 2 == 0 ? 1.0 : -1.0;
    x[i] = static_cast<float>(sign * std::ldexp(m, e));
  }
  return x;
}

}  // namespace gradcomp::test
