// Writes the seed corpus of the fuzz targets from encoder output: make_seeds <corpus dir>.
// Each seed is a mode byte (see fuzz_target.hpp) followed by a valid message. Run it after a
// deliberate wire-format change and commit the result.
#include <gradcomp/gradcomp.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <initializer_list>
#include <fstream>
#include <span>
#include <string>
#include <vector>

namespace {

std::vector<float> input(std::size_t n) {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i)
    x[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)) * (1.0 + static_cast<double>(i % 5)));
  return x;
}

template <class Codec, class T>
void write_seeds(const std::filesystem::path& dir, const std::string& stem, const Codec& codec, const std::vector<T>& x,
                 std::initializer_list<std::uint8_t> modes = {std::uint8_t{0}, std::uint8_t{1}, std::uint8_t{2},
                                                              std::uint8_t{3}}) {
  const gradcomp::cpu_executor cpu;
  std::vector<std::byte> message(codec.max_encoded_bytes(x.size()));
  std::vector<std::byte> ws(codec.workspace_bytes(cpu, x.size()));
  message.resize(
      codec.encode(cpu, std::span<const T>(x), message, ws, gradcomp::message_key{.step = 3, .tensor_id = 1}));
  std::filesystem::create_directories(dir);
  for (const std::uint8_t mode : modes) {
    std::ofstream out(dir / (stem + "_mode" + std::to_string(mode) + ".bin"), std::ios::binary);
    out.put(static_cast<char>(mode));
    out.write(reinterpret_cast<const char*>(message.data()), static_cast<std::streamsize>(message.size()));
  }
}

/// x rounded to the 16-bit type H.
template <class H>
std::vector<H> half_of(const std::vector<float>& x) {
  std::vector<H> h(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) h[i] = gradcomp::narrow<H>(x[i]);
  return h;
}

/// An LHC seed in fuzz_lhc.cpp's layout: the settings byte, n, the contributors, then the index
/// and the sketch of one rank's sparse gradient (every fourth value of `x` kept).
template <class T>
void write_lhc_seed(const std::filesystem::path& dir, const std::string& stem, std::uint8_t settings,
                    const gradcomp::lhc_params& params, const std::vector<T>& x, unsigned half = 0) {
  using C = typename gradcomp::lossless_homomorphic<T>::cell_type;
  const gradcomp::cpu_executor cpu;
  const gradcomp::lossless_homomorphic<T> lhc(params);
  std::vector<T> sparse(x.size(), T{0});
  for (std::size_t i = 0; i < x.size(); i += 4) sparse[i] = x[i];
  std::vector<std::byte> index(static_cast<std::size_t>(lhc.index_bytes(x.size())));
  lhc.encode_index(cpu, std::span<const T>(sparse), index);
  const gradcomp::lhc_plan plan = lhc.plan(cpu, index, x.size(), 1);
  std::vector<C> sketch(static_cast<std::size_t>(plan.sketch_values()));
  lhc.encode_sketch(cpu, std::span<const T>(sparse), index, plan, std::span<C>(sketch));
  std::filesystem::create_directories(dir);
  std::ofstream out(dir / (stem + ".bin"), std::ios::binary);
  const std::uint8_t head[4] = {settings, static_cast<std::uint8_t>(x.size() & 0xFF),
                                static_cast<std::uint8_t>((x.size() >> 8) | half << 4), 0};
  out.write(reinterpret_cast<const char*>(head), 4);
  out.write(reinterpret_cast<const char*>(index.data()), static_cast<std::streamsize>(index.size()));
  out.write(reinterpret_cast<const char*>(sketch.data()), static_cast<std::streamsize>(sketch.size() * sizeof(C)));
}

}  // namespace

