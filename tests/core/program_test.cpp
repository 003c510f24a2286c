// The Program builder: valid programs for every schedule, the FLOPs of all
// ranks' kernels add up to the accounting's hardware FLOPs, and sends,
// receives and collectives appear where the plan says.
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "core/accounting/activations.hpp"
#include "core/accounting/flops.hpp"
#include "core/accounting/params.hpp"
#include "core/program/builder.hpp"
#include "core/program/stage_writer.hpp"
#include "models.hpp"
#include "program_support.hpp"
#include "support.hpp"

using namespace megascope;
using namespace megascope::test;

TEST_CASE("Programs of every schedule are valid and carry the hardware FLOPs of the iteration", "[core]") {
  ModelSpec m = gpt(16, 1024, 16);
  m.add_bias_linear = false;
  for (const char* plan : {"tp=2,pp=4,schedule=1f1b", "tp=2,pp=4,schedule=gpipe", "tp=2,pp=4,vpp=2,schedule=interleaved",
                           "tp=2,pp=4,schedule=zb-h1", "tp=2,pp=4,schedule=zb-v", "tp=2,pp=4,schedule=dualpipev",
                           "tp=2,pp=2,sp=on,recompute=selective,distopt=on,overlap_grad_reduce=on",
                           "tp=1,pp=2,recompute=full,recompute_method=uniform,recompute_layers=2",
                           "tp=1,pp=2,recompute=full,recompute_method=block,recompute_layers=3",
                           "tp=2,pp=1,cp=2,sp=on"}) {
    INFO(plan);
    const Setup s = make_setup(m, "dgx-a100", plan, 16, 16);
    auto p = build_program(s);
    REQUIRE(p);
    CHECK(program_flops(*p) == Approx(iteration_flops(s).hardware).epsilon(1e-9));
  }
}

TEST_CASE("DualPipe programs carry the FLOPs once although every rank holds two stages", "[core]") {
  const ModelSpec m = gpt_no_bias(16, 1024, 16);
  const Setup s = make_setup(m, "dgx-a100", "tp=1,pp=4,schedule=dualpipe", 16, 8);
  auto p = build_program(s);
  REQUIRE(p);
  CHECK(program_flops(*p) == Approx(iteration_flops(s).hardware).epsilon(1e-9));
  // Uneven first and last stages (16 layers as 3 + 5 + 5 + 3): rank r holds
  // stages r and 3 - r, so ranks 0 and 3 hold 6 layers, ranks 1 and 2 hold 10.
  const Setup u = make_setup(m, "dgx-a100", "tp=1,pp=4,schedule=dualpipe,first_stage_layers=3,last_stage_layers=3", 16, 8);
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    REQUIRE(u.chunks[static_cast<std::size_t>(r)].size() == 2);
    CHECK(u.chunks[static_cast<std::size_t>(r)][0].virtual_stage == r);
    CHECK(u.chunks[static_cast<std::size_t>(r)][1].virtual_stage == 3 - r);
    CHECK(u.layers_on_rank(r) == (r == 0 || r == 3 ? 6 : 10));
  }
  CHECK(u.chunks[0][0].first == 0);
  CHECK(u.chunks[0][0].count == 3);
  CHECK(u.chunks[0][1].first == 13);
  auto pu = build_program(u);
  REQUIRE(pu);
  CHECK(program_flops(*pu) == Approx(iteration_flops(u).hardware).epsilon(1e-9));
}

TEST_CASE("Memory kernels of backward ops are marked backward, and no other kernel is", "[core]") {
  for (const char* plan : {"tp=2,pp=2,sp=on,recompute=full,recompute_method=uniform,recompute_layers=1",
                           "tp=1,pp=1,recompute=selective"}) {
    INFO(plan);
    const Setup setup = make_setup(gpt(8, 512, 8), "dgx-a100", plan, 8, 4);
    const auto p = build_program(setup);
    REQUIRE(p);
    std::size_t marked = 0, unmarked_memory = 0;
    for (const StageProgram& s : p->stages)
      for (const Op& op : s.ops) {
        if (op.kind != OpKind::compute) continue;
        const bool bwd = op.phase == Phase::backward_input || op.phase == Phase::backward_weight;
        for (std::uint32_t k = op.kernel_begin; k < op.kernel_begin + op.kernel_count; ++k) {
          const Kernel& kr = s.kernels[k];
          CHECK(kr.backward == (bwd && kr.kind == KernelKind::memory));
          marked += kr.backward ? 1 : 0;
          unmarked_memory += kr.kind == KernelKind::memory && !kr.backward ? 1 : 0;
        }
      }
    CHECK(marked > 0);             // norms, activations, dropouts of the backward
    CHECK(unmarked_memory > 0);    // the forward's, the recompute's and AdamW's
  }
}

