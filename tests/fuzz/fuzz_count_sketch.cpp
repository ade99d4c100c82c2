// Fuzz target: count-sketch decode, decode_accumulate, estimate, heavy_hitters, and summing a
// message into a copy of itself (3 rows of 64 float cells, or 2 rows of 5 double cells; bf16 and
// fp16 sketches of 3 rows of 64 float32 cells, decoded into their own type and into float32), for
// messages of at most fuzz::max_elements_dense_work elements; bits 1-2 of the first byte choose the
// codec.
#include "fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gradcomp;
  const count_sketch_params wide_params{.rows = 3, .columns = 64, .seed = 7, .heavy_hitters = {.k = 10}};
  const count_sketch<float> wide(wide_params);
  const count_sketch<double> narrow({.rows = 2, .columns = 5, .seed = 1, .heavy_hitters = {.density = 0.1}});
  const count_sketch<bf16> b16(wide_params);
  const count_sketch<fp16> h16(wide_params);
  const auto run = [&](const auto& codec) {
    using codec_type = std::decay_t<decltype(codec)>;
    using C = typename codec_type::cell_type;
    const std::vector<std::byte> message = fuzz::message_from(data, size, codec.params_hash());
    fuzz::decode_both(codec, message, fuzz::max_elements_dense_work);
    if constexpr (half_precision<typename codec_type::value_type>)
      fuzz::decode_both<float>(codec, message, fuzz::max_elements_dense_work);
    fuzz::accumulate_into_copy(codec, message);
    const cpu_executor cpu;
    const std::size_t n = fuzz::declared_elements(message, fuzz::max_elements_dense_work);
    std::vector<C> estimates(n);
    std::vector<std::uint64_t> indices(static_cast<std::size_t>(codec.heavy_hitter_count(n)));
    std::vector<std::byte> ws(codec.workspace_bytes(cpu, n));
    const decode_limits limits{.max_elements = fuzz::max_elements_dense_work};
    try {
      codec.estimate(cpu, message, std::span<C>(estimates), ws, limits);
      for (const C v : estimates)
        if (!is_finite(v)) __builtin_trap();
      const std::size_t found = codec.heavy_hitters(cpu, message, n, indices, ws, limits);
      for (std::size_t m = 0; m < found; ++m)
        if (indices[m] >= n || (m > 0 && indices[m] <= indices[m - 1])) __builtin_trap();
    } catch (const error&) {
    }
  };
  switch (size > 0 ? (data[0] >> 1) & 3u : 0u) {
    case 1: run(narrow); break;
    case 2: run(b16); break;
    case 3: run(h16); break;
    default: run(wide); break;
  }
  return 0;
}
