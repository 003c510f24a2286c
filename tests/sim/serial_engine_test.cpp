// Serial execution (sim/engine.hpp): the ops of a rank one at a time in list
// order, as the CPU executor runs them. Golden timelines on hand-built
// programs, the default per device kind, and a shipped program whose serial
// step is the plain sum of its ops.
#include <catch2/catch.hpp>

#include "core/program/builder.hpp"
#include "core/program/stage_writer.hpp"
#include "sim/engine.hpp"
#include "engine_support.hpp"
#include "support.hpp"

using namespace megascope;
using namespace megascope::sim;
using megascope::test::make_setup;
using megascope::test::shipped_cluster;
using megascope::test::shipped_model;
using megascope::test::seconds;
using megascope::test::span_of;
using megascope::test::unit_cost;

namespace {

// Two pipeline stages that pass an activation forward and a gradient back.
Program ping_pong() {
  Program p = megascope::test::two_stages();
  detail::OpContext ctx;
  detail::StageWriter w0(p.stages[0]), w1(p.stages[1]);
  const auto c0 = w0.compute(OpLabel::mlp, ctx, {seconds(1.0)});            // 0
  w0.p2p(OpKind::send, OpLabel::pp_activation, ctx, 1, 7, 64e6, {c0});     // 1
  w0.compute(OpLabel::mlp, ctx, {seconds(2.0)});                            // 2
  const auto r0 = w0.p2p(OpKind::recv, OpLabel::pp_gradient, ctx, 1, 8, 32e6);   // 3
  w0.compute(OpLabel::mlp, ctx, {seconds(0.5)}, {r0});                     // 4
  const auto r1 = w1.p2p(OpKind::recv, OpLabel::pp_activation, ctx, 0, 7, 64e6);  // 0
  const auto c1 = w1.compute(OpLabel::mlp, ctx, {seconds(1.0)}, {r1});    // 1
  w1.p2p(OpKind::send, OpLabel::pp_gradient, ctx, 0, 8, 32e6, {c1});       // 2
  w1.compute(OpLabel::attention, ctx, {seconds(0.25)});                     // 3
  return p;
}

}  // namespace

TEST_CASE("A CPU device runs its ops serially by default, a GPU device on overlapping streams", "[sim]") {
  CHECK(default_execution(shipped_cluster("cpu-host").device) == Execution::serial);
  CHECK(default_execution(shipped_cluster("dgx-h100").device) == Execution::streams);
}

TEST_CASE("Serial ranks post sends and go on, wait in receives, and a receive is posted only at its turn", "[sim]") {
  const Program p = ping_pong();
  REQUIRE(validate_program(p));
  const Topology topo = Topology::build(shipped_cluster("cpu-host"), 2);
  const std::vector<int> pair = {0, 1};
  const double x = isolated_time(topo, collective_flow(topo, Collective::send_recv, pair, 64e6));
  const double y = isolated_time(topo, collective_flow(topo, Collective::send_recv, pair, 32e6));
  REQUIRE(x < 1.0);
  SimOptions serial;
  serial.mode = Mode::full;
  auto r = simulate(p, topo, unit_cost(DeviceKind::cpu), serial);
  REQUIRE(r);
  // Stage 0: compute [0, 1]; posts its send at 1 (zero-length span) and computes [1, 3]; the
  // transfer runs [1, 1 + x] because stage 1 sat in its receive from 0.
  CHECK(span_of(*r, 0, 0).end == 1.0);
  CHECK(span_of(*r, 0, 1).start == 1.0);
  CHECK(span_of(*r, 0, 1).end == 1.0);
  CHECK(span_of(*r, 0, 2).start == 1.0);
  CHECK(span_of(*r, 0, 2).end == Approx(3.0));
  CHECK(span_of(*r, 1, 0).start == 0.0);   // the receive holds the rank from the moment it is reached
  CHECK(span_of(*r, 1, 0).end == Approx(1.0 + x));
  CHECK(span_of(*r, 1, 1).start == Approx(1.0 + x));
  CHECK(span_of(*r, 1, 2).start == Approx(2.0 + x));   // the gradient send is posted at 2 + x ...
  CHECK(span_of(*r, 1, 3).start == Approx(2.0 + x));   // ... and stage 1 computes on at once
  CHECK(span_of(*r, 1, 3).end == Approx(2.25 + x));
  // ... but stage 0 posts its receive only after its compute [1, 3]: the transfer runs [3, 3 + y].
  CHECK(span_of(*r, 0, 3).start == Approx(3.0));
  CHECK(span_of(*r, 0, 3).end == Approx(3.0 + y));
  CHECK(span_of(*r, 0, 4).start == Approx(3.0 + y));
  CHECK(r->step_time_s == Approx(3.5 + y));

  // On streams the receive is posted up front and the transfer overlaps stage 0's compute.
  SimOptions streams = serial;
  streams.execution = Execution::streams;
  auto s = simulate(p, topo, unit_cost(DeviceKind::cpu), streams);
  REQUIRE(s);
  CHECK(span_of(*s, 0, 3).start == Approx(2.0 + x));
  CHECK(s->step_time_s == Approx(3.5));
}

