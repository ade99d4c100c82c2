// Fuzz target: QSGD decode and decode_accumulate: 8-bit codes in float, 2-bit codes in double, and
// bf16 and fp16 messages (into their own type and into float32), chosen by bits 1-2 of the first
// byte.
#include "fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gradcomp;
  const qsgd_quantizer<float> f32({.levels = 15, .bucket = 32, .seed = 3});
  const qsgd_quantizer<double> f64({.levels = 1, .bucket = 16, .seed = 9});
  const qsgd_quantizer<bf16> b16({.levels = 7, .bucket = 32, .seed = 4});
  const qsgd_quantizer<fp16> h16({.levels = 15, .bucket = 16, .seed = 6});
  switch (size > 0 ? (data[0] >> 1) & 3u : 0u) {
    case 0: fuzz::decode_both(f32, fuzz::message_from(data, size, f32.params_hash())); break;
    case 1: fuzz::decode_both(f64, fuzz::message_from(data, size, f64.params_hash())); break;
    case 2: fuzz::decode_both_outputs(b16, fuzz::message_from(data, size, b16.params_hash())); break;
    default: fuzz::decode_both_outputs(h16, fuzz::message_from(data, size, h16.params_hash())); break;
  }
  return 0;
}
