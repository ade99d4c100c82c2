#pragma once
/// @file
/// The pipeline (a sparsifier's indices, then a quantizer's message of the kept values;
/// docs/wire-format.md §12) on a host executor: the reference backend on `reference_executor`, whose
/// stages run their own reference backends, and the CPU backend on `cpu_executor`, the same steps
/// with the stages' CPU backends. The pipeline itself only copies the index section and gathers and
/// scatters the kept values, so the host has nothing faster to offer than these plain loops.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/narrowing.hpp>
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/pipeline.hpp>
#include <gradcomp/sparsify/sparse_format.hpp>

namespace gradcomp {

/// A sparsifier followed by a quantizer on a host executor E (the reference, or the CPU).
template <class S, class Q, class E>
  requires(std::same_as<E, reference_executor> || std::same_as<E, cpu_executor>)
struct backend<pipeline<S, Q>, E> {
  using T = typename S::value_type;
  using C = compute_type<T>;  ///< What the decoder's kept values are held in (float32 for a 16-bit T).

  /// The workspace, its kept values of type V (T when encoding, C when decoding).
  template <class V>
  struct scratch {
    std::span<std::byte> sparse;  ///< The sparsifier's message.
    std::span<std::byte> stage;   ///< Workspace of whichever stage runs.
    std::span<V> values;          ///< Kept values, contiguous.
  };

  template <class V>
  static scratch<V> carve(workspace_arena& arena, const pipeline<S, Q>& codec, const E& e, std::uint64_t n) {
    scratch<V> s;
    s.sparse = arena.take<std::byte>(codec.sparsify_stage().max_encoded_bytes(n));
    s.stage = arena.take<std::byte>(
        std::max(codec.sparsify_stage().workspace_bytes(e, n), codec.quantize_stage().workspace_bytes(e, n)));
    s.values = arena.take<V>(static_cast<std::size_t>(n));
    return s;
  }

  static std::size_t workspace_bytes(const pipeline<S, Q>& codec, const E& e, std::uint64_t n) {
    workspace_arena arena = workspace_arena::measure();
    carve<C>(arena, codec, e, n);  // C is at least as large as T
    return arena.bytes_needed();
  }

  static std::size_t encode(const pipeline<S, Q>& codec, const E& e, std::span<const T> grad, std::span<std::byte> out,
                            std::span<std::byte> ws, message_key key) {
    workspace_arena arena(ws);
    const scratch<T> s = carve<T>(arena, codec, e, grad.size());
    // The sparsifier's own message (docs/wire-format.md §4): its count, index section and kept values.
    const std::size_t sparse_bytes = codec.sparsify_stage().encode(e, grad, s.sparse, s.stage, key);
    const std::span<const std::byte> sparse_message(s.sparse.data(), sparse_bytes);
    const envelope inner = parse_envelope(sparse_message);
    const sparse_view<T> view = parse_sparse_payload<T>(inner, payload_of(sparse_message));
    const std::uint64_t k = view.index.kept;
    for (std::uint64_t j = 0; j < k; ++j) s.values[j] = view.value(j);

    // docs/wire-format.md §12.1: the count and index section copied as they are, then the
    // quantizer's complete message of the k kept values, keyed alike.
    const std::uint64_t head = view.index.bytes();
    detail::begin_host_message(out, static_cast<std::size_t>(envelope::size + head));
    std::memcpy(out.data() + envelope::size, payload_of(sparse_message).data(), static_cast<std::size_t>(head));
    const std::size_t values_bytes =
        codec.quantize_stage().encode(e, std::span<const T>(s.values.data(), static_cast<std::size_t>(k)),
                                      out.subspan(static_cast<std::size_t>(envelope::size + head)), s.stage, key);

    // The envelope last: the sparsifier's index coding as layout, its payload-CRC choice as flag.
    const std::uint64_t payload_bytes = head + values_bytes;
    detail::seal_host_message(out,
                              {codec_id::pipeline, dtype_of<T>, inner.layout, 0, key, grad.size(), payload_bytes,
                               codec.params_hash(), 0},
                              inner.flags != 0);
    return static_cast<std::size_t>(envelope::size + payload_bytes);
  }

  /// Decodes into `out` of T, or (a 16-bit T) of float32; with `accumulate` adds instead. A
  /// 16-bit T's kept values are decoded into float32 and reach a 16-bit output rounded once
  /// (docs/half-precision.md §3), every result checked to fit before the first is written.
  template <gradient_value O>
  static void decode(const pipeline<S, Q>& codec, const E& e, std::span<const std::byte> message, std::span<O> out,
                     std::span<std::byte> ws, const decode_limits& limits, bool accumulate) {
    // docs/wire-format.md §12.2, in order: the envelope, the count and index section, the workspace,
    // the nested message's key, then the quantizer's own checks of the nested message.
    const envelope env = parse_envelope(message);
    validate_envelope(env, {codec_id::pipeline, dtype_of<T>, out.size(), codec.params_hash()}, limits);
    const std::span<const std::byte> payload = payload_of(message);
    const sparse_indices index = parse_sparse_indices(env, payload, 0);
    workspace_arena arena(ws);
    const scratch<C> s = carve<C>(arena, codec, e, out.size());
    const std::span<C> values(s.values.data(), static_cast<std::size_t>(index.kept));
    const std::span<const std::byte> nested = payload.subspan(static_cast<std::size_t>(index.bytes()));
    detail::require(parse_envelope(nested).key == env.key, errc::step_mismatch,
                    "the nested quantizer message belongs to another step or tensor");
    codec.quantize_stage().decode(e, nested, values, s.stage,
                                  {.max_elements = index.kept, .require_checksum = limits.require_checksum});
    // Zeros (decode), then value j at the j-th kept index, written or added (a 16-bit output's
    // results checked to fit first, then rounded once).
    const auto result = [&](std::uint64_t j, std::uint64_t i) {
      return accumulate ? widen(out[i]) + values[j] : values[j];
    };
    if constexpr (half_precision<O>) {
      index.for_each([&](std::uint64_t j, std::uint64_t i) { detail::require_narrows<O>(i, result(j, i)); });
    }
    if (!accumulate) std::fill(out.begin(), out.end(), O{});
    index.for_each([&](std::uint64_t j, std::uint64_t i) {
      if constexpr (half_precision<O>) out[i] = narrow<O>(result(j, i));
      else
        out[i] = result(j, i);
    });
  }
};

}  // namespace gradcomp
