// Built by nvcc against an installed gradcomp through find_package(... COMPONENTS cuda): a kernel
// draws Philox words with gradcomp::random_stream and the host checks them against its own draws.
// ctest only builds this program (CI machines may have no GPU); it is correct to run where one is.
#include <gradcomp/gradcomp.hpp>
#include <gradcomp/core/philox.hpp>

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

namespace {

__global__ void draw(gradcomp::random_stream stream, std::uint32_t* words, std::uint64_t n) {
  const std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x;
  if (i < n) words[i] = stream.word(i);
}

}  // namespace

int main() {
  constexpr std::uint64_t n = 1000;
  const gradcomp::random_stream stream{.seed = 7,
                                       .step = 3,
                                       .tensor_id = 1,
                                       .purpose = gradcomp::random_purpose::random_k};
  std::uint32_t* words = nullptr;
  if (cudaMalloc(&words, n * sizeof *words) != cudaSuccess) {
    std::fprintf(stderr, "no usable CUDA device\n");
    return 1;
  }
  draw<<<(n + 127) / 128, 128>>>(stream, words, n);
  std::vector<std::uint32_t> device_words(n);
  const bool copied = cudaDeviceSynchronize() == cudaSuccess &&
                      cudaMemcpy(device_words.data(), words, n * sizeof *words, cudaMemcpyDeviceToHost) == cudaSuccess;
  cudaFree(words);
  if (!copied) return 1;
  for (std::uint64_t i = 0; i < n; ++i) {
    if (device_words[i] != stream.word(i)) return 1;
  }
  return 0;
}
