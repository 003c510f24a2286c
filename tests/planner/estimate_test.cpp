// Stage 1 against the exact models: memory equals memory_report() on every
// plan of small spaces and on samples of shipped models; collective curves
// equal the simulator's isolated times; the closed-form time follows the
// simulator on a sample of plans.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "config/plan_settings.hpp"
#include "core/accounting/memory.hpp"
#include "core/program/builder.hpp"
#include "planner/estimate.hpp"
#include "sim/engine.hpp"
#include "sim/network.hpp"
#include "small_models.hpp"
#include "support.hpp"

using namespace megascope;
using namespace megascope::planner;

namespace {

SearchInputs inputs(const ModelSpec& m, const std::string& cluster, int gpus, std::int64_t batch) {
  SearchInputs in;
  in.model = m;
  in.cluster = *with_device_count(test::shipped_cluster(cluster), gpus);
  in.training.global_batch_size = batch;
  in.gpu_counts = {gpus};
  in.constraints.max_mbs = 4;
  in.constraints.schedules = {Schedule::gpipe, Schedule::one_f_one_b, Schedule::interleaved, Schedule::zb_h1,
                              Schedule::zb_v,  Schedule::dualpipe,     Schedule::dualpipev};
  return in;
}

// Checks stage-1 memory against memory_report on every `stride`-th plan; returns how many were checked.
int check_memory(const SearchInputs& in, int stride) {
  auto cost = sim::CostModel::for_device(in.cluster.device);
  REQUIRE(cost);
  Estimator est(in, *cost);
  Rejections rej;
  int i = 0, checked = 0;
  enumerate(in, rej, [&](const Candidate& c) {
    if (i++ % stride != 0) return;
    const PlanSpec p = to_plan(c);
    INFO(format_inline_plan(p));
    auto s = validate_setup(in.model, in.cluster, in.training, p, c.gpus);
    REQUIRE(s);
    const MemoryReport ref = memory_report(*s);
    auto e = est.memory(c);
    REQUIRE(e);
    CHECK(e->peak_bytes == Approx(ref.peak_bytes).epsilon(1e-12));
    CHECK(e->peak_stage == ref.peak_stage);
    CHECK(e->fits == (ref.peak_bytes + in.constraints.headroom_bytes <= ref.capacity_bytes));
    ++checked;
  });
  return checked;
}

}  // namespace

TEST_CASE("Stage-1 memory equals memory_report on every plan of a small dense space") {
  CHECK(check_memory(inputs(test::small_gpt(), "dgx-h100", 16, 16), 1) > 1000);
}

TEST_CASE("Stage-1 memory equals memory_report with the precision-aware optimizer (bf16 moments, fp16 master weights)") {
  SearchInputs in = inputs(test::small_moe(), "dgx-h100", 8, 16);
  OptimizerPrecision& op = in.training.optimizer_precision;
  op.enabled = true;
  op.exp_avg = Dtype::bf16;
  op.exp_avg_sq = Dtype::fp8;
  op.main_params = Dtype::fp16;
  in.training.grad_dtype = Dtype::bf16;
  CHECK(check_memory(in, 1) > 200);
}

TEST_CASE("Stage-1 memory equals memory_report on every plan of a small MoE space with a dense first layer") {
  CHECK(check_memory(inputs(test::small_moe(), "dgx-h100", 8, 16), 1) > 500);
}

TEST_CASE("Stage-1 memory equals memory_report on samples of shipped models (GPT-3, Llama 3 GQA, DeepSeek-V3 MLA+MTP)") {
  CHECK(check_memory(inputs(test::shipped_model("gpt3-175b"), "dgx-a100", 256, 512), 97) > 100);
  CHECK(check_memory(inputs(test::shipped_model("llama3-70b"), "dgx-h100", 128, 256), 89) > 100);
  // 61 layers: pp = 1 splits evenly; pp = 4 only unevenly (first/last stages lighter).
  SearchInputs ds = inputs(test::shipped_model("deepseek-v3"), "dgx-h100", 256, 512);
  ds.constraints.pp = {{1}, {}, {}};
  CHECK(check_memory(ds, 7) > 50);
  ds.constraints.pp = {{4}, {}, {}};
  ds.constraints.schedules = {Schedule::one_f_one_b};
  CHECK(check_memory(ds, 13) > 50);
}

