// Fuzz target: threshold decode and decode_accumulate.
#include "fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gradcomp;
  const threshold_sparsifier<float> codec({.target = {.density = 0.02}, .seed = 1});
  fuzz::decode_both(codec, fuzz::message_from(data, size, codec.params_hash()));
  return 0;
}
