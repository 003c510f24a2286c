// Variable-length training in the Program and the simulator: a packed
// micro-batch's attention against a direct sum over its documents, its ops
// shaped at its own tokens, dynamic CP's rings, fixed-length training as the
// special case it is, and sampled steps that are deterministic for a seed.
#include <catch2/catch.hpp>

#include <memory>
#include <numeric>

#include "core/program/builder.hpp"
#include "core/varlen.hpp"
#include "sim/cost_model.hpp"
#include "sim/engine.hpp"
#include "sim/varlen_sim.hpp"
#include "support.hpp"

using namespace megascope;
using namespace megascope::test;

namespace {

ModelSpec small_llama(int layers = 4) {
  ModelSpec m = shipped_model("llama3-8b");
  m.num_layers = layers;
  return m;
}

Setup varlen_setup(const ModelSpec& m, const std::string& plan, int gpus, std::int64_t batch, std::int64_t seq,
                   const LengthDistribution& d, Packing packing, int steps = 2, std::uint64_t seed = 1) {
  auto p = parse_inline_plan(plan);
  REQUIRE(p);
  TrainingSpec t;
  t.global_batch_size = batch;
  t.seq_length = seq;
  auto v = std::make_shared<VarlenSpec>();
  v->lengths = d;
  v->packing = packing;
  v->steps = steps;
  v->seed = seed;
  t.varlen = v;
  auto c = with_device_count(shipped_cluster("dgx-h100"), gpus);
  REQUIRE(c);
  auto s = validate_setup(m, *c, t, *p, gpus);
  if (!s) FAIL(s.error().str());
  return *s;
}

LengthDistribution histogram(std::vector<std::pair<std::int64_t, double>> rows) {
  LengthDistribution d;
  d.kind = LengthDistribution::Kind::histogram;
  d.histogram = std::move(rows);
  return d;
}

LengthDistribution fixed(std::int64_t length) {
  LengthDistribution d;
  d.kind = LengthDistribution::Kind::fixed;
  d.max = length;
  return d;
}

// Model FLOPs of the fused attention kernels of micro-batch `mb`'s forward
// through layer `layer` on stage 0, and the m of its first GEMM (its tokens).
struct LayerWork {
  double attention_fwd_flops = 0;
  std::int64_t gemm_m = 0;
  double cp_bytes = 0;
  int cp_ops = 0;
};
LayerWork forward_work(const Program& p, int mb, int layer) {
  LayerWork w;
  const StageProgram& sp = p.stages.at(0);
  for (const Op& op : sp.ops) {
    if (op.phase != Phase::forward || op.microbatch != mb || op.layer != layer) continue;
    if (op.kind == OpKind::compute) {
      for (std::uint32_t k = op.kernel_begin; k < op.kernel_begin + op.kernel_count; ++k) {
        const Kernel& kk = sp.kernels[k];
        if (kk.kind == KernelKind::attention_fwd) w.attention_fwd_flops += sim::attention_fwd_flops(kk.attention);
        if (kk.kind == KernelKind::gemm && w.gemm_m == 0) w.gemm_m = kk.gemm.m;
      }
    } else if (op.label == OpLabel::cp_comm) {
      w.cp_bytes += op.bytes;
      ++w.cp_ops;
    }
  }
  return w;
}

}  // namespace

