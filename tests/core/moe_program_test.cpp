// The Program builder on MoE models: the EP exchange of each dispatcher, the
// busiest rank's expert load, shared experts under TP, and the MTP layers on
// the last stage, against the accounting.
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "core/accounting/activations.hpp"
#include "core/accounting/flops.hpp"
#include "core/accounting/memory.hpp"
#include "core/accounting/params.hpp"
#include "core/program/builder.hpp"
#include "core/program/stage_writer.hpp"
#include "models.hpp"
#include "program_support.hpp"
#include "support.hpp"

using namespace megascope;
using namespace megascope::test;

TEST_CASE("MoE layers dispatch and combine tokens with all-to-all over EP", "[core]") {
  const Setup s = make_setup(shipped_model("mixtral-8x7b"), "dgx-h100", "tp=1,ep=4", 4, 4);
  auto p = build_program(s);
  REQUIRE(p);
  // 32 layers x (2 forward + 2 backward) per micro-batch.
  CHECK(count(*p, 0, OpKind::all_to_all, OpLabel::ep_comm) == 32 * 4);
}

namespace {

double bytes_of(const Program& p, OpKind kind, OpLabel label) {
  double b = 0;
  for (const StageProgram& s : p.stages)
    for (const Op& op : s.ops)
      if (op.kind == kind && op.label == label) b += op.bytes;
  return b;
}

ModelSpec tiny_moe_with(double imbalance, std::optional<double> capacity = std::nullopt, bool pad = false) {
  ModelSpec m = shipped_model("tiny-moe");
  m.moe->load_imbalance = imbalance;
  m.moe->capacity_factor = capacity;
  m.moe->pad_to_capacity = pad;
  return m;
}

// Four GPT layers of width 512 over 256 tokens, the last three MoE (4
// experts of width 512, top 2), with `shared_ffn` of shared experts (0:
// none) and `mla` attention if given; validated.
ModelSpec small_moe(int shared_ffn, std::optional<MlaSpec> mla = std::nullopt) {
  ModelSpec m = gpt_no_bias(4, 512, 8);
  m.seq_length = 256;
  m.mla = mla;
  MoeSpec e;
  e.num_experts = 4;
  e.top_k = 2;
  e.expert_ffn_hidden = 512;
  e.shared_expert_ffn_hidden = shared_ffn;
  e.moe_layers = {false, true, true, true};
  m.moe = e;
  auto v = validate_model(m);
  REQUIRE(v);
  return *v;
}

}  // namespace

TEST_CASE("Expert load: the busiest EP rank's tokens scale its expert GEMMs, its all-to-all bytes and its memory",
          "[core]") {
  const Setup base = make_setup(tiny_moe_with(1.0), "dgx-h100", "tp=1,ep=4", 4, 4);
  CHECK(base.expert_load == 1.0);
  const auto p0 = build_program(base);
  REQUIRE(p0);
  const double hw = iteration_flops(base).hardware;
  const double f0 = program_flops(*p0);   // the accounting's FLOPs and the routers' GEMMs (which it does not count)
  const double expert_hw = 3.0 * iteration_flops(base).forward.experts;   // no recomputation
  REQUIRE(expert_hw > 0);
  const double a2a0 = bytes_of(*p0, OpKind::all_to_all, OpLabel::ep_comm);
  REQUIRE(a2a0 > 0);
  const auto expert_memory = [](const Setup& s) {
    double b = 0;
    for (const ActivationTerm& t : layer_activations(s, 1).terms)
      if (t.name.rfind("expert_", 0) == 0) b += t.bytes;
    return b;
  };
  const double mem0 = expert_memory(base);
  REQUIRE(mem0 > 0);

  struct Case {
    ModelSpec model;
    const char* plan;
    double load;
  };
  const Case cases[] = {
      {tiny_moe_with(1.5), "tp=1,ep=4", 1.5},
      {tiny_moe_with(6.0), "tp=1,ep=4", 4.0},               // one rank takes at most every token
      {tiny_moe_with(2.0, 1.25), "tp=1,ep=4", 1.25},        // capped by the capacity factor
      {tiny_moe_with(1.0, 1.5, true), "tp=1,ep=4", 1.5},    // padded to capacity
      {tiny_moe_with(1.0, 0.75), "tp=1,ep=4", 0.75},        // tokens dropped everywhere
      {tiny_moe_with(3.0), "tp=1,ep=1", 1.0},               // one rank holds every expert
      {tiny_moe_with(1.0, 1.5, true), "tp=1,ep=1", 1.5},    // padding costs even there
  };
  for (const Case& c : cases) {
    INFO(c.plan << " imbalance " << c.model.moe->load_imbalance << " expected load " << c.load);
    const Setup s = make_setup(c.model, "dgx-h100", c.plan, 4, 4);
    CHECK(s.expert_load == Approx(c.load));
    const auto p = build_program(s);
    REQUIRE(p);
    // The model's FLOPs do not change; the busiest rank's expert work does.
    CHECK(iteration_flops(s).hardware == Approx(hw).epsilon(1e-12));
    CHECK(program_flops(*p) == Approx(f0 + (c.load - 1.0) * expert_hw).epsilon(1e-9));
    if (s.plan.ep > 1) CHECK(bytes_of(*p, OpKind::all_to_all, OpLabel::ep_comm) == Approx(c.load * a2a0).epsilon(1e-12));
    CHECK(expert_memory(s) == Approx(c.load * mem0).epsilon(1e-12));
  }
}

