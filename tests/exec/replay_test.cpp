// The device-independent part of the GPU replay (exec/replay.hpp): every
// Program kernel is replayed by a kernel with the same GEMM shape, attention
// shape or bytes; GEMM passes and memory kernels follow the op's phase; every
// cross-lane dependency becomes one event wait and none is lost; the
// point-to-point channels pair their transfers in order on every schedule
// the builder emits; shard mode runs compute only.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "core/program/builder.hpp"
#include "exec/params.hpp"
#include "exec/replay.hpp"
#include "support.hpp"

namespace mx = megascope::exec;
using megascope::Kernel;
using megascope::KernelKind;
using megascope::Op;
using megascope::OpKind;
using megascope::Phase;
using megascope::Program;
using megascope::Setup;
using RK = megascope::exec::ReplayKernel;

namespace {

struct Case {
  const char* model;
  const char* cluster;
  const char* plan;
  std::int64_t batch;
  int gpus;
};

const Case kCases[] = {
    {"tiny-gpt", "dgx-h100", "tp=2,pp=2,sp=on", 8, 4},
    {"tiny-gpt", "dgx-h100", "pp=2,vpp=2,schedule=interleaved,recompute=full,recompute_method=uniform,recompute_layers=1", 8, 2},
    {"tiny-llama", "dgx-h100", "cp=2,tp=2,sp=on", 8, 4},
    {"tiny-moe", "dgx-h100", "ep=2,dp=2,pp=2,distopt=on,overlap_grad_reduce=on,overlap_param_gather=on", 8, 4},
    {"llama3-8b", "dgx-h100", "tp=4,pp=4,dp=2,schedule=zb-v,sp=on", 32, 32},
    {"llama3-8b", "dgx-h100", "tp=8,pp=4,schedule=dualpipe,sp=on", 32, 32},
    {"llama3-8b", "dgx-h100", "tp=4,pp=4,dp=2,schedule=dualpipev,sp=on", 32, 32},
    {"gpt3-175b", "dgx-a100", "tp=8,pp=8,vpp=2,schedule=interleaved,sp=on,recompute=selective,distopt=on", 64, 128},
    {"gpt-1.7b", "dgx-a100", "tp=1,pp=2,schedule=zb-h1,attention=unfused", 16, 2},
    {"tiny-llama", "dgx-h100", "pp=4,schedule=gpipe", 8, 4},
    {"tiny-gpt", "dgx-h100", "pp=2,vpp=2,schedule=interleaved,overlap_p2p_comm=off", 8, 2},
};

Setup setup_of(const Case& c) {
  return megascope::test::make_setup(megascope::test::shipped_model(c.model), c.cluster, c.plan, c.batch, c.gpus);
}

Program program_of(const Setup& s) {
  auto p = megascope::build_program(s);
  if (!p) FAIL(p.error().str());
  return *p;
}

double gemm_flops(const megascope::GemmShape& g) {
  return 2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
}

// Calls f(setup, program, stage, plan) for every stage of every case.
template <class F>
void for_each_stage_plan(F f) {
  for (const Case& c : kCases) {
    const Setup s = setup_of(c);
    const Program p = program_of(s);
    for (const auto& sp : p.stages) {
      INFO(c.model << " " << c.plan << " stage " << sp.stage);
      auto r = mx::plan_replay(s, p, sp.stage, false);
      if (!r) FAIL(r.error().str());
      f(s, p, sp, *r);
    }
  }
}

}  // namespace

