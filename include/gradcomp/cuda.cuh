#pragma once
/// @file
/// Umbrella header of the CUDA backend: `cuda_executor`, the CUDA implementation of every codec
/// that has one, the compressed collectives' device memory operations and state rollback, and
/// `staged_transport` (a host transport for device buffers). The NCCL adapter is opt-in:
/// <gradcomp/transport/nccl.cuh>. Include it from a .cu file compiled by nvcc (with -std=c++20); link the target
/// `gradcomp::cuda`. It includes <gradcomp/gradcomp.hpp>, so the CPU backend is there too.

#include <gradcomp/cuda/config.cuh>

#include <gradcomp/gradcomp.hpp>

#include <gradcomp/cuda/detail/block_codes.cuh>
#include <gradcomp/cuda/check.cuh>
#include <gradcomp/cuda/collective_memory.cuh>
#include <gradcomp/cuda/count_sketch.cuh>
#include <gradcomp/cuda/detail/crc32c.cuh>
#include <gradcomp/cuda/device_array.cuh>
#include <gradcomp/cuda/dynamic.cuh>
#include <gradcomp/cuda/error_feedback.cuh>
#include <gradcomp/cuda/executor.cuh>
#include <gradcomp/cuda/detail/finite_check.cuh>
#include <gradcomp/cuda/detail/grid.cuh>
#include <gradcomp/cuda/loco.cuh>
#include <gradcomp/cuda/lossless_homomorphic.cuh>
#include <gradcomp/cuda/detail/message.cuh>
#include <gradcomp/cuda/mpc.cuh>
#include <gradcomp/cuda/detail/operation.cuh>
#include <gradcomp/cuda/pipeline.cuh>
#include <gradcomp/cuda/qsgd.cuh>
#include <gradcomp/cuda/detail/radix_select.cuh>
#include <gradcomp/cuda/detail/rank_order_combine.cuh>
#include <gradcomp/cuda/randomk.cuh>
#include <gradcomp/cuda/shared_scale.cuh>
#include <gradcomp/cuda/sign.cuh>
#include <gradcomp/cuda/detail/sparse_coding.cuh>
#include <gradcomp/cuda/step_rollback.cuh>
#include <gradcomp/cuda/threshold.cuh>
#include <gradcomp/cuda/topk.cuh>
#include <gradcomp/cuda/uniform.cuh>
#include <gradcomp/cuda/detail/warp.cuh>
#include <gradcomp/cuda/zfp_fixed_rate.cuh>

#include <gradcomp/transport/staged.cuh>
