// The event engine on hand-built programs whose timings can be computed by
// hand (golden traces), deadlock detection, determinism, and full vs reduced
// mode on a symmetric plan.
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "config/trace_file.hpp"
#include "core/program/builder.hpp"
#include "core/program/stage_writer.hpp"
#include "sim/engine.hpp"
#include "sim/report.hpp"
#include "core/models.hpp"
#include "engine_support.hpp"
#include "support.hpp"

using namespace megascope;
using namespace megascope::sim;
using megascope::test::make_setup;
using megascope::test::shipped_cluster;
using megascope::test::shipped_model;
using megascope::test::seconds;
using megascope::test::span_of;
using megascope::test::two_stages;
using megascope::test::unit_cost;


TEST_CASE("A send and its receive form one transfer and the consumer starts when it ends", "[sim]") {
  Program p = two_stages();
  detail::OpContext ctx;
  detail::StageWriter w0(p.stages[0]), w1(p.stages[1]);
  const auto c0 = w0.compute(OpLabel::mlp, ctx, {seconds(1.0)});
  w0.p2p(OpKind::send, OpLabel::pp_activation, ctx, 1, 7, 64e6, {c0});
  w0.compute(OpLabel::mlp, ctx, {seconds(2.0)});
  const auto r1 = w1.p2p(OpKind::recv, OpLabel::pp_activation, ctx, 0, 7, 64e6);
  w1.compute(OpLabel::mlp, ctx, {seconds(1.0)}, {r1});
  REQUIRE(validate_program(p));

  const ClusterSpec c = shipped_cluster("dgx-h100");
  const Topology topo = Topology::build(c, 2);
  const std::vector<int> pair = {0, 1};
  const double x = isolated_time(topo, collective_flow(topo, Collective::send_recv, pair, 64e6));
  auto r = simulate(p, topo, unit_cost(), {Mode::full, true, {}});
  REQUIRE(r);
  // Golden timeline: stage 0 computes [0, 1] then [1, 3]; the transfer runs [1, 1 + x]; stage 1 computes [1 + x, 2 + x].
  CHECK(span_of(*r, 0, 0).start == 0.0);
  CHECK(span_of(*r, 0, 0).end == 1.0);
  CHECK(span_of(*r, 0, 2).start == 1.0);
  CHECK(span_of(*r, 0, 2).end == Approx(3.0));
  CHECK(span_of(*r, 1, 0).start == Approx(1.0));   // the receive's span starts with the transfer
  CHECK(span_of(*r, 1, 0).end == Approx(1.0 + x));
  CHECK(span_of(*r, 1, 1).start == Approx(1.0 + x));
  CHECK(span_of(*r, 1, 1).end == Approx(2.0 + x));
  CHECK(r->step_time_s == Approx(std::max(3.0, 2.0 + x)));
  CHECK(x > 64e6 / 450e9);   // no faster than the NVLink line rate
}

TEST_CASE("Ops on one stream run in order while other streams overlap them", "[sim]") {
  Program p = two_stages();
  p.grid = RankGrid{1, 1, 1, 1, 1, 1, 1};
  p.stages.resize(1);
  detail::OpContext ctx;
  detail::StageWriter w(p.stages[0]);
  const auto a = w.compute(OpLabel::mlp, ctx, {seconds(1.0)});
  w.compute(OpLabel::mlp, ctx, {seconds(0.5)});
  w.compute(OpLabel::attention, ctx, {seconds(0.25)}, {a});
  const Topology topo = Topology::build(shipped_cluster("dgx-h100"), 1);
  auto r = simulate(p, topo, unit_cost(), {Mode::full, true, {}});
  REQUIRE(r);
  CHECK(span_of(*r, 0, 1).start == 1.0);
  CHECK(span_of(*r, 0, 2).start == 1.5);
  CHECK(r->step_time_s == 1.75);
}

TEST_CASE("Two ranks that each wait for the other's send are reported as a deadlock, not a hang", "[sim]") {
  Program p = two_stages();
  detail::OpContext ctx;
  detail::StageWriter w0(p.stages[0]), w1(p.stages[1]);
  const auto r0 = w0.p2p(OpKind::recv, OpLabel::pp_gradient, ctx, 1, 1, 1e6);
  const auto c0 = w0.compute(OpLabel::mlp, ctx, {seconds(1.0)}, {r0});
  w0.p2p(OpKind::send, OpLabel::pp_activation, ctx, 1, 2, 1e6, {c0});
  const auto r1 = w1.p2p(OpKind::recv, OpLabel::pp_activation, ctx, 0, 2, 1e6);
  const auto c1 = w1.compute(OpLabel::mlp, ctx, {seconds(1.0)}, {r1});
  w1.p2p(OpKind::send, OpLabel::pp_gradient, ctx, 0, 1, 1e6, {c1});
  REQUIRE(validate_program(p));
  auto r = simulate(p, Topology::build(shipped_cluster("dgx-h100"), 2), unit_cost(), {});
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Catch::Contains("deadlock"));
}