TEST_CASE("TP uses two all-reduces per layer and pass without SP and all-gather plus reduce-scatter with SP", "[core]") {
  const ModelSpec m = gpt_no_bias(4, 512, 8);
  const Setup plain = make_setup(m, "dgx-a100", "tp=2", 2, 2);
  const Setup sp = make_setup(m, "dgx-a100", "tp=2,sp=on", 2, 2);
  auto a = build_program(plain), b = build_program(sp);
  REQUIRE(a);
  REQUIRE(b);
  // 2 micro-batches x 4 layers x (2 forward + 2 backward) + embedding and output (fwd + bwd).
  CHECK(count(*a, 0, OpKind::all_reduce, OpLabel::tp_comm) == 2 * (4 * 4 + 2));
  CHECK(count(*b, 0, OpKind::all_gather, OpLabel::tp_comm) == 2 * (4 * 4 + 1));
  CHECK(count(*b, 0, OpKind::reduce_scatter, OpLabel::tp_comm) == 2 * (4 * 4 + 2));
}

TEST_CASE("Gradient buckets are reduced once per chunk and the distributed optimizer gathers parameters", "[core]") {
  const ModelSpec m = gpt_no_bias(8, 512, 8);
  const Setup s = make_setup(m, "dgx-a100", "tp=1,pp=2,vpp=2,schedule=interleaved,distopt=on", 16, 8);
  auto p = build_program(s);
  REQUIRE(p);
  CHECK(count(*p, 0, OpKind::reduce_scatter, OpLabel::dp_grad) == 2);
  CHECK(count(*p, 0, OpKind::all_gather, OpLabel::dp_param) == 1);
  CHECK(count(*p, 0, OpKind::all_reduce, OpLabel::embedding_grad) == 1);   // tied embeddings, first and last stage
  CHECK(count(*p, 1, OpKind::all_reduce, OpLabel::embedding_grad) == 1);
}

TEST_CASE("The rank grid follows Megatron's tp-cp-dp-pp order and folds experts into DP", "[core]") {
  const RankGrid g{2, 1, 4, 2, 2, 2, 2};
  CHECK(g.group(13, CommGroup::tp) == std::vector<int>{12, 13});
  CHECK(g.group(13, CommGroup::dp) == std::vector<int>{9, 11, 13, 15});
  CHECK(g.group(13, CommGroup::pp) == std::vector<int>{5, 13});
  CHECK(g.group(13, CommGroup::ep) == std::vector<int>{13, 15});
  CHECK(g.group(13, CommGroup::edp) == std::vector<int>{9, 13});   // etp 1, ep 0, edp 1 in stage 1
  CHECK(g.group(13, CommGroup::embedding) == std::vector<int>{5, 13});
  CHECK(g.group_id(12, CommGroup::tp) == g.group_id(13, CommGroup::tp));
  CHECK(g.group_id(12, CommGroup::tp) != g.group_id(14, CommGroup::tp));
}

TEST_CASE("A group's id is its kind and smallest member, the same for every member and only for them", "[core]") {
  // Dense and expert grids of every shape with a dimension of 1, 2 and 3, and HSDP shards.
  const std::vector<RankGrid> grids = {
      RankGrid{2, 1, 4, 2, 2, 2, 2}, RankGrid{3, 2, 2, 2, 1, 3, 4}, RankGrid{1, 3, 4, 1, 1, 2, 6},
      RankGrid{2, 2, 3, 3, 2, 1, 6, 3}, RankGrid{1, 2, 6, 2, 1, 4, 3, 4}, RankGrid{4, 1, 1, 3, 4, 1, 1}};
  for (const RankGrid& g : grids) {
    INFO("tp " << g.tp << " cp " << g.cp << " dp " << g.dp << " pp " << g.pp << " shard " << g.shard);
    for (int k = 0; k < kCommGroupCount; ++k) {
      const auto kind = static_cast<CommGroup>(k);
      std::map<std::int64_t, std::set<int>> members_of_id;
      for (int r = 0; r < g.world(); ++r) {
        const std::vector<int> members = g.group(r, kind);
        const std::int64_t id = g.group_id(r, kind);
        CHECK(id == static_cast<std::int64_t>(k) * g.world() + *std::min_element(members.begin(), members.end()));
        members_of_id[id].insert(r);
        for (const int m : members) CHECK(g.group_id(m, kind) == id);
      }
      // Ranks with one id are exactly one group's members (a middle stage's
      // embedding group is its pipeline's two ends, without the rank itself).
      if (kind == CommGroup::embedding && g.pp > 2) continue;
      for (const auto& [id, ranks] : members_of_id) {
        const std::vector<int> group = g.group(*ranks.begin(), kind);
        CHECK(ranks == std::set<int>(group.begin(), group.end()));
      }
    }
  }
}