TEST_CASE("The allgather dispatcher gathers every token over EP and reduce-scatters it back, whatever the load",
          "[core]") {
  const int moe_layers = shipped_model("tiny-moe").num_moe_layers();
  for (double load : {1.0, 1.5}) {
    INFO("load " << load);
    const Setup a2a = make_setup(tiny_moe_with(load), "dgx-h100", "tp=1,ep=4", 4, 4);
    const Setup ag = make_setup(tiny_moe_with(load), "dgx-h100", "tp=1,ep=4,moe_dispatcher=allgather", 4, 4);
    const auto pa = build_program(a2a), pg = build_program(ag);
    REQUIRE(pa);
    REQUIRE(pg);
    // Per micro-batch and MoE layer: one gather and one reduce-scatter each way.
    const std::size_t per_stage = static_cast<std::size_t>(2 * moe_layers * ag.num_microbatches);
    CHECK(count(*pg, 0, OpKind::all_to_all) == 0);
    CHECK(count(*pg, 0, OpKind::all_gather, OpLabel::ep_comm) == per_stage);
    CHECK(count(*pg, 0, OpKind::reduce_scatter, OpLabel::ep_comm) == per_stage);
    const double gathered = 2.0 * 64 * 64 * 4;   // bf16 tokens x hidden x ep, for any load
    for (const Op& op : pg->stages[0].ops)
      if (op.label == OpLabel::ep_comm) CHECK(op.bytes == gathered);
    CHECK(program_flops(*pg) == Approx(program_flops(*pa)).epsilon(1e-12));   // the experts' work follows the load
  }
  auto dense = try_setup(gpt_no_bias(4, 512, 8), "dgx-h100", "tp=1,moe_dispatcher=allgather", 4, 4);
  REQUIRE_FALSE(dense);
  CHECK(dense.error().field == "plan.moe_dispatcher");
  ModelSpec shared = shipped_model("tiny-moe");
  shared.moe->shared_expert_ffn_hidden = 64;
  auto both = try_setup(shared, "dgx-h100", "tp=1,ep=4,moe_dispatcher=allgather,moe_shared_expert_overlap=on", 4, 4);
  REQUIRE_FALSE(both);
  CHECK(both.error().field == "plan.moe_shared_expert_overlap");
}

TEST_CASE("Expert load settings out of range are errors naming the field", "[core]") {
  const auto error_of = [](ModelSpec m) {
    auto r = validate_model(std::move(m));
    REQUIRE_FALSE(r);
    return r.error().str();
  };
  CHECK_THAT(error_of(tiny_moe_with(0.9)), Catch::Contains("model.moe.load_imbalance"));
  CHECK_THAT(error_of(tiny_moe_with(std::nan(""))), Catch::Contains("model.moe.load_imbalance"));
  CHECK_THAT(error_of(tiny_moe_with(1.0, 0.0)), Catch::Contains("model.moe.capacity_factor"));
  ModelSpec pad = tiny_moe_with(1.0);
  pad.moe->pad_to_capacity = true;
  CHECK_THAT(error_of(pad), Catch::Contains("model.moe.pad_to_capacity"));
}