TEST_CASE("A program with a send that no stage receives is rejected by validation", "[sim]") {
  Program p = two_stages();
  detail::OpContext ctx;
  detail::StageWriter w0(p.stages[0]);
  w0.p2p(OpKind::send, OpLabel::pp_activation, ctx, 1, 3, 1e6);
  auto ok = validate_program(p);
  REQUIRE_FALSE(ok);
  CHECK_THAT(ok.error().message, Catch::Contains("has no matching receive"));
}

TEST_CASE("Validation names a tag used twice on one channel, even when both sides post in the same order", "[sim]") {
  Program p = two_stages();
  detail::OpContext ctx;
  detail::StageWriter w0(p.stages[0]), w1(p.stages[1]);
  for (int k = 0; k < 2; ++k) {
    w0.p2p(OpKind::send, OpLabel::pp_activation, ctx, 1, 5, 1e6);
    w1.p2p(OpKind::recv, OpLabel::pp_activation, ctx, 0, 5, 1e6);
  }
  auto ok = validate_program(p);
  REQUIRE_FALSE(ok);
  CHECK_THAT(ok.error().message, Catch::Contains("stage 0 op 1") && Catch::Contains("duplicate send tag"));
}

TEST_CASE("Sends and receives posted in different orders pair by tag", "[sim]") {
  // Stage 0 sends tag 1 (1 MB) then tag 2 (64 MB); stage 1 receives tag 2
  // first. Each receive ends with its own transfer: the 64 MB one last.
  Program p = two_stages();
  detail::OpContext ctx;
  detail::StageWriter w0(p.stages[0]), w1(p.stages[1]);
  w0.p2p(OpKind::send, OpLabel::pp_activation, ctx, 1, 1, 1e6);
  w0.p2p(OpKind::send, OpLabel::pp_activation, ctx, 1, 2, 64e6);
  w1.p2p(OpKind::recv, OpLabel::pp_activation, ctx, 0, 2, 64e6);
  w1.p2p(OpKind::recv, OpLabel::pp_activation, ctx, 0, 1, 1e6);
  REQUIRE(validate_program(p));
  const Topology topo = Topology::build(shipped_cluster("dgx-h100"), 2);
  auto r = simulate(p, topo, unit_cost(), {Mode::full, true, {}});
  REQUIRE(r);
  CHECK(span_of(*r, 1, 1).end < span_of(*r, 1, 0).end);   // tag 1, the small one, ends first
  CHECK(span_of(*r, 1, 0).end == Approx(span_of(*r, 0, 1).end));
  CHECK(span_of(*r, 1, 1).end == Approx(span_of(*r, 0, 0).end));

  Program q = two_stages();
  detail::StageWriter v1(q.stages[1]);
  v1.p2p(OpKind::recv, OpLabel::pp_activation, ctx, 0, 9, 1e6);
  auto bad = validate_program(q);
  REQUIRE_FALSE(bad);
  CHECK_THAT(bad.error().message, Catch::Contains("has no matching send"));
}

TEST_CASE("Stages that share a group must run the same collectives in it", "[sim]") {
  // The pipeline group spans every stage: an all-reduce of 1 MB on stage 0
  // and of 4 MB on stage 1 would be one collective of two sizes.
  Program p = two_stages();
  detail::OpContext ctx;
  detail::StageWriter w0(p.stages[0]), w1(p.stages[1]);
  w0.compute(OpLabel::mlp, ctx, {seconds(1e-4)});
  w0.collective(OpKind::all_reduce, Stream::tp, CommGroup::pp, OpLabel::tp_comm, ctx, 1e6);
  w1.compute(OpLabel::mlp, ctx, {seconds(5e-5)});
  w1.collective(OpKind::all_reduce, Stream::tp, CommGroup::pp, OpLabel::tp_comm, ctx, 4e6);
  auto bad = validate_program(p);
  REQUIRE_FALSE(bad);
  CHECK_THAT(bad.error().message, Catch::Contains("stages 0 and 1 run different pipeline-group collectives"));
  p.stages[1].ops[1].bytes = 1e6;
  CHECK(validate_program(p));
}

