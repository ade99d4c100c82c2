// Fuzz target: lossless homomorphic compression's receiving side, fed an aggregated index and a
// summed sketch that the fuzzer chooses. Input layout (see lhc_fuzz_input below): a settings byte,
// n (the low 12 bits of a u16, whose bits 12-13 choose a 16-bit gradient type), the number of
// contributors, then the index bytes and then the sketch values, each taken from the remaining
// bytes (zero-padded when short). n stays below 2^12
// because plan and decode take time linear in n and in the cells whatever the input's size: up
// to 2^16 they ran under 100 inputs per second, while 2^12 still spans several blocks of every
// size the settings byte chooses (8 … 1024). `plan` must reject every index it cannot
// size; `decode` must reject or decode every sketch, never read or write out of bounds, and never
// write a non-finite value.
#include "fuzz_target.hpp"

#include <cstring>

namespace {

using namespace gradcomp;

/// The settings byte: bits 0-1 the index coding (3 = bitmap), bit 2 double values, bit 3 the
/// median-estimate stall policy, bit 4 the reference layout, bits 5-7 the block (8 << value). Bits
/// 4-5 of the third byte: 1 a bf16 codec, 2 an fp16 codec (float32 sketch values, decoded into the
/// 16-bit type and into float32), else float or double as bit 2 says.
struct lhc_fuzz_input {
  lhc_params params;
  bool wide = false;
  unsigned half = 0;
  std::uint64_t n = 0;
  std::uint64_t contributors = 1;
  const std::uint8_t* rest = nullptr;
  std::size_t rest_size = 0;
};

lhc_fuzz_input parse(const std::uint8_t* data, std::size_t size) {
  lhc_fuzz_input in;
  if (size < 4) return in;
  const std::uint8_t settings = data[0];
  const std::uint8_t coding = settings & 3u;
  in.params.index = coding == 1   ? lhc_index_coding::sum4
                    : coding == 2 ? lhc_index_coding::sum8
                                  : lhc_index_coding::bitmap;
  in.wide = (settings & 4u) != 0;
  in.params.on_stall = (settings & 8u) != 0 ? lhc_stall_policy::median_estimate : lhc_stall_policy::report;
  in.params.reference_layout = (settings & 16u) != 0;
  if (in.params.reference_layout) in.params.fixed_compress_ratio = 2;
  in.params.block = 8u << (settings >> 5);
  in.n = std::uint64_t{data[1]} | (std::uint64_t{data[2] & 0x0fu} << 8);
  in.half = (data[2] >> 4) & 3u;
  in.contributors = 1 + data[3] % 32;
  in.rest = data + 4;
  in.rest_size = size - 4;
  return in;
}

/// `count` bytes from the input starting at `*offset` (zero past its end); advances the offset.
std::vector<std::byte> take(const lhc_fuzz_input& in, std::size_t count, std::size_t* offset) {
  std::vector<std::byte> bytes(count, std::byte{0});
  for (std::size_t i = 0; i < count && *offset + i < in.rest_size; ++i)
    bytes[i] = static_cast<std::byte>(in.rest[*offset + i]);
  *offset += count;
  return bytes;
}

/// Decodes into `out` (filled with 7s): on success every value is finite and the counts add up; on
/// a named error `out` is untouched.
template <class T, class O>
void decode_into(const lossless_homomorphic<T>& lhc, const std::vector<std::byte>& index, const lhc_plan& plan,
                 std::span<const typename lossless_homomorphic<T>::cell_type> sketch, std::vector<std::byte>& ws,
                 std::size_t n) {
  const O seven = [] {
    if constexpr (half_precision<O>) return narrow<O>(7.0f);
    else
      return O{7};
  }();
  std::vector<O> out(n, seven);
  try {
    const lhc_decode_result r = lhc.decode(cpu_executor{}, index, plan, sketch, std::span<O>(out), ws);
    if (r.recovered + r.unrecovered != plan.union_nonzeros) __builtin_trap();
    for (const O v : out)
      if (!is_finite(v)) __builtin_trap();
  } catch (const error&) {
    for (const O v : out)
      if (to_bits(v) != to_bits(seven)) __builtin_trap();  // a failed decode leaves `out` untouched
  }
}

template <class T>
void run(const lhc_fuzz_input& in) {
  using C = typename lossless_homomorphic<T>::cell_type;
  const cpu_executor cpu;
  const lossless_homomorphic<T> lhc(in.params);
  std::size_t offset = 0;
  const std::vector<std::byte> index = take(in, static_cast<std::size_t>(lhc.index_bytes(in.n)), &offset);
  lhc_plan plan{};
  try {
    plan = lhc.plan(cpu, index, in.n, in.contributors);
  } catch (const error&) {
    return;
  }
  if (plan.union_nonzeros > in.n || plan.sketch_values() > (std::uint64_t{1} << 24)) __builtin_trap();
  const std::vector<std::byte> raw = take(in, static_cast<std::size_t>(plan.sketch_values()) * sizeof(C), &offset);
  std::vector<C> sketch(static_cast<std::size_t>(plan.sketch_values()));
  if (!raw.empty()) std::memcpy(sketch.data(), raw.data(), raw.size());
  std::vector<std::byte> ws(lhc.workspace_bytes(cpu, plan));
  const auto n = static_cast<std::size_t>(in.n);
  decode_into<T, T>(lhc, index, plan, sketch, ws, n);
  if constexpr (half_precision<T>) decode_into<T, C>(lhc, index, plan, sketch, ws, n);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const lhc_fuzz_input in = parse(data, size);
  if (in.rest == nullptr) return 0;
  if (in.half == 1) run<bf16>(in);
  else if (in.half == 2)
    run<fp16>(in);
  else if (in.wide)
    run<double>(in);
  else
    run<float>(in);
  return 0;
}
