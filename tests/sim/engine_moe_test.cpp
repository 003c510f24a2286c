// The engine on MoE and MTP programs: the EP all-to-alls hidden behind
// compute (shared experts beside them, DualPipe's F&B units, combined 1F1B),
// the flex dispatcher's cross-node bytes, and the MTP layers' work; the same
// work in a shorter step, and the same step in full and reduced mode.
#include <catch2/catch.hpp>

#include "core/program/builder.hpp"
#include "sim/engine.hpp"
#include "sim/report.hpp"
#include "engine_support.hpp"
#include "support.hpp"

using namespace megascope;
using namespace megascope::sim;
using megascope::test::make_setup;
using megascope::test::shipped_model;

namespace {

// The step time of a setup's Program in one mode, with the setup's cluster
// and its device's shipped cost profile.
double step_time(const Setup& s, const Program& p, Mode mode) {
  auto cost = CostModel::for_device(s.cluster.device);
  REQUIRE(cost);
  auto r = simulate(p, Topology::build(s.cluster, s.world), *cost, {mode, false, {}});
  REQUIRE(r);
  return r->step_time_s;
}

struct StepAndEp {
  double step_s = 0, ep_exposed_s = 0;
};
StepAndEp reduced_step_and_ep(const Setup& s, const Program& p) {
  auto cost = CostModel::for_device(s.cluster.device);
  REQUIRE(cost);
  auto r = simulate(p, Topology::build(s.cluster, s.world), *cost, {Mode::reduced, true, {}});
  REQUIRE(r);
  const double step = r->step_time_s;
  return {step, make_report(s, p, std::move(*r)).exposed_comm_s[static_cast<std::size_t>(CommKind::ep)]};
}

}  // namespace

TEST_CASE("Shared experts overlapped with the EP all-to-alls do the same work in a shorter step", "[sim]") {
  ModelSpec m = shipped_model("mixtral-8x7b");
  m.num_layers = 4;
  m.moe->moe_layers.assign(4, true);
  m.moe->shared_expert_ffn_hidden = 4096;
  for (const char* plan : {"tp=1,ep=8", "tp=2,sp=on,ep=4", "tp=2,sp=on,ep=4,tp_comm_overlap=on",
                           "tp=2,sp=on,ep=2,etp=1,cp=2", "tp=2,sp=on,ep=4,pp=2,schedule=zb-v",
                           "tp=1,ep=8,pp=2,schedule=dualpipev",
                           "tp=2,sp=on,ep=4,pp=2,recompute=full,recompute_method=uniform,recompute_layers=1"}) {
    INFO(plan);
    const Setup off = make_setup(m, "dgx-h100", plan, 64, 16, 4096);
    const Setup on = make_setup(m, "dgx-h100", std::string(plan) + ",moe_shared_expert_overlap=on", 64, 16, 4096);
    CHECK(on.warnings.empty());
    auto p_off = build_program(off), p_on = build_program(on);
    REQUIRE(p_off);
    REQUIRE(p_on);
    const auto flops = [](const Program& p) {
      double f = 0;
      for (const StageProgram& st : p.stages)
        for (const Op& op : st.ops) f += op.flops;
      return f;
    };
    CHECK(flops(*p_on) == Approx(flops(*p_off)).epsilon(1e-12));
    const double on_reduced = step_time(on, *p_on, Mode::reduced);
    CHECK(on_reduced < step_time(off, *p_off, Mode::reduced));
    CHECK(step_time(on, *p_on, Mode::full) == Approx(on_reduced).epsilon(1e-9));
  }
  // Without shared experts, or without an all-to-all, the flag changes nothing and says so.
  const Setup none = make_setup(shipped_model("mixtral-8x7b"), "dgx-h100", "tp=1,ep=8,moe_shared_expert_overlap=on", 16,
                                16, 4096);
  REQUIRE(none.warnings.size() == 1);
  CHECK_THAT(none.warnings[0], Catch::Contains("no shared experts"));
  const Setup no_ep = make_setup(m, "dgx-h100", "tp=1,moe_shared_expert_overlap=on", 16, 16, 4096);
  REQUIRE(no_ep.warnings.size() == 1);
  CHECK_THAT(no_ep.warnings[0], Catch::Contains("without expert parallelism"));
}

TEST_CASE("MTP layers lengthen the last stage's work and the step, the same in full and reduced mode", "[sim]") {
  ModelSpec m = shipped_model("deepseek-v3");
  m.num_layers = 8;
  m.moe->moe_layers = {false, true, true, true, true, true, true, true};
  const auto step_of = [&](int depth, const char* plan) {
    ModelSpec mm = m;
    mm.mtp_num_layers = depth;
    const Setup s = make_setup(mm, "dgx-h100", plan, 64, 32, 4096);
    auto p = build_program(s);
    REQUIRE(p);
    const double reduced = step_time(s, *p, Mode::reduced);
    CHECK(step_time(s, *p, Mode::full) == Approx(reduced).epsilon(1e-9));
    return reduced;
  };
  for (const char* plan : {"tp=2,pp=2,ep=8,etp=1,sp=on", "tp=1,pp=2,ep=8,schedule=dualpipev"}) {
    INFO(plan);
    const double none = step_of(0, plan), one = step_of(1, plan);
    CHECK(one > none);
    CHECK(step_of(2, plan) > one);
  }
}

