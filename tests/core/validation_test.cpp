// Every validation rule has a negative test that checks the field and the
// message (docs/validation-rules.md lists the rules).
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <functional>
#include <limits>

#include "models.hpp"
#include "support.hpp"

using namespace megascope;
using namespace megascope::test;

namespace {

const ModelSpec& dense() {
  static const ModelSpec m = gpt(24, 2048, 16);   // 16 heads, f 8192, seq 2048
  return m;
}
const ModelSpec& moe() {
  static const ModelSpec m = shipped_model("mixtral-8x7b");   // 8 experts, 8 KV groups, seq 4096
  return m;
}

}  // namespace

TEST_CASE("A valid plan derives dp, the micro-batch count, the padded vocab and the layer layout", "[core]") {
  const Setup s = make_setup(dense(), "dgx-a100", "tp=2,pp=4,vpp=3,schedule=interleaved,mbs=2", 64, 32);
  CHECK(s.dp == 4);
  CHECK(s.num_microbatches == 8);
  CHECK(s.padded_vocab == 51200);   // multiple of 128 x 2
  CHECK(s.virtual_stages == 12);
  CHECK(s.chunks[1][2].first == 18);   // chunk 2 of rank 1 = virtual stage 2 x 4 + 1 = 9: layers 18, 19
  CHECK(s.chunks[1][2].count == 2);
  CHECK(s.chunks[1][2].virtual_stage == 9);
}

TEST_CASE("Sizes below one are rejected with the plan key named", "[core]") {
  PlanSpec p;
  p.pp = 0;
  TrainingSpec t;
  t.global_batch_size = 8;
  expect_error(validate_setup(dense(), shipped_cluster("dgx-a100"), t, p, 8), "plan.pp", "must be >= 1, found 0");
  p.pp = 1;
  p.vpp = 0;
  expect_error(validate_setup(dense(), shipped_cluster("dgx-a100"), t, p, 8), "plan.vpp", "must be >= 1, found 0");
}

TEST_CASE("The device count must fit the cluster and be divisible by tp x pp x cp", "[core]") {
  auto p = parse_inline_plan("tp=8");
  TrainingSpec t;
  t.global_batch_size = 8;
  ClusterSpec c = shipped_cluster("dgx-a100");
  c.num_nodes = 1;
  expect_error(validate_setup(dense(), c, t, *p, 16), "gpus", "needs 16 devices");
  expect_error(try_setup(dense(), "dgx-a100", "tp=4,pp=2", 12, 12), "plan.tp", "divisible by tp x pp x cp");
  expect_error(try_setup(dense(), "dgx-a100", "tp=2,dp=3", 12, 8), "plan.dp", "must equal the device count 8");
}

TEST_CASE("Parallel sizes above the cluster's devices, and products that would overflow 32 bits, are one error each",
          "[core]") {
  // Each of these once overflowed tp x pp x cp in 32 bits: a division by
  // zero, a negative size and an allocation failure, or a 14 s run.
  TrainingSpec t;
  t.global_batch_size = 8;
  const ClusterSpec c = shipped_cluster("dgx-a100");
  const auto with = [&](const std::string& plan, int devices) {
    return validate_setup(dense(), c, t, *parse_inline_plan(plan), devices);
  };
  expect_error(with("tp=65536,pp=65536", 8), "plan.tp", "65536 exceeds the");
  expect_error(with("cp=2,pp=2147483647", 8), "plan.pp", "exceeds the");
  expect_error(with("tp=4,pp=1073741826", 8), "plan.pp", "exceeds the");
  expect_error(with("ep=1000000", 8), "plan.ep", "exceeds the");
  expect_error(with("tp=8,pp=8,dp=1000000", 0), "plan.dp", "exceeds the");
  // Each size fits, their 64-bit product does not divide the devices.
  const int devices = c.total_devices();
  expect_error(with(fmt::format("tp={0},pp={0}", devices), 0), "plan.tp", "must be divisible by tp x pp x cp");
}

