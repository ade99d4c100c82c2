// Checking a kernel of your own against gradcomp's reference (docs/design.md §3.2).
//
// Two hand-written encoders of the uniform quantizer (8 bits, blocks of 256, round to nearest
// even), as a user porting it to an accelerator might write them: `half_to_even` follows
// docs/quantizers.md §2 (t = x · (L / m), rounded half to even); `half_away` rounds with
// std::lround, half away from zero, which agrees everywhere but on ties. The gradient is chosen to
// hold ties (values on a half-step grid, as gradients that went through a coarser format do), and
// `compare_encoding` accepts the first and, for the second, names the first differing byte, its
// field and the element involved.
//
//     build/release/examples/gradcomp_check_kernel
#include <gradcomp/gradcomp.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <vector>

namespace {

constexpr int levels = 127;           // L = 2^(8-1) - 1
constexpr std::uint32_t block = 256;  // values per scale

/// The user's encoder: scales, then one code per value, behind gradcomp's envelope.
/// `half_away` selects the variant that rounds half away from zero.
std::vector<std::byte> my_encode(const gradcomp::uniform_quantizer<float>& codec, std::span<const float> x,
                                 gradcomp::message_key key, bool half_away) {
  const std::size_t n = x.size(), blocks = (n + block - 1) / block;
  std::vector<std::byte> message(gradcomp::envelope::size + blocks * sizeof(float) + n);
  std::byte* const scales = message.data() + gradcomp::envelope::size;
  std::byte* const codes = scales + blocks * sizeof(float);
  for (std::size_t j = 0; j < blocks; ++j) {
    const std::size_t begin = j * block, end = std::min(n, begin + block);
    float m = 0.0f;
    for (std::size_t i = begin; i < end; ++i) m = std::max(m, std::fabs(x[i]));
    const float s = m / static_cast<float>(levels);
    std::memcpy(scales + j * sizeof(float), &s, sizeof s);  // little-endian host
    const float inverse = m > 0.0f ? static_cast<float>(levels) / m : 0.0f;
    for (std::size_t i = begin; i < end; ++i) {
      const float t = m == 0.0f ? 0.0f : x[i] * inverse;
      const long rounded = half_away ? std::lround(t) : std::lrint(t);  // lrint: the default mode, half to even
      const long q = std::clamp(rounded, -static_cast<long>(levels), static_cast<long>(levels));
      codes[i] = static_cast<std::byte>(q + levels);
    }
  }
  gradcomp::write_envelope({gradcomp::codec_id::uniform, gradcomp::value_dtype::float32, 0, 0, key, n,
                            message.size() - gradcomp::envelope::size, codec.params_hash(), 0},
                           message);
  return message;
}

}  // namespace

int main() {
  using namespace gradcomp;
  // Values k/2 for k in −254..254, and ±127 first in every block: m = 127, so t = x · 1 is x, ties included.
  std::vector<float> gradient(10'000);
  for (std::size_t i = 0; i < gradient.size(); ++i)
    gradient[i] = i % block == 0 ? 127.0f : static_cast<float>(static_cast<long>((i * 37) % 509) - 254) * 0.5f;

  const uniform_quantizer<float> codec(uniform_params{.bits = 8, .block = block});
  const message_key key{.step = 7, .tensor_id = 2};
  const std::span<const float> x(gradient);

  const encoding_comparison right = compare_encoding(codec, x, key, my_encode(codec, x, key, false));
  std::printf("half_to_even: %s\n", right.describe().c_str());
  const encoding_comparison wrong = compare_encoding(codec, x, key, my_encode(codec, x, key, true));
  std::printf("half_away:    %s\n", wrong.describe().c_str());

  // The decoder side: decode the reference-equal message with your decoder, then compare_decoding.
  const std::vector<std::byte> message = my_encode(codec, x, key, false);
  std::vector<float> decoded(gradient.size());
  std::vector<std::byte> workspace(codec.workspace_bytes(cpu_executor{}, gradient.size()));
  codec.decode(cpu_executor{}, message, std::span<float>(decoded), workspace);
  const decoding_comparison<float> decoding = compare_decoding(codec, message, std::span<const float>(decoded));
  std::printf("cpu decode:   %s\n", decoding.describe().c_str());

  const bool as_expected =
      right.same && !wrong.same && wrong.field.name.starts_with("code of element") && decoding.same;
  return as_expected ? 0 : 1;
}