TEST_CASE("DualPipe's interleaved F&B units hide all-to-all time behind the other chain's compute", "[sim]") {
  // The same Program with the units' forward and backward one after the
  // other (BuildOptions{false}) against interleaved: the EP all-to-alls of
  // one chain run while the other computes, so less of them is exposed and
  // the step is shorter, in both modes alike, given enough micro-batches
  // (32 and 64 here): each unit also sends its forward's output later, when
  // the interleaved forward ends, which costs more than it hides when the
  // warm-up and cool-down dominate (at m = 2 pp the first plan's step is 2.5%
  // longer).
  for (const char* plan : {"tp=1,ep=8,pp=4,schedule=dualpipev", "tp=2,sp=on,ep=4,pp=4,schedule=dualpipe"}) {
    INFO(plan);
    const Setup s = make_setup(shipped_model("mixtral-8x7b"), "dgx-h100", plan, 512, 64, 4096);
    auto on = build_program(s);
    auto off = build_program(s, BuildOptions{false});
    REQUIRE(on);
    REQUIRE(off);
    const StepAndEp a = reduced_step_and_ep(s, *on), b = reduced_step_and_ep(s, *off);
    INFO("ep exposed " << a.ep_exposed_s << " s against " << b.ep_exposed_s << " s");
    CHECK(a.ep_exposed_s < 0.7 * b.ep_exposed_s);
    CHECK(a.step_s < b.step_s);
    CHECK(step_time(s, *on, Mode::full) == Approx(a.step_s).epsilon(1e-9));
  }
}

TEST_CASE("The flex dispatcher moves fewer bytes across nodes than alltoall: less exposed EP time, the same in both modes",
          "[sim]") {
  // DeepSeek-V3's routing (256 experts, top-8 within 4 of 8 groups) on 8
  // layers, EP 32 over four nodes: alltoall sends 8 copies of a token, 6 of
  // them off its node on average; flex one per other node holding any of its
  // experts (fewer than 3), then the NVLink hop.
  ModelSpec m = shipped_model("deepseek-v3");
  m.num_layers = 8;
  m.mtp_num_layers = 0;
  m.moe->moe_layers = {false, true, true, true, true, true, true, true};
  StepAndEp r[2];
  for (int flex = 0; flex < 2; ++flex) {
    const std::string plan = std::string("tp=1,pp=2,ep=32,distopt=on,moe_dispatcher=") + (flex ? "flex" : "alltoall");
    INFO(plan);
    const Setup s = make_setup(m, "dgx-h100", plan, 64, 64, 4096);
    auto p = build_program(s);
    REQUIRE(p);
    r[flex] = reduced_step_and_ep(s, *p);
    CHECK(step_time(s, *p, Mode::full) == Approx(r[flex].step_s).epsilon(1e-9));
  }
  INFO("alltoall " << r[0].step_s << " s (EP exposed " << r[0].ep_exposed_s << " s), flex " << r[1].step_s << " s ("
                   << r[1].ep_exposed_s << " s)");
  CHECK(r[1].ep_exposed_s < 0.7 * r[0].ep_exposed_s);
  CHECK(r[1].step_s < r[0].step_s);
}

TEST_CASE("EP all-to-all overlap (combined 1F1B) does the same work in a shorter step when the all-to-alls are exposed",
          "[sim]") {
  ModelSpec m = shipped_model("mixtral-8x7b");
  m.num_layers = 4;
  m.moe->moe_layers.assign(4, true);
  m.moe->num_experts = 16;
  // EP 16 over two DGX H100 nodes: the all-to-alls cross InfiniBand.
  for (const auto& [plan, gpus] : {std::pair{"tp=1,ep=16", 16}, std::pair{"tp=1,ep=16,pp=2,vpp=2,schedule=interleaved", 32}}) {
    INFO(plan);
    const Setup off = make_setup(m, "dgx-h100", plan, 64, gpus, 4096);
    const Setup on = make_setup(m, "dgx-h100", std::string(plan) + ",moe_ep_overlap=on", 64, gpus, 4096);
    auto p_off = build_program(off), p_on = build_program(on);
    REQUIRE(p_off);
    REQUIRE(p_on);
    std::size_t ops_off = 0, ops_on = 0;
    double f_off = 0, f_on = 0;
    for (const StageProgram& st : p_off->stages)
      for (const Op& op : st.ops) f_off += op.flops, ++ops_off;
    for (const StageProgram& st : p_on->stages)
      for (const Op& op : st.ops) f_on += op.flops, ++ops_on;
    CHECK(ops_on == ops_off);   // the same ops, reordered
    CHECK(f_on == Approx(f_off).epsilon(1e-12));
    const double t_off = step_time(off, *p_off, Mode::reduced), t_on = step_time(on, *p_on, Mode::reduced);
    CHECK(t_on < 0.97 * t_off);
  }
}

TEST_CASE("Recomputed submodules lengthen the step by about their forward time, the whole MoE block most", "[sim]") {
  ModelSpec m = shipped_model("deepseek-v3");
  m.num_layers = 6;   // three dense layers, three MoE ones
  m.mtp_num_layers = 0;
  m.moe->moe_layers = {false, false, false, true, true, true};
  const std::string plan = "tp=1,ep=8,recompute=selective";
  const auto step = [&](const std::string& modules) {
    const Setup s = make_setup(m, "dgx-h100", plan + modules, 16, 8);
    auto p = build_program(s);
    REQUIRE(p);
    return step_time(s, *p, Mode::reduced);
  };
  const double base = step("");
  const double mlp = step(",recompute_modules=core_attn+mlp");
  const double shared = step(",recompute_modules=core_attn+shared_experts");
  const double moe = step(",recompute_modules=core_attn+moe");
  CHECK(mlp > base);
  CHECK(shared > base);
  CHECK(moe > shared);   // the routed experts and both all-to-alls again, beside the shared experts
  // Recomputing a forward costs less than the forward and backward it adds
  // to: below a third of the step per recomputed block here.
  CHECK(moe < base * 4.0 / 3.0);
}