TEST_CASE("Tensor parallelism must divide heads, query groups (or be divided by them) and the FFN", "[core]") {
  expect_error(try_setup(dense(), "dgx-a100", "tp=3", 3, 3), "plan.tp", "num_attention_heads (16) must be a multiple of tp (3)");
  ModelSpec m = dense();
  m.num_query_groups = 4;
  CHECK(try_setup(m, "dgx-a100", "tp=8", 8, 8).has_value());   // 4 groups divide tp = 8: KV heads replicated
  m.num_query_groups = 16;
  m.num_attention_heads = 48;
  m.kv_channels = 64;
  expect_error(try_setup(m, "dgx-a100", "tp=6", 6, 6), "plan.tp", "num_query_groups (16) must be a multiple or a divisor of tp (6)");
  ModelSpec f = dense();
  f.ffn_hidden_size = 8190;
  expect_error(try_setup(f, "dgx-a100", "tp=4", 4, 4), "plan.tp", "ffn_hidden_size (8190) must be divisible by tp (4)");
}

TEST_CASE("Sequence rules: learned positions bound the length, CP needs 2 x cp | s, SP needs tp | s/cp", "[core]") {
  expect_error(try_setup(dense(), "dgx-a100", "tp=1", 1, 1, 4096), "training.seq_length", "max_position_embeddings");
  expect_error(try_setup(dense(), "dgx-a100", "cp=3", 3, 3, 1802), "plan.cp", "multiple of 2 x cp = 6");
  ModelSpec m = dense();
  m.position_embedding = PositionEmbedding::rope;
  expect_error(try_setup(m, "dgx-a100", "tp=4,sp=on,cp=2", 8, 8, 4100), "plan.sp", "divisible by tp (4)");
}

TEST_CASE("Sequence parallelism at tp = 1 is switched off with a warning, as Megatron-LM does", "[core]") {
  const Setup s = make_setup(dense(), "dgx-a100", "tp=1,sp=on", 8, 8);
  CHECK_FALSE(s.sequence_parallel);
  REQUIRE(s.warnings.size() == 1);
  CHECK_THAT(s.warnings[0], Catch::Contains("no effect with tp = 1"));
}

TEST_CASE("TP communication overlap needs sequence parallelism", "[core]") {
  expect_error(try_setup(dense(), "dgx-a100", "tp=2,tp_comm_overlap=on", 8, 8), "plan.tp_comm_overlap", "needs sequence parallelism");
}

TEST_CASE("The global batch must be a multiple of micro-batch size x dp", "[core]") {
  expect_error(try_setup(dense(), "dgx-a100", "tp=1,mbs=2", 12, 8), "training.global_batch_size",
               "global batch (12) must be divisible by micro-batch size x dp = 2 x 8 = 16");
  // 10^14 sequences made a negative micro-batch count in 32 bits; the bound
  // is 65,536 micro-batches a step.
  expect_error(try_setup(dense(), "dgx-a100", "tp=1", 1000000000, 8), "training.global_batch_size",
               "125000000 micro-batches a step");
  expect_error(try_setup(dense(), "dgx-a100", "tp=1", 100000000000000, 8), "training.global_batch_size",
               "more than 2^50 tokens a step");
  expect_error(try_setup(dense(), "dgx-a100", "tp=1", 8 * (kMaxMicrobatches + 1), 8), "training.global_batch_size",
               "at most 65536");
  CHECK(try_setup(dense(), "dgx-a100", "tp=1", 8 * kMaxMicrobatches, 8));
  expect_error(try_setup(dense(), "dgx-a100", "tp=1,mbs=100000", 800000, 8), "plan.mbs", "at most 65536");
  expect_error(try_setup(dense(), "dgx-a100", "tp=1,mbs=65536", std::int64_t{1} << 40, 8), "training.global_batch_size",
               "2^50 tokens a step");
}

