// Memory per rank: bytes per parameter against Megatron's dist_optimizer
// table, weights+optimizer and activations against Megatron-LM's own
// estimator where both model the same thing, and the in-flight micro-batch
// counts of each schedule.
#include <catch2/catch.hpp>

#include "core/accounting/inflight.hpp"
#include "core/accounting/megatron_estimator.hpp"
#include "core/accounting/memory.hpp"
#include "core/accounting/params.hpp"
#include "models.hpp"
#include "support.hpp"

using namespace megascope;
using namespace megascope::test;

namespace {
double state_bytes(const StageMemory& s) { return s.weights_bytes + s.grads_bytes + s.optimizer_bytes; }

Setup with_dtypes(Setup s, Dtype params, Dtype grads) {
  s.training.params_dtype = params;
  s.training.grad_dtype = grads;
  return s;
}

double edge_terms(const StageMemory& st) {
  double e = 0;
  for (const auto& t : st.activation_terms)
    if (t.name == "input_ids" || t.name == "embedding_dropout_mask" || t.name == "final_norm_input" ||
        t.name == "output_layer_input" || t.name == "logits_fp32")
      e += t.bytes;
  return e;
}
}  // namespace

TEST_CASE("Bytes per parameter follow Megatron's distributed-optimizer table for every dtype pair", "[core]") {
  const ModelSpec m = gpt_no_bias(8, 1024, 16);
  for (bool distopt : {false, true}) {
    const Setup base = make_setup(m, "dgx-a100", distopt ? "tp=1,distopt=on" : "tp=1", 8, 8);
    const double D = 8;
    struct Row { Dtype p, g; double plain, dist; };
    for (const Row& r : {Row{Dtype::fp16, Dtype::fp16, 20, 4 + 16 / D}, Row{Dtype::bf16, Dtype::fp32, 18, 6 + 12 / D},
                         Row{Dtype::fp32, Dtype::fp32, 16, 8 + 8 / D}}) {
      const StageMemory st = memory_report(with_dtypes(base, r.p, r.g)).stages[0];
      INFO(to_string(r.p) << "/" << to_string(r.g) << " distopt " << distopt);
      CHECK(state_bytes(st) / st.params == Approx(distopt ? r.dist : r.plain));
    }
  }
}

TEST_CASE("The precision-aware optimizer keeps master weights and moments in their dtypes and no fp32 gradient copy", "[core]") {
  const ModelSpec m = gpt_no_bias(8, 1024, 16);
  const Setup base = make_setup(m, "dgx-a100", "tp=1,distopt=on", 8, 8);
  const double D = 8;
  // (weights, gradients, master, m, v, remainders): optimizer bytes per parameter before sharding.
  struct Row { Dtype p, g, master, m, v; bool rem; double optimizer, step; };
  for (const Row& r : {
           Row{Dtype::bf16, Dtype::fp32, Dtype::fp32, Dtype::fp32, Dtype::fp32, false, 12, 4 + 8 + 8 + 8 + 2},   // as off, fp32 grads
           Row{Dtype::bf16, Dtype::fp32, Dtype::fp32, Dtype::bf16, Dtype::bf16, true, 2 + 2 + 2, 4 + 4 + 4 + 4 + 4},  // DeepSeek-V3's
           Row{Dtype::bf16, Dtype::bf16, Dtype::fp32, Dtype::bf16, Dtype::bf16, false, 4 + 2 + 2, 2 + 8 + 4 + 4 + 2},
           Row{Dtype::bf16, Dtype::bf16, Dtype::fp16, Dtype::fp8, Dtype::fp8, true, 2 + 1 + 1, 2 + 4 + 2 + 2 + 2},  // remainders need fp32 master
           Row{Dtype::fp32, Dtype::fp32, Dtype::fp32, Dtype::fp16, Dtype::bf16, true, 2 + 2, 4 + 0 + 4 + 4 + 8}}) {   // fp32 weights are the master
    Setup s = with_dtypes(base, r.p, r.g);
    OptimizerPrecision& op = s.training.optimizer_precision;
    op.enabled = true;
    op.main_params = r.master;
    op.exp_avg = r.m;
    op.exp_avg_sq = r.v;
    op.store_param_remainders = r.rem;
    INFO(to_string(r.p) << " weights, " << to_string(r.g) << " grads, master " << to_string(r.master) << ", moments "
                        << to_string(r.m) << "/" << to_string(r.v) << ", remainders " << r.rem);
    REQUIRE(validate_training(s.training));
    CHECK(bytes_per_param(s).optimizer == r.optimizer);
    CHECK(optimizer_step_bytes_per_param(s.training) == r.step);
    const StageMemory st = memory_report(s).stages[0];
    CHECK(state_bytes(st) / st.params == Approx(bytes_of(r.p) + bytes_of(r.g) + r.optimizer / D));
  }
  // Off, every dtype pair: a flat 30 bytes a step, as before.
  for (Dtype p : {Dtype::bf16, Dtype::fp16, Dtype::fp32}) CHECK(optimizer_step_bytes_per_param(with_dtypes(base, p, Dtype::fp32).training) == 30.0);
}

