// Fuzz target: pipeline of top-k and an 8-bit uniform quantizer, decode and decode_accumulate (the
// sparse index section followed by a nested quantizer message): float, and bf16 and fp16 (into
// their own type and into float32), chosen by bits 1-2 of the first byte (2: bf16, 3: fp16, else
// float).
#include "fuzz_target.hpp"

namespace {

template <class T>
auto topk_then_u8() {
  using namespace gradcomp;
  return pipeline(topk_sparsifier<T>(sparsity{.k = 30}), uniform_quantizer<T>({.bits = 8, .block = 16}));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gradcomp;
  const auto f32 = topk_then_u8<float>();
  const auto b16 = topk_then_u8<bf16>();
  const auto h16 = topk_then_u8<fp16>();
  switch (size > 0 ? (data[0] >> 1) & 3u : 0u) {
    case 2: fuzz::decode_both_outputs(b16, fuzz::message_from(data, size, b16.params_hash())); break;
    case 3: fuzz::decode_both_outputs(h16, fuzz::message_from(data, size, h16.params_hash())); break;
    default: fuzz::decode_both(f32, fuzz::message_from(data, size, f32.params_hash())); break;
  }
  return 0;
}