TEST_CASE("Model dimensions and sequences beyond their bounds are one error naming the field, not negative figures",
          "[core]") {
  // vocab_size = 2^63 - 1 gave a negative padded vocabulary and negative
  // memory; hidden sizes near 2^62 an MFU above 100%.
  struct Case {
    const char* field;
    std::function<void(ModelSpec&)> set;
  };
  const std::int64_t huge = std::numeric_limits<std::int64_t>::max();
  for (const Case& c : {Case{"model.vocab_size", [&](ModelSpec& m) { m.vocab_size = huge; }},
                        Case{"model.hidden_size", [](ModelSpec& m) { m.hidden_size = kMaxModelWidth + 1; }},
                        Case{"model.ffn_hidden_size", [&](ModelSpec& m) { m.ffn_hidden_size = huge; }},
                        Case{"model.kv_channels", [](ModelSpec& m) { m.kv_channels = std::int64_t{1} << 62; }},
                        Case{"model.seq_length", [](ModelSpec& m) { m.seq_length = std::int64_t{1} << 62; }},
                        Case{"model.num_layers", [](ModelSpec& m) { m.num_layers = 100000; }}}) {
    INFO(c.field);
    ModelSpec m = dense();
    c.set(m);
    const auto r = validate_model(m);
    REQUIRE_FALSE(r);
    CHECK(r.error().field == c.field);
    CHECK_THAT(r.error().message, Catch::Contains("must be at most"));
  }
  ModelSpec mla = shipped_model("deepseek-v3");
  mla.mla->kv_lora_rank = huge;
  CHECK(validate_model(mla).error().field == "model.mla.kv_lora_rank");
  ModelSpec experts = moe();
  experts.moe->expert_ffn_hidden = huge;
  CHECK(validate_model(experts).error().field == "model.moe.expert_ffn_hidden_size");
  // At the bounds a model is valid.
  ModelSpec wide = dense();
  wide.seq_length = kMaxModelLength;
  wide.vocab_size = kMaxModelLength;
  CHECK(validate_model(wide));
  // A cluster of more than 2^18 devices, and the planner's --gpus above it.
  ClusterSpec big = shipped_cluster("dgx-h100");
  big.num_nodes = (1 << 15) + 1;   // 8 devices a node
  CHECK(validate_cluster(big).error().field == "cluster.num_nodes");
  // Negative or absurd latencies, and link rates of nothing or infinity.
  ClusterSpec lat = shipped_cluster("dgx-h100");
  lat.scale_out.latency_s = -5e-6;
  CHECK(validate_cluster(lat).error().field == "cluster.scale_out.latency_us");
  ClusterSpec hop = shipped_cluster("dgx-h100");
  hop.node.scale_up_latency_s = std::numeric_limits<double>::quiet_NaN();
  CHECK(validate_cluster(hop).error().field == "cluster.node.scale_up_latency_us");
  ClusterSpec nic = shipped_cluster("dgx-h100");
  nic.node.nic_bandwidth_Bps = 1e-300 / 8 * 1e9;
  CHECK(validate_cluster(nic).error().field == "cluster.node.nic_bandwidth_Gbps");
  ClusterSpec pcie = shipped_cluster("dgx-h100");
  pcie.node.pcie_bandwidth_Bps = -1;
  CHECK(validate_cluster(pcie).error().field == "cluster.node.pcie_bandwidth_GBps");
  ClusterSpec peak = shipped_cluster("dgx-h100");
  peak.device.peak_bf16_flops = std::numeric_limits<double>::infinity();
  CHECK(validate_cluster(peak).error().field == "cluster.device.peak_bf16_tflops");
  // Rates so small that a step would take forever (a denormal peak gave an infinite step, MFU NaN).
  for (auto [field, set] : std::vector<std::pair<std::string, std::function<void(ClusterSpec&)>>>{
           {"cluster.device.peak_bf16_tflops", [](ClusterSpec& c) { c.device.peak_bf16_flops = 4.9e-324 * 1e12; }},
           {"cluster.device.peak_fp32_tflops", [](ClusterSpec& c) { c.device.peak_fp32_flops = 1e8; }},
           {"cluster.device.peak_fp8_tflops", [](ClusterSpec& c) { c.device.peak_fp8_flops = 5e8; }},
           {"cluster.device.memory_bandwidth_TBps", [](ClusterSpec& c) { c.device.memory_bandwidth_Bps = 1e3; }},
           {"cluster.device.memory_GiB", [](ClusterSpec& c) { c.device.memory_bytes = 1e3; }},
           {"cluster.scale_out.p2p_efficiency", [](ClusterSpec& c) { c.scale_out.p2p_efficiency = 4.9e-324; }}}) {
    INFO(field);
    ClusterSpec slow = shipped_cluster("dgx-h100");
    set(slow);
    const auto r = validate_cluster(slow);
    REQUIRE_FALSE(r);
    CHECK(r.error().field == field);
  }
  ClusterSpec cpu = shipped_cluster("cpu-host");   // the slowest shipped device passes
  CHECK(validate_cluster(cpu));
  // The training sequence likewise.
  TrainingSpec t;
  t.global_batch_size = 8;
  t.seq_length = std::int64_t{1} << 62;
  CHECK(validate_training(t).error().field == "training.seq_length");
}