TEST_CASE("Ops may share a range of dependencies", "[sim]") {
  // Five ops name the same one-entry range {op 0}: valid (each range is in
  // bounds and points back), and the engine's packing must not assume one
  // range per op. The compute stream runs them one after another.
  Program p = two_stages();
  detail::OpContext ctx;
  detail::StageWriter w0(p.stages[0]);
  for (int k = 0; k < 6; ++k) w0.compute(OpLabel::mlp, ctx, {seconds(1.0)});
  StageProgram& st = p.stages[0];
  st.deps = {0};
  for (std::size_t k = 0; k < st.ops.size(); ++k) {
    st.ops[k].dep_begin = 0;
    st.ops[k].dep_count = k == 0 ? 0 : 1;
  }
  REQUIRE(validate_program(p));
  const Topology topo = Topology::build(shipped_cluster("dgx-h100"), 2);
  for (const bool regions : {true, false}) {
    SimOptions o{Mode::full, true, {}};
    o.regions = regions;
    auto r = simulate(p, topo, unit_cost(), o);
    REQUIRE(r);
    CHECK(r->step_time_s == Approx(6.0));
    CHECK(span_of(*r, 0, 5).start == Approx(5.0));
  }
}

TEST_CASE("Full and reduced modes give the same step time on a symmetric plan", "[sim]") {
  const Setup s = make_setup(shipped_model("llama3-8b"), "dgx-h100", "tp=2,pp=2,sp=on,distopt=on,overlap_grad_reduce=on",
                             8, 8, 2048);
  auto program = build_program(s);
  REQUIRE(program);
  auto cost = CostModel::for_device(s.cluster.device);
  REQUIRE(cost);
  const Topology topo = Topology::build(s.cluster, s.world);
  auto full = simulate(*program, topo, *cost, {Mode::full, false, {}});
  auto reduced = simulate(*program, topo, *cost, {Mode::reduced, false, {}});
  REQUIRE(full);
  REQUIRE(reduced);
  CHECK(full->simulated_ranks.size() == 8);
  CHECK(reduced->simulated_ranks.size() == 2);
  CHECK(full->step_time_s == Approx(reduced->step_time_s).epsilon(1e-9));
}

TEST_CASE("The simulation is deterministic: the same input gives the same spans", "[sim]") {
  const Setup s = make_setup(shipped_model("llama3-8b"), "dgx-h100", "tp=2,pp=2,vpp=2,schedule=interleaved", 8, 8, 2048);
  auto program = build_program(s);
  REQUIRE(program);
  auto cost = CostModel::for_device(s.cluster.device);
  const Topology topo = Topology::build(s.cluster, s.world);
  auto a = simulate(*program, topo, *cost, {Mode::full, true, {}});
  auto b = simulate(*program, topo, *cost, {Mode::full, true, {}});
  REQUIRE(a);
  REQUIRE(b);
  REQUIRE(a->spans.size() == b->spans.size());
  for (std::size_t i = 0; i < a->spans.size(); ++i) {
    CHECK(a->spans[i].op == b->spans[i].op);
    CHECK(a->spans[i].start == b->spans[i].start);
    CHECK(a->spans[i].end == b->spans[i].end);
  }
}

TEST_CASE("Synchronous pipeline communication holds the next compute until the sends have ended", "[sim]") {
  const ModelSpec m = megascope::test::gpt(8, 2048, 16, 1024, 2048);
  struct Run {
    double step = 0;
    int compute_during_send = 0;   // compute spans of rank 0 that start after a send of it and before that send ends
  };
  auto run = [&](const char* plan) {
    const Setup s = make_setup(m, "dgx-h100", plan, 8, 2, 2048);
    auto program = build_program(s);
    REQUIRE(program);
    auto cost = CostModel::for_device(s.cluster.device);
    REQUIRE(cost);
    auto r = simulate(*program, Topology::build(s.cluster, s.world), *cost, {Mode::full, true, {}});
    REQUIRE(r);
    const StageProgram& st = program->stages[0];
    std::map<std::uint32_t, Span> of_op;
    for (const Span& sp : r->spans)
      if (sp.rank == 0) of_op[sp.op] = sp;
    Run out{r->step_time_s, 0};
    for (const auto& [i, send] : of_op) {
      if (st.ops[i].kind != OpKind::send) continue;
      // The first compute with kernels after the send in the stage's list.
      for (std::uint32_t j = i + 1; j < st.ops.size(); ++j)
        if (st.ops[j].kind == OpKind::compute && st.ops[j].kernel_count > 0) {
          if (of_op.at(j).start < send.end - 1e-12) ++out.compute_during_send;
          break;
        }
    }
    return out;
  };
  const Run sync = run("tp=1,pp=2");                       // Megatron-LM's 1f1b: synchronous
  const Run overlapped = run("tp=1,pp=2,overlap_p2p_comm=on");
  CHECK(sync.compute_during_send == 0);
  CHECK(overlapped.compute_during_send > 0);   // the warm-up's next forward starts while the activation is on its way
  CHECK(sync.step > overlapped.step);
}