TEST_CASE("Stage-1 memory equals memory_report with more than 8 virtual stages per rank") {
  // 80 layers on pp = 2: vpp up to 40 chunks per rank (the in-flight table grows with them).
  SearchInputs in = inputs(test::shipped_model("llama3-70b"), "dgx-h100", 16, 32);
  in.constraints.pp = {{2}, {}, {}};
  in.constraints.vpp = {{10, 20, 40}, {}, {}};
  in.constraints.schedules = {Schedule::interleaved};
  in.constraints.recompute = {RecomputeGranularity::none, RecomputeGranularity::selective};
  CHECK(check_memory(in, 1) > 20);
}

TEST_CASE("Stage-1 memory equals memory_report on every plan with uneven first/last stages") {
  SearchInputs in = inputs(test::small_gpt(), "dgx-h100", 16, 16);
  in.constraints.uneven = UnevenStages::on;
  in.constraints.pp = {{2, 4}, {}, {}};
  int uneven = 0;
  Rejections rej;
  enumerate(in, rej, [&](const Candidate& c) { uneven += c.first_layers > 0; });
  CHECK(uneven > 500);
  CHECK(check_memory(in, 1) > uneven);
}

TEST_CASE("Stage-1 memory equals memory_report on DualPipe plans with uneven first/last stages") {
  SearchInputs in = inputs(test::small_gpt(), "dgx-h100", 16, 16);
  in.constraints.uneven = UnevenStages::on;
  in.constraints.schedules = {Schedule::dualpipe};
  in.constraints.pp = {{2, 4}, {}, {}};
  int uneven = 0;
  Rejections rej;
  enumerate(in, rej, [&](const Candidate& c) { uneven += c.first_layers > 0 || c.last_layers > 0; });
  CHECK(uneven > 50);
  CHECK(check_memory(in, 1) > uneven);
}

TEST_CASE("A collective curve gives exactly the simulator's isolated time at every size, from its undominated lines") {
  const ClusterSpec cl = *with_device_count(test::shipped_cluster("dgx-a100"), 64);
  const sim::Topology topo = sim::Topology::build(cl, 64);
  const std::vector<std::vector<int>> groups = {{0, 1, 2, 3, 4, 5, 6, 7}, {0, 8, 16, 24, 32, 40, 48, 56}, {0, 2}, {3, 40}};
  for (const auto& g : groups)
    for (sim::Collective c : {sim::Collective::all_reduce, sim::Collective::reduce_scatter, sim::Collective::all_gather,
                              sim::Collective::all_to_all, sim::Collective::send_recv}) {
      if (c == sim::Collective::send_recv && g.size() != 2) continue;
      const sim::CollectiveCurve curve = sim::collective_curve(topo, c, g);
      for (double bytes = 1; bytes < 1e11; bytes *= 3.7) {
        INFO(g.size() << " ranks, collective " << static_cast<int>(c) << ", " << bytes << " bytes");
        CHECK(curve.at(bytes) == Approx(sim::isolated_time(topo, sim::collective_flow(topo, c, g, bytes))).epsilon(1e-12));
      }
      CHECK(curve.at(0) == 0);
      // Only lines that can give the minimum are kept: none is no better
      // than another in both latency and time per byte.
      for (std::size_t i = 0; i < curve.lines.size(); ++i)
        for (std::size_t j = 0; j < curve.lines.size(); ++j)
          if (i != j)
            CHECK_FALSE((curve.lines[j].first <= curve.lines[i].first && curve.lines[j].second <= curve.lines[i].second));
    }
}