int main(int argc, char** argv) {
  using namespace gradcomp;
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds <corpus dir>\n");
    return 2;
  }
  const std::filesystem::path root(argv[1]);
  // LHC seeds (fuzz_lhc.cpp's layout); block 8 << (settings >> 5).
  for (const std::size_t n : {std::size_t{0}, std::size_t{7}, std::size_t{300}, std::size_t{4000}}) {
    const std::vector<float> x = input(n);
    const std::vector<double> xd(x.begin(), x.end());
    const std::string size = std::to_string(n);
    write_lhc_seed(root / "lhc", "bitmap_b32_n" + size, std::uint8_t{0x03 | (2u << 5)}, lhc_params{.block = 32}, x);
    write_lhc_seed(root / "lhc", "sum4_b8_f64_n" + size, std::uint8_t{0x01 | 0x04},
                   lhc_params{.block = 8, .index = lhc_index_coding::sum4}, xd);
    write_lhc_seed(
        root / "lhc", "sum8_b64_median_n" + size, std::uint8_t{0x02 | 0x08 | (3u << 5)},
        lhc_params{.block = 64, .index = lhc_index_coding::sum8, .on_stall = lhc_stall_policy::median_estimate}, x);
    write_lhc_seed(root / "lhc", "reference_b16_n" + size, std::uint8_t{0x03 | 0x10 | (1u << 5)},
                   lhc_params{.block = 16, .reference_layout = true, .fixed_compress_ratio = 2}, x);
    write_lhc_seed(root / "lhc", "bitmap_b32_bf16_n" + size, std::uint8_t{0x03 | (2u << 5)}, lhc_params{.block = 32},
                   half_of<bf16>(x), 1);
    write_lhc_seed(root / "lhc", "sum8_b64_median_fp16_n" + size, std::uint8_t{0x02 | 0x08 | (3u << 5)},
                   lhc_params{.block = 64,
                              .index = lhc_index_coding::sum8,
                              .on_stall = lhc_stall_policy::median_estimate},
                   half_of<fp16>(x), 2);
  }
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{64}, std::size_t{1000}}) {
    const std::vector<float> x = input(n);
    std::vector<double> xd(x.begin(), x.end());
    const std::string size = std::to_string(n);
    write_seeds(root / "envelope", "topk_n" + size, topk_sparsifier<float>(sparsity{.k = 10}), x);
    write_seeds(root / "topk", "list_n" + size, topk_sparsifier<float>(sparsity{.k = 10}), x);
    write_seeds(root / "topk", "checksum_n" + size,
                topk_sparsifier<float>(sparsity{.k = 10}, wire_options{.payload_checksum = true}), x);
    write_seeds(root / "topk", "bitmap_f64_n" + size, topk_sparsifier<double>(sparsity{.k = 40}), xd);
    write_seeds(root / "topk", "list_bf16_n" + size, topk_sparsifier<bf16>(sparsity{.k = 10}), half_of<bf16>(x),
                {std::uint8_t{4}, std::uint8_t{5}});
    write_seeds(root / "topk", "bitmap_fp16_n" + size, topk_sparsifier<fp16>(sparsity{.k = 40}), half_of<fp16>(x),
                {std::uint8_t{6}, std::uint8_t{7}});
    write_seeds(root / "threshold", "n" + size, threshold_sparsifier<float>({.target = {.density = 0.02}, .seed = 1}),
                x);
    write_seeds(root / "threshold", "bf16_n" + size,
                threshold_sparsifier<bf16>({.target = {.density = 0.02}, .seed = 1}), half_of<bf16>(x),
                {std::uint8_t{4}, std::uint8_t{5}});
    write_seeds(root / "threshold", "fp16_n" + size,
                threshold_sparsifier<fp16>({.target = {.density = 0.05}, .seed = 2}), half_of<fp16>(x),
                {std::uint8_t{6}, std::uint8_t{7}});
    write_seeds(root / "randomk", "n" + size, randomk_sparsifier<float>({.amount = {.density = 0.05}, .seed = 42}), x);
    write_seeds(root / "randomk", "bf16_n" + size, randomk_sparsifier<bf16>({.amount = {.density = 0.05}, .seed = 42}),
                half_of<bf16>(x), {std::uint8_t{4}, std::uint8_t{5}});
    write_seeds(root / "randomk", "fp16_n" + size, randomk_sparsifier<fp16>({.amount = {.density = 0.05}, .seed = 42}),
                half_of<fp16>(x), {std::uint8_t{6}, std::uint8_t{7}});
    write_seeds(root / "uniform", "u8_n" + size, uniform_quantizer<float>({.bits = 8, .block = 32}), x);
    write_seeds(root / "uniform", "u4_sr_f64_n" + size,
                uniform_quantizer<double>({.bits = 4, .block = 16, .round = rounding::stochastic, .seed = 9}), xd);
    write_seeds(root / "uniform", "u8_bf16_n" + size, uniform_quantizer<bf16>({.bits = 8, .block = 32}),
                half_of<bf16>(x), {std::uint8_t{4}, std::uint8_t{5}});
    write_seeds(root / "uniform", "u4_sr_fp16_n" + size,
                uniform_quantizer<fp16>({.bits = 4, .block = 64, .round = rounding::stochastic, .seed = 5}),
                half_of<fp16>(x), {std::uint8_t{6}, std::uint8_t{7}});
    write_seeds(root / "sign", "f32_n" + size, sign_quantizer<float>({.block = 32}), x);
    write_seeds(root / "sign", "f64_n" + size, sign_quantizer<double>({.block = 16}), xd);
    write_seeds(root / "sign", "bf16_n" + size, sign_quantizer<bf16>({.block = 32}), half_of<bf16>(x),
                {std::uint8_t{4}, std::uint8_t{5}});
    write_seeds(root / "sign", "fp16_n" + size, sign_quantizer<fp16>({.block = 16}), half_of<fp16>(x),
                {std::uint8_t{6}, std::uint8_t{7}});
    write_seeds(root / "mpc", "d1_n" + size, mpc_codec<float>({.dim = 1}), x);
    write_seeds(root / "mpc", "d3_n" + size, mpc_codec<float>({.dim = 3}), x);
    write_seeds(root / "zfp_fixed_rate", "r8_n" + size, zfp_fixed_rate_codec<float>({.rate_bits = 8}), x);
    write_seeds(root / "zfp_fixed_rate", "r3_n" + size, zfp_fixed_rate_codec<float>({.rate_bits = 3}), x);
    write_seeds(root / "mpc", "d1_bf16_n" + size, mpc_codec<bf16>({.dim = 1}), half_of<bf16>(x),
                {std::uint8_t{8}, std::uint8_t{9}});
    write_seeds(root / "mpc", "d3_fp16_n" + size, mpc_codec<fp16>({.dim = 3}), half_of<fp16>(x),
                {std::uint8_t{18}, std::uint8_t{19}});
    write_seeds(root / "zfp_fixed_rate", "r8_bf16_n" + size, zfp_fixed_rate_codec<bf16>({.rate_bits = 8}),
                half_of<bf16>(x), {std::uint8_t{8}, std::uint8_t{9}});
    write_seeds(root / "zfp_fixed_rate", "r17_fp16_n" + size, zfp_fixed_rate_codec<fp16>({.rate_bits = 17}),
                half_of<fp16>(x), {std::uint8_t{20}, std::uint8_t{21}});
    write_seeds(root / "qsgd", "f32_n" + size, qsgd_quantizer<float>({.levels = 15, .bucket = 32, .seed = 3}), x);
    write_seeds(root / "qsgd", "f64_n" + size, qsgd_quantizer<double>({.levels = 1, .bucket = 16, .seed = 9}), xd);
    write_seeds(root / "qsgd", "bf16_n" + size, qsgd_quantizer<bf16>({.levels = 7, .bucket = 32, .seed = 4}),
                half_of<bf16>(x), {std::uint8_t{4}, std::uint8_t{5}});
    write_seeds(root / "qsgd", "fp16_n" + size, qsgd_quantizer<fp16>({.levels = 15, .bucket = 16, .seed = 6}),
                half_of<fp16>(x), {std::uint8_t{6}, std::uint8_t{7}});
    write_seeds(root / "shared_scale", "f32_n" + size,
                shared_scale_quantizer<float>({.bits = 8, .block = 32, .headroom_bits = 2}), x);
    write_seeds(root / "shared_scale", "f64_n" + size,
                shared_scale_quantizer<double>(
                    {.bits = 2, .block = 16, .round = rounding::stochastic, .seed = 9, .headroom_bits = 0}),
                xd);
    write_seeds(root / "shared_scale", "bf16_n" + size,
                shared_scale_quantizer<bf16>({.bits = 4, .block = 32, .headroom_bits = 2}), half_of<bf16>(x),
                {std::uint8_t{4}, std::uint8_t{5}});
    write_seeds(root / "shared_scale", "fp16_n" + size,
                shared_scale_quantizer<fp16>(
                    {.bits = 2, .block = 16, .round = rounding::stochastic, .seed = 5, .headroom_bits = 1}),
                half_of<fp16>(x), {std::uint8_t{6}, std::uint8_t{7}});
    write_seeds(root / "pipeline", "topk_u8_n" + size,
                pipeline(topk_sparsifier<float>(sparsity{.k = 30}), uniform_quantizer<float>({.bits = 8, .block = 16})),
                x);
    write_seeds(root / "pipeline", "topk_u8_bf16_n" + size,
                pipeline(topk_sparsifier<bf16>(sparsity{.k = 30}), uniform_quantizer<bf16>({.bits = 8, .block = 16})),
                half_of<bf16>(x), {std::uint8_t{4}, std::uint8_t{5}});
    write_seeds(root / "pipeline", "topk_u8_fp16_n" + size,
                pipeline(topk_sparsifier<fp16>(sparsity{.k = 30}), uniform_quantizer<fp16>({.bits = 8, .block = 16})),
                half_of<fp16>(x), {std::uint8_t{6}, std::uint8_t{7}});
    write_seeds(root / "count_sketch", "f32_n" + size,
                count_sketch<float>({.rows = 3, .columns = 64, .seed = 7, .heavy_hitters = {.k = 10}}), x);
    write_seeds(root / "count_sketch", "f64_n" + size,
                count_sketch<double>({.rows = 2, .columns = 5, .seed = 1, .heavy_hitters = {.density = 0.1}}), xd);
    write_seeds(root / "count_sketch", "bf16_n" + size,
                count_sketch<bf16>({.rows = 3, .columns = 64, .seed = 7, .heavy_hitters = {.k = 10}}), half_of<bf16>(x),
                {std::uint8_t{4}, std::uint8_t{5}});
    write_seeds(root / "count_sketch", "fp16_n" + size,
                count_sketch<fp16>({.rows = 3, .columns = 64, .seed = 7, .heavy_hitters = {.k = 10}}), half_of<fp16>(x),
                {std::uint8_t{6}, std::uint8_t{7}});
    write_seeds(root / "envelope", "randomk_n" + size,
                randomk_sparsifier<float>({.amount = {.density = 0.05}, .seed = 42}), x);
  }
  return 0;
}