TEST_CASE("Synchronous pipeline communication never deadlocks: every schedule that has it, every shape", "[sim]") {
  // Includes the interleaved ranks whose forwards are all warm-up (m = pp):
  // their last forward is not paired with the backward after it.
  const auto run = [&](const std::string& plan, int batch, int pp, int vpp = 1) {
    INFO(plan << ", " << batch << " micro-batches");
    const Setup s = make_setup(megascope::test::gpt(2 * pp * vpp, 256, 4, 1024, 256), "dgx-h100", plan, batch, pp, 256);
    auto program = build_program(s);
    REQUIRE(program);
    auto cost = CostModel::for_device(s.cluster.device);
    auto r = simulate(*program, Topology::build(s.cluster, s.world), *cost, {Mode::full, false, {}});
    if (!r) FAIL(r.error().str());
    CHECK(r->step_time_s > 0);
  };
  for (int pp = 2; pp <= 5; ++pp) {
    for (int vpp = 2; vpp <= 3; ++vpp)
      for (int k = 1; k <= 3; ++k) {
        run(fmt::format("pp={},vpp={},schedule=interleaved,overlap_p2p_comm=off", pp, vpp), k * pp, pp, vpp);
        // Megatron-Core's default: synchronous warm-up and flush only.
        run(fmt::format("pp={},vpp={},schedule=interleaved", pp, vpp), k * pp, pp, vpp);
      }
    for (int batch = 1; batch <= 2 * pp + 1; ++batch) {
      run(fmt::format("pp={}", pp), batch, pp);
      run(fmt::format("pp={},schedule=gpipe", pp), batch, pp);
    }
  }
}

TEST_CASE("Interleaved warm-up and flush transfers waited for cost time, overlapped (warmup_flush) they hide", "[sim]") {
  // tp 8 fills a node: the pipeline's transfers cross InfiniBand.
  const auto step = [&](const std::string& flag) {
    const Setup s = make_setup(megascope::test::gpt(16, 4096, 32, 1024, 2048), "dgx-h100",
                               "tp=8,sp=on,pp=4,vpp=2,schedule=interleaved,overlap_p2p_warmup_flush=" + flag, 8, 32, 2048);
    auto program = build_program(s);
    REQUIRE(program);
    auto cost = CostModel::for_device(s.cluster.device);
    auto r = simulate(*program, Topology::build(s.cluster, s.world), *cost, {});
    REQUIRE(r);
    return r->step_time_s;
  };
  const double waited = step("off"), hidden = step("on");
  CHECK(waited > hidden);
  CHECK(waited < 1.2 * hidden);   // a few transfers' worth, not a different schedule
}

TEST_CASE("More micro-batches shrink the 1F1B bubble toward (p-1)/m on balanced stages", "[sim]") {
  // A tiny vocabulary keeps the embedding and output off the critical path, so
  // the four stages are equal and the idle time is the pipeline bubble.
  const ModelSpec m = megascope::test::gpt(32, 4096, 32, 1024, 2048);
  auto bubble = [&](int batch) {
    const Setup s = make_setup(m, "dgx-h100", "tp=1,pp=4", batch, 4, 2048);
    auto program = build_program(s);
    auto cost = CostModel::for_device(s.cluster.device);
    auto r = simulate(*program, Topology::build(s.cluster, s.world), *cost, {});
    return make_report(s, *program, *r).bubble_fraction;
  };
  const double b4 = bubble(4), b16 = bubble(16);
  CHECK(b16 < b4);
  // Ideal: (p-1)/(m+p-1) of the step; communication and unequal stages add a little.
  CHECK(b4 == Approx(3.0 / 7.0).margin(0.08));
  CHECK(b16 == Approx(3.0 / 19.0).margin(0.05));
}

TEST_CASE("The report does not depend on the order spans arrive in", "[sim]") {
  // Interleaved with tensor and pipeline parallelism: compute, TP, DP and PP
  // spans, some ending out of start order. Reordered a little (neighbours
  // swapped: the report's insertion sort) or wholly (reversed: past its
  // budget, the full sort), the report must not change at all.
  const Setup s = make_setup(shipped_model("llama3-8b"), "dgx-h100", "tp=2,pp=2,vpp=2,schedule=interleaved,dp=2", 8, 8, 2048);
  auto program = build_program(s);
  REQUIRE(program);
  auto cost = CostModel::for_device(s.cluster.device);
  auto r = simulate(*program, Topology::build(s.cluster, s.world), *cost, {});
  REQUIRE(r);
  REQUIRE(r->spans.size() > 1000);
  const SimReport base = make_report(s, *program, *r);
  const auto same = [&](const SimReport& other) {
    CHECK(other.bubble_fraction == base.bubble_fraction);
    CHECK(other.exposed_comm_s == base.exposed_comm_s);
    REQUIRE(other.stages.size() == base.stages.size());
    for (std::size_t i = 0; i < base.stages.size(); ++i) {
      CHECK(other.stages[i].compute_busy_s == base.stages[i].compute_busy_s);
      CHECK(other.stages[i].bubble_s == base.stages[i].bubble_s);
      CHECK(other.stages[i].exposed_comm_s == base.stages[i].exposed_comm_s);
    }
  };
  SimResult swapped = *r;
  for (std::size_t i = 0; i + 1 < swapped.spans.size(); i += 3) std::swap(swapped.spans[i], swapped.spans[i + 1]);
  same(make_report(s, *program, swapped));
  SimResult reversed = *r;
  std::reverse(reversed.spans.begin(), reversed.spans.end());
  same(make_report(s, *program, reversed));
  CHECK(base.bubble_fraction > 0);
}