TEST_CASE("Expert rules: MoE only, experts divisible by ep, ffn by etp, EP x ETP inside DP x CP, SP with EP and TP", "[core]") {
  expect_error(try_setup(dense(), "dgx-a100", "ep=2", 8, 8), "plan.ep", "needs an MoE model");
  expect_error(try_setup(dense(), "dgx-a100", "tp=2,etp=1", 8, 8), "plan.etp", "only applies to MoE layers");
  expect_error(try_setup(moe(), "dgx-h100", "ep=3", 6, 6), "plan.ep", "num_experts (8) must be a multiple of ep (3)");
  ModelSpec odd = moe();
  odd.moe->expert_ffn_hidden = 14335;
  expect_error(try_setup(odd, "dgx-h100", "tp=2", 8, 8), "plan.etp", "must be divisible by etp (2)");
  ModelSpec shared = moe();
  shared.moe->shared_expert_ffn_hidden = 1001;
  expect_error(try_setup(shared, "dgx-h100", "tp=2,sp=on", 8, 8), "plan.tp", "shared-expert ffn size (1001)");
  expect_error(try_setup(moe(), "dgx-h100", "tp=2,ep=8,sp=on", 8, 8), "plan.ep", "experts live inside DP x CP");
  expect_error(try_setup(moe(), "dgx-h100", "tp=2,ep=2", 8, 8), "plan.sp", "needs sequence parallelism");
  ModelSpec biased = moe();
  biased.add_bias_linear = true;
  expect_error(try_setup(biased, "dgx-h100", "tp=2,sp=on", 8, 8), "plan.etp", "need etp = 1");
  auto s = try_setup(moe(), "dgx-h100", "ep=2", 8, 8);
  REQUIRE(s);
  CHECK(s->edp == 4);
}

TEST_CASE("Expert parallelism is refused with fp16 parameters", "[core]") {
  auto p = parse_inline_plan("ep=2");
  TrainingSpec t;
  t.global_batch_size = 8;
  t.params_dtype = Dtype::fp16;
  expect_error(validate_setup(moe(), shipped_cluster("dgx-h100"), t, *p, 8), "plan.ep", "fp16");
}

TEST_CASE("Overlapped parameter gather needs the distributed optimizer and overlapped gradient reduce", "[core]") {
  expect_error(try_setup(dense(), "dgx-a100", "overlap_param_gather=on,overlap_grad_reduce=on", 8, 8),
               "plan.overlap_param_gather", "distributed optimizer");
  expect_error(try_setup(dense(), "dgx-a100", "overlap_param_gather=on,distopt=on", 8, 8), "plan.overlap_param_gather",
               "overlap_grad_reduce");
}

