#pragma once
// The codec state of one DDP bucket, for the extension (gradcomp_torch.cpp) and replay_mpi alike:
// the plan the library's `automatic_plan` picks for the bucket's n values over P ranks (a
// transport with an all-to-all: ProcessGroupOps has one, MPI too), and the states that plan keeps
// on this rank (docs/transports.md §9):
//
// | plan | stateful codec (EF, LoCo) | stateless codec |
// |---|---|---|
// | `scatter_reduce` | P chunk states (`make_chunk_states`) + a server state | a server state (error feedback around the codec) |
// | `gather_decode` | one state of n values | none |
// | `summed_encodings` | (not a stateful plan) | none |
//
// Saved state (little-endian): u32 count of states, then per state (the chunk states or the one
// state first, the server state last) u64 size and the codec's own saved state.
#include <gradcomp/gradcomp.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace gradcomp_torch {

namespace detail {
template <class C, class E, bool = gradcomp::stateful<C, E>>
struct worker_state {
  using type = std::monostate;
};
template <class C, class E>
struct worker_state<C, E, true> {
  using type = gradcomp::state_type_of<C, E>;
};
}  // namespace detail

/// The states one rank keeps for one bucket of n values (table in this file's comment).
template <class C, class E = gradcomp::cpu_executor>
struct bucket_state {
  static constexpr bool has_state = gradcomp::stateful<C, E>;
  gradcomp::all_reduce_plan plan = gradcomp::all_reduce_plan::gather_decode;
  std::uint64_t n = 0;
  int ranks = 1;
  int rank = 0;
  std::vector<typename detail::worker_state<C, E>::type> workers;  ///< Chunk states, or the one state.
  std::vector<gradcomp::server_state_t<C, E>> server;  ///< One for `scatter_reduce`, else none.
};

/// The plan for a bucket of n values over `ranks` ranks: the library's `automatic_plan` over a
/// transport with an all-to-all (the same on every rank and in replay_mpi).
template <class C>
[[nodiscard]] gradcomp::all_reduce_plan bucket_plan(const C& codec, std::uint64_t n, int ranks) {
  return gradcomp::automatic_plan(codec, n, ranks, true);
}

/// The plan's name, as the hook reports it.
[[nodiscard]] inline const char* plan_name(gradcomp::all_reduce_plan plan) {
  switch (plan) {
    case gradcomp::all_reduce_plan::summed_encodings: return "summed_encodings";
    case gradcomp::all_reduce_plan::scatter_reduce: return "scatter_reduce";
    case gradcomp::all_reduce_plan::dense: return "dense";
    default: return "gather_decode";
  }
}

/// Fresh states for a bucket of n values on rank `rank` of `ranks`.
template <class C, class E>
[[nodiscard]] bucket_state<C, E> make_bucket_state(const E& e, const C& codec, std::uint64_t n, int ranks, int rank) {
  bucket_state<C, E> s;
  s.plan = bucket_plan(codec, n, ranks);
  s.n = n;
  s.ranks = ranks;
  s.rank = rank;
  const bool scatter = s.plan == gradcomp::all_reduce_plan::scatter_reduce;
  if (scatter) s.server.push_back(gradcomp::make_server_state(e, codec, n, ranks, rank));
  if constexpr (bucket_state<C, E>::has_state) {
    if (scatter) s.workers = gradcomp::make_chunk_states(e, codec, n, ranks);
    else
      s.workers.push_back(codec.make_state(e, n));
  }
  return s;
}

/// All-reduces `data` (the bucket's n values) with the states of `s`, `options.plan` automatic:
/// each overload of `compressed_all_reduce` resolves it to `s.plan` (or `dense` in the warm-up).
template <class C, class E, gradcomp::transport X>
gradcomp::compressed_report bucket_all_reduce(const E& e, X& t, const C& codec, bucket_state<C, E>& s,
                                              std::span<typename C::value_type> data,
                                              gradcomp::all_reduce_options options) {
  gradcomp::detail::require(s.n == data.size() && s.ranks == t.size() && s.rank == t.rank(),
                            gradcomp::errc::size_mismatch, [&] {
                              return "the bucket holds " + std::to_string(data.size()) + " values on rank " +
                                     std::to_string(t.rank()) + " of " + std::to_string(t.size()) + ", its state " +
                                     std::to_string(s.n) + " on rank " + std::to_string(s.rank) + " of " +
                                     std::to_string(s.ranks);
                            });
  options.plan = gradcomp::all_reduce_plan::automatic;
  const bool scatter = s.plan == gradcomp::all_reduce_plan::scatter_reduce;
  if constexpr (bucket_state<C, E>::has_state) {
    if (scatter)
      return gradcomp::compressed_all_reduce(e, t, codec, std::span(s.workers), s.server.front(), data, options);
    return gradcomp::compressed_all_reduce(e, t, codec, s.workers.front(), data, options);
  } else {
    if (scatter) return gradcomp::compressed_all_reduce(e, t, codec, s.server.front(), data, options);
    return gradcomp::compressed_all_reduce(e, t, codec, data, options);
  }
}