TEST_CASE("Shared experts under TP gather their input and reduce their output like the dense MLP", "[core]") {
  ModelSpec plain = shipped_model("tiny-moe");
  ModelSpec shared = plain;
  shared.moe->shared_expert_ffn_hidden = 64;
  const int moe_layers = plain.num_moe_layers();
  REQUIRE(moe_layers == 3);
  // Per micro-batch and MoE layer: one more TP gather and one more reduction in
  // the forward and in the backward.
  for (const char* plan : {"tp=2,sp=on,ep=2", "tp=2,sp=off"}) {
    INFO(plan);
    const Setup a = make_setup(plain, "dgx-h100", plan, 4, 4);
    const Setup b = make_setup(shared, "dgx-h100", plan, 4, 4);
    const auto pa = build_program(a), pb = build_program(b);
    REQUIRE(pa);
    REQUIRE(pb);
    const int mb = a.num_microbatches;
    if (a.sequence_parallel) {
      CHECK(count(*pb, 0, OpKind::all_gather, OpLabel::tp_comm) ==
            count(*pa, 0, OpKind::all_gather, OpLabel::tp_comm) + 2 * moe_layers * mb);
      CHECK(count(*pb, 0, OpKind::reduce_scatter, OpLabel::tp_comm) ==
            count(*pa, 0, OpKind::reduce_scatter, OpLabel::tp_comm) + 2 * moe_layers * mb);
      CHECK(program_flops(*pb) - program_flops(*pa) ==
            Approx(iteration_flops(b).hardware - iteration_flops(a).hardware).epsilon(1e-9));
    } else {
      CHECK(count(*pb, 0, OpKind::all_reduce, OpLabel::tp_comm) ==
            count(*pa, 0, OpKind::all_reduce, OpLabel::tp_comm) + 2 * moe_layers * mb);
    }
  }
  // Without TP they run beside the routed experts: no collective of their own.
  const auto pa = build_program(make_setup(plain, "dgx-h100", "tp=1,ep=2", 4, 4));
  const auto pb = build_program(make_setup(shared, "dgx-h100", "tp=1,ep=2", 4, 4));
  REQUIRE(pa);
  REQUIRE(pb);
  CHECK(pb->stages[0].ops.size() == pa->stages[0].ops.size());
}

TEST_CASE("MTP layers on the last stage carry the accounting's FLOPs and their gradients' bytes", "[core]") {
  for (int depth : {1, 2}) {
    ModelSpec m = gpt_no_bias(8, 512, 8);
    m.mtp_num_layers = depth;
    for (const char* plan : {"tp=2,pp=2,sp=on", "tp=1,pp=2,vpp=2,schedule=interleaved", "tp=2,pp=2,schedule=zb-v",
                             "tp=1,pp=2,schedule=dualpipe", "tp=2,pp=2,schedule=zb-h1",
                             "tp=2,pp=2,recompute=full,recompute_method=uniform,recompute_layers=1",
                             "tp=2,pp=1,recompute=selective,distopt=on,overlap_grad_reduce=on,overlap_param_gather=on"}) {
      INFO(plan << " depth " << depth);
      const Setup s = make_setup(m, "dgx-a100", plan, 16, 8);
      auto p = build_program(s);
      REQUIRE(p);
      CHECK(program_flops(*p) == Approx(iteration_flops(s).hardware).epsilon(1e-9));
    }
  }
  // The last stage reduces each MTP layer's gradients: one layer's worth more per depth.
  const auto last_stage_grad_bytes = [](int depth) {
    ModelSpec m = gpt_no_bias(8, 512, 8);
    m.mtp_num_layers = depth;
    const Setup s = make_setup(m, "dgx-a100", "tp=2,pp=2", 16, 8);
    auto p = build_program(s);
    REQUIRE(p);
    double b = 0;
    for (const Op& op : p->stages.at(1).ops)
      if (op.label == OpLabel::dp_grad) b += op.bytes;
    return b;
  };
  const double b0 = last_stage_grad_bytes(0), b1 = last_stage_grad_bytes(1), b2 = last_stage_grad_bytes(2);
  ModelSpec m = gpt_no_bias(8, 512, 8);
  m.mtp_num_layers = 1;
  const double per_layer = mtp_layer_params(m, Sharding{2, 2, 1}).total() * 4.0;   // fp32 main gradients
  CHECK(b1 - b0 == Approx(per_layer).epsilon(1e-12));
  CHECK(b2 - b1 == Approx(per_layer).epsilon(1e-12));
}