TEST_CASE("Replay: each Program kernel is replayed with its shape or its bytes, in the op's pass", "[exec][replay]") {
  for_each_stage_plan([](const Setup& s, const Program&, const megascope::StageProgram& sp, const mx::ReplayPlan& plan) {
    const mx::ReplayPlan* r = &plan;
    REQUIRE(r->ops.size() == sp.ops.size());
    for (std::size_t i = 0; i < sp.ops.size(); ++i) {
      const Op& op = sp.ops[i];
      const mx::ReplayOp& ro = r->ops[i];
      if (op.kind != OpKind::compute) {
        CHECK(ro.kernels.empty());
        CHECK(ro.elements == std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(op.bytes / 2))));
        continue;
      }
      // A grouped GEMM (the routed experts) is replayed once per group, its one shape each time.
      std::size_t launches = 0;
      for (std::uint32_t k = 0; k < op.kernel_count; ++k) launches += std::max<std::uint32_t>(1, sp.kernels[op.kernel_begin + k].groups);
      REQUIRE(ro.kernels.size() == launches);
      const bool bwd = op.phase == Phase::backward_input || op.phase == Phase::backward_weight;
      std::size_t next = 0;
      for (std::uint32_t k = 0; k < op.kernel_count; ++k)
      for (std::uint32_t g = 0; g < std::max<std::uint32_t>(1, sp.kernels[op.kernel_begin + k].groups); ++g) {
        const Kernel& pk = sp.kernels[op.kernel_begin + k];
        const RK& rk = r->kernels.at(ro.kernels[next++]);
        switch (pk.kind) {
          case KernelKind::gemm:
            REQUIRE(rk.type == RK::Type::gemm);
            CHECK(rk.gemm.shape == pk.gemm);
            CHECK(gemm_flops(rk.gemm.shape) == gemm_flops(pk.gemm));
            CHECK(rk.precision == pk.precision);
            CHECK(rk.gemm.pass == (op.phase == Phase::backward_input    ? megascope::exec::GemmPass::backward_input
                                   : op.phase == Phase::backward_weight ? megascope::exec::GemmPass::backward_weight
                                                                        : megascope::exec::GemmPass::forward));
            break;
          case KernelKind::attention_fwd:
          case KernelKind::attention_bwd:
            REQUIRE(rk.type == RK::Type::attention);
            CHECK(rk.attention.backward == (pk.kind == KernelKind::attention_bwd));
            CHECK(rk.attention.shape.seq_q == pk.attention.seq_q);
            CHECK(rk.attention.shape.seq_kv == pk.attention.seq_kv);
            CHECK(rk.attention.shape.heads == pk.attention.heads);
            CHECK(rk.attention.shape.kv_heads == pk.attention.kv_heads);
            CHECK(rk.attention.shape.head_dim == pk.attention.head_dim);
            CHECK(rk.attention.shape.batch == pk.attention.batch);
            CHECK(rk.attention.rope == (s.model.position_embedding == megascope::PositionEmbedding::rope));
            break;
          case KernelKind::memory:
            if (pk.memory == megascope::MemoryOp::other) {
              REQUIRE(rk.type == RK::Type::copy);
              CHECK(rk.bytes == pk.bytes);
              break;
            }
            REQUIRE(rk.type == RK::Type::memory);
            CHECK(megascope::exec::memory_op_of(rk.memory.kernel) == pk.memory);
            if (pk.memory != megascope::MemoryOp::optimizer) {
              const std::string name = megascope::exec::to_string(rk.memory.kernel);
              CHECK(name.substr(name.size() - 3) == (bwd ? "bwd" : "fwd"));
            }
            // The kernel moves the Program's bytes, to within half a row.
            const double row = megascope::exec::program_bytes(rk.memory.kernel, 1, rk.memory.width);
            CHECK(std::abs(megascope::exec::program_bytes(rk.memory.kernel, rk.memory.rows, rk.memory.width) -
                           pk.bytes) <= std::max(row / 2, pk.bytes < row ? row : 0.0) + 1e-6);
            break;
        }
      }
    }
    // Distinct kernels: no duplicates, and few (a layer's worth, not an op's).
    for (std::size_t a = 0; a < r->kernels.size(); ++a)
      for (std::size_t b = a + 1; b < r->kernels.size(); ++b) CHECK_FALSE(r->kernels[a] == r->kernels[b]);
    CHECK(r->kernels.size() < 80);
  });
}

