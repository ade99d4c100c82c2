#pragma once
// Deadlines of the compressed collectives, shared by the in-process tests and the MPI and Gloo
// tests (each process running its own rank): one rank stops calling in the middle of a collective
// (a `stalling_transport` holds it at its k-th transport call, after it has agreed and its peers
// have encoded), and every other rank must throw `timeout` naming the collective and its key, no
// earlier than the deadline and at most `deadline_margin` after it, with its data, output and codec
// state as before the call.
#include <gradcomp/gradcomp.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "collective/collective_checks.hpp"
#include "support/errors.hpp"

namespace gradcomp::test {

/// Thrown on the stalled rank once it is let go, to leave the collective it stopped in.
struct stalled_on_purpose {};

/// Forwards every call to X, with X's capabilities, except that rank `victim`'s call number
/// `stop_at` (counted from 0 after `stop_at_call`) waits in `stall()`, then throws
/// `stalled_on_purpose`: a rank that stops calling in the middle of a collective.
template <transport X>
class stalling_transport {
 public:
  stalling_transport(X& inner, int victim, std::function<void()> stall)
      : inner_(inner), victim_(victim), stall_(std::move(stall)) {}

  /// The victim stops at its `k`-th call from now (0: the next one).
  void stop_at_call(int k) {
    calls_ = 0;
    stop_at_ = k;
  }

  [[nodiscard]] int rank() const { return inner_.rank(); }
  [[nodiscard]] int size() const { return inner_.size(); }
  void set_deadline(const deadline& d)
    requires transport_with_deadline<X>
  {
    inner_.set_deadline(d);
  }
  [[nodiscard]] deadline current_deadline() const
    requires transport_with_deadline<X>
  {
    return inner_.current_deadline();
  }

  template <class V>
  void all_reduce_sum(std::span<V> d) {
    enter();
    inner_.all_reduce_sum(d);
  }
  template <class V>
  void all_reduce_max(std::span<V> d) {
    enter();
    inner_.all_reduce_max(d);
  }
  void all_reduce_or(std::span<std::uint8_t> d)
    requires transport_with_bitwise_or<X>
  {
    enter();
    inner_.all_reduce_or(d);
  }
  template <class V>
  void reduce_sum(std::span<V> d, int root) {
    enter();
    inner_.reduce_sum(d, root);
  }
  template <class V>
  void reduce_scatter_sum(std::span<const V> in, std::span<V> out) {
    enter();
    inner_.reduce_scatter_sum(in, out);
  }
  void broadcast(std::span<std::byte> d, int root) {
    enter();
    inner_.broadcast(d, root);
  }
  auto all_gather_bytes(std::span<const std::byte> mine) {
    enter();
    return inner_.all_gather_bytes(mine);
  }
  auto all_to_all_bytes(std::span<const std::span<const std::byte>> to_each)
    requires transport_with_all_to_all<X>
  {
    enter();
    return inner_.all_to_all_bytes(to_each);
  }
  void send_bytes(std::span<const std::byte> data, int dest)
    requires transport_with_point_to_point<X>
  {
    enter();
    inner_.send_bytes(data, dest);
  }
  auto recv_bytes(int source)
    requires transport_with_point_to_point<X>
  {
    enter();
    return inner_.recv_bytes(source);
  }
  auto sendrecv_bytes(std::span<const std::byte> data, int dest, int source)
    requires transport_with_point_to_point<X>
  {
    enter();
    return inner_.sendrecv_bytes(data, dest, source);
  }

 private:
  void enter() {
    if (rank() != victim_ || calls_++ != stop_at_) return;
    stall_();
    throw stalled_on_purpose{};
  }

