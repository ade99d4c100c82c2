// Fuzz target: pipeline of top-k and an 8-bit uniform quantizer, decode and decode_accumulate
// (the sparse index section followed by a nested quantizer message).
#include "fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gradcomp;
  const pipeline codec(topk_sparsifier<float>(sparsity{.k = 30}), uniform_quantizer<float>({.bits = 8, .block = 16}));
  fuzz::decode_both(codec, fuzz::message_from(data, size, codec.params_hash()));
  return 0;
}