TEST_CASE("Recomputation: method and layer count only with full, both required with full, layers in range", "[core]") {
  expect_error(try_setup(dense(), "dgx-a100", "recompute=selective,recompute_method=block", 8, 8), "plan.recompute_method",
               "only applies to recompute=full");
  expect_error(try_setup(dense(), "dgx-a100", "recompute_layers=2", 8, 8), "plan.recompute_layers", "only applies to recompute=full");
  expect_error(try_setup(dense(), "dgx-a100", "recompute=full,recompute_layers=2", 8, 8), "plan.recompute_method", "needs recompute_method");
  expect_error(try_setup(dense(), "dgx-a100", "recompute=full,recompute_method=block", 8, 8), "plan.recompute_layers",
               "needs recompute_layers");
  expect_error(try_setup(dense(), "dgx-a100", "pp=4,recompute=full,recompute_method=block,recompute_layers=7", 8, 8),
               "plan.recompute_layers", "between 1 and the layers per model chunk (6)");
  expect_error(try_setup(dense(), "dgx-a100", "recompute=full,recompute_method=block,recompute_layers=1,recompute_modules=core_attn", 8, 8),
               "plan.recompute_modules", "only applies to recompute=selective");
  expect_error(try_setup(dense(), "dgx-a100", "recompute=selective,recompute_modules=mla_up_proj", 8, 8), "plan.recompute_modules",
               "needs multi-latent attention");
  expect_error(try_setup(dense(), "dgx-a100", "recompute=selective,recompute_modules=moe_act", 8, 8), "plan.recompute_modules",
               "needs routed experts");
  CHECK(try_setup(dense(), "dgx-a100", "recompute=selective,recompute_modules=layernorm", 8, 8));
  // The checkpointed submodules need the layers they recompute, and
  // Megatron-Core's exclusions with the MoE overlaps.
  CHECK(try_setup(dense(), "dgx-a100", "recompute=selective,recompute_modules=mlp", 8, 8));
  expect_error(try_setup(dense(), "dgx-a100", "recompute=selective,recompute_modules=moe", 8, 8), "plan.recompute_modules",
               "moe recomputes MoE layers");
  const ModelSpec mixtral = shipped_model("mixtral-8x7b");   // every layer MoE, no shared experts
  expect_error(try_setup(mixtral, "dgx-h100", "ep=8,recompute=selective,recompute_modules=mlp", 8, 8),
               "plan.recompute_modules", "every layer of the model is a MoE layer");
  expect_error(try_setup(mixtral, "dgx-h100", "ep=8,recompute=selective,recompute_modules=shared_experts", 8, 8),
               "plan.recompute_modules", "needs shared experts");
  CHECK(try_setup(mixtral, "dgx-h100", "ep=8,recompute=selective,recompute_modules=moe", 8, 8));
  expect_error(try_setup(mixtral, "dgx-h100", "ep=8,moe_ep_overlap=on,recompute=selective,recompute_modules=moe", 8, 8),
               "plan.recompute_modules", "moe_ep_overlap");
  ModelSpec shared = mixtral;
  shared.moe->shared_expert_ffn_hidden = 4096;
  CHECK(try_setup(shared, "dgx-h100", "ep=8,recompute=selective,recompute_modules=shared_experts", 8, 8));
  expect_error(try_setup(shared, "dgx-h100",
                         "ep=8,moe_shared_expert_overlap=on,recompute=selective,recompute_modules=shared_experts", 8, 8),
               "plan.recompute_modules", "moe_shared_expert_overlap");
}

namespace {

// Eight sequences in FP8 with `recipe`.
TrainingSpec fp8_training(Fp8Recipe recipe = Fp8Recipe::delayed) {
  TrainingSpec t;
  t.global_batch_size = 8;
  t.precision = Precision::fp8;
  t.fp8_recipe = recipe;
  return t;
}

}  // namespace

TEST_CASE("FP8 needs a device with FP8 tensor cores", "[core]") {
  auto p = parse_inline_plan("tp=1");
  const TrainingSpec t = fp8_training();
  expect_error(validate_setup(dense(), shipped_cluster("dgx-a100"), t, *p, 8), "training.precision", "has none");
  CHECK(validate_setup(dense(), shipped_cluster("dgx-h100"), t, *p, 8).has_value());
}

TEST_CASE("MXFP8 needs tensor cores with the MX formats: Blackwell's, not Hopper's", "[core]") {
  auto p = parse_inline_plan("tp=1");
  TrainingSpec t = fp8_training(Fp8Recipe::mxfp8);
  CHECK_FALSE(shipped_cluster("dgx-h100").device.mx_formats);
  CHECK(shipped_cluster("dgx-b200").device.mx_formats);
  CHECK(shipped_cluster("gb200-nvl72").device.mx_formats);
  expect_error(validate_setup(dense(), shipped_cluster("dgx-h100"), t, *p, 8), "training.fp8_recipe",
               "H100-SXM5-80GB does not have (Blackwell has them");
  CHECK(validate_setup(dense(), shipped_cluster("dgx-b200"), t, *p, 8).has_value());
  // Hopper takes the other recipes.
  for (const Fp8Recipe r : {Fp8Recipe::delayed, Fp8Recipe::tensorwise, Fp8Recipe::blockwise}) {
    t.fp8_recipe = r;
    CHECK(validate_setup(dense(), shipped_cluster("dgx-h100"), t, *p, 8).has_value());
  }
}

