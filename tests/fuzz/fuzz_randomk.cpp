// Fuzz target: random-k decode, decode_accumulate, and summing a message into a copy of itself
// (float, and bf16 and fp16 into their own type and into float32); bits 1-2 of the first byte
// choose the decoder.
#include "fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gradcomp;
  const randomk_sparsifier<float> f32({.amount = {.density = 0.05}, .seed = 42});
  const randomk_sparsifier<bf16> b16({.amount = {.density = 0.05}, .seed = 42});
  const randomk_sparsifier<fp16> h16({.amount = {.density = 0.05}, .seed = 42});
  const auto both_types = [&](const auto& codec) {
    const std::vector<std::byte> m = fuzz::message_from(data, size, codec.params_hash());
    fuzz::decode_both_outputs(codec, m);
    fuzz::accumulate_into_copy(codec, m);
  };
  switch (size > 0 ? (data[0] >> 1) & 3u : 0u) {
    case 2: both_types(b16); break;
    case 3: both_types(h16); break;
    default: {
      const std::vector<std::byte> message = fuzz::message_from(data, size, f32.params_hash());
      fuzz::decode_both(f32, message);
      fuzz::accumulate_into_copy(f32, message);
      break;
    }
  }
  return 0;
}