TEST_CASE("Standalone MTP: the depths on their own stage, every head with the loss, the hidden states of every depth "
          "sent between them", "[core]") {
  // 8 layers and 2 MTP depths over pp 4 x vpp 2 (Megatron-Core's standalone
  // layout): the MTP stage is the last chunk of rank 2 (virtual stage 6),
  // the loss the last chunk of rank 3 (virtual stage 7).
  ModelSpec m = gpt_no_bias(8, 512, 8);
  m.mtp_num_layers = 2;
  m.tied_embeddings = false;
  const Setup merged = make_setup(m, "dgx-a100", "tp=1,pp=4,schedule=interleaved,layout=Et|t|t|t|t|t|tt|mmL", 8, 4);
  const Setup standalone = make_setup(m, "dgx-a100", "tp=1,pp=4,schedule=interleaved,layout=Et|t|t|t|t|t|ttmm|L", 8, 4);
  REQUIRE(standalone.chunks[2][1].mtp == 2);
  REQUIRE_FALSE(standalone.chunks[2][1].loss);
  auto pm = build_program(merged), ps = build_program(standalone);
  REQUIRE(pm);
  REQUIRE(ps);
  // The same work and parameters, placed differently.
  CHECK(program_flops(*ps) == Approx(iteration_flops(standalone).hardware).epsilon(1e-9));
  CHECK(program_flops(*ps) == Approx(program_flops(*pm)).epsilon(1e-12));
  double params_m = 0, params_s = 0;
  for (int r = 0; r < 4; ++r) {
    params_m += rank_params(merged, r).total();
    params_s += rank_params(standalone, r).total();
  }
  CHECK(params_s == Approx(params_m).epsilon(1e-12));
  // MTP layers (numbered num_layers + k) run on rank 2 only.
  for (int r = 0; r < 4; ++r) {
    bool has_mtp = false;
    for (const Op& op : ps->stages[static_cast<std::size_t>(r)].ops)
      has_mtp = has_mtp || (op.layer && *op.layer >= m.num_layers);
    CHECK(has_mtp == (r == 2));
  }
  // Transfers: (1 + k) x the activation from the MTP stage to the loss's, 1 x elsewhere.
  const double act = 2.0 * 2048 * 512;   // bf16, seq 2048, mbs 1
  for (int r = 0; r < 4; ++r)
    for (const Op& op : ps->stages[static_cast<std::size_t>(r)].ops) {
      if (op.kind != OpKind::send) continue;
      const bool mtp_boundary = (r == 2 && op.peer_stage == 3 && op.label == OpLabel::pp_activation && *op.chunk == 1) ||
                                (r == 3 && op.peer_stage == 2 && op.label == OpLabel::pp_gradient && *op.chunk == 1);
      INFO("rank " << r << " to " << op.peer_stage << " chunk " << *op.chunk);
      CHECK(op.bytes == Approx(mtp_boundary ? 3 * act : act));
    }
  // Memory: the depths' activations on the MTP stage, their heads' with the loss.
  const MemoryReport mm = memory_report(merged), ms = memory_report(standalone);
  const auto term = [](const StageMemory& st, const std::string& name) {
    for (const ActivationTerm& t : st.activation_terms)
      if (t.name == name) return t.bytes;
    return 0.0;
  };
  CHECK(term(ms.stages[2], "mtp_layers") > 0);
  CHECK(term(ms.stages[3], "mtp_heads") > 0);
  CHECK(term(ms.stages[3], "mtp_layers") == 0);
  CHECK(term(mm.stages[3], "mtp_layers") > 0);
  // Megatron-Core's rules: every depth in one stage, in the last chunk of its rank.
  expect_error(try_setup(m, "dgx-a100", "tp=1,pp=4,schedule=interleaved,layout=Et|t|t|t|t|t|ttm|mL", 8, 4),
               "plan.layout", "all of them must sit in one stage");
  expect_error(try_setup(m, "dgx-a100", "tp=1,pp=4,schedule=interleaved,layout=Etttt|tttt|mm|||||L", 8, 4),
               "plan.layout", "last model chunk");
}

