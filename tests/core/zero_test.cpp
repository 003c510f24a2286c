// Sharded data parallelism (ZeRO stages 2 and 3, FSDP): memory per rank
// against the ZeRO paper's formulas, the Program's per-micro-batch gathers
// and reduce-scatters counted and summed, and the plan rules.
#include <catch2/catch.hpp>

#include <numeric>

#include "core/accounting/memory.hpp"
#include "core/accounting/params.hpp"
#include "core/program/builder.hpp"
#include "models.hpp"
#include "program_support.hpp"
#include "support.hpp"

using namespace megascope;
using namespace megascope::test;

namespace {

Setup with_dtypes(Setup s, Dtype params, Dtype grads) {
  s.training.params_dtype = params;
  s.training.grad_dtype = grads;
  return s;
}

double other_term(const StageMemory& st, const std::string& name) {
  for (const auto& t : st.other_terms)
    if (t.name == name) return t.bytes;
  return 0;
}

// Bytes of the collectives of one kind, label and stream on stage 0.
double bytes_of_ops(const Program& p, OpKind kind, OpLabel label, std::optional<Stream> stream = std::nullopt) {
  double b = 0;
  for (const Op& op : p.stages[0].ops)
    if (op.kind == kind && op.label == label && (!stream || op.stream == *stream)) b += op.bytes;
  return b;
}

Program build(const Setup& s) {
  auto p = build_program(s);
  if (!p) FAIL(p.error().str());
  return *p;
}

}  // namespace

TEST_CASE("ZeRO memory per parameter follows Rajbhandari et al. 2020 stage by stage", "[core][zero]") {
  // The paper's mixed-precision Adam: 2 bytes of fp16 weights, 2 of fp16
  // gradients, K = 12 of fp32 master weights and moments; stage 1 divides
  // K by the DP size N, stage 2 the gradients too, stage 3 the weights too.
  // Megatron's optimizer also keeps an fp32 copy of 16-bit main gradients
  // (4 bytes, Megatron's dist_optimizer.md table), sharded with the rest of
  // the optimizer state: K = 12 + 4 here.
  const ModelSpec m = gpt_no_bias(8, 1024, 16);
  const double N = 8, K = 12 + 4;
  struct Row { const char* plan; double weights, grads, optimizer; };
  for (const Row& r : {Row{"tp=1,distopt=on", 2, 2, K / N}, Row{"tp=1,zero=2", 2, 2 / N, K / N},
                       Row{"tp=1,zero=3", 2 / N, 2 / N, K / N}}) {
    const Setup s = with_dtypes(make_setup(m, "dgx-a100", r.plan, 8, 8), Dtype::fp16, Dtype::fp16);
    const StageMemory st = memory_report(s).stages[0];
    INFO(r.plan);
    CHECK(st.weights_bytes / st.params == Approx(r.weights));
    CHECK(st.grads_bytes / st.params == Approx(r.grads));
    CHECK(st.optimizer_bytes / st.params == Approx(r.optimizer));
  }
}