TEST_CASE("Interleaved micro-batch groups: between pp and m, a last group of 0 or at least pp, interleaved only", "[core]") {
  const Setup g = make_setup(dense(), "dgx-a100", "pp=4,vpp=2,schedule=interleaved,microbatch_group=6", 10, 4);
  CHECK(g.microbatch_group == 6);   // 10 = 6 + 4: the last group holds pp
  CHECK(make_setup(dense(), "dgx-a100", "pp=4,vpp=2,schedule=interleaved", 8, 4).microbatch_group == 4);
  expect_error(try_setup(dense(), "dgx-a100", "pp=4,vpp=2,schedule=interleaved,microbatch_group=3", 8, 4),
               "plan.microbatch_group", "between pp (4) and the micro-batch count (8)");
  expect_error(try_setup(dense(), "dgx-a100", "pp=4,vpp=2,schedule=interleaved,microbatch_group=8", 10, 4),
               "plan.microbatch_group", "last group of 2 micro-batches");
  expect_error(try_setup(dense(), "dgx-a100", "pp=4,microbatch_group=4", 8, 4), "plan.microbatch_group",
               "schedule 1f1b has no groups");
}

TEST_CASE("Schedule rules: interleaving needs vpp >= 2, pp >= 2 and m a multiple of pp", "[core]") {
  expect_error(try_setup(dense(), "dgx-a100", "pp=2,schedule=interleaved", 8, 8), "plan.vpp", "needs vpp >= 2");
  expect_error(try_setup(dense(), "dgx-a100", "pp=1,vpp=2,schedule=interleaved", 8, 8), "plan.pp", "needs pp >= 2");
  expect_error(try_setup(dense(), "dgx-a100", "pp=4,vpp=2,schedule=interleaved", 6, 8), "training.global_batch_size",
               "micro-batch count (3) to be a multiple of pp (4)");
  expect_error(try_setup(dense(), "dgx-a100", "pp=2,vpp=2", 8, 8), "plan.vpp", "use schedule=interleaved");
}

TEST_CASE("Pipeline communication overlaps by the schedule's default, and is synchronous only where Megatron-LM has it",
          "[core]") {
  // Megatron-LM's 1f1b and gpipe wait on every exchange; its interleaved
  // schedule overlaps by default (--overlap-p2p-communication).
  CHECK_FALSE(try_setup(dense(), "dgx-a100", "pp=2", 8, 8)->overlap_p2p_comm);
  CHECK_FALSE(try_setup(dense(), "dgx-a100", "pp=2,schedule=gpipe", 8, 8)->overlap_p2p_comm);
  CHECK(try_setup(dense(), "dgx-a100", "pp=2,vpp=2,schedule=interleaved", 8, 8)->overlap_p2p_comm);
  CHECK(try_setup(dense(), "dgx-a100", "pp=2,schedule=zb-h1", 8, 8)->overlap_p2p_comm);
  CHECK_FALSE(
      try_setup(dense(), "dgx-a100", "pp=2,vpp=2,schedule=interleaved,overlap_p2p_comm=off", 8, 8)->overlap_p2p_comm);
  CHECK(try_setup(dense(), "dgx-a100", "pp=2,overlap_p2p_comm=on", 8, 8)->overlap_p2p_comm);
  for (const char* sch : {"zb-h1", "zb-v", "dualpipev"}) {
    INFO(sch);
    expect_error(try_setup(dense(), "dgx-a100", fmt::format("pp=2,schedule={},overlap_p2p_comm=off", sch), 8, 8),
                 "plan.overlap_p2p_comm", "modelled for the gpipe, 1f1b and interleaved schedules");
  }
}

TEST_CASE("Schedule rules: V schedules take two chunks, pipelined schedules need pp >= 2, DualPipe needs even counts", "[core]") {
  expect_error(try_setup(dense(), "dgx-a100", "pp=2,vpp=3,schedule=zb-v", 8, 8), "plan.vpp", "vpp must be 2");
  expect_error(try_setup(dense(), "dgx-a100", "pp=1,schedule=zb-h1", 8, 8), "plan.schedule", "needs pp >= 2");
  expect_error(try_setup(dense(), "dgx-a100", "pp=3,schedule=dualpipe", 24, 24), "plan.pp", "even pp");
  expect_error(try_setup(dense(), "dgx-a100", "pp=4,schedule=dualpipe", 12, 8), "training.global_batch_size",
               "even micro-batch count >= 2 x pp = 8");
  expect_error(try_setup(dense(), "dgx-a100", "pp=4,schedule=dualpipev", 6, 8), "training.global_batch_size",
               "at least 2 x pp = 8");
  // The V schedules take uneven first/last virtual stages (tests/core/layout_test.cpp) when the rest divide.
  expect_error(try_setup(dense(), "dgx-a100", "pp=4,schedule=dualpipev,last_stage_layers=2", 16, 8),
               "plan.first_stage_layers", "leave 22 layers, which must divide evenly over the other 7 virtual stages");
}