TEST_CASE("Recompute modules: the Program recomputes the norms, MLA's up-projections and the experts' activation in backward, "
          "with the accounting's FLOPs",
          "[core]") {
  MlaSpec a;
  a.q_lora_rank = 128;
  a.kv_lora_rank = 64;
  a.qk_head_dim = 64;
  a.qk_rope_head_dim = 32;
  a.v_head_dim = 64;
  const ModelSpec m = small_moe(0, a);
  const MoeSpec& e = *m.moe;
  // Bytes of memory-bound kernels and FLOPs of backward-input ops, over the whole program.
  const auto backward = [&](const std::string& modules) {
    const Setup s = make_setup(m, "dgx-a100", "tp=2,pp=2,ep=2,sp=on,recompute=selective" + modules, 16, 8);
    auto p = build_program(s);
    REQUIRE(p);
    double bytes = 0, flops = 0;
    for (const StageProgram& st : p->stages)
      for (const Op& op : st.ops)
        if (op.kind == OpKind::compute && op.phase == Phase::backward_input) {
          flops += op.flops;
          for (std::uint32_t k = op.kernel_begin; k < op.kernel_begin + op.kernel_count; ++k)
            if (st.kernels[k].kind == KernelKind::memory) bytes += st.kernels[k].bytes;
        }
    const double ranks = p->grid.tp * p->grid.cp * p->grid.dp;
    return std::pair{bytes * ranks, flops * ranks};
  };
  const auto base = backward("");
  const auto with = backward(",recompute_modules=core_attn+layernorm+mla_up_proj+moe_act");
  // 16 sequences of 256 tokens over dp = 2 (tp x pp = 4 of 8): per pipeline 8 micro-batches of 256
  // tokens, each layer once per micro-batch on each of its 2 TP ranks.
  // Over the iteration, every layer sees all 16 x 256 tokens once: the norms
  // (4 bytes a token and hidden unit, SP-sharded but on every TP rank) twice
  // a layer, the experts' activation over each MoE layer's top-k copies
  // (2 bytes a token, unit and operand: gelu reads one, writes one).
  const double tokens = 16.0 * 256;
  const double norms = 2 * 4.0 * tokens * 512 * 4;               // 4 layers
  const double act = 2.0 * tokens * e.top_k * 512 * 2 * 3;       // 3 MoE layers, expert width 512 (etp 1)
  const double up_proj = 4 * mla_up_proj_flops(m, 256) * 16;                     // every layer, every sequence
  CHECK(with.first - base.first == Approx(norms + act).epsilon(1e-9));
  CHECK(with.second - base.second == Approx(up_proj).epsilon(1e-9));
  // The accounting's hardware FLOPs grow by the same (the Program also holds
  // the TP-replicated MLA down-projections and the routers, which it does not count).
  const auto hardware = [&](const std::string& modules) {
    return iteration_flops(make_setup(m, "dgx-a100", "tp=2,pp=2,ep=2,sp=on,recompute=selective" + modules, 16, 8)).hardware;
  };
  CHECK(hardware(",recompute_modules=core_attn+layernorm+mla_up_proj+moe_act") - hardware("") == Approx(up_proj).epsilon(1e-9));
}