TEST_CASE("Serial execution ignores streams: a DP all-reduce listed before a compute op delays it", "[sim]") {
  Program p;
  p.grid = RankGrid{1, 1, 2, 1, 1, 1, 1};   // dp = 2
  p.stages.resize(1);
  detail::OpContext ctx;
  detail::StageWriter w(p.stages[0]);
  const auto a = w.compute(OpLabel::mlp, ctx, {seconds(1.0)});
  w.collective(OpKind::all_reduce, Stream::dp, CommGroup::dp_cp, OpLabel::dp_grad, ctx, 400e6, {a});
  w.compute(OpLabel::mlp, ctx, {seconds(0.5)});
  REQUIRE(validate_program(p));
  const Topology topo = Topology::build(shipped_cluster("cpu-host"), 2);
  const std::vector<int> group = {0, 1};
  const double ar = isolated_time(topo, collective_flow(topo, Collective::all_reduce, group, 400e6));
  REQUIRE(ar > 0.0);
  for (Mode mode : {Mode::full, Mode::reduced}) {
    SimOptions o;
    o.mode = mode;
    auto serial = simulate(p, topo, unit_cost(DeviceKind::cpu), o);
    REQUIRE(serial);
    CHECK(span_of(*serial, 0, 2).start == Approx(1.0 + ar));
    CHECK(serial->step_time_s == Approx(1.5 + ar));
    o.execution = Execution::streams;
    auto streams = simulate(p, topo, unit_cost(DeviceKind::cpu), o);
    REQUIRE(streams);
    CHECK(span_of(*streams, 0, 2).start == 1.0);
    CHECK(streams->step_time_s == Approx(std::max(1.5, 1.0 + ar)));
  }
}

TEST_CASE("A serial DP run of tiny-gpt takes the sum of its compute ops and its collectives", "[sim]") {
  const Setup s = make_setup(shipped_model("tiny-gpt"), "cpu-host", "dp=2", 8, 2);
  auto program = build_program(s);
  REQUIRE(program);
  auto cost = CostModel::for_device(s.cluster.device);
  REQUIRE(cost);
  const Topology topo = Topology::build(s.cluster, s.world);
  double expected = 0;
  const StageProgram& stage = program->stages[0];
  const std::vector<double> compute = compute_durations(stage, *cost);
  for (std::size_t i = 0; i < stage.ops.size(); ++i) {
    const Op& op = stage.ops[i];
    if (op.kind == OpKind::compute) {
      expected += compute[i];
    } else {
      REQUIRE(op.kind == OpKind::all_reduce);
      const std::vector<int> group = program->grid.group(0, op.group);
      expected += isolated_time(topo, collective_flow(topo, Collective::all_reduce, group, op.bytes));
    }
  }
  auto r = simulate(*program, topo, *cost, {});
  REQUIRE(r);
  CHECK(r->step_time_s == Approx(expected).epsilon(1e-12));
  SimOptions streams;
  streams.execution = Execution::streams;
  auto overlapped = simulate(*program, topo, *cost, streams);
  REQUIRE(overlapped);
  CHECK(overlapped->step_time_s <= r->step_time_s);
}

