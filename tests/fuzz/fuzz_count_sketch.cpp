// Fuzz target: count-sketch decode, decode_accumulate, estimate, heavy_hitters, and summing a
// message into a copy of itself (3 rows of 64 float cells, or 2 rows of 5 double cells), for
// messages of at most fuzz::max_elements_dense_work elements.
#include "fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gradcomp;
  const count_sketch<float> wide({.rows = 3, .columns = 64, .seed = 7, .heavy_hitters = {.k = 10}});
  const count_sketch<double> narrow({.rows = 2, .columns = 5, .seed = 1, .heavy_hitters = {.density = 0.1}});
  const auto run = [&](const auto& codec) {
    using T = typename std::decay_t<decltype(codec)>::value_type;
    const std::vector<std::byte> message = fuzz::message_from(data, size, codec.params_hash());
    fuzz::decode_both(codec, message, fuzz::max_elements_dense_work);
    fuzz::accumulate_into_copy(codec, message);
    const cpu_executor cpu;
    const std::size_t n = fuzz::declared_elements(message, fuzz::max_elements_dense_work);
    std::vector<T> estimates(n);
    std::vector<std::uint64_t> indices(static_cast<std::size_t>(codec.heavy_hitter_count(n)));
    std::vector<std::byte> ws(codec.workspace_bytes(cpu, n));
    const decode_limits limits{.max_elements = fuzz::max_elements_dense_work};
    try {
      codec.estimate(cpu, message, std::span<T>(estimates), ws, limits);
      for (const T v : estimates)
        if (!is_finite(v)) __builtin_trap();
      const std::size_t found = codec.heavy_hitters(cpu, message, n, indices, ws, limits);
      for (std::size_t m = 0; m < found; ++m)
        if (indices[m] >= n || (m > 0 && indices[m] <= indices[m - 1])) __builtin_trap();
    } catch (const error&) {
    }
  };
  if (size > 0 && (data[0] & 2u) != 0) run(narrow);
  else
    run(wide);
  return 0;
}
