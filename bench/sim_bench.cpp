// sim_bench: speed of the simulator. Prints a header row, a units row and one
// row per case (wall time of program building and simulation, events, events
// per second, ops simulated per second, peak resident memory), then the rows
// as JSON. Not a test. An event is what the engine's loop takes in one turn: an
// op's end, a network event, or the end of a region of local ops that start
// one another (SimOptions::regions), so ops/s is the rate to compare across
// engines.
//
//   ./build/bench/sim_bench [--skip-full] [--repeat N] [--case TEXT] [--no-regions]
// --case keeps the cases whose name contains TEXT ("gpt3", "1t", "530b").
// --no-regions runs the engine with every op's end its own event (the same
// times): the classic event-per-op rate of the event loop.
// With --repeat N every case runs N times and the fastest run is reported
// (the first run of a process pays for page faults the later ones reuse).
// Cases: GPT-3 175B on 1024 A100s (the default example) in both modes, and
// the 1T model of Narayanan Table 1 on 3072 A100s (tp 8, pp 64, dp 6, 512
// micro-batches per pipeline) in reduced and full mode.
#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "config/library.hpp"
#include "config/plan_settings.hpp"
#include "core/program/builder.hpp"
#include "sim/engine.hpp"

using namespace megascope;
using Clock = std::chrono::steady_clock;

namespace {

double peak_rss_gib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) * 1024.0 / (1024.0 * 1024 * 1024);
}

struct Row {
  std::string name, mode;
  double build_s = 0, setup_s = 0, sim_s = 0, step_s = 0;
  std::uint64_t events = 0, ops = 0;
  std::size_t ranks = 0;
  double rss_gib = 0;
};

}  // namespace

