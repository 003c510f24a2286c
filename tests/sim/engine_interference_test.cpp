// Interference (CostProfile::comm_sms): a collective running on a GPU takes
// SMs from its compute ops, which progress at 1 - n comm_sms / sms of their
// rate meanwhile. Golden timelines computed by hand on a unit device.
#include <catch2/catch.hpp>

#include <vector>

#include "core/program/stage_writer.hpp"
#include "engine_support.hpp"
#include "sim/engine.hpp"
#include "sim/network.hpp"
#include "support.hpp"

using namespace megascope;
using namespace megascope::sim;
using megascope::test::seconds;
using megascope::test::shipped_cluster;
using megascope::test::span_of;

namespace {

// unit_cost() with `comm_sms` of its 100 SMs held by each running collective.
CostModel unit_cost_with(int comm_sms) {
  const CostModel base = test::unit_cost();
  CostProfile p = base.profile();
  p.sms = 100;
  p.comm_sms = comm_sms;
  return CostModel(base.device(), p);
}

// One stage on two TP ranks (one DGX H100 node).
Program tp_pair() {
  Program p;
  p.grid = RankGrid{2, 1, 1, 1, 1, 1, 1};
  p.stages.resize(1);
  return p;
}

constexpr double kBytes = 256e6;

// The all-reduce's time alone on the two GPUs' NVLink ports.
double all_reduce_time(const Topology& topo) {
  const std::vector<int> pair = {0, 1};
  return isolated_time(topo, collective_flow(topo, Collective::all_reduce, pair, kBytes));
}

}  // namespace

TEST_CASE("A compute op beside a collective runs at the rate the collective's SMs leave it, and at full rate after",
          "[sim]") {
  Program p = tp_pair();
  detail::OpContext ctx;
  detail::StageWriter w(p.stages[0]);
  constexpr double work = 2e-3;   // seconds at the full rate
  w.compute(OpLabel::mlp, ctx, {seconds(work)});
  w.collective(OpKind::all_reduce, Stream::tp, CommGroup::tp, OpLabel::tp_comm, ctx, kBytes);
  REQUIRE(validate_program(p));
  const Topology topo = Topology::build(shipped_cluster("dgx-h100"), 2);
  const double x = all_reduce_time(topo);
  REQUIRE(x > 0.2 * work);   // a sizeable part of the op runs beside it
  REQUIRE(x < work);
  for (const Mode mode : {Mode::full, Mode::reduced}) {
    INFO((mode == Mode::full ? "full" : "reduced"));
    // Half the SMs: the compute does x / 2 of its work while the collective runs, the rest after.
    auto r = simulate(p, topo, unit_cost_with(50), {mode, true, {}});
    REQUIRE(r);
    CHECK(span_of(*r, 0, 1).start == 0.0);
    CHECK(span_of(*r, 0, 1).end == Approx(x));
    CHECK(span_of(*r, 0, 0).end == Approx(x + (work - 0.5 * x)).epsilon(1e-9));
    CHECK(r->step_time_s == Approx(work + 0.5 * x).epsilon(1e-9));
    // No SMs held: the compute is not slowed, with regions on or off.
    for (const bool regions : {true, false}) {
      SimOptions o{mode, true, {}};
      o.regions = regions;
      auto free = simulate(p, topo, unit_cost_with(0), o);
      REQUIRE(free);
      CHECK(span_of(*free, 0, 0).end == work);
    }
  }
}

TEST_CASE("A collective that starts while a compute op runs moves that op's end, and two collectives take twice the SMs",
          "[sim]") {
  Program p = tp_pair();
  detail::OpContext ctx;
  detail::StageWriter w(p.stages[0]);
  constexpr double t0 = 0.25e-3, work = 2e-3;
  const auto first = w.compute(OpLabel::mlp, ctx, {seconds(t0)});
  w.compute(OpLabel::mlp, ctx, {seconds(work)});                                                          // op 1: from t0
  w.collective(OpKind::all_reduce, Stream::tp, CommGroup::tp, OpLabel::tp_comm, ctx, kBytes, {first});       // op 2
  w.collective(OpKind::all_reduce, Stream::dp, CommGroup::tp, OpLabel::dp_grad, ctx, kBytes / 4, {first});   // op 3
  REQUIRE(validate_program(p));
  const Topology topo = Topology::build(shipped_cluster("dgx-h100"), 2);
  for (const Mode mode : {Mode::full, Mode::reduced}) {
    INFO((mode == Mode::full ? "full" : "reduced"));
    auto r = simulate(p, topo, unit_cost_with(20), {mode, true, {}});
    REQUIRE(r);
    // Both collectives start at t0 and share the NVLink ports: the smaller ends first, the larger later than alone.
    const double end2 = span_of(*r, 0, 2).end, end3 = span_of(*r, 0, 3).end;
    CHECK(span_of(*r, 0, 2).start == t0);
    CHECK(span_of(*r, 0, 3).start == t0);
    REQUIRE(end3 < end2);
    CHECK(end2 > t0 + all_reduce_time(topo));
    // Op 1: rate 0.6 with both running, 0.8 with one, 1 after.
    const double done = 0.6 * (end3 - t0) + 0.8 * (end2 - end3);
    REQUIRE(done < work);
    CHECK(span_of(*r, 0, 1).start == t0);
    CHECK(span_of(*r, 0, 1).end == Approx(end2 + (work - done)).epsilon(1e-9));
    // At a single rate of 0.8 throughout the overlap it would end later: the two-collective stretch counts.
    CHECK(span_of(*r, 0, 1).end > end2 + (work - 0.8 * (end2 - t0)) + 1e-6);
  }
}

TEST_CASE("Pipeline sends and receives take no SMs from compute", "[sim]") {
  Program p = test::two_stages();
  detail::OpContext ctx;
  detail::StageWriter w0(p.stages[0]), w1(p.stages[1]);
  w0.p2p(OpKind::send, OpLabel::pp_activation, ctx, 1, 7, 64e6);
  w0.compute(OpLabel::mlp, ctx, {seconds(1.0)});
  w1.p2p(OpKind::recv, OpLabel::pp_activation, ctx, 0, 7, 64e6);
  w1.compute(OpLabel::mlp, ctx, {seconds(1.0)});
  REQUIRE(validate_program(p));
  const Topology topo = Topology::build(shipped_cluster("dgx-h100"), 2);
  auto r = simulate(p, topo, unit_cost_with(50), {Mode::full, true, {}});
  REQUIRE(r);
  CHECK(span_of(*r, 0, 1).end == 1.0);
  CHECK(span_of(*r, 1, 1).end == 1.0);
}