TEST_CASE("ZeRO-3 keeps the units being gathered unsharded, as many as it prefetches", "[core][zero]") {
  const ModelSpec m = gpt_no_bias(8, 1024, 16);
  const double layer = layer_params(m, 0).total();
  const double root = rank_params(make_setup(m, "dgx-a100", "tp=1", 8, 8), 0).total() - 8 * layer;
  INFO("layer " << layer << " root " << root);
  REQUIRE(root > 0);   // the embedding and the final norm
  for (int prefetch : {0, 1, 3}) {
    const Setup s = make_setup(m, "dgx-a100", fmt::format("tp=1,zero=3,fsdp_prefetch={}", prefetch), 8, 8);
    const StageMemory st = memory_report(s).stages[0];
    INFO("prefetch " << prefetch);
    // bf16 weights gathered: the unit computing, the prefetched ones, the root unit.
    CHECK(other_term(st, "fsdp_gathered_params") == Approx(2.0 * ((1 + prefetch) * layer + root)));
    // fp32 main gradients of two units (computing, being reduce-scattered).
    CHECK(other_term(st, "fsdp_unsharded_grads") == Approx(4.0 * 2 * std::max(layer, root)));
  }
  // Not resharded after the forward: every layer stays gathered.
  const Setup keep = make_setup(m, "dgx-a100", "tp=1,zero=3,reshard_after_forward=off", 8, 8);
  CHECK(other_term(memory_report(keep).stages[0], "fsdp_gathered_params") == Approx(2.0 * (8 * layer + root)));
  // ZeRO-2 gathers no parameters; ZeRO-1 keeps no unsharded working set.
  const Setup z2 = make_setup(m, "dgx-a100", "tp=1,zero=2", 8, 8);
  CHECK(other_term(memory_report(z2).stages[0], "fsdp_gathered_params") == 0);
  CHECK(other_term(memory_report(z2).stages[0], "fsdp_unsharded_grads") > 0);
  const Setup z1 = make_setup(m, "dgx-a100", "tp=1,distopt=on", 8, 8);
  CHECK(other_term(memory_report(z1).stages[0], "fsdp_unsharded_grads") == 0);
}

TEST_CASE("FP8 parameter gathers move one byte per parameter and keep no 16-bit weight copy", "[core][zero]") {
  const ModelSpec m = gpt_no_bias(4, 1024, 16);
  for (const char* plan : {"tp=1,distopt=on", "tp=1,zero=3"}) {
    auto base = try_setup(m, "dgx-h100", plan, 8, 8);
    REQUIRE(base);
    Setup fp8 = *base;
    fp8.training.precision = Precision::fp8;
    Setup gather = fp8;
    gather.plan.fp8_param_gather = true;
    INFO(plan);
    // Weights: 2 + 1 (the FP8 copy) per parameter, or 1 alone.
    const StageMemory a = memory_report(fp8).stages[0], b = memory_report(gather).stages[0];
    CHECK(b.weights_bytes / a.weights_bytes == Approx(1.0 / 3.0));
    // The gathers' bytes halve.
    const double ga = bytes_of_ops(build(fp8), OpKind::all_gather, OpLabel::dp_param);
    const double gb = bytes_of_ops(build(gather), OpKind::all_gather, OpLabel::dp_param);
    REQUIRE(ga > 0);
    CHECK(gb / ga == Approx(0.5));
  }
}

TEST_CASE("ZeRO-3 gathers every unit before each micro-batch's forward and backward and reduce-scatters it after",
          "[core][zero]") {
  const ModelSpec m = gpt_no_bias(6, 1024, 16);   // tied embeddings
  const int layers = 6, mb = 4;
  const Setup s = make_setup(m, "dgx-a100", "tp=1,zero=3,overlap_grad_reduce=on", 4 * mb, 4);
  REQUIRE(s.num_microbatches == mb);
  const Program p = build(s);
  const double chunk = rank_params(s, 0).total();
  const double layer = layer_params(m, 0).total();
  // Forward: the root unit and each layer; backward: each layer again.
  CHECK(count(p, 0, OpKind::all_gather, OpLabel::dp_param) == static_cast<std::size_t>(mb * (2 * layers + 1)));
  CHECK(bytes_of_ops(p, OpKind::all_gather, OpLabel::dp_param, Stream::dp_param) ==
        Approx(mb * 2.0 * (chunk + layers * layer)).epsilon(1e-4));
  // No end-of-step gather: every gather is on the dp_param stream, inside a micro-batch.
  for (const Op& op : p.stages[0].ops)
    if (op.label == OpLabel::dp_param) {
      CHECK(op.stream == Stream::dp_param);
      CHECK(op.microbatch.has_value());
    }
  // Each micro-batch reduce-scatters each layer's gradients and the
  // embedding's (tied on one stage: the output piece has none of its own).
  CHECK(count(p, 0, OpKind::reduce_scatter, OpLabel::dp_grad) == static_cast<std::size_t>(mb * (layers + 1)));
  CHECK(bytes_of_ops(p, OpKind::reduce_scatter, OpLabel::dp_grad) == Approx(mb * 4.0 * chunk).epsilon(1e-4));
  // Not resharded after the forward: no second gather in the backward.
  const Program keep = build(make_setup(m, "dgx-a100", "tp=1,zero=3,reshard_after_forward=off", 4 * mb, 4));
  CHECK(count(keep, 0, OpKind::all_gather, OpLabel::dp_param) == static_cast<std::size_t>(mb * (layers + 1)));
}

