#pragma once
// The fixed messages pinned by golden files in tests/golden/: inputs are closed-form so the
// decoded values are known without running any codec.
#include <gradcomp/gradcomp.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "support/codec_io.hpp"
#include "support/golden_io.hpp"

namespace gradcomp::test {

/// x_i = sin(0.37·i)·(1 + i mod 5), computed in double and rounded to T.
/// A 16-bit T: the value rounded to float32, then to T (round to nearest even both times).
template <class T>
std::vector<T> golden_input(std::size_t n) {
  std::vector<T> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double v = std::sin(0.37 * static_cast<double>(i)) * static_cast<double>(1 + i % 5);
    if constexpr (half_precision<T>) x[i] = narrow<T>(static_cast<float>(v));
    else
      x[i] = static_cast<T>(v);
  }
  return x;
}

/// golden_input with elements 32..47 zero and, when `negative_zeros`, every 7th value −0 (zero
/// blocks and signed zeros for the sign and QSGD files).
template <class T>
std::vector<T> golden_input_with_zeros(std::size_t n, bool negative_zeros) {
  std::vector<T> x = golden_input<T>(n);
  if (negative_zeros)
    for (std::size_t i = 0; i < n; i += 7) x[i] = -T{0};
  for (std::size_t i = 32; i < n && i < 48; ++i) x[i] = T{0};
  return x;
}

/// One pinned message: a file name, how to produce it on the CPU, and its element count.
struct golden_case {
  std::string file;
  std::function<std::vector<std::byte>()> encode;
  std::size_t elements;
};

/// Calls `f(file, codec, input, key)` for each pinned message of a single encode: the golden
/// file's name, the codec that wrote it (and decodes it), its closed-form input and its key.
template <class F>
void for_each_golden_codec(F&& f) {
  f("topk_f32_list32.bin", topk_sparsifier<float>(sparsity{.k = 10}), golden_input<float>(1000),
    message_key{.step = 1, .tensor_id = 2});
  f("topk_f64_bitmap.bin", topk_sparsifier<double>(sparsity{.k = 40}), golden_input<double>(64),
    message_key{.step = 5});
  f("topk_f32_checksum.bin", topk_sparsifier<float>(sparsity{.k = 5}, wire_options{.payload_checksum = true}),
    golden_input<float>(100), message_key{.step = 2});
  f("threshold_f32.bin", threshold_sparsifier<float>({.target = {.density = 0.02}, .seed = 1}),
    golden_input<float>(5000), message_key{.step = 3, .tensor_id = 4});
  f("uniform8_f32.bin", uniform_quantizer<float>({.bits = 8, .block = 32}), golden_input<float>(100),
    message_key{.step = 4});
  f("uniform8_sr_f32.bin",
    uniform_quantizer<float>({.bits = 8, .block = 64, .round = rounding::stochastic, .seed = 11}),
    golden_input<float>(300), message_key{.step = 8, .tensor_id = 5});
  f("uniform4_sr_f64.bin",
    uniform_quantizer<double>({.bits = 4, .block = 16, .round = rounding::stochastic, .seed = 9}),
    golden_input<double>(50), message_key{.step = 6, .tensor_id = 2});
  f("pipeline_topk_u8_f32.bin",
    pipeline(topk_sparsifier<float>(sparsity{.k = 30}), uniform_quantizer<float>({.bits = 8, .block = 16})),
    golden_input<float>(1000), message_key{.step = 2});
  f("sign_f32.bin", sign_quantizer<float>({.block = 32}), golden_input_with_zeros<float>(100, true),
    message_key{.step = 4, .tensor_id = 2});
  f("sign_f64.bin", sign_quantizer<double>({.block = 16}), golden_input_with_zeros<double>(50, true),
    message_key{.step = 6});
  f("qsgd_f32.bin", qsgd_quantizer<float>({.levels = 15, .bucket = 32, .seed = 3}),
    golden_input_with_zeros<float>(100, false), message_key{.step = 4, .tensor_id = 1});
  f("qsgd_f64.bin", qsgd_quantizer<double>({.levels = 3, .bucket = 16, .seed = 9}),
    golden_input_with_zeros<double>(50, false), message_key{.step = 6, .tensor_id = 2});
  f("randomk_f32.bin", randomk_sparsifier<float>({.amount = {.density = 0.05}, .seed = 42}), golden_input<float>(1000),
    message_key{.step = 7, .tensor_id = 1});
  f("shared_scale2_sr_f64.bin",
    shared_scale_quantizer<double>(
        {.bits = 2, .block = 16, .round = rounding::stochastic, .seed = 9, .headroom_bits = 0}),
    golden_input<double>(50), message_key{.step = 6, .tensor_id = 2});
  f("count_sketch_f32.bin", count_sketch<float>({.rows = 3, .columns = 64, .seed = 7, .heavy_hitters = {.k = 10}}),
    golden_input<float>(1000), message_key{.step = 5, .tensor_id = 3});
  f("mpc_f32.bin", mpc_codec<float>({.dim = 1}), golden_input<float>(1000), message_key{.step = 9, .tensor_id = 4});
  f("zfp_fixed_rate_r8_f32.bin", zfp_fixed_rate_codec<float>({.rate_bits = 8}), golden_input<float>(1000),
    message_key{.step = 9, .tensor_id = 5});
}