namespace {

// Bytes of dropout_residual kernels per stage and phase, over every micro-batch.
double dropout_bytes(const Program& p, int stage, Phase phase) {
  const StageProgram& st = p.stages.at(static_cast<std::size_t>(stage));
  double b = 0;
  for (const Op& op : st.ops)
    if (op.kind == OpKind::compute && op.phase == phase)
      for (std::uint32_t k = op.kernel_begin; k < op.kernel_begin + op.kernel_count; ++k)
        if (st.kernels[k].kind == KernelKind::memory && st.kernels[k].memory == MemoryOp::dropout_residual)
          b += st.kernels[k].bytes;
  return b;
}

}  // namespace

TEST_CASE("Each stage carries its own layers' bias-dropout-adds and the first stage the embedding dropout", "[core]") {
  // 8 layers on pp = 2, 4 micro-batches (per DP rank) of 2048 tokens, h = 512 (tp = 2 with SP: 1024 per rank).
  const double T = 2048, h = 512, mbs = 4, L = 4;   // L: layers per stage
  SECTION("GPT: dropout 0.1 and biases") {
    const Setup s = make_setup(gpt(8, 512, 8), "dgx-a100", "tp=2,pp=2,sp=on", 4, 4);
    auto p = build_program(s);
    REQUIRE(p);
    const double Tsp = T / 2;
    // Forward: two bias-dropout-adds per layer (6 bytes per element), and the embedding dropout (5) on stage 0.
    CHECK(dropout_bytes(*p, 0, Phase::forward) == Approx(mbs * (L * 2 * 6 * Tsp * h + 5 * Tsp * h)));
    CHECK(dropout_bytes(*p, 1, Phase::forward) == Approx(mbs * L * 2 * 6 * Tsp * h));
    // Backward: the mask on the gradient after the attention and after the MLP (4), and the embedding's (5).
    CHECK(dropout_bytes(*p, 0, Phase::backward_input) == Approx(mbs * L * 2 * 4 * Tsp * h));
    CHECK(dropout_bytes(*p, 0, Phase::backward_weight) == Approx(mbs * 5 * Tsp * h));
    CHECK(dropout_bytes(*p, 1, Phase::backward_input) == Approx(mbs * L * 2 * 4 * Tsp * h));
    CHECK(dropout_bytes(*p, 1, Phase::backward_weight) == 0);
  }
  SECTION("Llama-like: no dropout, no biases: the residual add only, no backward kernel") {
    ModelSpec m = gpt_no_bias(8, 512, 8);
    m.hidden_dropout = 0;
    m.attention_dropout = 0;
    const Setup s = make_setup(m, "dgx-a100", "tp=1,pp=2", 8, 4);
    auto p = build_program(s);
    REQUIRE(p);
    CHECK(dropout_bytes(*p, 0, Phase::forward) == Approx(mbs * L * 2 * 6 * T * h));
    CHECK(dropout_bytes(*p, 1, Phase::forward) == Approx(mbs * L * 2 * 6 * T * h));
    for (int stage : {0, 1}) {
      CHECK(dropout_bytes(*p, stage, Phase::backward_input) == 0);
      CHECK(dropout_bytes(*p, stage, Phase::backward_weight) == 0);
    }
  }
}

TEST_CASE("An unsplit backward runs each layer's weight gradients right after its input gradients", "[core]") {
  // Megatron-LM's autograd order: B(L-1) W(L-1) B(L-2) W(L-2) ..., so that the
  // last micro-batch's gradient buckets complete (and their reduction starts)
  // as the backward passes their layers, not after the whole chunk.
  const ModelSpec m = gpt_no_bias(8, 512, 8);
  for (const char* plan : {"tp=2,pp=2,sp=on,distopt=on,overlap_grad_reduce=on", "tp=2,pp=2,vpp=2,schedule=interleaved",
                           "tp=2,pp=2,tp_grad_overlap=off", "tp=1,pp=1,recompute=full,recompute_method=uniform,recompute_layers=1"}) {
    INFO(plan);
    const Setup s = make_setup(m, "dgx-a100", plan, 8, 4);
    auto p = build_program(s);
    REQUIRE(p);
    for (const StageProgram& sp : p->stages) {
      // Per micro-batch, the layers of its backward ops in op order.
      std::map<std::pair<int, int>, std::vector<std::pair<Phase, int>>> seen;   // (mb, chunk) -> (phase, layer)
      for (const Op& op : sp.ops)
        if ((op.phase == Phase::backward_input || op.phase == Phase::backward_weight) && op.layer && op.microbatch) {
          auto& v = seen[{*op.microbatch, op.chunk.value_or(0)}];
          if (v.empty() || v.back() != std::make_pair(op.phase, *op.layer)) v.emplace_back(op.phase, *op.layer);
        }
      REQUIRE_FALSE(seen.empty());
      for (const auto& [key, v] : seen) {
        // B l, W l, B l-1, W l-1, ...: every W follows the B of its own layer.
        REQUIRE(v.size() % 2 == 0);
        for (std::size_t k = 0; k < v.size(); k += 2) {
          CHECK(v[k].first == Phase::backward_input);
          CHECK(v[k + 1].first == Phase::backward_weight);
          CHECK(v[k].second == v[k + 1].second);
          if (k > 0) CHECK(v[k].second == v[k - 1].second - 1);
        }
      }
    }
  }
  // Zero-bubble schedules keep their weight gradients apart: ZB-H1 defers
  // some past the forward of a later micro-batch.
  const Setup zb = make_setup(m, "dgx-a100", "tp=1,pp=4,schedule=zb-h1", 8, 8);
  auto pz = build_program(zb);
  REQUIRE(pz);
  bool deferred = false;
  int latest_forward = -1;
  for (const Op& op : pz->stages.back().ops) {
    if (!op.microbatch) continue;
    if (op.phase == Phase::forward) latest_forward = std::max(latest_forward, *op.microbatch);
    if (op.phase == Phase::backward_weight && op.layer) deferred = deferred || latest_forward > *op.microbatch + 1;
  }
  CHECK(deferred);
}

