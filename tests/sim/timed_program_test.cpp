// The automatic zero-bubble schedules in the simulator (sim/timed_program):
// stage times read off a first run equal the priced kernels, the Program runs
// the order placed from them, and on the same cluster it is no slower than the
// handcrafted schedule of the same memory.
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "core/accounting/memory.hpp"
#include "core/models.hpp"
#include "core/program/builder.hpp"
#include "sim/engine.hpp"
#include "sim/report.hpp"
#include "sim/timed_program.hpp"
#include "support.hpp"

using namespace megascope;
using namespace megascope::sim;
using megascope::test::make_setup;

namespace {

// tp 1: a pass is its compute ops back to back, so its span is their priced sum.
Setup setup_of(const std::string& plan, int m = 16) {
  ModelSpec model = megascope::test::gpt_no_bias(16, 2048, 16);
  model.vocab_size = 4096;
  return make_setup(model, "dgx-a100", "tp=1,pp=4," + plan, m, 4, 2048);
}

struct Outcome {
  TimedProgram timed;
  SimReport report;
};

Outcome run(const Setup& s) {
  auto cost = CostModel::for_device(s.cluster.device);
  REQUIRE(cost);
  const Topology topo = Topology::build(s.cluster, s.world);
  auto timed = build_timed_program(s, *cost, topo);
  REQUIRE(timed);
  auto r = simulate(timed->program, topo, *cost, {});
  REQUIRE(r);
  SimReport rep = make_report(s, timed->program, *r);
  return {std::move(*timed), std::move(rep)};
}

// The (pass, micro-batch) order of a stage's compute ops: the first op of each pass.
RankSchedule order_of(const StageProgram& st) {
  RankSchedule out;
  std::map<std::pair<int, int>, bool> seen;
  for (const Op& op : st.ops) {
    if (op.kind != OpKind::compute || !op.microbatch) continue;
    Pass p = Pass::F;
    switch (op.phase) {
      case Phase::forward: p = Pass::F; break;
      case Phase::recompute:
      case Phase::backward_input: p = Pass::B; break;
      case Phase::backward_weight: p = Pass::W; break;
      default: continue;
    }
    if (seen.emplace(std::pair{static_cast<int>(p), static_cast<int>(*op.microbatch)}, true).second)
      out.push_back({p, *op.microbatch, 0, false});
  }
  return out;
}

}  // namespace

TEST_CASE("Stage times for the automatic schedules are the priced kernels of each pass, and the transfer is positive",
          "[sim]") {
  const Setup s = setup_of("schedule=zb-1p");
  auto program = build_program(s);
  REQUIRE(program);
  auto cost = CostModel::for_device(s.cluster.device);
  const Topology topo = Topology::build(s.cluster, s.world);
  SimOptions so;
  auto r = simulate(*program, topo, *cost, so);
  REQUIRE(r);
  const AutoScheduleInputs in = measured_stage_times(s, *program, *r);
  REQUIRE(in.times.f.size() == 4);
  for (int st = 0; st < 4; ++st) {
    INFO("stage " << st);
    const StageProgram& sp = program->stages[static_cast<std::size_t>(st)];
    const std::vector<double> d = compute_durations(sp, *cost);
    double f = 0, b = 0, w = 0;
    for (std::size_t i = 0; i < sp.ops.size(); ++i) {
      const Op& op = sp.ops[i];
      if (op.kind != OpKind::compute || !(op.microbatch == 8)) continue;
      (op.phase == Phase::forward ? f : op.phase == Phase::backward_weight ? w : b) += d[i];
    }
    CHECK(in.times.f[static_cast<std::size_t>(st)] == Approx(f).epsilon(1e-9));
    CHECK(in.times.b[static_cast<std::size_t>(st)] == Approx(b).epsilon(1e-9));
    CHECK(in.times.w[static_cast<std::size_t>(st)] == Approx(w).epsilon(1e-9));
    CHECK(in.w_memory[static_cast<std::size_t>(st)] > 0);
    CHECK(in.w_memory[static_cast<std::size_t>(st)] <= 1);
  }
  CHECK(in.times.comm > 0);
  CHECK(in.times.comm < 0.1 * in.times.f[1]);
  CHECK(in.memory_limit == 4);
}

TEST_CASE("zb-1p and zb-2p run the order placed from the stage times, no slower than ZB-H1 and ZB-H2", "[sim]") {
  for (const auto& [automatic, handcrafted] :
       {std::pair<std::string, std::string>{"schedule=zb-1p", "schedule=zb-h1"},
        {"schedule=zb-2p,post_validation=on", "schedule=zb-h2,post_validation=on"}}) {
    INFO(automatic);
    const Setup s = setup_of(automatic);
    const Outcome a = run(s);
    const Outcome h = run(setup_of(handcrafted));
    REQUIRE_FALSE(a.timed.chosen.empty());
    const AutoSchedule placed = auto_zero_bubble(4, s.num_microbatches, a.timed.inputs);
    for (int r = 0; r < 4; ++r) CHECK(order_of(a.timed.program.stages[static_cast<std::size_t>(r)]) == placed.order[static_cast<std::size_t>(r)]);
    // Placed on the stage-time model, timed by the engine: within 0.5% of
    // the handcrafted order, or faster.
    CHECK(a.report.step_time_s <= h.report.step_time_s * 1.005);
  }
  // The other schedules build as build_program does, with no placement.
  const Setup s = setup_of("schedule=zb-h1");
  const Outcome h = run(s);
  CHECK(h.timed.chosen.empty());
  CHECK(h.timed.program.op_count() == build_program(s)->op_count());
}

TEST_CASE("zb-1p and zb-2p hold their memory limit in the accounting", "[sim]") {
  for (const auto& [plan, limit] : {std::pair<std::string, int>{"schedule=zb-1p", 4}, {"schedule=zb-2p", 8}}) {
    INFO(plan);
    const Setup s = setup_of(plan, 32);
    for (int r = 0; r < 4; ++r) CHECK(s.chunks[static_cast<std::size_t>(r)].size() == 1);
    const MemoryReport mem = memory_report(s);
    for (const StageMemory& st : mem.stages) CHECK(st.inflight_microbatches == limit);
  }
}