TEST_CASE("Optimizer state dtypes need the precision-aware optimizer, and it needs the distributed optimizer", "[core]") {
  TrainingSpec t;
  t.global_batch_size = 8;
  t.optimizer_precision.exp_avg = Dtype::bf16;
  CHECK(validate_training(t).error().field == "training.exp_avg_dtype");
  CHECK_THAT(validate_training(t).error().message, Catch::Contains("precision_aware_optimizer = true"));
  t.optimizer_precision = {};
  t.optimizer_precision.main_params = Dtype::fp16;
  CHECK(validate_training(t).error().field == "training.main_params_dtype");
  t.optimizer_precision.enabled = true;
  CHECK(validate_training(t));
  t.optimizer_precision.main_params = Dtype::bf16;   // not one of Megatron-LM's choices
  CHECK(validate_training(t).error().field == "training.main_params_dtype");
  t.optimizer_precision.main_params = Dtype::fp32;
  t.params_dtype = Dtype::fp16;
  t.grad_dtype = Dtype::fp16;
  CHECK(validate_training(t).error().field == "training.grad_dtype");
  t.params_dtype = Dtype::bf16;
  t.grad_dtype = Dtype::fp32;
  const ModelSpec m = gpt_no_bias(8, 1024, 16);
  auto plan = parse_inline_plan("tp=1");
  REQUIRE(plan);
  const auto no_distopt = validate_setup(m, shipped_cluster("dgx-a100"), t, *plan, 8);
  REQUIRE_FALSE(no_distopt);
  CHECK(no_distopt.error().field == "plan.distopt");
  plan->distributed_optimizer = true;
  CHECK(validate_setup(m, shipped_cluster("dgx-a100"), t, *plan, 8));
}

TEST_CASE("Weights and optimizer equal Megatron's estimator for dense, GQA, MoE and MLA models at pp = 1", "[core]") {
  struct Case { ModelSpec m; std::string plan; int gpus; };
  ModelSpec mixtral = shipped_model("mixtral-8x7b");
  ModelSpec deepseek = shipped_model("deepseek-v3");
  deepseek.mtp_num_layers = 0;   // Megatron's estimator puts MTP on the first stage; compared separately
  for (const Case& c : {Case{gpt_no_bias(24, 2048, 16), "tp=2", 8}, Case{gpt_no_bias(24, 2048, 16), "tp=2,distopt=on", 8},
                        Case{shipped_model("llama3-70b"), "tp=8,distopt=on", 64},
                        Case{mixtral, "tp=1,ep=8,distopt=on", 64}, Case{mixtral, "tp=2,ep=4,sp=on", 32},
                        Case{deepseek, "tp=1,ep=64,distopt=on", 128}}) {
    INFO(c.m.name << " " << c.plan);
    const Setup s = make_setup(c.m, "dgx-h100", c.plan, 256, c.gpus);
    CHECK(state_bytes(memory_report(s).stages[0]) == Approx(megatron_theoretical_memory(s).weight_and_optimizer_bytes).epsilon(1e-12));
  }
}

TEST_CASE("With pp > 1 the two differ only by the final norm, which Megascope places on the last stage", "[core]") {
  const ModelSpec m = gpt_no_bias(24, 2048, 16);
  const Setup s = make_setup(m, "dgx-a100", "tp=2,pp=4,distopt=on", 64, 32);
  const double final_norm_on_stage0_per_megatron = 2.0 * 2048 / 4;   // n_norm h / p
  const double bytes = 6 + 12.0 / s.dp;
  CHECK(megatron_theoretical_memory(s).weight_and_optimizer_bytes - state_bytes(memory_report(s).stages[0]) ==
        Approx(final_norm_on_stage0_per_megatron * bytes).epsilon(1e-9));
}

TEST_CASE("Activations with SP and selective recompute equal Megatron's estimator (path A) layer by layer", "[core]") {
  const ModelSpec m = gpt(96, 12288, 96);
  for (const char* plan : {"tp=8,pp=1,sp=on,recompute=selective", "tp=8,pp=8,sp=on,recompute=selective",
                           "tp=8,pp=8,vpp=3,schedule=interleaved,sp=on,recompute=selective"}) {
    INFO(plan);
    const Setup s = make_setup(m, "dgx-a100", plan, 128, 64);
    const StageMemory st = memory_report(s).stages[0];
    const double sbh = 2048.0 * 12288, t = 8, p = s.plan.pp;
    double factor = 1;
    if (s.vpp > 1) factor = 1 + (p - 1) / (p * s.vpp);
    else if (p > 1) factor = std::min(1.0, s.num_microbatches / p);
    // Megatron path A's layer term: L s b h (18 + 4f/h) / t x factor; Megascope's layers, edge terms aside.
    CHECK(st.activations_bytes - edge_terms(st) == Approx(96 * sbh * 34 / t * factor).epsilon(1e-12));
    if (p == 1) {
      // Output terms: 4 s b h (1 + V/h) / t, identical in both.
      double out = 0;
      for (const auto& term : st.activation_terms)
        if (term.name == "final_norm_input" || term.name == "output_layer_input" || term.name == "logits_fp32") out += term.bytes;
      CHECK(out == Approx(4 * sbh * (1 + 51200.0 / 12288) / t));
    }
  }
}

