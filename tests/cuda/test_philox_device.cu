// Philox4x32-10 and the random permutation compiled by nvcc: the host half checks the published
// known-answer vectors through the same header; the device half checks that kernels draw exactly
// the host's numbers.
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/random_permutation.hpp>

#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "cuda/gpu_case.cuh"

namespace {

__global__ void draw(gradcomp::random_stream stream, std::uint32_t* words, std::uint64_t* images, std::uint64_t n) {
  const std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x;
  if (i >= n) return;
  words[i] = stream.word(i);
  images[i] = gradcomp::random_permutation(n, stream)(i);
}

}  // namespace

TEST_CASE("philox compiled by nvcc reproduces the Random123 known answers on the host") {
  const gradcomp::philox_block out =
      gradcomp::philox4x32_10({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u);
  CHECK(out.word[0] == 0xd16cfe09u);
  CHECK(out.word[1] == 0x94fdccebu);
  CHECK(out.word[2] == 0x5001e420u);
  CHECK(out.word[3] == 0x24126ea1u);
}

GRADCOMP_CUDA_TEST_CASE("device draws equal host draws for the same key") {
  constexpr std::uint64_t n = 4099;
  const gradcomp::random_stream stream{0x1234567890abcdefull, 17, 5, gradcomp::random_purpose::random_k};
  const cudaStream_t queue = gradcomp::test::test_gpu().native_stream();
  std::uint32_t* words = nullptr;
  std::uint64_t* images = nullptr;
  REQUIRE(cudaMalloc(&words, n * sizeof *words) == cudaSuccess);
  REQUIRE(cudaMalloc(&images, n * sizeof *images) == cudaSuccess);
  draw<<<(n + 255) / 256, 256, 0, queue>>>(stream, words, images, n);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  std::vector<std::uint32_t> device_words(n);
  std::vector<std::uint64_t> device_images(n);
  REQUIRE(cudaMemcpyAsync(device_words.data(), words, n * sizeof *words, cudaMemcpyDeviceToHost, queue) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(device_images.data(), images, n * sizeof *images, cudaMemcpyDeviceToHost, queue) ==
          cudaSuccess);
  REQUIRE(cudaStreamSynchronize(queue) == cudaSuccess);
  cudaFree(words);
  cudaFree(images);
  const gradcomp::random_permutation host_permutation(n, stream);
  for (std::uint64_t i = 0; i < n; ++i) {
    CHECK(device_words[i] == stream.word(i));
    CHECK(device_images[i] == host_permutation(i));
  }
}
