// Tensors of n = 2^31 + 5 elements on the GPU (8 GiB of float), one codec per family: uniform
// 8-bit (quantizer), random-k (sparsifier), error feedback around uniform 8-bit (feedback), ZFP at
// R = 8 (lossless family), the count sketch (sketch). Indices past 2^31 take every 64-bit path of
// the kernels (thread and block indices, offsets into the payload, the permutation's domain).
//
// Encoding 8 GiB on the CPU would take longer than the whole GPU check, so the comparisons are
// sampled where the format allows it cheaply, and exact everywhere else:
//   - uniform, EF and ZFP code each block on its own (round to nearest, no key-dependent draw), so
//     windows of blocks (at the start, near 2^30, just below 2^31, and the partial last block past
//     2^31) are encoded on the CPU as tensors of their own and must match the GPU message's bytes
//     for those blocks, and the GPU's decoding of the whole message must match their values; the
//     whole decoding must hold no poisoned value;
//   - random-k's payload is value j = g[π(j)]: every one of its k values is checked against the
//     permutation and the input computed on the host, and the decoding against them (k values,
//     the rest zero, nothing poisoned);
//   - the count sketch's input is zero but for 4096 exact values k·2^-8 at known indices, so every
//     cell is an exact sum the test's own hashing oracle gives bit for bit, and so is each
//     estimate at those indices.
// The input is computed on the device and on the host from one function of the index (Philox
// words turned into floats exactly). The cases need 9 to 27 GiB of free device memory and are
// skipped with a reason where the card has less; they are named "cuda: large: …" so that a run
// can take or leave them with a filter (docs/cuda.md §6).
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/random_permutation.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "cuda/device_io.cuh"
#include "support/sketch_oracle.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

namespace {

constexpr std::uint64_t large_n = (std::uint64_t{1} << 31) + 5;
constexpr std::size_t gib = std::size_t{1} << 30;

/// Input element i of seed `seed`: a Philox word's top 24 bits as a signed integer, times 2^-33,
/// times 2^(0 … 7) by the element's block of 256 (so block scales differ). Exact in float, and the
/// same on the host and the device under any flags.
__host__ __device__ inline float large_input(std::uint64_t i, std::uint64_t seed) {
  const std::uint32_t word = random_stream{seed, 0, 0, random_purpose::random_k}.word(i);
  const auto integer = static_cast<float>(static_cast<std::int32_t>(word >> 8) - (std::int32_t{1} << 23));
  return integer * 0x1p-33f * static_cast<float>(1u << ((i >> 8) & 7u));
}

__global__ void fill_large_input(float* x, std::uint64_t n, std::uint64_t seed) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::uint64_t{gridDim.x} * blockDim.x)
    x[i] = large_input(i, seed);
}

__global__ void scatter(float* x, const std::uint64_t* at, const float* values, std::uint64_t count) {
  for (std::uint64_t j = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; j < count;
       j += std::uint64_t{gridDim.x} * blockDim.x)
    x[at[j]] = values[j];
}

__global__ void gather(const float* x, const std::uint64_t* at, float* values, std::uint64_t count) {
  for (std::uint64_t j = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; j < count;
       j += std::uint64_t{gridDim.x} * blockDim.x)
    values[j] = x[at[j]];
}

/// counts[0] += elements whose bits are `pattern`, counts[1] += elements whose bits are not 0.
__global__ void count_bits(const std::uint32_t* x, std::uint64_t n, std::uint32_t pattern, unsigned long long* counts) {
  unsigned long long matching = 0, non_zero = 0;
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::uint64_t{gridDim.x} * blockDim.x) {
    matching += x[i] == pattern ? 1u : 0u;
    non_zero += x[i] != 0u ? 1u : 0u;
  }
  atomicAdd(&counts[0], matching);
  atomicAdd(&counts[1], non_zero);
}

constexpr unsigned helper_grid = 1024;
constexpr unsigned helper_threads = 256;