TEST_CASE("1F1B keeps p - r micro-batches on rank r and interleaving adds (p-1)/(p v) on rank 0", "[core]") {
  const ModelSpec m = gpt(32, 1024, 16);
  const Setup one = make_setup(m, "dgx-a100", "tp=1,pp=4", 16, 4);
  const auto in1 = inflight_microbatches(one);
  for (int r = 0; r < 4; ++r) CHECK(in1[r][0].full == 4 - r);
  const Setup few = make_setup(m, "dgx-a100", "tp=1,pp=4", 2, 4);   // m = 2 < p
  CHECK(inflight_microbatches(few)[0][0].full == 2);
  const Setup il = make_setup(m, "dgx-a100", "tp=1,pp=4,vpp=2,schedule=interleaved", 16, 4);
  const auto in2 = inflight_microbatches(il);
  int total = 0;
  for (const auto& c : in2[0]) total += c.full;
  CHECK(total == 2 * 4 + 4 - 1);   // v p + p - 1 chunk-micro-batches = L (1 + (p-1)/(p v)) layers
  CHECK(in2[0][0].full == 7);      // chunk 0: p, then p - 1 more before the first backward
  const Setup gp = make_setup(m, "dgx-a100", "tp=1,pp=4,schedule=gpipe", 16, 4);
  CHECK(inflight_microbatches(gp)[3][0].full == 16);
}

TEST_CASE("Zero-bubble and DualPipe schedules hold the activations their papers state", "[core]") {
  const ModelSpec m = gpt(32, 1024, 16);
  const int p = 4;
  const auto h1 = inflight_microbatches(make_setup(m, "dgx-a100", "tp=1,pp=4,schedule=zb-h1", 16, 4));
  for (int r = 0; r < p; ++r) {
    CHECK(h1[r][0].full == p - r);           // (p - i + 1) M_B for worker i = r + 1
    CHECK(h1[r][0].weight_grad_only == r);   // (i - 1) M_W
  }
  const auto zbv = inflight_microbatches(make_setup(m, "dgx-a100", "tp=1,pp=4,schedule=zb-v", 16, 4));
  const auto dp = inflight_microbatches(make_setup(m, "dgx-a100", "tp=1,pp=4,schedule=dualpipe", 16, 4));
  const auto dpv = inflight_microbatches(make_setup(m, "dgx-a100", "tp=1,pp=4,schedule=dualpipev", 16, 4));
  for (int r = 0; r < p; ++r) {
    CHECK(zbv[r][0].full + zbv[r][1].full == 2 * p);       // p M_B, a stage being two chunks
    CHECK(dp[r][0].full + dp[r][1].full == p + 1);         // (PP + 1) M_B
    CHECK(dpv[r][0].full + dpv[r][1].full == 2 * p + 1);   // (2p + 1) chunks of a 2p-stage pipeline
  }
}

TEST_CASE("DualPipe doubles the parameters each rank holds, V schedules do not", "[core]") {
  const ModelSpec m = gpt_no_bias(32, 1024, 16);
  const Setup one = make_setup(m, "dgx-a100", "tp=1,pp=4", 16, 4);
  const Setup dual = make_setup(m, "dgx-a100", "tp=1,pp=4,schedule=dualpipe", 16, 4);
  const Setup v = make_setup(m, "dgx-a100", "tp=1,pp=4,schedule=zb-v", 16, 4);
  CHECK(rank_param_parts(dual, 1).layers.total() == Approx(2 * rank_param_parts(one, 1).layers.total()));
  CHECK(rank_param_parts(v, 1).layers.total() == Approx(rank_param_parts(one, 1).layers.total()));
  CHECK(v.holds_embedding(0));
  CHECK(v.holds_output(0));   // the V folds back: rank 0 holds the first and the last chunk
}

TEST_CASE("The estimate fits the Korthikanti 175B configuration in 80 GB and not without recomputation at mbs 4", "[core]") {
  const ModelSpec m = gpt(96, 12288, 96);
  const std::string plan = "tp=8,pp=8,vpp=3,schedule=interleaved,sp=on,recompute=selective,distopt=on";
  CHECK(memory_report(make_setup(m, "dgx-a100", plan, 1536, 1024)).fits);
  const auto big = memory_report(make_setup(m, "dgx-a100", "tp=8,pp=8,mbs=4,attention=unfused", 1536, 1024));
  CHECK_FALSE(big.fits);
  CHECK(big.peak_bytes > big.capacity_bytes);
}