TEST_CASE("Without tp_grad_overlap a layer's weight gradients wait for its input gradient's collective", "[core]") {
  const ModelSpec m = gpt_no_bias(4, 512, 8);
  for (const bool overlap : {true, false}) {
    const Setup s = make_setup(m, "dgx-a100", overlap ? "tp=2" : "tp=2,tp_grad_overlap=off", 2, 2);
    auto p = build_program(s);
    REQUIRE(p);
    const StageProgram& sp = p->stages.front();
    int waits = 0, ws = 0;
    for (const Op& op : sp.ops) {
      if (op.phase != Phase::backward_weight || !op.layer) continue;
      ++ws;
      for (std::uint32_t d = op.dep_begin; d < op.dep_begin + op.dep_count; ++d)
        if (sp.ops[sp.deps[d]].kind == OpKind::all_reduce) ++waits;
    }
    CHECK(ws == 4 * 2);   // 4 layers x 2 micro-batches
    CHECK(waits == (overlap ? 0 : ws));
  }
}

TEST_CASE("Weight gradients wait for the gradients they need: the embedding's, and QKV's under CP", "[core]") {
  const ModelSpec m = gpt_no_bias(4, 512, 8);
  // On the first stage of `plan`: how many weight-gradient ops `pick` selects,
  // and how many of them depend on a `kind` collective of `group`, directly
  // or through an empty compute op that joins it with the compute beside it.
  const auto waiting = [&](const char* plan, auto pick, OpKind kind, CommGroup group) {
    const Setup s = make_setup(m, "dgx-a100", plan, 2, 2);
    auto p = build_program(s);
    REQUIRE(p);
    const StageProgram& sp = p->stages.front();
    std::pair<int, int> n{0, 0};
    for (const Op& op : sp.ops) {
      if (op.phase != Phase::backward_weight || !pick(op)) continue;
      ++n.first;
      const auto is = [&](const Op& o) { return o.kind == kind && o.group == group; };
      bool waits = false;
      for (std::uint32_t d = op.dep_begin; d < op.dep_begin + op.dep_count; ++d) {
        const Op& before = sp.ops[sp.deps[d]];
        waits = waits || is(before);
        if (before.kind == OpKind::compute && before.kernel_count == 0)
          for (std::uint32_t e = before.dep_begin; e < before.dep_begin + before.dep_count; ++e)
            waits = waits || is(sp.ops[sp.deps[e]]);
      }
      n.second += waits ? 1 : 0;
    }
    return n;
  };
  // The embedding's weight gradient is the first layer's input gradient,
  // complete only after that layer's TP all-reduce.
  CHECK(waiting("tp=2", [](const Op& op) { return op.label == OpLabel::embedding; }, OpKind::all_reduce, CommGroup::tp) ==
        std::make_pair(2, 2));
  // With CP, QKV's weight gradient needs the KV gradients reduced over the ring.
  CHECK(waiting("tp=1,cp=2", [](const Op& op) { return op.layer.has_value(); }, OpKind::reduce_scatter, CommGroup::cp) ==
        std::make_pair(4 * 2, 4 * 2));
}

