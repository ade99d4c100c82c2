// mpi_train: the training demo's model trained by P processes (or threads), one worker per rank,
// the gradients summed by gradcomp's compressed all-reduce over a real transport.
//
//   mpirun -np 4 mpi_train [options]                          MPI (when built with MPI)
//   tests/support/run_ranks.sh 4 mpi_train --transport gloo   Gloo (when built with Gloo)
//   mpi_train --transport threads --ranks 4                   in-process threads
//
// Options: --codec NAME (repeatable; default: every row that runs over a transport; `--list`
// prints them), --steps S (default 300), --log-every K (print the loss and bytes of every K-th
// step), --max-loss-gap PCT (exit 1 when a row's final loss is more than PCT% above the first
// row's). The first row is the baseline of the summary; name `dense` first to compare with it.
// With 4 ranks every row ends with the parameters of the same row of `gradcomp_train_demo --row`.
#include <gradcomp/gradcomp.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "rank_training.hpp"

#if defined(GRADCOMP_EXAMPLE_WITH_MPI)
#  include <gradcomp/transport/mpi.hpp>
#  include <mpi.h>
#endif
#if defined(GRADCOMP_EXAMPLE_WITH_GLOO)
#  include <gradcomp/transport/gloo.hpp>
#  include <gloo/rendezvous/context.h>
#  include <gloo/rendezvous/file_store.h>
#  include <gloo/transport/tcp/device.h>
#endif

namespace {

struct command_line {
  std::string transport;
  int ranks = 4;  // --transport threads
  std::vector<std::string> codecs;
  train::run_options run;
  double max_loss_gap = 0.0;
  bool list = false;
};

command_line parse(int argc, char** argv) {
  command_line c;
#if defined(GRADCOMP_EXAMPLE_WITH_MPI)
  c.transport = "mpi";
#else
  c.transport = "threads";
#endif
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--transport") c.transport = value();
    else if (arg == "--ranks")
      c.ranks = std::stoi(value());
    else if (arg == "--codec")
      c.codecs.push_back(value());
    else if (arg == "--steps")
      c.run.steps = std::stoul(value());
    else if (arg == "--log-every")
      c.run.log_every = std::stoul(value());
    else if (arg == "--max-loss-gap")
      c.max_loss_gap = std::stod(value());
    else if (arg == "--list")
      c.list = true;
    else
      throw std::invalid_argument("unknown option " + arg);
  }
  return c;
}

// Runs the chosen rows on this rank; rank 0 prints. Returns the exit status (the same on every rank).
template <gradcomp::transport Inner>
int run_rank(Inner& t, const command_line& c, const char* transport_name) {
  using X = train::timed_transport<Inner>;
  const auto rows = train::all_rank_rows<X>();
  const bool printer = t.rank() == 0;
  if (c.list) {
    if (printer)
      for (const auto& row : rows)
        fmt::print("{}{}\n", row.name, row.make ? "" : "   (needs a transport with point-to-point calls)");
    return 0;
  }
  std::vector<const train::rank_row<X>*> chosen;
  for (const auto& row : rows)
    if (row.make && (c.codecs.empty() || std::find(c.codecs.begin(), c.codecs.end(), row.name) != c.codecs.end()))
      chosen.push_back(&row);
  if (chosen.size() != (c.codecs.empty() ? chosen.size() : c.codecs.size())) {
    if (printer) fmt::print(stderr, "unknown or unavailable codec name among --codec (see --list)\n");
    return 2;
  }
  const train::setup data(static_cast<std::size_t>(t.size()));
  if (printer)
    fmt::print("mpi_train: {} ranks over {}, MLP {}-{}-{} = {} parameters, {} steps of {} samples per rank\n", t.size(),
               transport_name, train::experiment::inputs, train::experiment::hidden, train::experiment::classes,
               train::experiment::model().size(), c.run.steps, train::experiment::batch);
  std::vector<train::rank_result> results;
  for (const auto* row : chosen) results.push_back(train::train_row(t, *row, data, c.run));
  if (printer) {
    train::print_summary(results, t.size(), c.max_loss_gap);
    fmt::print("parameter hashes were identical on all {} ranks after every step\n", t.size());
  }
  bool ok = true;
  for (const auto& r : results) {
    ok = ok && r.failure.empty();
    if (c.max_loss_gap > 0.0 && &r != &results.front())
      ok = ok && r.loss <= results.front().loss * (1.0 + c.max_loss_gap / 100.0);
  }
  return ok ? 0 : 1;
}

#if defined(GRADCOMP_EXAMPLE_WITH_GLOO)
int getenv_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) throw std::invalid_argument(std::string("--transport gloo needs the environment variable ") + name);
  return std::stoi(v);
}
#endif

}  // namespace

int main(int argc, char** argv) {
  try {
    const command_line c = parse(argc, argv);
    if (c.transport == "threads") {
      std::vector<int> status(static_cast<std::size_t>(c.ranks));
      gradcomp::in_process_group(c.ranks).run([&](gradcomp::in_process_transport& t) {
        status[static_cast<std::size_t>(t.rank())] = run_rank(t, c, "in-process threads");
      });
      return status[0];
    }
#if defined(GRADCOMP_EXAMPLE_WITH_MPI)
    if (c.transport == "mpi") {
      MPI_Init(&argc, &argv);
      int status = 0;
      {
        gradcomp::mpi_transport t(MPI_COMM_WORLD);
        status = run_rank(t, c, "MPI");
      }
      MPI_Finalize();
      return status;
    }
#endif
#if defined(GRADCOMP_EXAMPLE_WITH_GLOO)
    if (c.transport == "gloo") {
      const int rank = getenv_int("GRADCOMP_RANK"), size = getenv_int("GRADCOMP_SIZE");
      const char* store_dir = std::getenv("GRADCOMP_STORE");
      if (store_dir == nullptr)
        throw std::invalid_argument("--transport gloo needs GRADCOMP_STORE (a shared directory)");
      gloo::rendezvous::FileStore store(store_dir);
      auto device = gloo::transport::tcp::CreateDevice(gloo::transport::tcp::attr("127.0.0.1"));
      auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
      context->connectFullMesh(store, device);
      gradcomp::gloo_transport t(context);
      return run_rank(t, c, "Gloo");
    }
#endif
    throw std::invalid_argument("transport " + c.transport + " is not built in (threads" +
#if defined(GRADCOMP_EXAMPLE_WITH_MPI)
                                ", mpi" +
#endif
#if defined(GRADCOMP_EXAMPLE_WITH_GLOO)
                                ", gloo" +
#endif
                                std::string(" are)"));
  } catch (const std::exception& e) {
    fmt::print(stderr, "mpi_train: {}\n", e.what());
    return 2;
  }
}
