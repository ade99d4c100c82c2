// Fuzz target: threshold decode and decode_accumulate: float, and bf16 and fp16 (into their own type
// and into float32), chosen by bits 1-2 of the first byte (2: bf16, 3: fp16, else float).
#include "fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gradcomp;
  const threshold_sparsifier<float> f32({.target = {.density = 0.02}, .seed = 1});
  const threshold_sparsifier<bf16> b16({.target = {.density = 0.02}, .seed = 1});
  const threshold_sparsifier<fp16> h16({.target = {.density = 0.05}, .seed = 2});
  switch (size > 0 ? (data[0] >> 1) & 3u : 0u) {
    case 2: fuzz::decode_both_outputs(b16, fuzz::message_from(data, size, b16.params_hash())); break;
    case 3: fuzz::decode_both_outputs(h16, fuzz::message_from(data, size, h16.params_hash())); break;
    default: fuzz::decode_both(f32, fuzz::message_from(data, size, f32.params_hash())); break;
  }
  return 0;
}
