// Writes the seed corpus of the fuzz targets from encoder output: make_seeds <corpus dir>.
// Each seed is a mode byte (see fuzz_target.hpp) followed by a valid message. Run it after a
// deliberate wire-format change and commit the result.
#include <gradcomp/gradcomp.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

namespace {

std::vector<float> input(std::size_t n) {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)) * (1.0 + static_cast<double>(i % 5)));
  return x;
}

template <class Codec, class T>
void write_seeds(const std::filesystem::path& dir, const std::string& stem, const Codec& codec, const std::vector<T>& x) {
  const gradcomp::cpu_executor cpu;
  std::vector<std::byte> message(codec.max_encoded_bytes(x.size()));
  std::vector<std::byte> ws(codec.workspace_bytes(cpu, x.size()));
  message.resize(codec.encode(cpu, std::span<const T>(x), message, ws, gradcomp::message_key{.step = 3, .tensor_id = 1}));
  std::filesystem::create_directories(dir);
  for (const std::uint8_t mode : {std::uint8_t{0}, std::uint8_t{1}, std::uint8_t{2}, std::uint8_t{3}}) {
    std::ofstream out(dir / (stem + "_mode" + std::to_string(mode) + ".bin"), std::ios::binary);
    out.put(static_cast<char>(mode));
    out.write(reinterpret_cast<const char*>(message.data()), static_cast<std::streamsize>(message.size()));
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace gradcomp;
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds <corpus dir>\n");
    return 2;
  }
  const std::filesystem::path root(argv[1]);
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{64}, std::size_t{1000}}) {
    const std::vector<float> x = input(n);
    std::vector<double> xd(x.begin(), x.end());
    const std::string size = std::to_string(n);
    write_seeds(root / "envelope", "topk_n" + size, topk_sparsifier<float>(sparsity{.k = 10}), x);
    write_seeds(root / "topk", "list_n" + size, topk_sparsifier<float>(sparsity{.k = 10}), x);
    write_seeds(root / "topk", "checksum_n" + size,
                topk_sparsifier<float>(sparsity{.k = 10}, wire_options{.payload_checksum = true}), x);
    write_seeds(root / "topk", "bitmap_f64_n" + size, topk_sparsifier<double>(sparsity{.k = 40}), xd);
    write_seeds(root / "threshold", "n" + size, threshold_sparsifier<float>({.target = {.density = 0.02}, .seed = 1}), x);
    write_seeds(root / "randomk", "n" + size, randomk_sparsifier<float>({.amount = {.density = 0.05}, .seed = 42}), x);
    write_seeds(root / "uniform", "u8_n" + size, uniform_quantizer<float>({.bits = 8, .block = 32}), x);
    write_seeds(root / "uniform", "u4_sr_f64_n" + size,
                uniform_quantizer<double>({.bits = 4, .block = 16, .round = rounding::stochastic, .seed = 9}), xd);
    write_seeds(root / "sign", "f32_n" + size, sign_quantizer<float>({.block = 32}), x);
    write_seeds(root / "sign", "f64_n" + size, sign_quantizer<double>({.block = 16}), xd);
    write_seeds(root / "qsgd", "f32_n" + size, qsgd_quantizer<float>({.levels = 15, .bucket = 32, .seed = 3}), x);
    write_seeds(root / "qsgd", "f64_n" + size, qsgd_quantizer<double>({.levels = 1, .bucket = 16, .seed = 9}), xd);
    write_seeds(root / "shared_scale", "f32_n" + size, shared_scale_quantizer<float>({.bits = 8, .block = 32, .headroom_bits = 2}), x);
    write_seeds(root / "shared_scale", "f64_n" + size,
                shared_scale_quantizer<double>({.bits = 2, .block = 16, .round = rounding::stochastic, .seed = 9, .headroom_bits = 0}),
                xd);
    write_seeds(root / "pipeline", "topk_u8_n" + size,
                pipeline(topk_sparsifier<float>(sparsity{.k = 30}), uniform_quantizer<float>({.bits = 8, .block = 16})), x);
    write_seeds(root / "envelope", "randomk_n" + size, randomk_sparsifier<float>({.amount = {.density = 0.05}, .seed = 42}), x);
  }
  return 0;
}