int main(int argc, char** argv) {
  bool skip_full = false, regions = true;
  int repeat = 1;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    skip_full = skip_full || std::strcmp(argv[i], "--skip-full") == 0;
    regions = regions && std::strcmp(argv[i], "--no-regions") != 0;
    if (std::strcmp(argv[i], "--repeat") == 0 && i + 1 < argc) repeat = std::max(1, std::atoi(argv[++i]));
    else if (std::strcmp(argv[i], "--case") == 0 && i + 1 < argc) only = argv[++i];
  }
  struct Case {
    const char* name;
    const char* model;
    const char* cluster;
    const char* plan;
    std::int64_t batch;
    int gpus;
    sim::Mode mode;
  };
  std::vector<Case> cases = {
      {"gpt3-175b 1024 A100", "gpt3-175b", "dgx-a100",
       "tp=8,pp=8,vpp=3,schedule=interleaved,sp=on,recompute=selective,distopt=on", 1536, 1024, sim::Mode::reduced},
      {"gpt3-175b 1024 A100", "gpt3-175b", "dgx-a100",
       "tp=8,pp=8,vpp=3,schedule=interleaved,sp=on,recompute=selective,distopt=on", 1536, 1024, sim::Mode::full},
      {"gpt-1t 3072 A100", "gpt-1t", "dgx-a100", "tp=8,pp=64,mbs=1,recompute=full,recompute_method=uniform,recompute_layers=1",
       3072, 3072, sim::Mode::reduced},
      // The planner's pick for the 530B model on 2520 A100s: one of stage 2's
      // 32 reduced simulations, with interleaving, DP overlap and traffic on
      // the fabric.
      {"gpt-530b 2520 A100", "gpt-529.6b", "dgx-a100",
       "tp=8,pp=15,vpp=7,dp=21,sp=on,distopt=on,overlap_grad_reduce=on,overlap_param_gather=on,tp_comm_overlap=on,schedule=interleaved",
       2520, 2520, sim::Mode::reduced},
      {"gpt-1t 3072 A100", "gpt-1t", "dgx-a100", "tp=8,pp=64,mbs=1,recompute=full,recompute_method=uniform,recompute_layers=1",
       3072, 3072, sim::Mode::full},
  };
  std::vector<Row> rows;
  for (const Case& c : cases) {
    if (skip_full && c.mode == sim::Mode::full) continue;
    if (!only.empty() && std::string(c.name).find(only) == std::string::npos) continue;
    auto model = resolve_model(c.model);
    auto cluster = resolve_cluster(c.cluster);
    auto plan = parse_inline_plan(c.plan);
    TrainingSpec t;
    t.global_batch_size = c.batch;
    auto sized = with_device_count(*cluster, c.gpus);
    auto setup = validate_setup(*model, *sized, t, *plan, c.gpus);
    if (!setup) {
      fmt::print(stderr, "{}: {}\n", c.name, setup.error().str());
      return 1;
    }
    Row row;
    row.name = c.name;
    row.mode = c.mode == sim::Mode::full ? "full" : "reduced";
    for (int rep = 0; rep < repeat; ++rep) {
      const auto t0 = Clock::now();
      auto program = build_program(*setup);
      const auto t1 = Clock::now();
      auto cost = sim::CostModel::for_device(setup->cluster.device);
      const sim::Topology topo = sim::Topology::build(setup->cluster, setup->world);
      const auto t2 = Clock::now();
      sim::SimOptions so{c.mode, false, {}};
      so.regions = regions;
      auto r = sim::simulate(*program, topo, *cost, so);
      const auto t3 = Clock::now();
      if (!r) {
        fmt::print(stderr, "{}: {}\n", c.name, r.error().str());
        return 1;
      }
      const double build_s = std::chrono::duration<double>(t1 - t0).count();
      const double setup_s = std::chrono::duration<double>(t2 - t1).count();
      const double sim_s = std::chrono::duration<double>(t3 - t2).count();
      if (rep == 0 || build_s + setup_s + sim_s < row.build_s + row.setup_s + row.sim_s) {
        row.build_s = build_s;
        row.setup_s = setup_s;
        row.sim_s = sim_s;
      }
      row.step_s = r->step_time_s;
      row.events = r->events;
      row.ranks = r->simulated_ranks.size();
      row.ops = 0;
      for (int rank : r->simulated_ranks) row.ops += program->of_rank(rank).ops.size();
    }
    row.rss_gib = peak_rss_gib();
    rows.push_back(row);
    fmt::print(stderr, "done: {} {}\n", row.name, row.mode);
  }
  // build: build_program; setup: cost model and topology; simulate: the engine
  // alone (events/s is events / simulate).
  fmt::print("{:<22} {:>8} {:>6} {:>9} {:>9} {:>9} {:>12} {:>12} {:>12} {:>12} {:>9} {:>9}\n", "case", "mode", "ranks",
             "build", "setup", "simulate", "events", "events/s", "ops", "ops/s", "step", "peak RSS");
  fmt::print("{:<22} {:>8} {:>6} {:>9} {:>9} {:>9} {:>12} {:>12} {:>12} {:>12} {:>9} {:>9}\n", "", "", "", "s", "s", "s", "",
             "1/s", "", "1/s", "s", "GiB");
  for (const Row& r : rows)
    fmt::print("{:<22} {:>8} {:>6} {:>9.4f} {:>9.4f} {:>9.4f} {:>12} {:>12.3g} {:>12} {:>12.3g} {:>9.3f} {:>9.2f}\n", r.name,
               r.mode, r.ranks, r.build_s, r.setup_s, r.sim_s, r.events, static_cast<double>(r.events) / r.sim_s, r.ops,
               static_cast<double>(r.ops) / r.sim_s, r.step_s, r.rss_gib);
  fmt::print("\n[");
  for (std::size_t i = 0; i < rows.size(); ++i)
    fmt::print("{}{{\"case\": \"{}\", \"mode\": \"{}\", \"ranks\": {}, \"build_s\": {:.4f}, \"setup_s\": {:.4f}, "
               "\"simulate_s\": {:.4f}, "
               "\"events\": {}, \"ops\": {}, \"step_time_s\": {:.6f}, \"peak_rss_gib\": {:.3f}}}",
               i ? ",\n " : "", rows[i].name, rows[i].mode, rows[i].ranks, rows[i].build_s, rows[i].setup_s, rows[i].sim_s,
               rows[i].events, rows[i].ops, rows[i].step_s, rows[i].rss_gib);
  fmt::print("]\n");
  return 0;
}