/// Whether the device has `bytes` free (and half a GiB to spare); skips the case with a reason
/// when it has not.
bool device_memory_allows(std::size_t bytes) {
  std::size_t free = 0, total = 0;
  GRADCOMP_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  if (free >= bytes + gib / 2) return true;
  skip_gpu_case("the device has " + std::to_string(free / gib) + " GiB free of " + std::to_string(total / gib) +
                " GiB; this case needs " + std::to_string(bytes / gib + 1) + " GiB");
  return false;
}

/// The input of seed `seed` on the device, n = large_n values.
device_array<float> large_device_input(const cuda_executor& gpu, std::uint64_t seed) {
  device_array<float> x(large_n, gpu);
  fill_large_input<<<helper_grid, helper_threads, 0, gpu.native_stream()>>>(x.data(), large_n, seed);
  GRADCOMP_CUDA_CHECK(cudaGetLastError());
  return x;
}

/// Elements [first, last) of the input of seed `seed`, computed on the host.
std::vector<float> host_input(std::uint64_t first, std::uint64_t last, std::uint64_t seed) {
  std::vector<float> x(last - first);
  for (std::uint64_t i = first; i < last; ++i) x[i - first] = large_input(i, seed);
  return x;
}

/// `count` values of type T from device address `at`, after `gpu`'s queued work.
template <class T>
std::vector<T> read_device(const cuda_executor& gpu, const T* at, std::size_t count) {
  std::vector<T> host(count);
  GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(host.data(), at, count * sizeof(T), cudaMemcpyDeviceToHost, gpu.native_stream()));
  gpu.synchronize();
  return host;
}

/// The elements of `values` whose bits are the poison's, and those that are not zero.
struct bit_census {
  unsigned long long poisoned;
  unsigned long long non_zero;
};

bit_census census(const cuda_executor& gpu, const device_array<float>& values) {
  device_array<unsigned long long> counts(2, gpu);
  count_bits<<<helper_grid, helper_threads, 0, gpu.native_stream()>>>(reinterpret_cast<const std::uint32_t*>(
                                                                          values.data()),
                                                                      values.size(), 0xA5A5A5A5u, counts.data());
  GRADCOMP_CUDA_CHECK(cudaGetLastError());
  const std::vector<unsigned long long> host = read_device(gpu, counts.data(), 2);
  return {host[0], host[1]};
}

/// Blocks [first, last) of the tensor.
struct block_window {
  std::uint64_t first;
  std::uint64_t last;
};

/// Elements [first, last) of a window of blocks of `block` values.
std::uint64_t first_element(const block_window& w, std::uint64_t block) { return w.first * block; }
std::uint64_t last_element(const block_window& w, std::uint64_t block) { return std::min(large_n, w.last * block); }

/// Windows of `per_window` blocks of `block` elements around the elements 0, 2^30 + 12345,
/// 2^31 − 2^16 and the last one (past 2^31, in the partial last block).
std::vector<block_window> windows(std::uint64_t block, std::uint64_t per_window = 64) {
  const std::uint64_t blocks = (large_n + block - 1) / block;
  std::vector<block_window> result;
  for (const std::uint64_t element :
       {std::uint64_t{0}, (std::uint64_t{1} << 30) + 12345, (std::uint64_t{1} << 31) - (1u << 16), large_n - 1}) {
    const std::uint64_t centre = element / block;
    const std::uint64_t first = centre >= per_window / 2 ? centre - per_window / 2 : 0;
    result.push_back({first, std::min(blocks, first + per_window)});
  }
  return result;
}

/// The GPU message's envelope describes large_n elements and `size` bytes, and otherwise says
/// what the CPU's message of a window says (codec, dtype, layout, flags, key, parameters).
void check_envelope(const std::vector<std::byte>& header, std::size_t size,
                    const std::vector<std::byte>& window_message) {
  const envelope big = parse_envelope_header(header, size);
  const envelope small = parse_envelope(window_message);
  CHECK(big.elements == large_n);
  CHECK(big.payload_bytes == size - envelope::size);
  CHECK(big.codec == small.codec);
  CHECK(big.dtype == small.dtype);
  CHECK(big.layout == small.layout);
  CHECK(big.flags == small.flags);
  CHECK(big.key == small.key);
  CHECK(big.params_hash == small.params_hash);
}

