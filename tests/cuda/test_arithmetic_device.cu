// The device float arithmetic of this test binary is IEEE: division and square root correctly
// rounded, subnormal operands and results kept (not flushed to zero). Byte identity with the CPU
// rests on it (docs/cuda.md §4), and nvcc defines no macro for the flags that break it
// (--use_fast_math, -ftz=true, -prec-div=false, -prec-sqrt=false), so a kernel checks it here,
// against the host's double arithmetic rounded once to float: float's quotient, square root and
// product are exact or correctly rounded that way, since double carries more than 2·24 + 2 bits.
#include <gradcomp/core/float_bits.hpp>

#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "cuda/device_io.cuh"

using namespace gradcomp;
using namespace gradcomp::test;

namespace {

__global__ void float_arithmetic(const float* a, const float* b, float* quotient, float* root, float* product,
                                 std::uint64_t n) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::uint64_t{gridDim.x} * blockDim.x) {
    quotient[i] = a[i] / b[i];
    root[i] = sqrtf(a[i]);
    product[i] = a[i] * b[i];
  }
}

/// A positive float with a random mantissa and the exponent 2^e.
float random_float(std::mt19937& engine, int e) {
  const std::uint32_t mantissa = static_cast<std::uint32_t>(engine()) & 0x7FFFFFu;
  return from_bits<float>((static_cast<std::uint32_t>(e + 127) << 23) | mantissa);
}

}  // namespace

GRADCOMP_CUDA_TEST_CASE("device float division and square root are correctly rounded and subnormals are kept") {
  std::vector<float> a = {1.0f,      2.0f,      from_bits<float>(0x00000001u), from_bits<float>(0x00400000u),
                          0x1p-100f, 0x1.8p-70f};
  std::vector<float> b = {3.0f, 3.0f, 1.0f, 3.0f, 0x1p-30f, 0x1.4p-60f};  // products 2^-130 and 1.875·2^-130: subnormal
  std::mt19937 engine(2024);
  std::uniform_int_distribution<int> exponent(-60, 60);
  for (int i = 0; i < (1 << 16); ++i) {
    a.push_back(random_float(engine, exponent(engine)));
    b.push_back(random_float(engine, exponent(engine)));
  }
  const std::size_t n = a.size();
  const cuda_executor gpu = test_gpu();
  const device_array<float> da = to_device(gpu, a);
  const device_array<float> db = to_device(gpu, b);
  device_array<float> quotient = poisoned<float>(gpu, n);
  device_array<float> root = poisoned<float>(gpu, n);
  device_array<float> product = poisoned<float>(gpu, n);
  float_arithmetic<<<64, 256, 0, gpu.native_stream()>>>(da.data(), db.data(), quotient.data(), root.data(),
                                                        product.data(), n);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  const std::vector<float> q = to_host(gpu, quotient);
  const std::vector<float> r = to_host(gpu, root);
  const std::vector<float> p = to_host(gpu, product);

  CHECK(to_bits(q[0]) == 0x3EAAAAABu);  // 1/3, correctly rounded
  CHECK(p[4] != 0.0f);  // 2^-100 · 2^-30, a subnormal product, not flushed
  CHECK(r[2] != 0.0f);  // the square root of the smallest subnormal, 2^-74.5
  std::size_t wrong_quotients = 0, wrong_roots = 0, wrong_products = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const auto x = static_cast<double>(a[i]);
    const auto y = static_cast<double>(b[i]);
    wrong_quotients += to_bits(q[i]) != to_bits(static_cast<float>(x / y)) ? 1u : 0u;
    wrong_roots += to_bits(r[i]) != to_bits(static_cast<float>(std::sqrt(x))) ? 1u : 0u;
    wrong_products += to_bits(p[i]) != to_bits(static_cast<float>(x * y)) ? 1u : 0u;
  }
  CHECK(wrong_quotients == 0);  // -prec-div=false (and --use_fast_math) give approximate quotients
  CHECK(wrong_roots == 0);  // -prec-sqrt=false (and --use_fast_math) give approximate roots
  CHECK(wrong_products == 0);  // -ftz=true (and --use_fast_math) flush subnormal operands and results
}