TEST_CASE("The report from the engine's gathered activity equals the report from the spans", "[sim]") {
  // SimOptions::activity (the planner's stage 2: no spans) against the spans
  // (simulate's trace): every figure of the report equal, bit for bit, in
  // both modes, with streams and with serial execution, on plans with TP,
  // CP, DP, PP and their overlaps.
  struct Case {
    const char* model;
    const char* plan;
    int batch, gpus;
    Mode mode;
    Execution execution;
  };
  const Case cases[] = {
      {"llama3-8b", "tp=2,pp=2,vpp=2,schedule=interleaved,dp=2,sp=on,distopt=on,overlap_grad_reduce=on,overlap_param_gather=on",
       8, 8, Mode::reduced, Execution::streams},
      {"llama3-8b", "tp=2,pp=2,cp=2,sp=on,distopt=on,overlap_grad_reduce=on", 8, 8, Mode::full, Execution::streams},
      {"llama3-8b", "tp=2,pp=2,schedule=zb-h1", 8, 4, Mode::full, Execution::serial},
  };
  for (const Case& c : cases) {
    INFO(c.plan);
    const Setup s = make_setup(shipped_model(c.model), "dgx-h100", c.plan, c.batch, c.gpus, 2048);
    auto program = build_program(s);
    REQUIRE(program);
    auto cost = CostModel::for_device(s.cluster.device);
    const Topology topo = Topology::build(s.cluster, s.world);
    SimOptions with_spans{c.mode, true, {}, c.execution};
    SimOptions with_activity{c.mode, false, {}, c.execution};
    with_activity.activity = true;
    auto a = simulate(*program, topo, *cost, with_spans);
    auto b = simulate(*program, topo, *cost, with_activity);
    REQUIRE(a);
    REQUIRE(b);
    CHECK(a->activity.empty());
    CHECK(b->spans.empty());
    REQUIRE(b->activity.size() == b->traced_ranks.size());
    CHECK(b->step_time_s == a->step_time_s);
    const SimReport from_spans = make_report(s, *program, *a);
    const SimReport from_activity = make_report(s, *program, *b);
    const SimReport consumed = make_report(s, *program, std::move(*b));
    for (const SimReport* other : {&from_activity, &consumed}) {
      CHECK(other->bubble_fraction == from_spans.bubble_fraction);
      CHECK(other->exposed_comm_s == from_spans.exposed_comm_s);
      REQUIRE(other->stages.size() == from_spans.stages.size());
      for (std::size_t i = 0; i < from_spans.stages.size(); ++i) {
        CHECK(other->stages[i].rank == from_spans.stages[i].rank);
        CHECK(other->stages[i].compute_busy_s == from_spans.stages[i].compute_busy_s);
        CHECK(other->stages[i].bubble_s == from_spans.stages[i].bubble_s);
        CHECK(other->stages[i].exposed_comm_s == from_spans.stages[i].exposed_comm_s);
        CHECK(other->stages[i].compute_by_label_s == from_spans.stages[i].compute_by_label_s);
      }
    }
    CHECK(from_spans.stages.size() == b->traced_ranks.size());
    double exposed = 0;
    for (double e : from_spans.exposed_comm_s) exposed += e;
    CHECK(exposed > 0);   // the cases have communication to count
  }
}

