// Fuzz target: MPC lossless codec decode and decode_accumulate (dimensionality 1 and 3: bit 1 of
// the mode byte) of float32 messages, and of bf16 and fp16 ones (bits 3-4: 1 and 2) decoded into
// their own type and into float32.
#include "fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gradcomp;
  if (size == 0) return 0;
  fuzz::with_float_codec_dtype(data[0], [&](auto type) {
    const mpc_codec<typename decltype(type)::type> codec({.dim = (data[0] & 2u) != 0 ? 3u : 1u});
    fuzz::decode_every_output(codec, fuzz::message_from(data, size, codec.params_hash()));
  });
  return 0;
}
