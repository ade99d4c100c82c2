// Golden wire files: today's encoders must reproduce them byte for byte, and they must decode to
// values known from the closed-form inputs. Set GRADCOMP_UPDATE_GOLDEN=1 to rewrite the files
// after a deliberate format change (and say so in the commit).
#include <doctest/doctest.h>

#include <cmath>
#include <set>
#include <span>
#include <vector>

#include "support/data.hpp"
#include "support/golden_cases.hpp"
#include "support/oracles.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

TEST_CASE("encoders reproduce the golden wire files byte for byte") {
  for (const golden_case& c : golden_cases()) {
    CAPTURE(c.file);
    const std::vector<std::byte> bytes = c.encode();
    CHECK(golden_bytes(c.file, bytes) == bytes);
  }
}

TEST_CASE("golden top-k files decode to the largest magnitudes of the known input") {
  const std::vector<float> x32 = golden_input<float>(1000);
  CHECK(
      bitwise_equal(decode_values(topk_sparsifier<float>(sparsity{.k = 10}), read_golden("topk_f32_list32.bin"), 1000),
                    dense_at<float>(x32, topk_indices_oracle<float>(x32, 10))));
  const std::vector<double> x64 = golden_input<double>(64);
  CHECK(bitwise_equal(decode_values(topk_sparsifier<double>(sparsity{.k = 40}), read_golden("topk_f64_bitmap.bin"), 64),
                      dense_at<double>(x64, topk_indices_oracle<double>(x64, 40))));
  const std::vector<float> x100 = golden_input<float>(100);
  CHECK(bitwise_equal(decode_values(topk_sparsifier<float>(sparsity{.k = 5}, wire_options{.payload_checksum = true}),
                                    read_golden("topk_f32_checksum.bin"), 100, {.require_checksum = true}),
                      dense_at<float>(x100, topk_indices_oracle<float>(x100, 5))));
}

TEST_CASE("golden threshold and random-k files decode to entries of the known input") {
  const std::vector<float> x = golden_input<float>(5000);
  const std::vector<float> t = decode_values(threshold_sparsifier<float>({.target = {.density = 0.02}, .seed = 1}),
                                             read_golden("threshold_f32.bin"), 5000);
  std::size_t kept = 0;
  bool entries_of_x = true;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (t[i] != 0.0f) ++kept;
    entries_of_x = entries_of_x && (t[i] == 0.0f || t[i] == x[i]);
  }
  CHECK(entries_of_x);
  CHECK(kept >= 80);   // target 100 (2% of 5000)
  CHECK(kept <= 125);

  const std::vector<float> y = golden_input<float>(1000);
  const std::vector<float> r = decode_values(randomk_sparsifier<float>({.amount = {.density = 0.05}, .seed = 42}),
                                             read_golden("randomk_f32.bin"), 1000);
  std::size_t selected = 0;
  bool scaled_entries = true;
  for (std::size_t i = 0; i < y.size(); ++i) {
    if (r[i] == 0.0f) continue;
    ++selected;
    scaled_entries = scaled_entries && r[i] == y[i] * 20.0f;  // n/k = 1000/50
  }
  CHECK(scaled_entries);
  CHECK(selected == 50);
}

TEST_CASE("golden uniform files decode within half a step of the known input") {
  const std::vector<float> x = golden_input<float>(100);
  const std::vector<float> q8 =
      decode_values(uniform_quantizer<float>({.bits = 8, .block = 32}), read_golden("uniform8_f32.bin"), 100);
  const std::vector<double> y = golden_input<double>(50);
  const std::vector<double> q4 =
      decode_values(uniform_quantizer<double>({.bits = 4, .block = 16, .round = rounding::stochastic, .seed = 9}),
                    read_golden("uniform4_sr_f64.bin"), 50);
  // |x| ≤ 5, so the 8-bit step is at most 5/127 and RTN errs by half of it; stochastic rounding
  // errs by less than a whole 4-bit step of at most 5/7.
  bool close8 = true, close4 = true;
  for (std::size_t i = 0; i < x.size(); ++i)
    close8 = close8 && std::fabs(x[i] - q8[i]) <= 0.5f * 5.0f / 127.0f * 1.0001f;
  for (std::size_t i = 0; i < y.size(); ++i) close4 = close4 && std::fabs(y[i] - q4[i]) < 5.0 / 7.0;
  CHECK(close8);
  CHECK(close4);
}

