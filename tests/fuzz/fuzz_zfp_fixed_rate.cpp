// Fuzz target: ZFP fixed-rate codec decode and decode_accumulate at rates 8, 3, 17 and 32 (bits 1
// and 2 of the mode byte); decoded values may be ±Inf (a corrupted exponent), never NaN.
#include "fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gradcomp;
  static const zfp_fixed_rate_codec codecs[] = {zfp_fixed_rate_codec({.rate_bits = 8}),
                                                zfp_fixed_rate_codec({.rate_bits = 3}),
                                                zfp_fixed_rate_codec({.rate_bits = 17}),
                                                zfp_fixed_rate_codec({.rate_bits = 32})};
  const zfp_fixed_rate_codec& codec = codecs[size > 0 ? (data[0] >> 1) & 3u : 0];
  fuzz::decode_both(codec, fuzz::message_from(data, size, codec.params_hash()));
  return 0;
}