TEST_CASE("Layer split rules: even split, uneven first/last stages, chunks of equal size", "[core]") {
  expect_error(try_setup(dense(), "dgx-a100", "pp=5", 5, 5), "plan.pp", "num_layers (24) must be divisible by pp (5)");
  auto uneven = try_setup(dense(), "dgx-a100", "pp=4,first_stage_layers=3,last_stage_layers=3", 8, 4);
  REQUIRE(uneven);
  CHECK(uneven->layers_on_rank(0) == 3);
  CHECK(uneven->layers_on_rank(1) == 9);
  CHECK(uneven->layers_on_rank(3) == 3);
  expect_error(try_setup(dense(), "dgx-a100", "pp=3,first_stage_layers=3", 6, 3), "plan.first_stage_layers",
               "remaining layers must divide evenly over the 2 middle stages");
  expect_error(try_setup(dense(), "dgx-a100", "pp=2,first_stage_layers=20,last_stage_layers=3", 4, 2),
               "plan.first_stage_layers", "leave 1 layers for 0 middle stages");
  expect_error(try_setup(dense(), "dgx-a100", "pp=1,first_stage_layers=3", 4, 1), "plan.first_stage_layers", "pp >= 2");
  expect_error(try_setup(dense(), "dgx-a100", "pp=4,vpp=4,schedule=interleaved", 8, 4), "plan.vpp",
               "holds 6 layers, which must divide into vpp = 4");
}

TEST_CASE("Model rules: heads vs groups, MoE top-k and pattern, MLA groups, dropout range", "[core]") {
  ModelSpec m = dense();
  m.num_query_groups = 3;
  CHECK(validate_model(m).error().field == "model.num_query_groups");
  ModelSpec e = moe();
  e.moe->top_k = 9;
  CHECK_THAT(validate_model(e).error().message, Catch::Contains("must be in [1, num_experts = 8]"));
  e = moe();
  e.moe->moe_layers.pop_back();
  CHECK_THAT(validate_model(e).error().message, Catch::Contains("31 entries but the model has 32 layers"));
  ModelSpec d = shipped_model("deepseek-v3");
  d.num_query_groups = 8;
  CHECK_THAT(validate_model(d).error().message, Catch::Contains("MLA models"));
  m = dense();
  m.hidden_dropout = 1.5;
  CHECK(validate_model(m).error().field == "model.hidden_dropout");
  m = dense();
  m.hidden_size = 0;
  CHECK_THAT(validate_model(m).error().message, Catch::Contains("positive integer, found 0"));
}

TEST_CASE("Cluster rules: scale-up domain in whole nodes, NICs when spanning domains", "[core]") {
  ClusterSpec c = shipped_cluster("dgx-h100");
  c.scale_up_domain = 12;
  CHECK_THAT(validate_cluster(c).error().message, Catch::Contains("whole number of nodes (8 devices each)"));
  c = shipped_cluster("dgx-h100");
  c.node.nics_per_node = 0;
  CHECK(validate_cluster(c).error().field == "cluster.node.nics");
  c = shipped_cluster("dgx-h100");
  c.scale_out.oversubscription = 0.5;
  CHECK(validate_cluster(c).error().field == "cluster.scale_out.oversubscription");
  for (double eff : {0.0, -0.5, 1.5}) {
    c = shipped_cluster("dgx-h100");
    c.scale_out.p2p_efficiency = eff;
    INFO("p2p_efficiency " << eff);
    CHECK(validate_cluster(c).error().field == "cluster.scale_out.p2p_efficiency");
  }
  c.scale_out.p2p_efficiency = 1.0;
  CHECK(validate_cluster(c));
}

TEST_CASE("Training rules: a positive batch, no fp8 parameter or gradient dtype", "[core]") {
  TrainingSpec t;
  CHECK(validate_training(t).error().field == "training.global_batch_size");
  t.global_batch_size = 1;
  t.params_dtype = Dtype::fp8;
  CHECK(validate_training(t).error().field == "training.params_dtype");
}