TEST_CASE("A micro-batch turning between two virtual stages of one rank waits for the stage before", "[core]") {
  // DualPipeV: the middle rank holds virtual stages pp - 1 and pp; nothing is
  // sent between them, but the later stage's first op must wait for the
  // earlier one's last (its TP all-reduce), forward and backward.
  const ModelSpec m = gpt_no_bias(8, 512, 8);
  const Setup s = make_setup(m, "dgx-a100", "tp=2,pp=4,schedule=dualpipev", 16, 16);
  auto p = build_program(s);
  REQUIRE(p);
  const int r = 3;   // holds virtual stages 3 and 4
  const StageProgram& sp = p->stages.at(r);
  const auto& chunks = s.chunks.at(r);
  REQUIRE(chunks.size() == 2);
  const auto chunk_of = [&](int vs) {
    for (std::size_t c = 0; c < chunks.size(); ++c)
      if (chunks[c].virtual_stage == vs) return static_cast<int>(c);
    return -1;
  };
  const int upper = chunk_of(s.plan.pp), lower = chunk_of(s.plan.pp - 1);
  REQUIRE(upper >= 0);
  REQUIRE(lower >= 0);
  // The first op of each forward of the upper stage and of each backward of the lower one.
  std::map<std::pair<Phase, int>, const Op*> first;
  for (const Op& op : sp.ops) {
    if (!op.microbatch || !op.chunk) continue;
    const bool f = op.phase == Phase::forward && *op.chunk == upper;
    const bool b = op.phase == Phase::backward_input && *op.chunk == lower;
    if ((f || b) && !first.count({op.phase, *op.microbatch})) first[{op.phase, *op.microbatch}] = &op;
  }
  REQUIRE(first.size() == 2 * static_cast<std::size_t>(s.num_microbatches));
  for (const auto& [key, op] : first) {
    INFO(to_string(key.first) << " micro-batch " << key.second);
    CHECK(op->dep_count > 0);
  }
}

namespace {

// The bytes of kind-`other` memory kernels (gradient accumulation outside the
// GEMMs) in the first stage's weight-gradient ops labelled `label`, and how
// many such ops there are.
std::pair<int, double> grad_add_bytes(const StageProgram& sp, OpLabel label) {
  std::pair<int, double> out{0, 0.0};
  for (const Op& op : sp.ops) {
    if (op.kind != OpKind::compute || op.phase != Phase::backward_weight || op.label != label) continue;
    ++out.first;
    for (std::uint32_t k = op.kernel_begin; k < op.kernel_begin + op.kernel_count; ++k)
      if (sp.kernels[k].kind == KernelKind::memory && sp.kernels[k].memory == MemoryOp::other)
        out.second += sp.kernels[k].bytes;
  }
  return out;
}

Setup setup_with_grads(const ModelSpec& m, const std::string& plan, Dtype params, Dtype grads) {
  auto p = parse_inline_plan(plan);
  REQUIRE(p);
  TrainingSpec t;
  t.global_batch_size = 2;
  t.params_dtype = params;
  t.grad_dtype = grads;
  auto c = with_device_count(shipped_cluster("dgx-a100"), 2);
  REQUIRE(c);
  auto s = validate_setup(m, *c, t, *p, 2);
  if (!s) FAIL(s.error().str());
  return *s;
}

}  // namespace

TEST_CASE("Without gradient accumulation fusion every weight gradient is added to the main gradient once per micro-batch",
          "[core]") {
  // tp 2, untied embeddings, RoPE (no position table), 2 micro-batches, one stage.
  ModelSpec m = gpt_no_bias(4, 512, 8);
  m.tied_embeddings = false;
  const double layer = layer_params(m, 0, Sharding{2, 2, 1}).total();
  for (const bool fusion : {true, false}) {
    for (const Dtype grads : {Dtype::fp32, Dtype::fp16}) {
      INFO("fusion " << fusion << ", main gradients " << to_string(grads));
      const Setup s = setup_with_grads(m, fusion ? "tp=2" : "tp=2,grad_accum_fusion=off",
                                       grads == Dtype::fp16 ? Dtype::fp16 : Dtype::bf16, grads);
      auto p = build_program(s);
      REQUIRE(p);
      const StageProgram& sp = p->stages.front();
      const double word = static_cast<double>(s.padded_vocab) * 512 / 2;
      // Read the 16-bit gradient, read and write the main gradient: 10 bytes
      // per parameter with fp32 main gradients, 6 with fp16 ones.
      const double add = grads == Dtype::fp32 ? 10.0 : 6.0;
      // Each layer's weight gradients (the MLP label carries them).
      const auto [layer_ops, layer_bytes] = grad_add_bytes(sp, OpLabel::mlp);
      CHECK(layer_ops == 4 * 2);
      CHECK(layer_bytes == Approx(fusion ? 0.0 : 4 * 2 * add * layer).epsilon(1e-12));
      // The output layer's weight gradient: the same rule.
      const auto [out_ops, out_bytes] = grad_add_bytes(sp, OpLabel::output_loss);
      CHECK(out_ops == 2);
      CHECK(out_bytes == Approx(fusion ? 0.0 : 2 * add * word).epsilon(1e-12));
      // The embedding's gradient is never fused: a zero-filled 16-bit table
      // (2 bytes per parameter) added to the main gradient.
      const auto [emb_ops, emb_bytes] = grad_add_bytes(sp, OpLabel::embedding);
      CHECK(emb_ops == 2);
      CHECK(emb_bytes == Approx(2 * (2.0 + add) * word).epsilon(1e-12));
    }
  }
}