/// `for_each_golden_codec` for the messages of 16-bit gradients (docs/half-precision.md), which
/// the CPU backends and the reference write (the CUDA backend does not take 16-bit values yet).
template <class F>
void for_each_golden_half_codec(F&& f) {
  f("uniform8_bf16.bin", uniform_quantizer<bf16>({.bits = 8, .block = 32}), golden_input<bf16>(100),
    message_key{.step = 4, .tensor_id = 3});
  f("uniform4_sr_fp16.bin", uniform_quantizer<fp16>({.bits = 4, .block = 64, .round = rounding::stochastic, .seed = 5}),
    golden_input<fp16>(150), message_key{.step = 7, .tensor_id = 1});
  f("topk_bf16_list32.bin", topk_sparsifier<bf16>(sparsity{.k = 12}), golden_input<bf16>(1000),
    message_key{.step = 3, .tensor_id = 6});
  f("topk_fp16_bitmap.bin", topk_sparsifier<fp16>(sparsity{.k = 30}), golden_input<fp16>(64), message_key{.step = 8});
  f("sign_fp16.bin", sign_quantizer<fp16>({.block = 32}), golden_input<fp16>(100),
    message_key{.step = 5, .tensor_id = 2});
  f("qsgd_bf16.bin", qsgd_quantizer<bf16>({.levels = 15, .bucket = 32, .seed = 3}), golden_input<bf16>(100),
    message_key{.step = 4, .tensor_id = 1});
  f("threshold_bf16.bin", threshold_sparsifier<bf16>({.target = {.density = 0.02}, .seed = 1}),
    golden_input<bf16>(5000), message_key{.step = 3, .tensor_id = 4});
  f("randomk_fp16.bin", randomk_sparsifier<fp16>({.amount = {.density = 0.1}, .seed = 7}), golden_input<fp16>(300),
    message_key{.step = 5, .tensor_id = 3});
  f("pipeline_topk_u8_bf16.bin",
    pipeline(topk_sparsifier<bf16>(sparsity{.k = 30}), uniform_quantizer<bf16>({.bits = 8, .block = 16})),
    golden_input<bf16>(1000), message_key{.step = 2, .tensor_id = 4});
  f("shared_scale4_bf16.bin", shared_scale_quantizer<bf16>({.bits = 4, .block = 32, .headroom_bits = 2}),
    golden_input<bf16>(100), message_key{.step = 6, .tensor_id = 2});
  f("count_sketch_bf16.bin", count_sketch<bf16>({.rows = 3, .columns = 64, .seed = 7, .heavy_hitters = {.k = 10}}),
    golden_input<bf16>(1000), message_key{.step = 5, .tensor_id = 3});
  f("mpc_bf16.bin", mpc_codec<bf16>({.dim = 1}), golden_input<bf16>(1000), message_key{.step = 9, .tensor_id = 4});
  f("zfp_fixed_rate_r12_fp16.bin", zfp_fixed_rate_codec<fp16>({.rate_bits = 12}), golden_input<fp16>(1000),
    message_key{.step = 9, .tensor_id = 6});
}

/// The codec of the shared-scale sum's golden file (three ranks' messages summed).
inline shared_scale_quantizer<float> golden_shared_sum_codec() {
  return shared_scale_quantizer<float>({.bits = 8, .block = 32, .headroom_bits = 2});
}

/// Every pinned message, produced on the CPU: the single encodes, then the shared-scale sum (a
/// protocol of three ranks).
inline const std::vector<golden_case>& golden_cases() {
  static const std::vector<golden_case> cases = [] {
    std::vector<golden_case> all;
    const auto add = [&](const std::string& file, const auto& codec, const auto& x, message_key key) {
      all.push_back({file, [codec, x, key] { return encode_bytes(codec, x, key); }, x.size()});
    };
    for_each_golden_codec(add);
    for_each_golden_half_codec(add);
    all.push_back({"shared_scale8_sum3_f32.bin",
                   [] {
                     // Three ranks holding x, −x/2 and x/4, summed with accumulate_encoded.
                     const std::vector<float> x = golden_input<float>(100);
                     std::vector<std::vector<float>> ranks(3, x);
                     for (std::size_t i = 0; i < x.size(); ++i) {
                       ranks[1][i] = -0.5f * x[i];
                       ranks[2][i] = 0.25f * x[i];
                     }
                     const shared_scale_quantizer<float> q = golden_shared_sum_codec();
                     std::vector<std::vector<std::byte>> messages =
                         encode_shared_ranks(q, ranks, {.step = 4, .tensor_id = 1});
                     for (std::size_t r = 1; r < messages.size(); ++r)
                       q.accumulate_encoded(cpu_executor{}, messages[0], messages[r]);
                     return messages[0];
                   },
                   100});
    return all;
  }();
  return cases;
}

}  // namespace gradcomp::test
