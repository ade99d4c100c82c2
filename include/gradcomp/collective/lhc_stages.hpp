#pragma once
/// @file
/// The first collective stage of lossless homomorphic compression over a user transport, shared by
/// the compressed all-reduce's two-stage plan and TAGC's reduce-scatter: which index coding the
/// transport can aggregate, the aggregation itself (in the transport's memory), and whether LHC
/// decodes on an executor at all.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <gradcomp/core/error.hpp>
#include <gradcomp/sketch/lossless_homomorphic.hpp>
#include <gradcomp/transport/transport.hpp>

namespace gradcomp {

/// The index coding `params` use over transport `X` with `ranks` ranks: the configured one, except
/// that a bitmap over a transport without bitwise OR becomes 4-bit fields (P ≤ 15) or 8-bit fields
/// (P ≤ 255), which a uint8 SUM aggregates. `where` prefixes the error.
/// @throws error `invalid_argument` when no coding holds `ranks` contributions.
template <transport X>
[[nodiscard]] lhc_index_coding lhc_index_coding_for(const lhc_params& params, int ranks, const char* where) {
  lhc_index_coding coding = params.index;
  if (coding == lhc_index_coding::bitmap && !transport_with_bitwise_or<X>)
    coding = ranks <= 15 ? lhc_index_coding::sum4 : lhc_index_coding::sum8;
  lhc_params with_coding = params;
  with_coding.index = coding;
  const std::uint64_t limit = lossless_homomorphic<float>(with_coding).max_contributors();
  detail::require(static_cast<std::uint64_t>(ranks) <= limit, errc::invalid_argument, [&] {
    return std::string(where) + ": " + std::to_string(ranks) + " ranks exceed the " + std::to_string(limit) +
           " contributors the index coding can sum";
  });
  return coding;
}

/// Aggregates the ranks' indexes of one coding in place: bitwise OR for a bitmap, uint8 SUM for
/// the summed fields (collective: every rank calls it with the same coding and size).
/// @throws error `invalid_argument` for a bitmap over a transport without OR (a SUM would carry
///         between bits; `lhc_index_coding_for` never chooses it), before anything is sent.
template <transport X>
void aggregate_lhc_index(X& t, lhc_index_coding coding, std::span<std::byte> index) {
  const auto bytes = std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(index.data()), index.size());
  if (coding == lhc_index_coding::bitmap) {
    if constexpr (transport_with_bitwise_or<X>) t.all_reduce_or(bytes);
    else
      detail::fail(errc::invalid_argument, "a bitmap index needs a transport with bitwise OR; use summed fields");
    return;
  }
  t.all_reduce_sum(bytes);
}

}  // namespace gradcomp