/// Appends `state` (of `wrapper`, for m values) to `out`: its u64 size, then its saved bytes.
template <class W, class S, class E>
void append_saved_state(std::vector<std::byte>& out, const E& e, const W& wrapper, const S& state, std::uint64_t m) {
  std::vector<std::byte> bytes(wrapper.saved_state_bytes(m));
  bytes.resize(wrapper.save_state(e, state, bytes));
  const std::uint64_t size = bytes.size();
  const std::size_t at = out.size();
  out.resize(at + 8 + bytes.size());
  std::memcpy(out.data() + at, &size, 8);
  std::memcpy(out.data() + at + 8, bytes.data(), bytes.size());
}

/// Reads the next `size` bytes of `bytes` from `at` (advanced past them). @throws gradcomp::error
/// `truncated` when fewer are left.
inline std::span<const std::byte> take_saved(std::span<const std::byte> bytes, std::size_t& at, std::size_t size) {
  gradcomp::detail::require(bytes.size() - at >= size, gradcomp::errc::truncated, "a saved bucket state ends early");
  const std::span<const std::byte> piece = bytes.subspan(at, size);
  at += size;
  return piece;
}

/// Loads into `state` (of `wrapper`) the state `append_saved_state` wrote at `at` (advanced past it).
template <class W, class S, class E>
void load_saved_state(std::span<const std::byte> bytes, std::size_t& at, const E& e, const W& wrapper, S& state) {
  std::uint64_t size = 0;
  std::memcpy(&size, take_saved(bytes, at, 8).data(), 8);
  wrapper.load_state(e, take_saved(bytes, at, static_cast<std::size_t>(size)), state);
}

/// The saved states of `s` (format in this file's comment).
template <class C, class E>
[[nodiscard]] std::vector<std::byte> save_bucket_state(const E& e, const C& codec, const bucket_state<C, E>& s) {
  std::vector<std::byte> out(4);
  const auto count = static_cast<std::uint32_t>(s.workers.size() + s.server.size());
  std::memcpy(out.data(), &count, 4);
  const auto append = [&](const auto& wrapper, const auto& state, std::uint64_t m) {
    append_saved_state(out, e, wrapper, state, m);
  };
  const bool scatter = s.plan == gradcomp::all_reduce_plan::scatter_reduce;
  if constexpr (bucket_state<C, E>::has_state)
    for (std::size_t j = 0; j < s.workers.size(); ++j)
      append(codec, s.workers[j], scatter ? gradcomp::ring_chunk_of(s.n, s.ranks, static_cast<int>(j)).count : s.n);
  for (const auto& server : s.server)
    append(gradcomp::server_codec_of(e, codec), server, gradcomp::ring_chunk_of(s.n, s.ranks, s.rank).count);
  return out;
}

/// States for a bucket of n values on rank `rank` of `ranks`, loaded from `save_bucket_state`'s
/// bytes. @throws gradcomp::error `truncated` / `trailing_bytes` / `size_mismatch` when the bytes
/// are not of such a bucket, or as the codec's `load_state`.
template <class C, class E>
[[nodiscard]] bucket_state<C, E> load_bucket_state(const E& e, const C& codec, std::span<const std::byte> bytes,
                                                   std::uint64_t n, int ranks, int rank) {
  bucket_state<C, E> s = make_bucket_state(e, codec, n, ranks, rank);
  std::size_t at = 0;
  std::uint32_t count = 0;
  std::memcpy(&count, take_saved(bytes, at, 4).data(), 4);
  gradcomp::detail::require(count == s.workers.size() + s.server.size(), gradcomp::errc::size_mismatch, [&] {
    return "a saved bucket state of " + std::to_string(count) + " states, the bucket's plan (" + plan_name(s.plan) +
           ") keeps " + std::to_string(s.workers.size() + s.server.size());
  });
  const auto load = [&](const auto& wrapper, auto& state) { load_saved_state(bytes, at, e, wrapper, state); };
  if constexpr (bucket_state<C, E>::has_state)
    for (auto& worker : s.workers) load(codec, worker);
  for (auto& server : s.server) load(gradcomp::server_codec_of(e, codec), server);
  gradcomp::detail::require(at == bytes.size(), gradcomp::errc::trailing_bytes,
                            "a saved bucket state has trailing bytes");
  return s;
}