TEST_CASE("Replay: every dependency on another lane is one event wait on that lane, none lost", "[exec][replay]") {
  for_each_stage_plan([](const Setup&, const Program&, const megascope::StageProgram& sp, const mx::ReplayPlan& plan) {
    const mx::ReplayPlan* r = &plan;
    for (std::size_t i = 0; i < sp.ops.size(); ++i) {
      const Op& op = sp.ops[i];
      const mx::ReplayOp& ro = r->ops[i];
      REQUIRE(ro.lane >= 0);
      REQUIRE(ro.lane < r->lanes);
      CHECK(ro.run);
      if (op.kind == OpKind::send || op.kind == OpKind::recv) {
        const mx::ReplayChannel& ch = r->channels.at(static_cast<std::size_t>(ro.channel));
        CHECK(ch.send == (op.kind == OpKind::send));
        CHECK(ch.peer_stage == op.peer_stage);
        CHECK(ch.label == op.label);
        CHECK(ch.lane == ro.lane);
      } else {
        CHECK(ro.lane == static_cast<int>(op.stream));   // compute, tp, cp, ep, dp are lanes 0-4
      }
      // What the GPU runtime requires: kernels only on the compute stream, each
      // collective on the stream its group's communicator enqueues on.
      if (op.kind == OpKind::compute && op.kernel_count > 0) CHECK(ro.lane == 0);
      if (op.kind != OpKind::compute && op.kind != OpKind::send && op.kind != OpKind::recv)
        CHECK(op.stream == mx::stream_of(op.group));
      std::map<int, std::uint32_t> waited;   // lane -> op waited for
      for (std::uint32_t w : ro.waits) {
        REQUIRE(w < i);
        const int lane = r->ops[w].lane;
        CHECK(lane != ro.lane);
        CHECK(waited.emplace(lane, w).second);   // one wait per lane
      }
      for (std::uint32_t d = op.dep_begin; d < op.dep_begin + op.dep_count; ++d) {
        const std::uint32_t dep = sp.deps[d];
        const int lane = r->ops[dep].lane;
        if (lane == ro.lane) continue;   // stream order
        auto it = waited.find(lane);
        REQUIRE(it != waited.end());
        CHECK(it->second >= dep);        // waiting for a later op of that lane covers it
      }
    }
  });
}

TEST_CASE("Replay: channels pair their transfers in order, with equal sizes, on every schedule", "[exec][replay]") {
  for (const Case& c : kCases) {
    const Setup s = setup_of(c);
    const Program p = program_of(s);
    INFO(c.model << " " << c.plan);
    std::map<int, mx::ReplayPlan> plans;
    for (const auto& sp : p.stages) {
      auto r = mx::plan_replay(s, p, sp.stage, false);
      if (!r) FAIL(r.error().str());
      plans.emplace(sp.stage, std::move(*r));
    }
    const auto pairs = mx::replay_channels(p);
    CHECK(std::is_sorted(pairs.begin(), pairs.end()));
    std::size_t sends = 0;
    for (const mx::ReplayRoute& route : pairs) {
      const auto a = static_cast<std::size_t>(route.from), b = static_cast<std::size_t>(route.to);
      std::vector<std::int64_t> sent, got;
      for (std::size_t i = 0; i < p.stages[a].ops.size(); ++i) {
        const Op& op = p.stages[a].ops[i];
        if (op.kind == OpKind::send && op.peer_stage == route.to && op.label == route.label)
          sent.push_back(plans.at(route.from).ops[i].elements);
      }
      for (std::size_t i = 0; i < p.stages[b].ops.size(); ++i) {
        const Op& op = p.stages[b].ops[i];
        if (op.kind == OpKind::recv && op.peer_stage == route.from && op.label == route.label)
          got.push_back(plans.at(route.to).ops[i].elements);
      }
      CHECK(!sent.empty());
      CHECK(sent == got);
      sends += sent.size();
    }
    std::size_t all_sends = 0;
    for (const auto& sp : p.stages)
      all_sends += static_cast<std::size_t>(std::count_if(sp.ops.begin(), sp.ops.end(),
                                                          [](const Op& o) { return o.kind == OpKind::send; }));
    CHECK(sends == all_sends);
  }
}

TEST_CASE("Replay: a channel whose transfers would pair out of order is refused, naming the stages", "[exec][replay]") {
  const Setup s = megascope::test::make_setup(megascope::test::shipped_model("tiny-gpt"), "dgx-h100", "pp=2", 8, 2);
  Program p = program_of(s);
  std::vector<Op*> sends;
  for (Op& op : p.stages[0].ops)
    if (op.kind == OpKind::send) sends.push_back(&op);
  REQUIRE(sends.size() >= 2);
  std::swap(sends[0]->tag, sends[1]->tag);   // still a valid pairing by tag, no longer in order
  auto r = mx::plan_replay(s, p, 0, false);
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().str(), Catch::Matchers::Contains("pipeline stage 0 sends activations to stage 1 in an order"));
  auto r1 = mx::plan_replay(s, p, 1, false);   // the receiving side sees it too
  REQUIRE_FALSE(r1);
  auto bad = mx::plan_replay(s, p, 2, false);
  REQUIRE_FALSE(bad);
  CHECK_THAT(bad.error().str(), Catch::Matchers::Contains("stage 2 is not a pipeline stage"));
}