TEST_CASE("ZeRO-2 reduce-scatters every micro-batch and gathers the updated parameters once", "[core][zero]") {
  const ModelSpec m = gpt_no_bias(4, 1024, 16);
  const int mb = 3;
  for (const bool overlap : {false, true}) {
    const Setup s = make_setup(m, "dgx-a100", overlap ? "tp=1,zero=2,overlap_grad_reduce=on" : "tp=1,zero=2", 4 * mb, 4);
    const Program p = build(s);
    const double chunk = rank_params(s, 0).total();
    INFO("overlap " << overlap);
    CHECK(bytes_of_ops(p, OpKind::reduce_scatter, OpLabel::dp_grad) == Approx(mb * 4.0 * chunk).epsilon(1e-4));
    // Overlapped: one per unit as the backward completes it; else one per micro-batch.
    CHECK(count(p, 0, OpKind::reduce_scatter, OpLabel::dp_grad) == static_cast<std::size_t>(overlap ? mb * 5 : mb));
    CHECK(bytes_of_ops(p, OpKind::all_gather, OpLabel::dp_param) == Approx(2.0 * chunk).epsilon(1e-4));
  }
  // ZeRO-1 reduces once, after the last micro-batch.
  const Setup z1 = make_setup(m, "dgx-a100", "tp=1,distopt=on", 4 * mb, 4);
  CHECK(bytes_of_ops(build(z1), OpKind::reduce_scatter, OpLabel::dp_grad) == Approx(4.0 * rank_params(z1, 0).total()).epsilon(1e-4));
}

TEST_CASE("ZeRO-3 with pipeline stages and MoE layers shards experts over expert-DP", "[core][zero]") {
  ModelSpec m = shipped_model("mixtral-8x7b");
  m.num_layers = 4;
  m.moe->moe_layers.assign(4, true);
  const Setup s = make_setup(m, "dgx-h100", "tp=2,sp=on,pp=2,ep=4,zero=3", 64, 32);
  const Program p = build(s);
  double dense = 0, expert = 0;
  for (const Op& op : p.stages[0].ops)
    if (op.kind == OpKind::all_gather && op.label == OpLabel::dp_param)
      (op.group == CommGroup::edp ? expert : dense) += op.bytes;
  const ParamSplit ps = rank_params(s, 0);
  CHECK(expert > 0);
  // Per micro-batch: the layers twice (forward and backward), the root once.
  const double e = layer_params(m, 0, Sharding{2, s.etp, 4}).expert;
  CHECK(expert == Approx(s.num_microbatches * 2.0 /*bytes*/ * 2 /*passes*/ * 2 /*layers*/ * e));
  CHECK(dense > s.num_microbatches * 2.0 * ps.dense);   // layers twice, the embedding once
  const StageMemory st = memory_report(s).stages[0];
  CHECK(st.weights_bytes == Approx(2.0 * (ps.dense / (s.dp * s.plan.cp) + ps.expert / s.edp)));
}