/// The errors `s` carries, one value per element of the bucket: `worker` what this rank's
/// gradients still owe (its chunk states or its one state; zeros for a stateless codec), `server`
/// what its server state owes the sum of its chunk (zeros outside that chunk).
template <class C, class E>
void bucket_errors(const E& e, const C& codec, const bucket_state<C, E>& s, std::span<float> worker,
                   std::span<float> server) {
  std::fill(worker.begin(), worker.end(), 0.0f);
  std::fill(server.begin(), server.end(), 0.0f);
  const bool scatter = s.plan == gradcomp::all_reduce_plan::scatter_reduce;
  if constexpr (bucket_state<C, E>::has_state) {
    for (std::size_t j = 0; j < s.workers.size(); ++j) {
      const gradcomp::ring_chunk c =
          scatter ? gradcomp::ring_chunk_of(s.n, s.ranks, static_cast<int>(j)) : gradcomp::ring_chunk{0, s.n};
      codec.carried_error(e, s.workers[j],
                          worker.subspan(static_cast<std::size_t>(c.offset), static_cast<std::size_t>(c.count)));
    }
  }
  for (const auto& state : s.server) {
    const gradcomp::ring_chunk c = gradcomp::ring_chunk_of(s.n, s.ranks, s.rank);
    gradcomp::server_codec_of(e, codec).carried_error(e, state,
                                                      server.subspan(static_cast<std::size_t>(c.offset),
                                                                     static_cast<std::size_t>(c.count)));
  }
}

/// States for a bucket of `worker.size()` values carrying the errors `worker` and `server` (as
/// `bucket_errors` gives them, re-laid in the new bucket's order), with the step counters of
/// `like`. The server error of this rank's new chunk goes to its server state; the rest of it is
/// the sum's, which this rank can no longer re-encode: a stateful codec adds it to its own worker
/// error (the next step's sum carries it), a stateless one drops it. Returns the states and the
/// number of nonzero values dropped.
template <class C, class E>
[[nodiscard]] std::pair<bucket_state<C, E>, std::uint64_t> relaid_bucket_state(const E& e, const C& codec,
                                                                               std::span<const float> worker,
                                                                               std::span<const float> server,
                                                                               const bucket_state<C, E>& like,
                                                                               int ranks, int rank) {
  gradcomp::detail::require(worker.size() == server.size(), gradcomp::errc::size_mismatch,
                            "the worker and server errors differ in size");
  const std::uint64_t n = worker.size();
  bucket_state<C, E> s = make_bucket_state(e, codec, n, ranks, rank);
  const bool scatter = s.plan == gradcomp::all_reduce_plan::scatter_reduce;
  const gradcomp::ring_chunk own = scatter ? gradcomp::ring_chunk_of(n, ranks, rank) : gradcomp::ring_chunk{0, 0};
  std::vector<float> rest(worker.begin(), worker.end());
  std::uint64_t dropped = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    if (i >= own.offset && i < own.offset + own.count) continue;
    if constexpr (bucket_state<C, E>::has_state) rest[i] += server[i];
    else
      dropped += server[i] != 0.0f ? 1 : 0;
  }
  // The step counters go on: every bucket of a DDP model steps together.
  std::uint64_t steps = 0, total = 0;
  const auto read = [&](const auto& state) {
    steps = state.steps;
    if constexpr (requires { state.total_steps; }) total = state.total_steps;
  };
  const auto write = [&](auto& state) {
    state.steps = steps;
    if constexpr (requires { state.total_steps; }) state.total_steps = total;
  };
  if constexpr (bucket_state<C, E>::has_state)
    if (!like.workers.empty()) read(like.workers.front());
  if (like.workers.empty() && !like.server.empty()) read(like.server.front());
  if constexpr (bucket_state<C, E>::has_state) {
    for (std::size_t j = 0; j < s.workers.size(); ++j) {
      const gradcomp::ring_chunk c =
          scatter ? gradcomp::ring_chunk_of(n, ranks, static_cast<int>(j)) : gradcomp::ring_chunk{0, n};
      write(s.workers[j]);
      codec.set_carried_error(e,
                              std::span<const float>(rest).subspan(static_cast<std::size_t>(c.offset),
                                                                   static_cast<std::size_t>(c.count)),
                              s.workers[j]);
    }
  }
  for (auto& state : s.server) {
    write(state);
    gradcomp::server_codec_of(e, codec).set_carried_error(
        e, server.subspan(static_cast<std::size_t>(own.offset), static_cast<std::size_t>(own.count)), state);
  }
  return {std::move(s), dropped};
}

}  // namespace gradcomp_torch