TEST_CASE("The trace file is valid Chrome trace JSON with one event per span", "[sim]") {
  const Setup s = make_setup(shipped_model("llama3-8b"), "dgx-h100", "tp=2,pp=2", 4, 4, 2048);
  auto program = build_program(s);
  auto cost = CostModel::for_device(s.cluster.device);
  auto r = simulate(*program, Topology::build(s.cluster, s.world), *cost, {});
  REQUIRE(r);
  const std::string path = "megascope-test-trace.json";
  REQUIRE(write_trace(path, *program, *r));
  std::ifstream in(path);
  const auto j = nlohmann::json::parse(in);
  std::size_t complete = 0;
  for (const auto& e : j["traceEvents"]) complete += e["ph"] == "X";
  CHECK(complete == r->spans.size());

  // read_trace gives back every span with its op, rank, times and details.
  auto back = read_trace(path);
  REQUIRE(back);
  CHECK(back->info.source == TraceSource::simulated);
  CHECK(back->info.step_time_s == Approx(r->step_time_s).epsilon(1e-8));
  CHECK(back->ranks == r->traced_ranks);
  REQUIRE(back->spans.size() == r->spans.size());
  for (std::size_t i = 0; i < r->spans.size(); i += 97) {
    const Span& sp = r->spans[i];
    const TraceRecord& rec = back->spans[i];
    CHECK(rec.rank == sp.rank);
    CHECK(rec.op == sp.op);
    CHECK(rec.start_s == Approx(sp.start).margin(1e-9));
    CHECK(rec.end_s == Approx(sp.end).margin(2e-9));
    const Op& op = program->of_rank(sp.rank).ops[sp.op];
    CHECK(rec.label == to_string(op.label));
    CHECK(rec.stream == static_cast<int>(op.stream));
    CHECK(rec.microbatch == (op.microbatch ? std::optional<int>(*op.microbatch) : std::nullopt));
  }
  std::remove(path.c_str());

  // A file that is not a Megascope trace is refused with its name.
  { std::ofstream bad(path); bad << "{\"traceEvents\": []}"; }
  auto refused = read_trace(path);
  REQUIRE_FALSE(refused);
  CHECK_THAT(refused.error().str(), Catch::Contains(path) && Catch::Contains("not a Megascope trace"));
  std::remove(path.c_str());
}

namespace {

// Simulates a plan with one of the engine's shortcuts on and off, checks that
// the step time and every span agree to 1e-12 (spans matched by rank and
// op), and returns the events of both runs.
std::pair<std::uint64_t, std::uint64_t> same_spans(const char* model, const char* plan, int gpus, Mode mode,
                                                   bool SimOptions::*shortcut) {
  INFO(model << " " << plan << (mode == Mode::full ? " full" : " reduced"));
  const Setup s = make_setup(shipped_model(model), "dgx-h100", plan, 32, gpus, 2048);
  auto program = build_program(s);
  REQUIRE(program);
  auto cost = CostModel::for_device(s.cluster.device);
  REQUIRE(cost);
  const Topology topo = Topology::build(s.cluster, s.world);
  SimOptions on{mode, true, {}};
  SimOptions off = on;
  off.*shortcut = false;
  auto a = simulate(*program, topo, *cost, on);
  auto b = simulate(*program, topo, *cost, off);
  REQUIRE(a);
  REQUIRE(b);
  CHECK(a->step_time_s == Approx(b->step_time_s).epsilon(1e-12));
  std::map<std::pair<int, std::uint32_t>, std::pair<double, double>> spans;
  for (const Span& sp : b->spans) spans[{sp.rank, sp.op}] = {sp.start, sp.end};
  REQUIRE(a->spans.size() == spans.size());
  for (const Span& sp : a->spans) {
    const auto it = spans.find({sp.rank, sp.op});
    REQUIRE(it != spans.end());
    CHECK(sp.start == Approx(it->second.first).epsilon(1e-12));
    CHECK(sp.end == Approx(it->second.second).epsilon(1e-12));
  }
  return {a->events, b->events};
}

}  // namespace

TEST_CASE("Collectives alone on their links end when the network would end them", "[sim]") {
  // tp=8 fills a node: the TP groups' collectives have their NVLink ports to
  // themselves and end by formula; with tp=4 the DP pairs share those ports,
  // so nothing is alone. Either way every span equals the all-network run.
  struct Case {
    const char* plan;
    int gpus;
    bool expect_lone;
  };
  for (const Case c : {Case{"tp=8,pp=2,sp=on,distopt=on,overlap_grad_reduce=on", 16, true},
                       Case{"tp=8,pp=2,vpp=2,sp=on,tp_comm_overlap=on,schedule=interleaved", 16, true},
                       Case{"tp=4,pp=2,dp=2,sp=on,distopt=on,overlap_grad_reduce=on", 16, false}})
    for (const Mode mode : {Mode::full, Mode::reduced}) {
      const auto [on, off] = same_spans("llama3-8b", c.plan, c.gpus, mode, &SimOptions::lone_flows);
      if (c.expect_lone) CHECK(on < off);
      else CHECK(on == off);
    }
}