TEST_CASE("A word embedding tied to the output layer on one stage gets one gradient and one main-gradient add",
          "[core]") {
  // Tied embeddings, learned positions (a replicated seq x h table), one stage, tp 2.
  ModelSpec m = gpt_no_bias(4, 512, 8);
  m.tied_embeddings = true;
  m.position_embedding = PositionEmbedding::learned;
  for (const bool fusion : {true, false}) {
    INFO("fusion " << fusion);
    const Setup s = setup_with_grads(m, fusion ? "tp=2" : "tp=2,grad_accum_fusion=off", Dtype::bf16, Dtype::fp32);
    auto p = build_program(s);
    REQUIRE(p);
    const StageProgram& sp = p->stages.front();
    const double word = static_cast<double>(s.padded_vocab) * 512 / 2;
    const double position = static_cast<double>(m.seq_length) * 512;
    // Fusion on: the fused output GEMM still hands autograd a zero-filled
    // 16-bit gradient (2 bytes per parameter); off: nothing here, the
    // embedding's hook adds the summed gradient.
    const auto [out_ops, out_bytes] = grad_add_bytes(sp, OpLabel::output_loss);
    CHECK(out_ops == 2);
    CHECK(out_bytes == Approx(fusion ? 2 * 2.0 * word : 0.0).epsilon(1e-12));
    // The table: zero-filled (2), the output layer's gradient summed in (6),
    // one hook add (10); the position table: zero-filled and added (12).
    const auto [emb_ops, emb_bytes] = grad_add_bytes(sp, OpLabel::embedding);
    CHECK(emb_ops == 2);
    CHECK(emb_bytes == Approx(2 * (18.0 * word + 12.0 * position)).epsilon(1e-12));
  }
}

TEST_CASE("Fused attention kernels carry the model's attention dropout, forward and backward", "[core]") {
  for (const double p : {0.0, 0.1}) {
    INFO("attention dropout " << p);
    ModelSpec m = gpt(2, 1024, 16);
    m.attention_dropout = p;
    auto prog = build_program(make_setup(m, "dgx-h100", "tp=2,pp=1,mbs=1,recompute=full,recompute_method=uniform,recompute_layers=1", 8, 2));
    REQUIRE(prog);
    const StageProgram& st = prog->stages.at(0);
    int fwd = 0, bwd = 0;
    for (const Op& op : st.ops)
      for (std::uint32_t i = op.kernel_begin; i < op.kernel_begin + op.kernel_count; ++i) {
        const Kernel& k = st.kernels[i];
        if (k.kind != KernelKind::attention_fwd && k.kind != KernelKind::attention_bwd) continue;
        (k.kind == KernelKind::attention_fwd ? fwd : bwd) += 1;
        CHECK(k.attention.dropout == (p > 0));
      }
    // 2 layers x 8 micro-batches (batch 8 on 2 GPUs, tp 2): a forward, its recomputation and a backward each.
    CHECK(fwd == 32);
    CHECK(bwd == 16);
  }
}

TEST_CASE("Unfused attention's score-matrix kernels, and only they, are marked for the cost model", "[core]") {
  // 4 layers, h 1024, 16 heads (d 64), s 2048, tp 2: 8 heads per rank; mbs 2, 4 micro-batches, no recomputation.
  const ModelSpec m = gpt(4, 1024, 16);
  const double b = 2, heads = 8, s = 2048, d = 64, layers = 4, micro = 4;
  for (const char* attention : {"unfused", "flash"}) {
    INFO(attention);
    const Setup setup = make_setup(m, "dgx-a100", fmt::format("tp=2,pp=1,mbs=2,attention={}", attention), 8, 2);
    auto p = build_program(setup);
    REQUIRE(p);
    const StageProgram& st = p->stages.at(0);
    double gemm_flops = 0, bytes = 0;
    int marked = 0;
    for (const Op& op : st.ops)
      for (std::uint32_t k = op.kernel_begin; k < op.kernel_begin + op.kernel_count; ++k) {
        const Kernel& kr = st.kernels[k];
        if (!kr.unfused_attention) continue;
        ++marked;
        REQUIRE(kr.kind != KernelKind::attention_fwd);
        REQUIRE(kr.kind != KernelKind::attention_bwd);
        if (kr.kind == KernelKind::gemm)
          gemm_flops += 2.0 * static_cast<double>(kr.gemm.m) * static_cast<double>(kr.gemm.n) * static_cast<double>(kr.gemm.k);
        else bytes += kr.bytes;
      }
    if (std::string(attention) == "flash") {
      CHECK(marked == 0);
      continue;
    }
    // Per layer and micro-batch: QK^T, softmax, dropout, PV forward; dP, dV, dropout, softmax, dQ, dK backward.
    CHECK(marked == layers * micro * 10);
    // The two forward GEMMs (4 b h s^2 d) and four backward ones (8 b h s^2 d).
    CHECK(gemm_flops == Approx(layers * micro * 12 * b * heads * s * s * d));
    // Score-matrix bytes: softmax 4 + dropout 5 forward, dropout 5 + softmax 6 backward, per element.
    CHECK(bytes == Approx(layers * micro * 20 * b * heads * s * s));
  }
}