TEST_CASE("Replay in shard mode: compute only, back to back, with the same kernels", "[exec][replay]") {
  for (const Case& c : kCases) {
    const Setup s = setup_of(c);
    const Program p = program_of(s);
    for (const auto& sp : p.stages) {
      INFO(c.model << " " << c.plan << " stage " << sp.stage);
      auto full = mx::plan_replay(s, p, sp.stage, false);
      auto shard = mx::plan_replay(s, p, sp.stage, true);
      if (!full) FAIL(full.error().str());
      if (!shard) FAIL(shard.error().str());
      CHECK(shard->shard);
      REQUIRE(shard->ops.size() == full->ops.size());
      for (std::size_t i = 0; i < sp.ops.size(); ++i) {
        const mx::ReplayOp& o = shard->ops[i];
        CHECK(o.run == (sp.ops[i].kind == OpKind::compute));
        if (o.run) CHECK(o.waits.empty());   // every compute op is on lane 0 and waits on nothing else
        if (o.run) CHECK(o.kernels.size() == full->ops[i].kernels.size());
      }
      CHECK(shard->kernels.size() == full->kernels.size());
    }
  }
}

TEST_CASE("The executor refuses an expert capacity, a set load imbalance, the flex dispatcher, routing groups and a squared-ReLU MLP, naming the field", "[exec]") {
  megascope::ModelSpec m = megascope::test::shipped_model("tiny-moe");
  REQUIRE(megascope::exec::check_supported(megascope::test::make_setup(m, "cpu-host", "ep=2", 4, 2)));
  megascope::ModelSpec capped = m;
  capped.moe->capacity_factor = 1.25;
  auto a = megascope::exec::check_supported(megascope::test::make_setup(capped, "cpu-host", "ep=2", 4, 2));
  REQUIRE_FALSE(a);
  CHECK(a.error().field == "model.moe.capacity_factor");
  megascope::ModelSpec skewed = m;
  skewed.moe->load_imbalance = 1.5;
  auto b = megascope::exec::check_supported(megascope::test::make_setup(skewed, "cpu-host", "ep=2", 4, 2));
  REQUIRE_FALSE(b);
  CHECK(b.error().field == "model.moe.load_imbalance");
  // A plan both training and the replay (run --backend cuda, --shard) refuse, naming `field`.
  const auto refused_by_both = [](const megascope::Setup& s, const char* field) {
    auto trained = megascope::exec::check_supported(s);
    REQUIRE_FALSE(trained);
    CHECK(trained.error().field == field);
    auto program = megascope::build_program(s);
    REQUIRE(program);
    auto replay = megascope::exec::plan_replay(s, *program, 0, true);
    REQUIRE_FALSE(replay);
    CHECK(replay.error().field == field);
  };
  // Nor a squared-ReLU MLP (Nemotron): the executor has GeLU and SwiGLU kernels only.
  megascope::ModelSpec relu2 = megascope::test::shipped_model("tiny-gpt");
  relu2.activation = megascope::Activation::squared_relu;
  refused_by_both(megascope::test::make_setup(relu2, "cpu-host", "tp=1", 4, 1), "model.activation");
  // Nor the flex (DeepEP) dispatcher (its hops are no NCCL all-to-all over the group) or group-limited routing.
  refused_by_both(megascope::test::make_setup(m, "cpu-host", "ep=2,moe_dispatcher=flex", 4, 2), "plan.moe_dispatcher");
  megascope::ModelSpec grouped = m;
  grouped.moe->num_groups = 2;
  grouped.moe->group_topk = 1;
  auto d = megascope::exec::check_supported(megascope::test::make_setup(grouped, "cpu-host", "ep=2", 4, 2));
  REQUIRE_FALSE(d);
  CHECK(d.error().field == "model.moe.num_groups");
  // Nor recomputing modules beyond the attention core, in training or the replay; core_attn alone runs.
  REQUIRE(megascope::exec::check_supported(megascope::test::make_setup(m, "cpu-host", "ep=2,recompute=selective", 4, 2)));
  refused_by_both(
      megascope::test::make_setup(m, "cpu-host", "ep=2,recompute=selective,recompute_modules=core_attn+moe_act", 4, 2),
      "plan.recompute_modules");
}