namespace {

// Stage 1's step time against the simulator's on the candidates `pick`
// keeps (those that fit); checks a median |error| under 10% and a worst
// under `worst` (35% by default) over at least `at_least` plans, and prints both.
template <class Pick>
void check_stage1_time(const SearchInputs& in, int gpus, std::size_t at_least, const char* what, Pick pick,
                       double worst = 0.35) {
  auto cost = sim::CostModel::for_device(in.cluster.device);
  REQUIRE(cost);
  Estimator est(in, *cost);
  Rejections rej;
  std::vector<double> abs_err;
  const sim::Topology topo = sim::Topology::build(in.cluster, gpus);
  enumerate(in, rej, [&](const Candidate& c) {
    if (!pick(c)) return;
    auto e = est.evaluate(c);
    REQUIRE(e);
    if (!e->fits) return;
    const PlanSpec p = to_plan(c);
    INFO(format_inline_plan(p));
    auto s = validate_setup(in.model, in.cluster, in.training, p, c.gpus);
    REQUIRE(s);
    auto prog = build_program(*s);
    REQUIRE(prog);
    sim::SimOptions so;
    so.record_trace = false;
    auto r = sim::simulate(*prog, topo, *cost, so);
    REQUIRE(r);
    abs_err.push_back(std::abs(e->step_s / r->step_time_s - 1));
  });
  REQUIRE(abs_err.size() >= at_least);
  std::sort(abs_err.begin(), abs_err.end());
  const double median = abs_err[abs_err.size() / 2];
  WARN("stage 1 vs simulator on " << abs_err.size() << " " << what << ": median |error| " << 100 * median
                                  << "%, worst " << 100 * abs_err.back() << "%");
  CHECK(median < 0.10);
  CHECK(abs_err.back() < worst);
}

}  // namespace

TEST_CASE("Stage-1 time follows the simulator on a sample of GPT-3 175B plans on 256 A100s") {
  SearchInputs in = inputs(test::shipped_model("gpt3-175b"), "dgx-a100", 256, 512);
  in.constraints.schedules = {Schedule::one_f_one_b, Schedule::interleaved};
  in.constraints.mbs = {{1, 2}, {}, {}};
  in.constraints.recompute_modules = false;   // the next test samples the module sets
  int i = 0;
  check_stage1_time(in, 256, 15, "plans", [&](const Candidate& c) { return i++ % 997 == 0 && c.pp <= 16; });
}

TEST_CASE("Stage-1 time follows the simulator on selective plans with recompute module sets (GPT-3 175B on 256 A100s, "
          "Mixtral on 64 H100s)") {
  // Every `stride`-th module plan (selective, a set other than core_attn) of 1F1B and interleaved, micro-batch 1-2.
  const auto sample = [](const char* model, const char* cluster, int gpus, std::int64_t batch, int stride, const char* what) {
    SearchInputs in = inputs(test::shipped_model(model), cluster, gpus, batch);
    in.constraints.schedules = {Schedule::one_f_one_b, Schedule::interleaved};
    in.constraints.mbs = {{1, 2}, {}, {}};
    in.constraints.pp = {{}, {}, 16};
    in.constraints.recompute = {RecomputeGranularity::selective};
    in.constraints.zero = {0, 1};   // the ZeRO-2/3 samples are the [zero] tests'
    int i = 0;
    check_stage1_time(in, gpus, 15, what, [&](const Candidate& c) { return c.recompute_modules != 0 && i++ % stride == 0; });
  };
  sample("gpt3-175b", "dgx-a100", 256, 512, 97, "GPT-3 module plans");
  sample("mixtral-8x7b", "dgx-h100", 64, 128, 1999, "Mixtral module plans");
}

TEST_CASE("Stage-1 time follows the simulator on a model with sliding-window and full layers (gpt-oss-120b, 64 H100s)") {
  SearchInputs in = inputs(test::shipped_model("gpt-oss-120b"), "dgx-h100", 64, 256);
  in.constraints.schedules = {Schedule::one_f_one_b, Schedule::interleaved};
  in.constraints.mbs = {{1}, {}, {}};
  in.constraints.recompute_modules = false;
  in.constraints.zero = {0, 1};   // the ZeRO-2/3 samples are the [zero] tests'
  int i = 0;
  check_stage1_time(in, 64, 10, "gpt-oss plans", [&](const Candidate& c) { return c.ep > 1 && i++ % 97 == 0; });
}

TEST_CASE("Stage-1 time follows the simulator on plans with uneven first/last stages (Llama 3 70B, 128 H100s)") {
  SearchInputs in = inputs(test::shipped_model("llama3-70b"), "dgx-h100", 128, 256);
  in.constraints.schedules = {Schedule::one_f_one_b, Schedule::interleaved};
  in.constraints.mbs = {{1}, {}, {}};
  in.constraints.pp = {{2, 4, 8}, {}, {}};
  in.constraints.uneven = UnevenStages::on;
  in.constraints.recompute_modules = false;   // sampled apart
  int i = 0;
  check_stage1_time(in, 128, 10, "uneven plans",
                    [&](const Candidate& c) { return c.first_layers > 0 && i++ % 1499 == 0; });
}