TEST_CASE("A DualPipe F&B unit interleaves its forward and backward at their communication points", "[core]") {
  // Each chain: compute, all-to-all, compute, all-to-all, compute, every op
  // waiting for the one before. The forward (ops 0-4) goes first and hands
  // over when its next compute would wait for the all-to-all it just posted;
  // the backward (ops 5-9) does the same; a chain's all-to-all posted before
  // the other's turn no longer stalls it.
  const auto chain_unit = [](bool comm) {
    StageProgram sp;
    detail::StageWriter w(sp);
    detail::OpContext ctx;
    for (int chain = 0; chain < 2; ++chain) {
      std::optional<std::uint32_t> dep;
      for (int k = 0; k < 5; ++k)
        dep = k % 2 == 1 && comm ? w.collective(OpKind::all_to_all, Stream::ep, CommGroup::ep, OpLabel::ep_comm, ctx, 1e6, dep)
                                 : w.compute(OpLabel::moe, ctx, {detail::memory(MemoryOp::other, 1e6)}, dep);
    }
    return sp;
  };
  StageProgram sp = chain_unit(true);
  const std::vector<Op> before = sp.ops;
  const detail::FbUnit unit{0, 5, 10};
  const std::vector<std::uint32_t> at = detail::interleave_fb(sp, std::span(&unit, 1));
  const std::vector<std::uint32_t> order = {0, 1, 5, 6, 2, 3, 7, 8, 4, 9};   // old index at each new position
  for (std::uint32_t k = 0; k < order.size(); ++k) {
    INFO("position " << k);
    CHECK(at[order[k]] == k);
    CHECK(sp.ops[k].kind == before[order[k]].kind);
  }
  // Every op still waits for the op before it in its own chain, renumbered.
  for (std::uint32_t old = 0; old < 10; ++old) {
    const Op& op = sp.ops[at[old]];
    if (old % 5 == 0) {
      CHECK(op.dep_count == 0);
    } else {
      REQUIRE(op.dep_count == 1);
      CHECK(sp.deps[op.dep_begin] == at[old - 1]);
      CHECK(sp.deps[op.dep_begin] < at[old]);
    }
  }
  // Without communication the forward is written whole, then the backward.
  StageProgram plain = chain_unit(false);
  const std::vector<std::uint32_t> same = detail::interleave_fb(plain, std::span(&unit, 1));
  for (std::uint32_t k = 0; k < 10; ++k) CHECK(same[k] == k);
}

TEST_CASE("DualPipe programs interleave each F&B unit and keep its ops, FLOPs and transfers", "[core]") {
  for (const char* plan : {"tp=1,ep=8,pp=4,schedule=dualpipev", "tp=2,sp=on,ep=4,pp=4,schedule=dualpipe"}) {
    INFO(plan);
    const Setup s = make_setup(shipped_model("mixtral-8x7b"), "dgx-h100", plan, 128, 32, 4096);
    auto on = build_program(s);
    auto off = build_program(s, BuildOptions{false});
    REQUIRE(on);
    REQUIRE(off);
    REQUIRE(on->stages.size() == off->stages.size());
    for (std::size_t r = 0; r < on->stages.size(); ++r) {
      const StageProgram &a = on->stages[r], &b = off->stages[r];
      REQUIRE(a.ops.size() == b.ops.size());
      // The same ops, reordered: per (kind, phase, micro-batch, layer) counts and FLOPs agree.
      const auto census = [](const StageProgram& st) {
        std::map<std::tuple<int, int, int, int>, std::pair<int, double>> c;
        for (const Op& op : st.ops) {
          auto& e = c[{static_cast<int>(op.kind), static_cast<int>(op.phase), op.microbatch.value_or(-1), op.layer.value_or(-1)}];
          e.first += 1;
          e.second += op.flops;
        }
        return c;
      };
      CHECK(census(a) == census(b));
      // Interleaved: somewhere a backward op comes between two forward ops of one micro-batch.
      bool mixed = false;
      for (std::size_t i = 2; i < a.ops.size() && !mixed; ++i)
        mixed = a.ops[i].phase == Phase::forward && a.ops[i - 1].phase == Phase::backward_input &&
                std::any_of(a.ops.begin(), a.ops.begin() + static_cast<std::ptrdiff_t>(i - 1), [&](const Op& o) {
                  return o.phase == Phase::forward && o.microbatch == a.ops[i].microbatch && o.chunk == a.ops[i].chunk;
                });
      CHECK(mixed);
    }
  }
}