/// Bytes [offset, offset + count) of a device message.
std::vector<std::byte> message_bytes(const cuda_executor& gpu, const device_array<std::byte>& message,
                                     std::uint64_t offset, std::uint64_t count) {
  return read_device(gpu, message.data() + offset, count);
}

/// A byte range of a payload that a window of blocks owns: at `big` in the payload of the whole
/// tensor's message, at `small` in the payload of the window's own message.
struct payload_range {
  std::uint64_t big;
  std::uint64_t small;
  std::uint64_t bytes;
};

/// Uniform 8-bit with blocks of 256 (wire-format.md §9): the scales, then one code byte per element.
std::vector<payload_range> uniform8_ranges(const block_window& w) {
  const std::uint64_t blocks = (large_n + 255) / 256;
  const std::uint64_t scales = 4 * (w.last - w.first);
  return {{4 * w.first, 0, scales},
          {4 * blocks + first_element(w, 256), scales, last_element(w, 256) - first_element(w, 256)}};
}

/// ZFP at R = 8 (wire-format.md §18): block b is bits [32b, 32b + 32), payload bytes [4b, 4b + 4).
std::vector<payload_range> zfp8_ranges(const block_window& w) { return {{4 * w.first, 0, 4 * (w.last - w.first)}}; }

/// The GPU message of the whole tensor holds, in every range a window owns, the bytes of the CPU's
/// message of that window (which holds nothing else), and an envelope that agrees with it.
void check_window_payload(const cuda_executor& gpu, const device_array<std::byte>& message, std::size_t size,
                          const std::vector<payload_range>& ranges, const std::vector<std::byte>& window_message) {
  check_envelope(message_bytes(gpu, message, 0, envelope::size), size, window_message);
  std::uint64_t owned = 0;
  for (const payload_range& r : ranges) {
    CHECK(message_bytes(gpu, message, envelope::size + r.big, r.bytes) ==
          std::vector<std::byte>(window_message.begin() + static_cast<std::ptrdiff_t>(envelope::size + r.small),
                                 window_message.begin() +
                                     static_cast<std::ptrdiff_t>(envelope::size + r.small + r.bytes)));
    owned += r.bytes;
  }
  CHECK(window_message.size() == envelope::size + owned);
}

/// A codec that codes blocks of `block` values on their own, over the input of `seed`: the GPU's
/// message of the whole tensor holds the CPU's bytes of sampled windows (`ranges`), and the GPU's
/// decoding of it their CPU decodings, with no value left poisoned.
template <class Codec>
void check_block_local_codec(const Codec& codec, std::uint64_t block, std::uint64_t per_window, std::uint64_t seed,
                             message_key key, std::vector<payload_range> (*ranges)(const block_window&)) {
  const cuda_executor gpu = test_gpu();
  const std::size_t size = codec.max_encoded_bytes(large_n);
  const std::size_t ws_bytes = codec.workspace_bytes(gpu, large_n);
  if (!device_memory_allows(large_n * sizeof(float) + size + ws_bytes)) return;  // the input, then the decoding
  device_array<std::byte> message = poisoned<std::byte>(gpu, size);
  device_array<std::byte> ws = poisoned<std::byte>(gpu, ws_bytes);
  {
    const device_array<float> g = large_device_input(gpu, seed);
    CHECK(codec.encode(gpu, std::span<const float>(g.span()), message.span(), ws.span(), key) == size);
  }
  device_array<float> decoded = poisoned<float>(gpu, large_n);
  codec.decode(gpu, std::span<const std::byte>(message.span()), decoded.span(), ws.span());
  for (const block_window& w : windows(block, per_window)) {
    CAPTURE(w.first);
    const std::uint64_t first = first_element(w, block), last = last_element(w, block);
    const std::vector<float> x = host_input(first, last, seed);
    const std::vector<std::byte> cpu = encode_on(cpu_executor{}, codec, x, key);
    check_window_payload(gpu, message, size, ranges(w), cpu);
    CHECK(bit_patterns(read_device(gpu, decoded.data() + first, last - first)) ==
          bit_patterns(decode_on(cpu_executor{}, codec, cpu, poisoned_values<float>(x.size()))));
  }
  CHECK(census(gpu, decoded).poisoned == 0);
}

}  // namespace