TEST_CASE("Stage-1 time follows the simulator on DualPipe plans of an MoE model, F&B units interleaved, uneven stages too (Mixtral, 64 H100s)") {
  SearchInputs in = inputs(test::shipped_model("mixtral-8x7b"), "dgx-h100", 64, 512);
  in.constraints.schedules = {Schedule::dualpipe, Schedule::dualpipev};
  in.constraints.mbs = {{1, 2}, {}, {}};
  in.constraints.uneven = UnevenStages::on;   // DualPipe's uneven splits among them
  in.constraints.recompute_modules = false;   // sampled apart
  int i = 0;
  check_stage1_time(in, 64, 10, "DualPipe plans", [&](const Candidate& c) { return c.ep > 1 && i++ % 4999 == 0; });
}

TEST_CASE("Stage-1 times do not depend on the order plans are evaluated in (tied embeddings, one stage or two)") {
  // Tied word tables share one gradient only when one stage holds both, so
  // the edge ops of pp = 1 and pp = 2 plans differ although the layer-time
  // cache's other fields match.
  ModelSpec m = test::small_gpt();
  m.tied_embeddings = true;
  const SearchInputs in = inputs(m, "dgx-a100", 8, 16);
  auto cost = sim::CostModel::for_device(in.cluster.device);
  REQUIRE(cost);
  const auto candidate = [&](const char* plan) {
    auto p = parse_inline_plan(plan);
    REQUIRE(p);
    auto c = from_plan(*p, 8, 8 / (p->tp * p->pp));
    REQUIRE(c);
    return *c;
  };
  const Candidate one = candidate("tp=2,pp=1"), two = candidate("tp=2,pp=2");
  Estimator alone_one(in, *cost), alone_two(in, *cost), both(in, *cost);
  auto a1 = alone_one.evaluate(one);
  auto a2 = alone_two.evaluate(two);
  auto b2 = both.evaluate(two);   // fills the cache first
  auto b1 = both.evaluate(one);
  REQUIRE(a1);
  REQUIRE(a2);
  REQUIRE(b1);
  REQUIRE(b2);
  CHECK(b1->step_s == a1->step_s);
  CHECK(b2->step_s == a2->step_s);
}

TEST_CASE("Stage-1 times do not depend on the order plans are evaluated in (recomputation variants share probes)") {
  // The layer-time cache probes a layer's forward, weight-gradient and edge
  // ops once for every recomputation of otherwise equal plans, and the
  // input-gradient op once per selective module set: each plan alone, and
  // all in one estimator in either order, must give the same times.
  const auto check = [](const char* model, int gpus, const char* split, const std::vector<std::string>& variants) {
    const SearchInputs in = inputs(test::shipped_model(model), "dgx-h100", gpus, 256);
    auto cost = sim::CostModel::for_device(in.cluster.device);
    REQUIRE(cost);
    std::vector<Candidate> cs;
    for (const std::string& v : variants) {
      auto p = parse_inline_plan(std::string(split) + v);
      REQUIRE(p);
      auto c = from_plan(*p, gpus, gpus / (p->tp * p->pp * p->cp));
      REQUIRE(c);
      cs.push_back(*c);
    }
    std::vector<Estimate> alone;
    for (const Candidate& c : cs) {
      Estimator e(in, *cost);
      auto r = e.evaluate(c);
      INFO(model << " " << format_inline_plan(to_plan(c)) << ": " << (r ? "" : r.error().message));
      REQUIRE(r);
      alone.push_back(*r);
    }
    for (const bool reverse : {false, true}) {
      Estimator shared(in, *cost);
      for (std::size_t k = 0; k < cs.size(); ++k) {
        const std::size_t i = reverse ? cs.size() - 1 - k : k;
        INFO(model << " " << split << variants[i] << (reverse ? " (reverse order)" : ""));
        auto r = shared.evaluate(cs[i]);
        REQUIRE(r);
        CHECK(r->step_s == alone[i].step_s);
        CHECK(r->pipeline_s == alone[i].pipeline_s);
        CHECK(r->bubble_s == alone[i].bubble_s);
      }
    }
    // The module sets are timed apart: each recomputes other kernels.
    for (std::size_t i = 2; i < cs.size(); ++i)
      for (std::size_t j = i + 1; j < cs.size(); ++j) {
        INFO(variants[i] << " vs " << variants[j]);
        CHECK(alone[i].pipeline_s != alone[j].pipeline_s);
      }
  };
  check("mixtral-8x7b", 64, "tp=2,pp=4,ep=8,sp=on,mbs=1",
        {"", ",recompute=full,recompute_method=uniform,recompute_layers=1", ",recompute=selective",
         ",recompute=selective,recompute_modules=layernorm", ",recompute=selective,recompute_modules=moe_act",
         ",recompute=selective,recompute_modules=layernorm+moe_act"});
  // DualPipe: the F&B pair's probe holds the input-gradient op, so it is per set too.
  check("mixtral-8x7b", 64, "tp=2,pp=4,ep=8,sp=on,mbs=1,schedule=dualpipev",
        {"", ",recompute=full,recompute_method=uniform,recompute_layers=1", ",recompute=selective",
         ",recompute=selective,recompute_modules=layernorm", ",recompute=selective,recompute_modules=layernorm+moe_act"});
  check("deepseek-v3", 64, "tp=2,ep=8,sp=on,mbs=1",
        {"", ",recompute=full,recompute_method=uniform,recompute_layers=1", ",recompute=selective",
         ",recompute=selective,recompute_modules=mla_up_proj", ",recompute=selective,recompute_modules=layernorm+mla_up_proj+moe_act"});
}

