// Fuzz target: random-k decode, decode_accumulate, and summing a message into a copy of itself.
#include "fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gradcomp;
  const randomk_sparsifier<float> codec({.amount = {.density = 0.05}, .seed = 42});
  const std::vector<std::byte> message = fuzz::message_from(data, size, codec.params_hash());
  fuzz::decode_both(codec, message);
  fuzz::accumulate_into_copy(codec, message);
  return 0;
}