TEST_CASE("A profile's forward-pass efficiency divides the price of forward and recomputed ops, not the backward's", "[sim]") {
  // tiny-gpt on one A100 with full recomputation: forward, recompute, input-
  // and weight-gradient ops, and the optimizer step.
  const Setup s = make_setup(shipped_model("tiny-gpt"), "dgx-a100", "recompute=full,recompute_method=uniform,recompute_layers=1",
                             8, 1);
  auto program = build_program(s);
  REQUIRE(program);
  auto cost = CostModel::for_device(s.cluster.device);
  REQUIRE(cost);
  CostProfile half = cost->profile();
  half.forward_efficiency = 0.5;
  CostProfile unit = cost->profile();
  unit.forward_efficiency = 1.0;
  const StageProgram& stage = program->stages[0];
  const std::vector<double> at_half = compute_durations(stage, CostModel(s.cluster.device, half));
  const std::vector<double> at_one = compute_durations(stage, CostModel(s.cluster.device, unit));
  int forward = 0, recompute = 0, other = 0;
  for (std::size_t i = 0; i < stage.ops.size(); ++i) {
    const Op& op = stage.ops[i];
    if (op.kind != OpKind::compute || at_one[i] == 0) continue;
    const bool fwd = op.phase == Phase::forward || op.phase == Phase::recompute;
    CHECK(at_half[i] == Approx(fwd ? 2 * at_one[i] : at_one[i]).epsilon(1e-12));
    (op.phase == Phase::forward ? forward : op.phase == Phase::recompute ? recompute : other) += 1;
  }
  CHECK(forward > 0);
  CHECK(recompute > 0);
  CHECK(other > 0);
}

TEST_CASE("Ops of different phases that share a kernel range are each priced with their phase's factor, in either order", "[sim]") {
  // A GEMM's kernel is not marked by the phase (only memory kernels of
  // backward ops are), so a forward and an input-gradient op with the same
  // GEMM share one kernel range; the stage pricer's memo must not carry one
  // op's factor to the other.
  const Setup s = make_setup(shipped_model("tiny-gpt"), "dgx-a100", "dp=1", 8, 1);
  CostProfile half = CostModel::for_device(s.cluster.device)->profile();
  half.forward_efficiency = 0.5;
  const CostModel cost(s.cluster.device, half);
  const Kernel g = detail::gemm(4096, 4096, 4096, Precision::bf16);
  const double t = cost.kernel_s(g);
  REQUIRE(t > 0);
  for (const bool forward_first : {true, false}) {
    StageProgram stage;
    detail::StageWriter w(stage);
    detail::OpContext fwd, bwd;
    fwd.phase = Phase::forward;
    bwd.phase = Phase::backward_input;
    w.compute(OpLabel::mlp, forward_first ? fwd : bwd, {g});
    w.compute(OpLabel::mlp, forward_first ? bwd : fwd, {g});
    REQUIRE(stage.ops.size() == 2);
    REQUIRE(stage.ops[0].kernel_begin == stage.ops[1].kernel_begin);   // one shared range
    const std::vector<double> d = compute_durations(stage, cost);
    CHECK(d[forward_first ? 0 : 1] == Approx(2 * t).epsilon(1e-12));
    CHECK(d[forward_first ? 1 : 0] == Approx(t).epsilon(1e-12));
  }
}