TEST_CASE("A plan whose pipeline overlap is not its schedule's default is no search candidate") {
  // Stage 1 prices each schedule's default (synchronous 1f1b, overlapped
  // interleaved); another setting would be estimated as a different plan.
  const auto candidate = [](const char* plan) {
    auto p = parse_inline_plan(plan);
    REQUIRE(p);
    return from_plan(*p, 8, 8 / (p->tp * p->pp));
  };
  CHECK(candidate("tp=2,pp=2").has_value());
  CHECK(candidate("tp=2,pp=2,overlap_p2p_comm=off").has_value());   // the default, spelled out
  CHECK_FALSE(candidate("tp=2,pp=2,overlap_p2p_comm=on").has_value());
  CHECK(candidate("tp=2,pp=2,vpp=2,schedule=interleaved").has_value());
  CHECK_FALSE(candidate("tp=2,pp=2,vpp=2,schedule=interleaved,overlap_p2p_comm=off").has_value());
  CHECK(candidate("tp=2,pp=1,overlap_p2p_comm=on").has_value());     // no pipeline: nothing to overlap
}

namespace {

// evaluate(c, fit_bound, reject_bound) against evaluate(c) on every
// `stride`-th plan, each at several bounds around its own time: a bounded
// estimate's step is a lower bound of the full one and exceeds the bound
// that applies (fits or not); an estimate that is not bounded equals the full
// one exactly. Returns how many of the checks were bounded.
int check_bounds(const SearchInputs& in, int stride) {
  auto cost = sim::CostModel::for_device(in.cluster.device);
  REQUIRE(cost);
  Estimator est(in, *cost), bounded(in, *cost);
  Rejections rej;
  int i = 0, hits = 0, checks = 0;
  enumerate(in, rej, [&](const Candidate& c) {
    if (i++ % stride != 0) return;
    INFO(format_inline_plan(to_plan(c)));
    auto full = est.evaluate(c);
    REQUIRE(full);
    CHECK_FALSE(full->bounded);
    for (const double f : {0.0, 0.5, 0.9, 0.99, 1.0, 2.0}) {
      const double bound = f * full->step_s;
      // The bound that does not apply is 0: it must not be the one used.
      auto e = full->fits ? bounded.evaluate(c, bound, 0.0) : bounded.evaluate(c, 0.0, bound);
      REQUIRE(e);
      ++checks;
      CHECK(e->fits == full->fits);
      CHECK(e->peak_bytes == full->peak_bytes);
      if (e->bounded) {
        ++hits;
        CHECK(e->step_s > bound);
        CHECK(e->step_s <= full->step_s);
        CHECK(e->pipeline_s <= full->pipeline_s);
      } else {
        CHECK(e->step_s == full->step_s);
        CHECK(e->pipeline_s == full->pipeline_s);
        CHECK(e->bubble_s == full->bubble_s);
        CHECK(e->dp_exposed_s == full->dp_exposed_s);
      }
      if (f >= 1.0) CHECK_FALSE(e->bounded);   // a plan no slower than the bound is always timed
    }
  });
  REQUIRE(checks > 0);
  return hits;
}

}  // namespace