GRADCOMP_CUDA_TEST_CASE(
    "large: uniform 8-bit over 2^31 + 5 elements gives the CPU's bytes and values on sampled blocks") {
  check_block_local_codec(uniform_quantizer<float>({.bits = 8}), 256, 64, 1, {.step = 3, .tensor_id = 1},
                          uniform8_ranges);
}

GRADCOMP_CUDA_TEST_CASE(
    "large: error feedback around uniform 8-bit over 2^31 + 5 elements steps as the CPU on sampled blocks") {
  const cuda_executor gpu = test_gpu();
  const error_feedback<uniform_quantizer<float>> ef(uniform_quantizer<float>({.bits = 8}));
  const std::size_t size = ef.max_encoded_bytes(large_n);
  const std::size_t ws_bytes = ef.workspace_bytes(gpu, large_n);
  if (!device_memory_allows(3 * large_n * sizeof(float) + size + ws_bytes)) return;
  auto state = ef.make_state(gpu, large_n);
  GRADCOMP_CUDA_CHECK(
      cudaMemsetAsync(state.next.data(), poison_byte, state.next.size() * sizeof(float), gpu.native_stream()));
  device_array<std::byte> message(size, gpu);
  device_array<std::byte> ws(ws_bytes, gpu);
  // The CPU steps each window on a state of its own: blocks are coded, and their residuals carried, independently.
  const std::vector<block_window> sampled = windows(256);
  std::vector<stepper<cpu_executor, error_feedback<uniform_quantizer<float>>>> cpu;
  for (const block_window& w : sampled)
    cpu.emplace_back(cpu_executor{}, ef, last_element(w, 256) - first_element(w, 256));
  for (std::uint64_t step = 0; step < 2; ++step) {
    CAPTURE(step);
    const message_key key{.step = step, .tensor_id = 2};
    GRADCOMP_CUDA_CHECK(cudaMemsetAsync(message.data(), poison_byte, size, gpu.native_stream()));
    GRADCOMP_CUDA_CHECK(cudaMemsetAsync(ws.data(), poison_byte, ws_bytes, gpu.native_stream()));
    {
      const device_array<float> g = large_device_input(gpu, 10 + step);
      CHECK(ef.encode(gpu, std::span<const float>(g.span()), state, message.span(), ws.span(), key) == size);
    }
    for (std::size_t k = 0; k < sampled.size(); ++k) {
      const block_window& w = sampled[k];
      CAPTURE(w.first);
      const std::uint64_t first = first_element(w, 256), last = last_element(w, 256);
      check_window_payload(gpu, message, size, uniform8_ranges(w),
                           cpu[k].step(host_input(first, last, 10 + step), key));
      CHECK(bit_patterns(read_device(gpu, state.residual.data() + first, last - first)) ==
            bit_patterns(cpu[k].carried_error()));
    }
  }
  CHECK(state.steps == 2);
}