TEST_CASE("Transfers held while their links are idle end when the network would end them", "[sim]") {
  // Pipeline transfers between DP synchronisations, CP exchanges between TP
  // collectives, DP collectives with their NICs to themselves: held outside
  // the network until another flow comes onto one of their links, then
  // admitted as they would have started. Plans where transfers meet often
  // (TP and DP pairs on the same NVLink ports, CP beside TP, MoE all-to-all,
  // DualPipe's two directions) exercise the admission; every span must equal
  // the all-network run. `fewer`: in reduced mode the held run takes fewer
  // events. (In full mode the parallel transfers of a TP group's ranks end
  // at one time: one network event for all of them, one heap event each when
  // held; each is cheaper, and the count is no measure.)
  struct Case {
    const char* model;
    const char* plan;
    int gpus;
    bool fewer;
  };
  for (const Case c : {Case{"llama3-8b", "tp=4,pp=2,dp=2,sp=on,distopt=on,overlap_grad_reduce=on", 16, true},
                       Case{"llama3-8b", "tp=8,pp=2,cp=2,sp=on", 32, true},
                       Case{"llama3-8b", "tp=4,pp=2,cp=2,dp=2,sp=on,distopt=on,overlap_grad_reduce=on,overlap_param_gather=on", 32, true},
                       Case{"llama3-8b", "tp=8,pp=4,vpp=2,schedule=interleaved,sp=on,distopt=on,overlap_grad_reduce=on,"
                                         "overlap_param_gather=on", 32, true},
                       Case{"llama3-8b", "tp=8,pp=4,vpp=2,schedule=interleaved,sp=on,overlap_p2p_comm=off", 32, true},
                       Case{"llama3-8b", "tp=8,pp=4,schedule=zb-v,sp=on", 32, true},
                       Case{"llama3-8b", "tp=4,pp=4,dp=2,schedule=dualpipev,sp=on", 32, true},
                       Case{"mixtral-8x7b", "tp=2,pp=2,ep=4,sp=on", 16, true}})
    for (const Mode mode : {Mode::full, Mode::reduced}) {
      INFO(c.model << " " << c.plan << (mode == Mode::full ? " full" : " reduced"));
      const auto [on, off] = same_spans(c.model, c.plan, c.gpus, mode, &SimOptions::idle_flows);
      INFO(on << " events with held transfers, " << off << " without");
      if (mode == Mode::reduced && c.fewer) CHECK(on < off);
    }
}

TEST_CASE("Regions of local ops simulated as one event give every span of the op-by-op run", "[sim]") {
  // A region covers the compute ops and lone collectives that one op's end
  // lets start, forks and joins included (weight gradients beside a TP
  // collective, zero-bubble W ops, DualPipe's two directions); transfers end
  // it, and a lone collective with members to wait for is posted ahead (its
  // group launches it when its last member arrives). Every case must equal
  // the op-by-op run, span by span. `fold`: in reduced mode, where a TP group
  // filling a node has its collectives to itself, the op-by-op run takes at
  // least this many times the events; `full_fold`, the same in full mode,
  // where the group's eight members meet at each collective (0: only no more
  // events).
  struct Case {
    const char* model;
    const char* plan;
    int gpus;
    double fold, full_fold;
  };
  for (const Case c : {Case{"llama3-8b", "tp=8,pp=2,sp=on", 16, 10, 1.8},
                       Case{"llama3-8b", "tp=8,pp=2,vpp=2,schedule=interleaved,sp=on,tp_comm_overlap=on,distopt=on,"
                                         "overlap_grad_reduce=on,overlap_param_gather=on", 16, 10, 1.2},
                       Case{"llama3-8b", "tp=8,pp=4,schedule=zb-h1,recompute=full,recompute_method=uniform,recompute_layers=1", 32, 10, 5},
                       Case{"llama3-8b", "tp=8,pp=2,cp=2,sp=on", 32, 2, 1.4},
                       Case{"llama3-8b", "tp=4,pp=4,dp=2,schedule=dualpipev,sp=on", 32, 0, 0},
                       Case{"llama3-8b", "tp=8,pp=4,schedule=gpipe,sp=on", 32, 10, 1.8},
                       Case{"llama3-8b", "tp=8,pp=4,schedule=zb-v,sp=on", 32, 10, 1.6},
                       // In full mode the F&B units' two chains meet their TP groups in
                       // turn: fewer ops fold into one region.
                       Case{"llama3-8b", "tp=8,pp=4,schedule=dualpipe,sp=on", 32, 10, 1.2},
                       Case{"mixtral-8x7b", "tp=2,pp=2,ep=4,sp=on", 16, 0, 0},
                       Case{"llama3-8b", "tp=8,pp=4,vpp=2,schedule=interleaved,sp=on,recompute=selective,distopt=on", 32,
                            5, 1.8},
                       Case{"llama3-8b", "tp=8,pp=4,vpp=2,schedule=interleaved,sp=on,overlap_p2p_comm=off", 32, 0, 0}})
    for (const Mode mode : {Mode::full, Mode::reduced}) {
      const auto [on, off] = same_spans(c.model, c.plan, c.gpus, mode, &SimOptions::regions);
      INFO(c.plan << (mode == Mode::full ? " full: " : " reduced: ") << on << " events with regions, " << off << " without");
      CHECK(on <= off);
      const double fold = mode == Mode::reduced ? c.fold : c.full_fold;
      if (fold > 0) CHECK(static_cast<double>(on) * fold < static_cast<double>(off));
    }
}