TEST_CASE("Checkpointed submodules: mlp, moe and shared_experts run their forward again, collectives included, in backward",
          "[core]") {
  const ModelSpec m = small_moe(256);
  const MoeSpec& e = *m.moe;
  const std::string plan = "tp=2,pp=2,ep=2,sp=on,recompute=selective";
  struct Totals {
    double flops = 0;     // GEMM FLOPs of backward-input compute ops, every rank
    int ep_comm = 0;      // EP collectives in the backward-input phase, every rank
    int tp_comm = 0;      // TP collectives likewise
  };
  const auto backward = [&](const std::string& modules) {
    const Setup s = make_setup(m, "dgx-a100", plan + modules, 16, 8);
    auto p = build_program(s);
    REQUIRE(p);
    Totals t;
    for (const StageProgram& st : p->stages)
      for (const Op& op : st.ops) {
        if (op.phase != Phase::backward_input) continue;
        if (op.kind == OpKind::compute) t.flops += op.flops;
        else if (op.label == OpLabel::ep_comm) ++t.ep_comm;
        else if (op.label == OpLabel::tp_comm) ++t.tp_comm;
      }
    const double ranks = p->grid.tp * p->grid.cp * p->grid.dp;
    t.flops *= ranks;
    t.ep_comm *= static_cast<int>(ranks);
    t.tp_comm *= static_cast<int>(ranks);
    return t;
  };
  const auto hardware = [&](const std::string& modules) {
    return iteration_flops(make_setup(m, "dgx-a100", plan + modules, 16, 8)).hardware;
  };
  const Totals base = backward("");
  const double tokens = 16.0 * 256;   // every layer sees every token once over the iteration
  const double h = 512;
  // mlp: the dense layer's fc1 and fc2 again (GeLU MLP of 4h), with its SP
  // gather and reduce-scatter; no EP traffic.
  const Totals mlp = backward(",recompute_modules=core_attn+mlp");
  CHECK(mlp.flops - base.flops == Approx(2.0 * tokens * h * 2048 * 2).epsilon(1e-9));
  CHECK(hardware(",recompute_modules=core_attn+mlp") - hardware("") == Approx(mlp.flops - base.flops).epsilon(1e-9));
  CHECK(mlp.ep_comm == base.ep_comm);
  CHECK(mlp.tp_comm > base.tp_comm);
  // moe: the router, the routed experts over each token's top-k copies and
  // the shared experts again, and the dispatch and combine again: twice the
  // backward's EP collectives. The accounting does not count the router.
  const Totals moe = backward(",recompute_modules=core_attn+moe");
  const double experts = 3 * 2.0 * tokens * e.top_k * h * 512 * 2;
  const double shared = 3 * 2.0 * tokens * h * 256 * 2;
  const double router = 3 * 2.0 * tokens * h * e.num_experts;
  CHECK(moe.flops - base.flops == Approx(experts + shared + router).epsilon(1e-9));
  CHECK(hardware(",recompute_modules=core_attn+moe") - hardware("") == Approx(experts + shared).epsilon(1e-9));
  REQUIRE(base.ep_comm > 0);
  CHECK(moe.ep_comm == 2 * base.ep_comm);
  // shared_experts: only the shared experts again, with their TP collectives.
  const Totals sh = backward(",recompute_modules=core_attn+shared_experts");
  CHECK(sh.flops - base.flops == Approx(shared).epsilon(1e-9));
  CHECK(hardware(",recompute_modules=core_attn+shared_experts") - hardware("") == Approx(shared).epsilon(1e-9));
  CHECK(sh.ep_comm == base.ep_comm);
  CHECK(sh.tp_comm > base.tp_comm);
}

TEST_CASE("Each dispatcher's token permutations move the routed copies as Megatron-Core's dispatchers do", "[core]") {
  // The memory kernels of kind `other` in an MoE layer's forward and input
  // gradient: the top-k selection (8 bytes per routed token and expert),
  // the unpermutation after the combine (2 x the copies' bytes), and the
  // permutations of each dispatcher: permute-1 (alltoall only, any ep:
  // 2 x the copies' bytes) and permute-2 with unpermute-2 (alltoall with
  // more than one local expert, and always with flex and allgather: 4 bytes
  // per element of the experts' input each). The input gradient moves the same bytes back.
  const auto other = [](const Setup& s, int layer, LayerPass pass) {
    const LayerProbe p = probe_layer(s, layer, pass);
    double b = 0;
    for (const Op& op : p.ops.ops)
      for (std::uint32_t i = 0; op.kind == OpKind::compute && i < op.kernel_count; ++i) {
        const Kernel& k = p.ops.kernels[op.kernel_begin + i];
        if (k.kind == KernelKind::memory && k.memory == MemoryOp::other) b += k.bytes;
      }
    return b;
  };
  struct Case { const char* model; const char* plan; int gpus; int layer; bool first, second; };
  for (const Case& c : {Case{"mixtral-8x7b", "tp=1,ep=2", 2, 0, true, true},    // 4 local experts
                        Case{"mixtral-8x7b", "tp=1,ep=8", 8, 0, true, false},   // one local expert
                        Case{"mixtral-8x7b", "tp=1", 1, 0, true, true},         // no exchange, still sorted by expert
                        Case{"mixtral-8x7b", "tp=1,ep=8,moe_dispatcher=allgather", 8, 0, false, true},
                        Case{"deepseek-v3", "tp=1,ep=8,moe_dispatcher=flex", 8, 3, false, true},
                        Case{"mixtral-8x7b", "tp=1,ep=8,moe_dispatcher=flex", 8, 0, false, true}}) {   // flex: always
    INFO(c.model << " " << c.plan);
    ModelSpec m = shipped_model(c.model);
    m.mtp_num_layers = 0;
    const Setup s = make_setup(m, "dgx-h100", c.plan, c.gpus, c.gpus, 4096);
    const MoeSpec& e = *m.moe;
    const double routed = 4096, h = static_cast<double>(m.hidden_size);
    const double own = 2.0 * routed * e.top_k * h;
    const double tokens = routed * e.top_k * s.etp * s.expert_load;
    const double perms = (c.first ? 2.0 * own : 0) + (c.second ? 2 * 4.0 * tokens * h : 0);
    CHECK(other(s, c.layer, LayerPass::forward) == Approx(8.0 * routed * e.num_experts + 2.0 * own + perms).epsilon(1e-12));
    CHECK(other(s, c.layer, LayerPass::backward_input) == Approx(2.0 * own + perms).epsilon(1e-12));
  }
}