TEST_CASE("A bounded stage-1 estimate is a lower bound of the full one, and only above its bound") {
  // Every schedule, so every bubble formula; with and without the
  // distributed optimizer (the bound's optimizer term).
  SECTION("every plan of a small dense space") {
    const int hits = check_bounds(inputs(test::small_gpt(), "dgx-h100", 16, 32), 1);
    CHECK(hits > 0);
  }
  SECTION("a sample of GPT-3 175B on 256 A100s") {
    const int hits = check_bounds(inputs(test::shipped_model("gpt3-175b"), "dgx-a100", 256, 512), 613);
    CHECK(hits > 0);
  }
  SECTION("a sample of a MoE model (expert parallelism, expert data parallelism)") {
    const int hits = check_bounds(inputs(test::small_moe(), "dgx-h100", 16, 32), 7);
    CHECK(hits > 0);
  }
}

TEST_CASE("Stage-1 time follows the simulator on ZeRO-2 and ZeRO-3 plans of dense models", "[zero]") {
  {
    SearchInputs in = inputs(test::shipped_model("gpt3-175b"), "dgx-a100", 256, 512);
    in.constraints.schedules = {Schedule::one_f_one_b, Schedule::interleaved};
    in.constraints.mbs = {{1, 2}, {}, {}};
    in.constraints.recompute_modules = false;
    in.constraints.zero = {2, 3};
    int i = 0;
    check_stage1_time(in, 256, 10, "GPT-3 ZeRO-2/3 plans", [&](const Candidate& c) { return i++ % 499 == 0 && c.pp <= 16; });
  }
  {
    SearchInputs in = inputs(test::shipped_model("llama3-70b"), "dgx-h100", 64, 128);
    in.constraints.schedules = {Schedule::one_f_one_b, Schedule::interleaved};
    in.constraints.mbs = {{1}, {}, {}};
    in.constraints.recompute_modules = false;
    in.constraints.zero = {3};
    int i = 0;
    check_stage1_time(in, 64, 10, "Llama 3 70B ZeRO-3 plans", [&](const Candidate&) { return i++ % 97 == 0; });
  }
}

TEST_CASE("Stage-1 time follows the simulator on hybrid-sharded (HSDP) plans, stages 1-3", "[zero]") {
  SearchInputs in = inputs(test::shipped_model("llama3-70b"), "dgx-h100", 128, 256);
  in.constraints.schedules = {Schedule::one_f_one_b, Schedule::interleaved};
  in.constraints.mbs = {{1}, {}, {}};
  in.constraints.recompute_modules = false;
  in.constraints.zero = {1, 2, 3};
  int i = 0;
  check_stage1_time(in, 128, 10, "Llama 3 70B HSDP plans", [&](const Candidate& c) {
    return c.dp_replicas > 1 && i++ % 53 == 0;
  });
}

TEST_CASE("Stage-1 time follows the simulator on ZeRO-2 and ZeRO-3 plans of a MoE model (Mixtral, 64 H100s)", "[zero]") {
  SearchInputs in = inputs(test::shipped_model("mixtral-8x7b"), "dgx-h100", 64, 128);
  in.constraints.schedules = {Schedule::one_f_one_b, Schedule::interleaved};
  in.constraints.mbs = {{1}, {}, {}};
  in.constraints.recompute_modules = false;
  in.constraints.zero = {2, 3};
  // The worst plans are the ones whose in-layer collectives (expert TP over
  // two nodes) share the scale-out links with the sharded DP traffic, which
  // stage 1 lets hide behind the compute, and interleaving with one layer
  // per virtual stage, whose every pass waits for its first gather in stage
  // 1 but overlaps it with the pipeline's receives in the simulator.
  int i = 0;
  check_stage1_time(
      in, 64, 10, "Mixtral ZeRO-2/3 plans", [&](const Candidate&) { return i++ % 2111 == 0; }, 0.45);
}