TEST_CASE("A layer's ops stay one region when each compute op names the next and W runs beside a collective", "[sim]") {
  // Each compute op of an SP layer names the next compute op, which also waits
  // for the TP collective between them; with tp_grad_overlap the weight
  // gradients run beside the layer's last collective and the next layer waits
  // for both (a fork and a join). Neither ends the region: a pipeline stage's
  // micro-batch is one region from its receive to its send. (Chains of ops
  // that each let exactly one op start took twice the events with the
  // overlap; cutting a chain at an op waiting for another unravelled it one
  // op per pass.) Reduced mode: a TP group's collectives have no other
  // simulated member.
  for (const char* plan : {"tp=8,pp=2,sp=on,recompute=selective,tp_grad_overlap=off", "tp=8,pp=2,sp=on,recompute=selective"}) {
    INFO(plan);
    const auto [on, off] = same_spans("llama3-8b", plan, 16, Mode::reduced, &SimOptions::regions);
    INFO(on << " events with regions, " << off << " without");
    CHECK(on * 40 < off);
  }
}

TEST_CASE("A lone collective starting just after a network event ends the same with or without regions", "[sim]") {
  // Stage 0 sends A, computes, sends B, and runs a TP all-reduce after each
  // send (tp = 8 on a DGX node: the all-reduces are lone, and local in
  // reduced mode). When B's end falls within the network's event tolerance
  // (1e-12 relative) of A's, the network reports both at A's time but its
  // clock may run up to that tolerance ahead. A lone collective never
  // touches the network, so both the op-by-op path and a region price it
  // from the engine's clock; pricing one of them from the network's clock
  // made the all-reduces' spans differ by up to 1e-12 s on such sizes of B.
  const ClusterSpec cluster = *with_device_count(shipped_cluster("dgx-h100"), 16);
  const Topology topo = Topology::build(cluster, 16);
  const CostModel cost = unit_cost();
  const double pa = 8e6, pause = 1e-5;
  const auto make = [&](double pb) {
    Program p;
    p.grid = RankGrid{8, 1, 1, 2, 1, 1, 1};
    p.stages.resize(2);
    p.stages[0].stage = 0;
    p.stages[1].stage = 1;
    detail::OpContext ctx;
    detail::StageWriter w0(p.stages[0]), w1(p.stages[1]);
    const auto a = w0.p2p(OpKind::send, OpLabel::pp_activation, ctx, 1, 1, pa);
    w1.p2p(OpKind::recv, OpLabel::pp_activation, ctx, 0, 1, pa);
    const auto c = w0.compute(OpLabel::mlp, ctx, {seconds(pause)});
    const auto b = w0.p2p(OpKind::send, OpLabel::pp_activation, ctx, 1, 2, pb, {c});
    w0.collective(OpKind::all_reduce, Stream::tp, CommGroup::tp, OpLabel::tp_comm, ctx, 4e6, {b});
    w1.p2p(OpKind::recv, OpLabel::pp_activation, ctx, 0, 2, pb);
    w0.collective(OpKind::all_reduce, Stream::tp, CommGroup::tp, OpLabel::tp_comm, ctx, 4e6, {a});
    return p;
  };
  // B's size at which the two sends end together (bisection on B's end - A's end).
  const auto gap = [&](double pb) {
    auto r = simulate(make(pb), topo, cost, {Mode::reduced, true, {}});
    REQUIRE(r);
    return span_of(*r, 0, 2).end - span_of(*r, 0, 0).end;
  };
  double lo = 1e6, hi = 16e6;
  REQUIRE(gap(lo) < 0);
  REQUIRE(gap(hi) > 0);
  for (int it = 0; it < 200; ++it) (gap(0.5 * (lo + hi)) < 0 ? lo : hi) = 0.5 * (lo + hi);
  int compared = 0;
  for (int k = -200; k <= 400; ++k) {
    const Program p = make(lo + k * 0.002);
    SimOptions on{Mode::reduced, true, {}};
    SimOptions off = on;
    off.regions = false;
    auto with = simulate(p, topo, cost, on);
    auto without = simulate(p, topo, cost, off);
    REQUIRE(with);
    REQUIRE(without);
    REQUIRE(with->spans.size() == without->spans.size());
    for (const Span& sp : with->spans) {
      const Span other = span_of(*without, sp.rank, sp.op);
      INFO("B = " << lo + k * 0.002 << " bytes, rank " << sp.rank << " op " << sp.op);
      CHECK(sp.start == other.start);
      CHECK(sp.end == other.end);
      ++compared;
    }
  }
  CHECK(compared == 601 * 7);
}