TEST_CASE("Sharded data parallelism is refused where it is not modelled, naming the rule", "[core][zero]") {
  const ModelSpec m = gpt_no_bias(8, 1024, 16);
  expect_error(try_setup(m, "dgx-a100", "tp=1,pp=2,zero=3,schedule=zb-h1", 16, 8), "plan.zero", "1f1b or interleaved");
  expect_error(try_setup(m, "dgx-a100", "tp=1,zero=1,fsdp_prefetch=2", 16, 8), "plan.fsdp_prefetch", "zero=3");
  expect_error(try_setup(m, "dgx-a100", "tp=1,zero=2,reshard_after_forward=off", 16, 8), "plan.reshard_after_forward",
               "zero=3");
  expect_error(try_setup(m, "dgx-a100", "tp=1,zero=3,overlap_grad_reduce=on,overlap_param_gather=on", 16, 8),
               "plan.overlap_param_gather", "fsdp_prefetch");
  expect_error(try_setup(m, "dgx-a100", "tp=1,distopt=on,fp8_param_gather=on", 16, 8), "plan.fp8_param_gather", "fp8");
  expect_error(try_setup(m, "dgx-a100", "tp=1,zero=3,distopt=off", 16, 8), "plan.zero", "distopt=on");
  expect_error(try_setup(m, "dgx-a100", "tp=1,pp=2,zero=2", 16, 8), "plan.zero", "tied embeddings");
  auto bad = parse_inline_plan("tp=1,zero=4");
  REQUIRE_FALSE(bad);
  CHECK(bad.error().field == "plan.zero");
}

TEST_CASE("Hybrid sharding shards inside each replica and all-reduces the gradient shards across replicas once a step",
          "[core][zero]") {
  // The groups: DP x CP positions split into replicas of consecutive ranks.
  RankGrid g{2, 1, 4, 1, 2, 1, 4};
  g.shard = 2;
  // rank 5 = tp 1, dp 2: its replica is DP positions 2-3, its peers position 0 of the other replica.
  CHECK(g.group(5, CommGroup::dp_shard) == std::vector<int>{5, 7});
  CHECK(g.group(5, CommGroup::dp_replica) == std::vector<int>{1, 5});
  CHECK(g.group(0, CommGroup::dp_shard) == std::vector<int>{0, 2});
  CHECK(g.group(0, CommGroup::dp_replica) == std::vector<int>{0, 4});

  const ModelSpec m = gpt_no_bias(4, 1024, 16);
  const int mb = 2;
  const Setup s = make_setup(m, "dgx-a100", "tp=1,zero=3,dp_replicas=2,overlap_grad_reduce=on", 8 * mb, 8);
  REQUIRE(s.dp_shard == 4);
  const Program p = build(s);
  const double chunk = rank_params(s, 0).total();
  double replica_ar = 0;
  for (const Op& op : p.stages[0].ops) {
    if (op.label == OpLabel::dp_param) CHECK(op.group == CommGroup::dp_shard);
    if (op.kind == OpKind::reduce_scatter && op.label == OpLabel::dp_grad) CHECK(op.group == CommGroup::dp_shard);
    if (op.kind == OpKind::all_reduce && op.label == OpLabel::dp_grad) {
      CHECK(op.group == CommGroup::dp_replica);
      replica_ar += op.bytes;
    }
  }
  // The shards of the fp32 gradients, once: chunk x 4 bytes / 4 ranks per replica.
  CHECK(replica_ar == Approx(4.0 * chunk / 4).epsilon(1e-4));
  // State sharded over the replica's 4 ranks, not all 8.
  const StageMemory st = memory_report(s).stages[0];
  CHECK(st.optimizer_bytes / st.params == Approx(12.0 / 4));
  CHECK(st.weights_bytes / st.params == Approx(2.0 / 4));
  // The rules.
  expect_error(try_setup(m, "dgx-a100", "tp=1,zero=3,dp_replicas=3", 16, 8), "plan.dp_replicas", "divide");
  expect_error(try_setup(m, "dgx-a100", "tp=1,dp_replicas=2", 16, 8), "plan.dp_replicas", "zero 1-3");
}