GRADCOMP_CUDA_TEST_CASE("large: random-k over 2^31 + 5 elements sends g at the keyed permutation and decodes it") {
  const cuda_executor gpu = test_gpu();
  const randomk_sparsifier<float> rk({.amount = {.density = 0.001}, .seed = 77, .scaled = false});
  const std::uint64_t k = rk.k(large_n);
  const std::size_t size = rk.max_encoded_bytes(large_n);
  const std::size_t ws_bytes = rk.workspace_bytes(gpu, large_n);
  if (!device_memory_allows(large_n * sizeof(float) + size + ws_bytes + k * 12))
    return;  // the input, then the decoding
  const message_key key{.step = 5, .tensor_id = 3};
  device_array<std::byte> message = poisoned<std::byte>(gpu, size);
  device_array<std::byte> ws = poisoned<std::byte>(gpu, ws_bytes);
  {
    const device_array<float> g = large_device_input(gpu, 2);
    CHECK(rk.encode(gpu, std::span<const float>(g.span()), message.span(), ws.span(), key) == size);
  }
  // The oracle: value j is g[π(j)] (wire-format.md §5), π keyed by the seed, step and tensor id.
  const random_permutation pi(large_n, random_stream{77, key.step, key.tensor_id, random_purpose::random_k});
  std::vector<std::uint64_t> at(k);
  std::vector<float> expected(k);
  std::uint64_t near_2_31 = 0, non_zero = 0;  // about k/2^11 of the indices lie in the last 2^20 below 2^31
  for (std::uint64_t j = 0; j < k; ++j) {
    at[j] = pi(j);
    expected[j] = large_input(at[j], 2);
    near_2_31 += at[j] >= (std::uint64_t{1} << 31) - (1u << 20) ? 1u : 0u;
    non_zero += expected[j] != 0.0f ? 1u : 0u;
  }
  CHECK(near_2_31 > 0);
  const std::vector<std::byte> host_message = message_bytes(gpu, message, 0, size);
  check_envelope(std::vector<std::byte>(host_message.begin(), host_message.begin() + envelope::size), size,
                 encode_on(cpu_executor{}, rk, std::vector<float>(1000), key));  // a message of the same codec and key
  std::vector<float> values(k);
  std::memcpy(values.data(), host_message.data() + envelope::size, k * sizeof(float));
  CHECK(bit_patterns(values) == bit_patterns(expected));

  device_array<float> decoded = poisoned<float>(gpu, large_n);
  rk.decode(gpu, std::span<const std::byte>(message.span()), decoded.span(), ws.span());
  const device_array<std::uint64_t> device_at = to_device(gpu, at);
  device_array<float> gathered = poisoned<float>(gpu, k);
  gather<<<helper_grid, helper_threads, 0, gpu.native_stream()>>>(decoded.data(), device_at.data(), gathered.data(), k);
  GRADCOMP_CUDA_CHECK(cudaGetLastError());
  CHECK(bit_patterns(to_host(gpu, gathered)) == bit_patterns(expected));
  const bit_census seen = census(gpu, decoded);
  CHECK(seen.poisoned == 0);
  CHECK(seen.non_zero == non_zero);  // every other element is zero
}

GRADCOMP_CUDA_TEST_CASE(
    "large: ZFP at rate 8 over 2^31 + 5 elements gives the CPU's bytes and values on sampled blocks") {
  check_block_local_codec(zfp_fixed_rate_codec<float>({.rate_bits = 8}), 4, 1024, 3, {.step = 1, .tensor_id = 4},
                          zfp8_ranges);
}