TEST_CASE("A packed micro-batch's attention is the sum over its documents, its GEMMs its tokens'", "[sim][varlen]") {
  const ModelSpec m = small_llama(2);
  const std::vector<std::int64_t> docs = {1000, 3000, 96};   // 4,096 tokens of an 8,192-token budget
  for (const int cp : {1, 2, 4}) {
    INFO("cp " << cp);
    const Setup s = varlen_setup(m, fmt::format("tp=1,cp={},mbs=1", cp), 8, 16, 8192, histogram({{1000, 1}}),
                                 Packing::pack);
    // The pack shaped at its tokens (a multiple of 2 cp), its documents'
    // pairs over that length's (each rank holds 1/cp of every document).
    const std::int64_t length = 4096;
    double pairs = 0, tiles = 0;
    for (const std::int64_t d : docs) {
      pairs += causal_pairs(d);
      tiles += causal_block_pairs(d);
    }
    std::vector<MicrobatchLoad> loads(static_cast<std::size_t>(s.num_microbatches));
    loads[0] = MicrobatchLoad{length, pairs / causal_pairs(length), tiles / causal_block_pairs(length), 0};
    BuildOptions bo;
    bo.loads = &loads;
    auto packed = build_program(s, bo);
    if (!packed) FAIL(packed.error().str());
    // 2 FLOPs x heads x pairs x (qk + v head dims) per rank, summed directly.
    const double heads = static_cast<double>(m.num_attention_heads);
    const double direct = 2.0 * heads * (pairs / cp) * 2.0 * static_cast<double>(m.kv_channels);
    const LayerWork w0 = forward_work(*packed, 0, 0);
    CHECK(w0.attention_fwd_flops == Approx(direct).epsilon(1e-12));
    CHECK(w0.gemm_m == length / cp);
    // Micro-batch 1 keeps the full-length shapes: one sequence of 8,192 tokens.
    const LayerWork w1 = forward_work(*packed, 1, 0);
    CHECK(w1.attention_fwd_flops ==
          Approx(2.0 * heads * (causal_pairs(8192) / cp) * 2.0 * static_cast<double>(m.kv_channels)).epsilon(1e-12));
    CHECK(w1.gemm_m == 8192 / cp);
    // The same as building without loads, op for op, for a full-length load.
    auto plain = build_program(s);
    REQUIRE(plain);
    const LayerWork wp = forward_work(*plain, 1, 0);
    CHECK(wp.attention_fwd_flops == w1.attention_fwd_flops);
    CHECK(wp.cp_bytes == w1.cp_bytes);
    if (cp > 1) CHECK(w0.cp_bytes == Approx(wp.cp_bytes * 0.5));   // half the tokens' KV around the ring
  }
}

TEST_CASE("Dynamic CP's rings: one rank exchanges nothing, a smaller ring its share", "[sim][varlen]") {
  const Setup s = varlen_setup(small_llama(2), "tp=1,cp=4,mbs=1,dynamic_cp=on", 8, 4, 8192, histogram({{1000, 1}}),
                               Packing::pack);
  REQUIRE(s.num_microbatches == 2);
  // Micro-batch 0: a rank alone with 2,048 tokens (ring 1); micro-batch 1: a
  // ring of 2 ranks, 2,048 tokens each.
  std::vector<MicrobatchLoad> loads = {MicrobatchLoad{8192, 0.5, 0.5, 1}, MicrobatchLoad{8192, 0.5, 0.5, 2}};
  BuildOptions bo;
  bo.loads = &loads;
  auto p = build_program(s, bo);
  if (!p) FAIL(p.error().str());
  auto plain = build_program(s);
  REQUIRE(plain);
  const LayerWork full = forward_work(*plain, 0, 0);
  REQUIRE(full.cp_ops == 1);
  const LayerWork alone = forward_work(*p, 0, 0);
  CHECK(alone.cp_ops == 0);
  const LayerWork pair = forward_work(*p, 1, 0);
  CHECK(pair.cp_ops == 1);
  // The plan's ring forwards 3 blocks, a ring of 2 one: a third of the bytes.
  CHECK(pair.cp_bytes == Approx(full.cp_bytes / 3.0));
  auto v = validate_program(*p);
  CHECK(v.has_value());
}

