#pragma once
/// @file
/// Umbrella header: everything gradcomp offers to host code. Never pulls in CUDA headers.

#include <gradcomp/version.hpp>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/codec_interface.hpp>
#include <gradcomp/core/bit_packing.hpp>
#include <gradcomp/core/concepts.hpp>
#include <gradcomp/core/config.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/crc32c.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/murmur3.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/memory_space.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/core/random_permutation.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/core/workspace.hpp>

#include <gradcomp/sparsify/dynamic.hpp>
#include <gradcomp/sparsify/randomk.hpp>
#include <gradcomp/sparsify/sparse_format.hpp>
#include <gradcomp/sparsify/sparsity.hpp>
#include <gradcomp/sparsify/threshold.hpp>
#include <gradcomp/sparsify/topk.hpp>

#include <gradcomp/feedback/error_feedback.hpp>
#include <gradcomp/feedback/loco.hpp>
#include <gradcomp/feedback/step_rollback.hpp>
#include <gradcomp/pipeline.hpp>

#include <gradcomp/quantize/qsgd.hpp>
#include <gradcomp/quantize/qsgd_math.hpp>
#include <gradcomp/quantize/shared_scale.hpp>
#include <gradcomp/quantize/sign.hpp>
#include <gradcomp/quantize/sign_math.hpp>
#include <gradcomp/quantize/uniform.hpp>
#include <gradcomp/quantize/uniform_math.hpp>

#include <gradcomp/sketch/count_sketch.hpp>
#include <gradcomp/sketch/lossless_homomorphic.hpp>

#include <gradcomp/lossless/mpc.hpp>
#include <gradcomp/lossless/zfp_fixed_rate.hpp>

#include <gradcomp/lowrank/powersgd.hpp>
#include <gradcomp/lowrank/powersgd_math.hpp>

#include <gradcomp/reference/comparison.hpp>

#include <gradcomp/collective/agreement.hpp>
#include <gradcomp/collective/all_reduce_cost.hpp>
#include <gradcomp/collective/all_to_all_chunks.hpp>
#include <gradcomp/collective/collective_memory.hpp>
#include <gradcomp/collective/compressed_all_gather.hpp>
#include <gradcomp/collective/compressed_all_reduce.hpp>
#include <gradcomp/collective/compressed_frame.hpp>
#include <gradcomp/collective/compressed_point_to_point.hpp>
#include <gradcomp/collective/compressed_reduce_scatter.hpp>
#include <gradcomp/collective/executor_transport.hpp>
#include <gradcomp/collective/lhc_stages.hpp>
#include <gradcomp/collective/low_rank_collectives.hpp>
#include <gradcomp/collective/ring.hpp>
#include <gradcomp/collective/scatter_reduce.hpp>
#include <gradcomp/collective/tagc.hpp>
#include <gradcomp/control/density_schedule.hpp>
#include <gradcomp/control/gravac.hpp>
#include <gradcomp/control/layer_policy.hpp>
#include <gradcomp/control/message_policy.hpp>

#include <gradcomp/transport/in_process.hpp>
#include <gradcomp/transport/rank_ordered.hpp>
#include <gradcomp/transport/received_bytes.hpp>
#include <gradcomp/transport/transport.hpp>