  X& inner_;
  int victim_;
  std::function<void()> stall_;
  int calls_ = 0;
  int stop_at_ = -1;
};

/// The timeout of the deadline cases, and how late a survivor may report after it: 2 s covers a
/// busy machine (the ranks of this 2-core test machine share it with other builds) without letting
/// a wait that ignored the deadline pass (those wait for the victim, which stalls far longer).
inline constexpr std::chrono::milliseconds case_timeout{1000};
inline constexpr std::chrono::milliseconds deadline_margin{2000};

/// Every entry point of the compressed collectives, one deadline case each.
enum class deadline_case : int {
  all_reduce_gather_decode,
  all_reduce_summed_encodings,
  all_reduce_ring_plan,
  all_reduce_lhc,
  all_reduce_error_feedback,
  all_reduce_scatter_reduce,
  reduce_scatter_all_to_all,
  reduce_scatter_ring_plan,
  reduce_scatter_gather_decode,
  reduce_scatter_loco,
  reduce_scatter_tagc,
  all_gather,
  ring_all_reduce,
  ring_reduce_scatter,
  send_recv,
};

/// Every case, in order.
inline std::vector<deadline_case> every_deadline_case() {
  std::vector<deadline_case> all;
  for (int c = 0; c <= static_cast<int>(deadline_case::send_recv); ++c) all.push_back(static_cast<deadline_case>(c));
  return all;
}

/// The name a survivor's error must start with: the collective and, where it has one, its key.
inline std::string expected_prefix(deadline_case c) {
  constexpr const char* key = " (step 7, tensor 3): ";
  switch (c) {
    case deadline_case::reduce_scatter_tagc: return std::string("compressed_reduce_scatter (tagc)") + key;
    case deadline_case::all_gather: return std::string("compressed_all_gather") + key;
    case deadline_case::ring_all_reduce: return std::string("ring_all_reduce") + key;
    case deadline_case::ring_reduce_scatter: return std::string("ring_reduce_scatter") + key;
    case deadline_case::send_recv: return "compressed_recv from rank ";
    case deadline_case::reduce_scatter_all_to_all:
    case deadline_case::reduce_scatter_ring_plan:
    case deadline_case::reduce_scatter_gather_decode:
    case deadline_case::reduce_scatter_loco: return std::string("compressed_reduce_scatter") + key;
    default: return std::string("compressed_all_reduce") + key;
  }
}

/// What one rank saw in one case.
struct deadline_outcome {
  std::string thrown = "no exception";  ///< `named(code)` of the error the call threw.
  std::string what;                     ///< Its message.
  double seconds = 0.0;                 ///< From just before the call to its end.
  bool unchanged = false;               ///< Data, output and codec state as before the call.
  bool stalled = false;                 ///< This rank was the victim and stalled.
};

namespace detail_deadline {

/// A saved state's bytes (`codec.save_state`), to compare a state before and after a call.
template <class Wrapper, class State>
std::vector<std::byte> state_bytes(const Wrapper& w, const State& s, std::uint64_t n) {
  std::vector<std::byte> bytes(w.saved_state_bytes(n));
  bytes.resize(w.save_state(cpu_executor{}, s, bytes));
  return bytes;
}

inline std::vector<std::byte> tagc_bytes(const tagc<float>& scheme, const tagc_state<float, cpu_executor>& s) {
  std::vector<std::byte> bytes(tagc<float>::saved_state_bytes(s));
  bytes.resize(scheme.save_state(cpu_executor{}, s, bytes));
  return bytes;
}

}  // namespace detail_deadline

/// Runs case `c` on this rank of `t` (a stalling_transport around the transport under test) under
/// `case_timeout`: first one step that completes on every rank (so that codec states hold data),
/// then the step in which the victim stops at its second transport call (its first for the
/// all-gather, a ring or a send: there is no agreement round before them). Every rank but the victim calls; the victim
/// stalls in the call until `stall` returns.
template <transport X>
deadline_outcome run_deadline_case(stalling_transport<X>& t, deadline_case c) {
  using clock = std::chrono::steady_clock;
  constexpr std::size_t n = 4096;
  const cpu_executor cpu;
  const int P = t.size(), rank = t.rank();
  const message_key warm_key{.step = 6, .tensor_id = 3};
  const message_key key{.step = 7, .tensor_id = 3};
  const auto timeout = case_timeout;
  std::vector<float> data = gradient_of(rank, n, 7);
  std::vector<float> out(static_cast<std::size_t>(ring_chunk_of(n, P, rank).count), -1.0f);
  std::vector<float> warm = gradient_of(rank, n, 6);
  std::vector<float> warm_out = out;
  std::function<void()> call;
  std::function<std::vector<std::byte>()> state_of = [] { return std::vector<std::byte>(); };
  int stop_at = 1;

  const error_feedback<topk_sparsifier<float>> ef(topk_sparsifier<float>(sparsity{.density = 0.02}));
  auto ef_state = ef.make_state(cpu, n);
  const loco<uniform_quantizer<float>> lc;
  std::vector<state_type_of<loco<uniform_quantizer<float>>, cpu_executor>> loco_states;
  for (int j = 0; j < P; ++j) loco_states.push_back(lc.make_state(cpu, ring_chunk_of(n, P, j).count));
  auto ef_chunks = make_chunk_states(cpu, ef, n, P);
  auto ef_server = make_server_state(cpu, ef, n, P, rank);
  const tagc<float> scheme;
  auto tagc_state = scheme.make_state(cpu);
  const topk_sparsifier<float> topk(sparsity{.density = 0.05});
  const mpc_codec<float> mpc;
  const count_sketch<float> sketch;
  const lossless_homomorphic<float> lhc;

  switch (c) {
    case deadline_case::all_reduce_gather_decode:
      call = [&] { compressed_all_reduce(cpu, t, topk, std::span<float>(data), {.key = key, .timeout = timeout}); };
      break;
    case deadline_case::all_reduce_summed_encodings:
      call = [&] { compressed_all_reduce(cpu, t, sketch, std::span<float>(data), {.key = key, .timeout = timeout}); };
      break;
    case deadline_case::all_reduce_ring_plan:
      call = [&] {
        compressed_all_reduce(cpu, t, mpc, std::span<float>(data),
                              {.key = key, .plan = all_reduce_plan::ring, .timeout = timeout});
      };
      break;
    case deadline_case::all_reduce_lhc:
      data = dyadic_sparse_gradient(rank, n, 0.01, 7);
      call = [&] { compressed_all_reduce(cpu, t, lhc, std::span<float>(data), {.key = key, .timeout = timeout}); };
      break;
    case deadline_case::all_reduce_error_feedback:
      compressed_all_reduce(cpu, t, ef, ef_state, std::span<float>(warm), {.key = warm_key, .timeout = timeout});
      state_of = [&] { return detail_deadline::state_bytes(ef, ef_state, n); };
      call = [&] {
        compressed_all_reduce(cpu, t, ef, ef_state, std::span<float>(data), {.key = key, .timeout = timeout});
      };
      break;
    case deadline_case::all_reduce_scatter_reduce:
      // The victim stops at the all-gather of the re-encoded chunks (after the agreement, the
      // all-to-all and the status round): every survivor has stepped its chunk and server states.
      stop_at = 3;
      compressed_all_reduce(cpu, t, ef, std::span(ef_chunks), ef_server, std::span<float>(warm),
                            {.key = warm_key, .timeout = timeout});
      state_of = [&] {
        std::vector<std::byte> all = detail_deadline::state_bytes(ef, ef_server, ring_chunk_of(n, P, rank).count);
        for (int j = 0; j < P; ++j) {
          const auto one =
              detail_deadline::state_bytes(ef, ef_chunks[static_cast<std::size_t>(j)], ring_chunk_of(n, P, j).count);
          all.insert(all.end(), one.begin(), one.end());
        }
        return all;
      };
      call = [&] {
        compressed_all_reduce(cpu, t, ef, std::span(ef_chunks), ef_server, std::span<float>(data),
                              {.key = key, .timeout = timeout});
      };
      break;
    case deadline_case::reduce_scatter_all_to_all:
      call = [&] {
        compressed_reduce_scatter(cpu, t, topk, std::span<const float>(data), std::span<float>(out),
                                  {.key = key, .timeout = timeout});
      };
      break;
    case deadline_case::reduce_scatter_ring_plan:
      call = [&] {
        compressed_reduce_scatter(cpu, t, mpc, std::span<const float>(data), std::span<float>(out),
                                  {.key = key, .plan = reduce_scatter_plan::ring, .timeout = timeout});
      };
      break;
    case deadline_case::reduce_scatter_gather_decode:
      call = [&] {
        compressed_reduce_scatter(cpu, t, topk, std::span<const float>(data), std::span<float>(out),
                                  {.key = key, .plan = reduce_scatter_plan::gather_decode, .timeout = timeout});
      };
      break;
    case deadline_case::reduce_scatter_loco:
      compressed_reduce_scatter(cpu, t, lc, std::span(loco_states), std::span<const float>(warm),
                                std::span<float>(warm_out), {.key = warm_key, .timeout = timeout});
      state_of = [&] {
        std::vector<std::byte> all;
        for (int j = 0; j < P; ++j) {
          const auto one =
              detail_deadline::state_bytes(lc, loco_states[static_cast<std::size_t>(j)], ring_chunk_of(n, P, j).count);
          all.insert(all.end(), one.begin(), one.end());
        }
        return all;
      };
      call = [&] {
        compressed_reduce_scatter(cpu, t, lc, std::span(loco_states), std::span<const float>(data),
                                  std::span<float>(out), {.key = key, .timeout = timeout});
      };
      break;
    case deadline_case::reduce_scatter_tagc:
      compressed_reduce_scatter(cpu, t, scheme, tagc_state, std::span<const float>(warm), std::span<float>(warm_out),
                                {.key = warm_key, .timeout = timeout});
      state_of = [&] { return detail_deadline::tagc_bytes(scheme, tagc_state); };
      call = [&] {
        compressed_reduce_scatter(cpu, t, scheme, tagc_state, std::span<const float>(data), std::span<float>(out),
                                  {.key = key, .timeout = timeout});
      };
      break;
    case deadline_case::all_gather:
      stop_at = 0;  // no agreement round: the frames' all-gather is the first call
      data.resize(n / static_cast<std::size_t>(P));
      out.assign(n / static_cast<std::size_t>(P) * static_cast<std::size_t>(P), -1.0f);
      call = [&] {
        compressed_all_gather(cpu, t, topk, std::span<const float>(data), std::span<float>(out),
                              {.key = key, .timeout = timeout});
      };
      break;
    case deadline_case::ring_all_reduce:
      stop_at = 0;
      call = [&] { ring_all_reduce(cpu, t, mpc, std::span<float>(data), {.key = key, .timeout = timeout}); };
      break;
    case deadline_case::ring_reduce_scatter:
      stop_at = 0;
      call = [&] {
        ring_reduce_scatter(cpu, t, mpc, std::span<const float>(data), std::span<float>(out),
                            {.key = key, .timeout = timeout});
      };
      break;
    case deadline_case::send_recv:
      // The victim's send is its first call; every other rank waits to receive from it.
      stop_at = 0;
      call = [&] {
        const int victim = P - 1;
        if (rank == victim)
          compressed_send(cpu, t, mpc, std::span<const float>(data), 0, {.key = key, .timeout = timeout});
        else
          compressed_recv(cpu, t, mpc, std::span<float>(data), victim, {.timeout = timeout});
      };
      break;
  }

  const std::vector<float> data_before = data, out_before = out;
  const std::vector<std::byte> state_before = state_of();
  deadline_outcome outcome;
  t.stop_at_call(stop_at);
  const auto start = clock::now();
  try {
    call();
  } catch (const stalled_on_purpose&) {
    outcome.stalled = true;
  } catch (const error& e) {
    outcome.thrown = named(e.code());
    outcome.what = e.what();
  }
  outcome.seconds = std::chrono::duration<double>(clock::now() - start).count();
  outcome.unchanged =
      same_bits<float>(data, data_before) && same_bits<float>(out, out_before) && state_of() == state_before;
  return outcome;
}

/// The checks of a survivor's outcome in case `c` (rank `rank`, the victim `P − 1`).
inline void check_survivor(const deadline_outcome& o, deadline_case c, int rank, int P) {
  CAPTURE(static_cast<int>(c));
  CAPTURE(rank);
  CAPTURE(o.what);
  CAPTURE(o.seconds);
  CHECK_FALSE(o.stalled);
  CHECK(o.thrown == named(errc::timeout));
  CHECK(o.what.find(std::string("timeout: ") + expected_prefix(c)) == 0);
  if (c == deadline_case::send_recv) CHECK(o.what.find("rank " + std::to_string(P - 1)) != std::string::npos);
  const double timeout = std::chrono::duration<double>(case_timeout).count();
  CHECK(o.seconds >= timeout);
  CHECK(o.seconds <= timeout + std::chrono::duration<double>(deadline_margin).count());
  CHECK(o.unchanged);
}

}  // namespace gradcomp::test