GRADCOMP_CUDA_TEST_CASE("large: count sketch over 2^31 + 5 elements gives the oracle's cells and estimates") {
  const cuda_executor gpu = test_gpu();
  const count_sketch_params p{.rows = 3, .columns = 65536, .seed = (std::uint64_t{5} << 40) | 9};
  const count_sketch<float> cs(p);
  const std::size_t size = cs.max_encoded_bytes(large_n);
  const std::size_t ws_bytes = cs.workspace_bytes(gpu, large_n);
  if (!device_memory_allows(2 * large_n * sizeof(float) + size + ws_bytes)) return;
  // 4096 non-zero values k·2^-8 (every cell sum exact): the first and last 1024 indices and 2048
  // spread over the rest.
  std::vector<std::uint64_t> at;
  for (std::uint64_t i = 0; i < 1024; ++i) at.push_back(i);
  for (std::uint64_t i = 0; i < 2048; ++i) at.push_back(1024 + i * ((large_n - 2048) / 2048) + (i * 7919) % 1000);
  for (std::uint64_t i = large_n - 1024; i < large_n; ++i) at.push_back(i);
  std::vector<float> values(at.size());
  for (std::size_t j = 0; j < at.size(); ++j) {
    const std::uint32_t word = random_stream{4, 0, 0, random_purpose::random_k}.word(j);
    values[j] = static_cast<float>(word % 255 + 1) / 256.0f * ((word >> 31) != 0 ? -1.0f : 1.0f);
  }
  device_array<float> g(large_n, gpu);  // zeros, but for the values scattered in
  {
    const device_array<std::uint64_t> device_at = to_device(gpu, at);
    const device_array<float> device_values = to_device(gpu, values);
    scatter<<<helper_grid, helper_threads, 0, gpu.native_stream()>>>(g.data(), device_at.data(), device_values.data(),
                                                                     at.size());
    GRADCOMP_CUDA_CHECK(cudaGetLastError());
    gpu.synchronize();
  }
  const message_key key{.step = 2, .tensor_id = 5};
  device_array<std::byte> message = poisoned<std::byte>(gpu, size);
  device_array<std::byte> ws = poisoned<std::byte>(gpu, ws_bytes);
  CHECK(cs.encode(gpu, std::span<const float>(g.span()), message.span(), ws.span(), key) == size);

  // The oracle's cells: Σ σ_j(i)·x_i over the non-zero x_i at h_j(i) (sketches.md §1).
  std::vector<float> cells(p.rows * p.columns, 0.0f);
  const auto sign_of = [&](std::uint32_t row, std::uint64_t i) {
    return (oracle_hash(p.seed, row, i) >> 31) != 0 ? -1.0f : 1.0f;
  };
  const auto cell_of = [&](std::uint32_t row, std::uint64_t i) {
    return row * p.columns + oracle_bucket(oracle_hash(p.seed, row, i), p.columns);
  };
  for (std::size_t j = 0; j < at.size(); ++j)
    for (std::uint32_t row = 0; row < p.rows; ++row) cells[cell_of(row, at[j])] += sign_of(row, at[j]) * values[j];
  const std::vector<std::byte> host_message = message_bytes(gpu, message, 0, size);
  check_envelope(std::vector<std::byte>(host_message.begin(), host_message.begin() + envelope::size), size,
                 encode_on(cpu_executor{}, cs, std::vector<float>(1000), key));  // a message of the same codec and key
  CHECK(bit_patterns(cells_of<float>(host_message)) == bit_patterns(cells));

  // Estimates: the median of the three signed cells, at the non-zero indices and at their
  // neighbours (mostly zero).
  device_array<float> estimates = poisoned<float>(gpu, large_n);
  cs.estimate(gpu, std::span<const std::byte>(message.span()), estimates.span(), ws.span());
  std::vector<std::uint64_t> probes = at;
  for (const std::uint64_t i : at)
    if (i + 1 < large_n) probes.push_back(i + 1);
  std::vector<float> expected(probes.size());
  for (std::size_t j = 0; j < probes.size(); ++j) {
    float row[3];
    for (std::uint32_t r = 0; r < 3; ++r) row[r] = sign_of(r, probes[j]) * cells[cell_of(r, probes[j])];
    expected[j] = std::max(std::min(row[0], row[1]), std::min(std::max(row[0], row[1]), row[2]));
  }
  const device_array<std::uint64_t> device_probes = to_device(gpu, probes);
  device_array<float> gathered = poisoned<float>(gpu, probes.size());
  gather<<<helper_grid, helper_threads, 0, gpu.native_stream()>>>(estimates.data(), device_probes.data(),
                                                                  gathered.data(), probes.size());
  GRADCOMP_CUDA_CHECK(cudaGetLastError());
  CHECK(to_host(gpu, gathered) == expected);  // by value: the median of ±0 may be either zero
  CHECK(census(gpu, estimates).poisoned == 0);
}