TEST_CASE("golden 16-bit uniform files decode within a step of the known input, into float32 and 16 bits") {
  // |x| ≤ 5: the 8-bit RTN step is at most 5/127 (half of it is the error), the 4-bit stochastic
  // step at most 5/7 (the error is below a whole step); a 16-bit output adds its own rounding,
  // at most half an ulp of 8 (bf16: 2^-5; fp16: 2^-8).
  const std::vector<bf16> x = golden_input<bf16>(100);
  const uniform_quantizer<bf16> q8({.bits = 8, .block = 32});
  const std::vector<std::byte> m8 = read_golden("uniform8_bf16.bin");
  const std::vector<bf16> as_bf16 = decode_values(q8, m8, 100);
  std::vector<float> as_float(100);
  q8.decode(cpu_executor{}, m8, std::span<float>(as_float), {});
  bool close8 = true;
  for (std::size_t i = 0; i < x.size(); ++i) {
    close8 = close8 && std::fabs(widen(x[i]) - as_float[i]) <= 0.5f * 5.0f / 127.0f * 1.0001f;
    close8 = close8 && std::fabs(widen(x[i]) - widen(as_bf16[i])) <= 0.5f * 5.0f / 127.0f * 1.0001f + 0x1p-5f;
  }
  CHECK(close8);
  const std::vector<fp16> y = golden_input<fp16>(150);
  const std::vector<fp16> q4 =
      decode_values(uniform_quantizer<fp16>({.bits = 4, .block = 64, .round = rounding::stochastic, .seed = 5}),
                    read_golden("uniform4_sr_fp16.bin"), 150);
  bool close4 = true;
  for (std::size_t i = 0; i < y.size(); ++i)
    close4 = close4 && std::fabs(widen(y[i]) - widen(q4[i])) < 5.0f / 7.0f + 0x1p-8f;
  CHECK(close4);
}

TEST_CASE("golden 16-bit top-k files decode to the largest magnitudes of the known input, bit for bit") {
  const std::vector<bf16> x = golden_input<bf16>(1000);
  const std::vector<float> wx = widened(x);
  std::vector<float> got(1000);
  topk_sparsifier<bf16>(sparsity{.k = 12})
      .decode(cpu_executor{}, read_golden("topk_bf16_list32.bin"), std::span<float>(got), {});
  CHECK(bitwise_equal(got, dense_at<float>(wx, topk_indices_oracle<float>(wx, 12))));
  const std::vector<fp16> y = golden_input<fp16>(64);
  const std::vector<float> wy = widened(y);
  const std::vector<fp16> h =
      decode_values(topk_sparsifier<fp16>(sparsity{.k = 30}), read_golden("topk_fp16_bitmap.bin"), 64);
  CHECK(bitwise_equal(widened(h), dense_at<float>(wy, topk_indices_oracle<float>(wy, 30))));
}

TEST_CASE("golden shared-scale files decode within half a step per rank of the known sum") {
  // Three ranks hold x, −x/2 and x/4 (sum 0.75·x), |x| ≤ 5: the agreed step is at most 5/127 and
  // each rank's RTN errs by half of it. The single 2-bit stochastic message errs by less than a
  // whole step of at most 5.
  const std::vector<float> x = golden_input<float>(100);
  const std::vector<float> sum =
      decode_values(shared_scale_quantizer<float>({.bits = 8, .block = 32, .headroom_bits = 2}),
                    read_golden("shared_scale8_sum3_f32.bin"), 100);
  const std::vector<double> y = golden_input<double>(50);
  const std::vector<double> sr =
      decode_values(shared_scale_quantizer<double>(
                        {.bits = 2, .block = 16, .round = rounding::stochastic, .seed = 9, .headroom_bits = 0}),
                    read_golden("shared_scale2_sr_f64.bin"), 50);
  bool close_sum = true, close_sr = true;
  for (std::size_t i = 0; i < x.size(); ++i)
    close_sum = close_sum && std::fabs(0.75f * x[i] - sum[i]) <= 3.0f * 0.5f * 5.0f / 127.0f * 1.0001f;
  for (std::size_t i = 0; i < y.size(); ++i) close_sr = close_sr && std::fabs(y[i] - sr[i]) < 5.0;
  CHECK(close_sum);
  CHECK(close_sr);
}