TEST_CASE("FP8 programs quantise each linear layer's input (unless a norm wrote it) and each output gradient, nothing else",
          "[core]") {
  // Against the BF16 program of the same plan: the same GEMMs and the same
  // other kernels, plus kFp8CastBytesPerElement per quantised element.
  struct Sums { int gemms = 0, other = 0; double flops = 0, other_bytes = 0, rest_bytes = 0; };
  const auto sums = [](const Setup& s, int layer, LayerPass pass) {
    const LayerProbe p = probe_layer(s, layer, pass);
    Sums out;
    for (const Op& op : p.ops.ops) {
      if (op.kind != OpKind::compute) continue;
      for (std::uint32_t i = 0; i < op.kernel_count; ++i) {
        const Kernel& k = p.ops.kernels[op.kernel_begin + i];
        if (k.kind == KernelKind::gemm) {
          ++out.gemms;
          out.flops += detail::kernel_flops(k);
        } else if (k.kind == KernelKind::memory && k.memory == MemoryOp::other) {
          ++out.other;
          out.other_bytes += k.bytes;
        } else {
          out.rest_bytes += k.bytes;
        }
      }
    }
    return out;
  };
  struct Case { const char* model; const char* plan; int gpus; int layer; };
  for (const Case& c : {Case{"llama3-70b", "tp=2,sp=on", 2, 0}, Case{"mixtral-8x7b", "tp=2,sp=on,ep=2", 4, 0},
                        Case{"deepseek-v3", "tp=2,sp=on,ep=4", 8, 3},
                        Case{"deepseek-v3", "tp=2,sp=on,ep=4,moe_shared_expert_overlap=on", 8, 3},
                        Case{"deepseek-v3", "tp=1,ep=4,recompute=selective,recompute_modules=moe_act", 4, 3}}) {
    INFO(c.model << " " << c.plan);
    const auto [s, s8] = bf16_and_fp8(c.model, c.plan, c.gpus);
    const ModelSpec& m = s.model;
    const double T = 4096, h = static_cast<double>(m.hidden_size), t = s.plan.tp;
    const double up = m.activation == Activation::swiglu ? 2 : 1;
    // The attention block: the projection's input (forward); its output
    // gradient and the QKV projections' (backward).
    double heads = m.num_attention_heads / t, core_out = 0, qkv_out = 0;
    if (m.mla) {
      const MlaSpec& a = *m.mla;
      core_out = heads * static_cast<double>(a.v_head_dim);
      qkv_out = static_cast<double>(a.q_lora_rank.value_or(0)) + heads * static_cast<double>(a.qk_head_dim + a.qk_rope_head_dim) +
                static_cast<double>(a.kv_lora_rank + a.qk_rope_head_dim) + heads * static_cast<double>(a.qk_head_dim + a.v_head_dim);
    } else {
      const double kv_heads = m.num_query_groups / t;
      core_out = heads * static_cast<double>(m.kv_channels);
      qkv_out = static_cast<double>(m.kv_channels) * (heads + 2 * kv_heads);
    }
    double fwd = T * core_out, bwd = T * h + T * qkv_out;
    int fwd_casts = 1, bwd_casts = m.mla ? 5 : 2;
    if (m.mla) {   // MLA's two projections from the hidden state quantise their input
      fwd += 2 * T * h;
      fwd_casts += 2;
    }
    if (!m.is_moe_layer(c.layer)) {
      const double f = static_cast<double>(m.ffn_hidden_size) / t;
      fwd += T * f;                      // fc2's input; fc1's is the norm's
      bwd += T * h + T * up * f;         // fc2's and fc1's output gradients
      fwd_casts += 1;
      bwd_casts += 2;
    } else {
      const MoeSpec& e = *m.moe;
      const double tokens = T / (s.sequence_parallel ? t : 1) * e.top_k * s.etp * s.expert_load;   // the busiest rank's
      const double fe = static_cast<double>(e.expert_ffn_hidden) / s.etp;
      fwd += tokens * h + tokens * fe;
      bwd += tokens * h + tokens * up * fe;
      fwd_casts += 2;
      bwd_casts += 2;
      if (e.shared_expert_ffn_hidden > 0) {
        const double fs = static_cast<double>(e.shared_expert_ffn_hidden) / t;
        fwd += T * h + T * fs;
        bwd += T * h + T * up * fs;
        fwd_casts += 2;
        bwd_casts += 2;
      }
    }
    for (const auto& [pass, elements, casts] : {std::tuple{LayerPass::forward, fwd, fwd_casts},
                                                std::tuple{LayerPass::backward_input, bwd, bwd_casts},
                                                std::tuple{LayerPass::backward_weight, 0.0, 0}}) {
      INFO("pass " << static_cast<int>(pass));
      const Sums a = sums(s, c.layer, pass), b = sums(s8, c.layer, pass);
      CHECK(b.gemms == a.gemms);
      CHECK(b.flops == Approx(a.flops).epsilon(1e-12));
      CHECK(b.rest_bytes == Approx(a.rest_bytes).epsilon(1e-12));
      CHECK(b.other - a.other == casts);
      CHECK(b.other_bytes - a.other_bytes == Approx(kFp8CastBytesPerElement * elements).epsilon(1e-12));
    }
  }
}
