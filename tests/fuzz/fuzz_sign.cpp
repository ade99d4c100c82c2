// Fuzz target: sign quantizer decode and decode_accumulate: float, double, and bf16 and fp16 (into
// their own type and into float32), chosen by bits 1-2 of the first byte.
#include "fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gradcomp;
  const sign_quantizer<float> f32({.block = 32});
  const sign_quantizer<double> f64({.block = 16});
  const sign_quantizer<bf16> b16({.block = 32});
  const sign_quantizer<fp16> h16({.block = 16});
  switch (size > 0 ? (data[0] >> 1) & 3u : 0u) {
    case 0: fuzz::decode_both(f32, fuzz::message_from(data, size, f32.params_hash())); break;
    case 1: fuzz::decode_both(f64, fuzz::message_from(data, size, f64.params_hash())); break;
    case 2: fuzz::decode_both_outputs(b16, fuzz::message_from(data, size, b16.params_hash())); break;
    default: fuzz::decode_both_outputs(h16, fuzz::message_from(data, size, h16.params_hash())); break;
  }
  return 0;
}
