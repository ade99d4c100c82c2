// Fuzz target: ZFP fixed-rate codec decode and decode_accumulate at rates 8, 3, 17 and 32 (bits 1
// and 2 of the mode byte) of float32 messages, and of bf16 and fp16 ones (bits 3-4: 1 and 2)
// decoded into their own type and into float32; decoded values may be ±Inf (a corrupted
// exponent), never NaN, and a 16-bit output is refused rather than given ±Inf.
#include "fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gradcomp;
  if (size == 0) return 0;
  fuzz::with_float_codec_dtype(data[0], [&](auto type) {
    constexpr std::uint32_t rates[] = {8, 3, 17, 32};
    const zfp_fixed_rate_codec<typename decltype(type)::type> codec({.rate_bits = rates[(data[0] >> 1) & 3u]});
    fuzz::decode_every_output(codec, fuzz::message_from(data, size, codec.params_hash()));
  });
  return 0;
}