TEST_CASE("Every sequence at seq_length prices the fixed-length step, packed or padded", "[sim][varlen]") {
  for (const Packing packing : {Packing::pack, Packing::pad}) {
    for (const char* plan : {"tp=1,mbs=1", "tp=2,cp=2,mbs=1,sp=on", "tp=1,pp=2,mbs=1"}) {
      INFO(plan << " " << to_string(packing));
      const Setup s = varlen_setup(small_llama(4), plan, 8, 16, 4096, fixed(4096), packing);
      auto cost = sim::CostModel::for_device(s.cluster.device);
      REQUIRE(cost);
      const sim::Topology topo = sim::Topology::build(s.cluster, s.world);
      auto r = sim::simulate_varlen(s, *cost, topo);
      if (!r) FAIL(r.error().str());
      CHECK(r->run.mean_step_s == Approx(r->fixed_step_s).epsilon(1e-12));
      CHECK(r->run.tokens_per_s == Approx(r->fixed_tokens_per_s).epsilon(1e-12));
      CHECK(r->run.balance == Approx(1.0).epsilon(1e-12));
      for (const sim::VarlenStep& st : r->run.steps) CHECK(st.tokens == 16 * 4096);
    }
  }
}

TEST_CASE("Sampled steps are the same for a seed and differ between seeds", "[sim][varlen]") {
  LengthDistribution d;
  d.kind = LengthDistribution::Kind::lognormal;
  d.mean = 1500;
  d.sigma = 1.2;
  d.min = 64;
  d.max = 8192;
  const auto run = [&](std::uint64_t seed) {
    const Setup s = varlen_setup(small_llama(2), "tp=1,cp=2,mbs=1", 8, 32, 8192, d, Packing::pack, 3, seed);
    auto cost = sim::CostModel::for_device(s.cluster.device);
    REQUIRE(cost);
    auto r = sim::simulate_varlen(s, *cost, sim::Topology::build(s.cluster, s.world));
    if (!r) FAIL(r.error().str());
    return *r;
  };
  const sim::VarlenReport a = run(5), b = run(5), c = run(6);
  REQUIRE(a.run.steps.size() == 3);
  for (std::size_t k = 0; k < 3; ++k) {
    CHECK(a.run.steps[k].step_s == b.run.steps[k].step_s);
    CHECK(a.run.steps[k].tokens == b.run.steps[k].tokens);
  }
  CHECK(a.run.steps[0].tokens != c.run.steps[0].tokens);
  // A step's tokens are its sampled lengths'; fewer tokens than 32 full
  // sequences, and less attention, take less time.
  for (std::size_t k = 0; k < 3; ++k) {
    const auto lengths = sample_lengths(d, 5, k, 32);
    CHECK(a.run.steps[k].tokens == std::accumulate(lengths.begin(), lengths.end(), std::int64_t{0}));
    CHECK(a.run.steps[k].step_s < a.fixed_step_s);
  }
  CHECK(a.mean_length == mean_length(d));
}

TEST_CASE("A long tail unbalances static packing over DP and dynamic CP recovers most of it", "[sim][varlen]") {
  // Mostly short documents and a few at the sequence length (the documented
  // long-context mix of docs/varlen.md, at a quarter of its lengths).
  const LengthDistribution mix =
      histogram({{256, 40}, {512, 30}, {1024, 20}, {2048, 8}, {8192, 1.5}, {32768, 0.5}});
  const Setup s = varlen_setup(small_llama(4), "tp=1,cp=8,mbs=1,dynamic_cp=on", 64, 512, 32768, mix, Packing::pack, 4);
  auto cost = sim::CostModel::for_device(s.cluster.device);
  REQUIRE(cost);
  auto r = sim::simulate_varlen(s, *cost, sim::Topology::build(s.cluster, s.world));
  if (!r) FAIL(r.error().str());
  REQUIRE(r->static_cp);
  CHECK(r->run.scheduler == "dynamic_cp");
  CHECK(r->static_cp->balance < 0.8);
  CHECK(r->run.balance > r->static_cp->balance);
  CHECK(r->run.tokens_per_s > 1.1 * r->static_cp->tokens_per_s);
  // The same tokens in both.
  for (std::size_t k = 0; k < r->run.steps.size(); ++k) CHECK(r->run.steps[k].tokens == r->static_cp->steps[k].tokens);
}