TEST_CASE("Routed experts run as grouped GEMMs: one per local expert on its share of the tokens, the same FLOPs as "
          "one merged GEMM",
          "[core]") {
  // tiny-moe (4 experts) on ep 2 of 4 GPUs: each rank holds two experts.
  const Setup s = make_setup(tiny_moe_with(1.0), "dgx-h100", "tp=1,ep=2", 4, 4);
  const auto p = build_program(s);
  REQUIRE(p);
  const int local = s.model.moe->num_experts / 2;
  REQUIRE(local > 1);
  int grouped = 0;
  for (const Kernel& k : p->stages[0].kernels) {
    if (k.kind != KernelKind::gemm || k.groups == 1) continue;
    CHECK(k.groups == static_cast<std::uint32_t>(local));
    ++grouped;
  }
  // fc1 and fc2 in the forward, their input gradients, their weight gradients.
  CHECK(grouped >= 6);
  // Each rank's experts take its 64 tokens' top-2 copies (balanced routing),
  // forward, input and weight gradients of fc1 (SwiGLU: 2 x 96 wide) and fc2,
  // on the 3 MoE layers: the same FLOPs as one merged GEMM over all copies.
  const ModelSpec& m = s.model;
  const double copies = 64.0 * m.moe->top_k;
  const double h = static_cast<double>(m.hidden_size), fe = static_cast<double>(m.moe->expert_ffn_hidden);
  const double expert_hw = 3.0 * m.num_moe_layers() * copies * (2 * h * 2 * fe + 2 * fe * h);
  double grouped_flops = 0;
  for (const StageProgram& sp : p->stages)
    for (const Op& op : sp.ops) {
      if (op.kind != OpKind::compute) continue;
      for (std::uint32_t k = op.kernel_begin; k < op.kernel_begin + op.kernel_count; ++k)
        if (sp.kernels[k].groups > 1) grouped_flops += detail::kernel_flops(sp.kernels[k]);
    }
  CHECK(grouped_flops == Approx(expert_hw).epsilon(1e-9));
}

TEST_CASE("A dropless MoE layer's ops are host-paced, not those of experts padded to a capacity nor dense layers",
          "[core]") {
  const auto paced = [](const Setup& s) {
    const auto p = build_program(s);
    REQUIRE(p);
    int moe = 0, other = 0;
    for (const Op& op : p->stages[0].ops) {
      if (op.kind != OpKind::compute || !op.host_paced) continue;
      REQUIRE(op.layer.has_value());
      (s.model.is_moe_layer(*op.layer) ? moe : other) += 1;
    }
    return std::pair{moe, other};
  };
  const auto [dropless, dropless_dense] = paced(make_setup(tiny_moe_with(1.0), "dgx-h100", "tp=1,ep=2", 2, 2));
  CHECK(dropless > 0);
  CHECK(dropless_dense == 0);
  const auto [padded, padded_dense] = paced(make_setup(tiny_moe_with(1.0, 1.0, true), "dgx-h100", "tp=1,ep=2", 2, 2));
  CHECK(padded == 0);
  CHECK(padded_dense == 0);
  // A capacity without padding still leaves the shapes to the router: the host copy stays.
  CHECK(paced(make_setup(tiny_moe_with(1.0, 1.25, false), "dgx-h100", "tp=1,ep=2", 2, 2)).first == dropless);
  const auto [dense, dense_other] = paced(make_setup(shipped_model("tiny-gpt"), "dgx-h100", "tp=1", 2, 2));
  CHECK(dense + dense_other == 0);
}
