// export_megatron_args: round trips (export, import again, compare model,
// training and plan) and the plans and dtypes Megatron-LM cannot express.
// Import alone is tested in megatron_import_test.cpp and
// megatron_cmdline_test.cpp.
#include "config/megatron_args.hpp"

#include <catch2/catch.hpp>

#include "config/megatron_support.hpp"

#include <string>
#include <vector>

#include "config/plan_settings.hpp"
#include "core/cluster.hpp"
#include "core/setup.hpp"
#include "support.hpp"

using namespace megascope;
using namespace megascope::test;

namespace {

ClusterSpec test_cluster() {
  ClusterSpec c;
  c.name = "test-h100";
  c.device.name = "H100";
  c.device.peak_bf16_flops = 989e12;
  c.device.peak_fp8_flops = 1979e12;
  c.device.peak_fp32_flops = 67e12;
  c.device.memory_bytes = 80e9;
  c.device.memory_bandwidth_Bps = 3.35e12;
  c.node.devices_per_node = 8;
  c.node.scale_up = ScaleUpKind::nvswitch;
  c.node.scale_up_bandwidth_Bps = 450e9;
  c.node.scale_up_latency_s = 3e-6;
  c.node.pcie_bandwidth_Bps = 64e9;
  c.node.nics_per_node = 8;
  c.node.nic_bandwidth_Bps = 50e9;
  c.scale_out.latency_s = 5e-6;
  c.num_nodes = 512;
  return c;
}

void check_same_model(const ModelSpec& a, const ModelSpec& b) {
  CHECK(a.num_layers == b.num_layers);
  CHECK(a.hidden_size == b.hidden_size);
  CHECK(a.ffn_hidden_size == b.ffn_hidden_size);
  CHECK(a.num_attention_heads == b.num_attention_heads);
  CHECK(a.num_query_groups == b.num_query_groups);
  CHECK(a.kv_channels == b.kv_channels);
  CHECK(a.vocab_size == b.vocab_size);
  CHECK(a.make_vocab_size_divisible_by == b.make_vocab_size_divisible_by);
  CHECK(a.seq_length == b.seq_length);
  CHECK(a.activation == b.activation);
  CHECK(a.norm == b.norm);
  CHECK(a.position_embedding == b.position_embedding);
  CHECK(a.add_bias_linear == b.add_bias_linear);
  CHECK(a.add_qkv_bias == b.add_qkv_bias);
  CHECK(a.tied_embeddings == b.tied_embeddings);
  CHECK(a.qk_layernorm == b.qk_layernorm);
  CHECK(a.hidden_dropout == b.hidden_dropout);
  CHECK(a.attention_dropout == b.attention_dropout);
  CHECK(a.mtp_num_layers == b.mtp_num_layers);
  CHECK(a.window_size == b.window_size);
  CHECK(a.window_skip_freq == b.window_skip_freq);
  REQUIRE(a.moe.has_value() == b.moe.has_value());
  if (a.moe) {
    CHECK(a.moe->num_experts == b.moe->num_experts);
    CHECK(a.moe->top_k == b.moe->top_k);
    CHECK(a.moe->expert_ffn_hidden == b.moe->expert_ffn_hidden);
    CHECK(a.moe->shared_expert_ffn_hidden == b.moe->shared_expert_ffn_hidden);
    CHECK(a.moe->moe_layers == b.moe->moe_layers);
    CHECK(a.moe->capacity_factor == b.moe->capacity_factor);
    CHECK(a.moe->pad_to_capacity == b.moe->pad_to_capacity);
    CHECK(a.moe->num_groups == b.moe->num_groups);
    CHECK(a.moe->group_topk == b.moe->group_topk);
  }
  REQUIRE(a.mla.has_value() == b.mla.has_value());
  if (a.mla) {
    CHECK(a.mla->q_lora_rank == b.mla->q_lora_rank);
    CHECK(a.mla->kv_lora_rank == b.mla->kv_lora_rank);
    CHECK(a.mla->qk_head_dim == b.mla->qk_head_dim);
    CHECK(a.mla->qk_rope_head_dim == b.mla->qk_rope_head_dim);
    CHECK(a.mla->v_head_dim == b.mla->v_head_dim);
  }
}

// Exports the setup, imports the line and compares model, training and plan.
void check_round_trip(const Setup& s) {
  auto line = export_megatron_args(s);
  if (!line) FAIL(line.error().field << ": " << line.error().message);
  INFO(*line);
  const MegatronLaunch back = import_ok(*line);
  check_same_model(back.model, s.model);
  CHECK(back.training.global_batch_size == s.training.global_batch_size);
  CHECK(back.training.seq_length == s.seq_length);
  CHECK(back.training.precision == s.training.precision);
  CHECK(back.training.fp8_recipe == s.training.fp8_recipe);
  CHECK(back.training.params_dtype == s.training.params_dtype);
  CHECK(back.training.grad_dtype == s.training.grad_dtype);
  const OptimizerPrecision &a = back.training.optimizer_precision, &b = s.training.optimizer_precision;
  CHECK(a.enabled == b.enabled);
  CHECK(a.main_params == b.main_params);
  CHECK(a.exp_avg == b.exp_avg);
  CHECK(a.exp_avg_sq == b.exp_avg_sq);
  CHECK(a.store_param_remainders == b.store_param_remainders);
  PlanSpec expected = s.plan;
  expected.dp.reset();
  CHECK(format_inline_plan(back.plan) == format_inline_plan(expected));
  CHECK(back.plan == expected);
  CHECK(back.ignored.empty());
}

Setup validated(const ModelSpec& m, const TrainingSpec& t, const PlanSpec& p) {
  auto s = validate_setup(m, test_cluster(), t, p);
  if (!s) FAIL(s.error().field << ": " << s.error().message);
  return *s;
}

}  // namespace

TEST_CASE("A squared-ReLU model (the shipped Nemotron-4 340B) exports --squared-relu and imports back the same", "[config]") {
  const ModelSpec m = megascope::test::shipped_model("nemotron4-340b");
  REQUIRE(m.activation == Activation::squared_relu);
  TrainingSpec t;
  t.global_batch_size = 32;
  PlanSpec p;
  p.tp = 8;
  p.pp = 8;
  p.dp = 1;
  const Setup s = validated(m, t, p);
  check_round_trip(s);
  REQUIRE_THAT(*export_megatron_args(s), Catch::Contains("--squared-relu"));
  REQUIRE_THAT(*export_megatron_args(s), !Catch::Contains("--swiglu"));
}

TEST_CASE("Exporting and importing a GPT-3 style interleaved fp16 setup gives back the model, training and plan",
          "[config]") {
  ModelSpec m;
  m.name = "gpt-530b";
  m.num_layers = 105;
  m.hidden_size = 20480;
  m.ffn_hidden_size = 81920;
  m.num_attention_heads = 128;
  m.num_query_groups = 128;
  m.kv_channels = 160;
  m.vocab_size = 50257;
  m.seq_length = 2048;
  m.hidden_dropout = 0.1;
  m.attention_dropout = 0.1;
  TrainingSpec t;
  t.global_batch_size = 2520;
  t.params_dtype = Dtype::fp16;
  t.grad_dtype = Dtype::fp32;
  PlanSpec p;
  p.tp = 8;
  p.pp = 35;
  p.vpp = 3;
  p.dp = 9;
  p.schedule = Schedule::interleaved;
  const Setup s = validated(m, t, p);
  check_round_trip(s);
  const std::string line = *export_megatron_args(s);
  REQUIRE_THAT(line, Catch::Contains("--fp16 --accumulate-allreduce-grads-in-fp32"));
  REQUIRE_THAT(line, Catch::Contains("--num-virtual-stages-per-pipeline-rank 3"));
  CHECK_THAT(line, !Catch::Contains("--hidden-dropout"));
  CHECK_THAT(line, !Catch::Contains("--no-async-tensor-model-parallel-allreduce"));

  // With all-to-all context parallelism (16 heads per TP rank over cp 2).
  PlanSpec c = p;
  c.cp = 2;
  c.dp = 4;
  c.cp_comm = CpCommType::a2a;
  const Setup a2a = validated(m, t, c);
  check_round_trip(a2a);
  REQUIRE_THAT(*export_megatron_args(a2a), Catch::Contains("--context-parallel-size 2 --cp-comm-type a2a"));

  // The same run as Megatron-LM of 2021 ran it: no asynchronous TP all-reduce.
  p.tp_grad_overlap = false;
  const Setup old = validated(m, t, p);
  check_round_trip(old);
  CHECK_THAT(*export_megatron_args(old), Catch::Contains("--no-async-tensor-model-parallel-allreduce"));
  CHECK_THAT(*export_megatron_args(old), !Catch::Contains("--no-gradient-accumulation-fusion"));

  // ... and without gradient accumulation fusion (added to Megatron-LM later in 2021).
  p.grad_accum_fusion = false;
  const Setup older = validated(m, t, p);
  check_round_trip(older);
  CHECK_THAT(*export_megatron_args(older), Catch::Contains("--no-gradient-accumulation-fusion"));
  CHECK_THAT(*export_megatron_args(older), !Catch::Contains("scatter-gather"));

  // ... and with its pipeline tensors scattered over TP: Megatron-LM's default then, and no flag
  // (Megatron-Core cannot), so the line is the same.
  p.pp_scatter_gather = true;
  const Setup oldest = validated(m, t, p);
  CHECK(*export_megatron_args(oldest) == *export_megatron_args(older));
  CHECK_THAT(*export_megatron_args(oldest), !Catch::Contains("p2p-communication"));

  // ... and waiting on every pipeline exchange, as the 2021 code did.
  p.pp_scatter_gather = false;   // no flag: it would not come back
  p.overlap_p2p_comm = false;
  const Setup sync = validated(m, t, p);
  check_round_trip(sync);
  CHECK_THAT(*export_megatron_args(sync), Catch::Contains("--no-overlap-p2p-communication"));
  CHECK_THAT(*export_megatron_args(sync), !Catch::Contains("warmup-flush"));

  // Overlapped warm-up and flush (Megatron-Core's --overlap-p2p-communication-warmup-flush).
  p.overlap_p2p_comm.reset();
  p.overlap_p2p_warmup_flush = true;
  const Setup flushed = validated(m, t, p);
  check_round_trip(flushed);
  CHECK_THAT(*export_megatron_args(flushed), Catch::Contains("--overlap-p2p-communication-warmup-flush"));
  p.overlap_p2p_warmup_flush = false;

  // Megatron-LM's 1f1b cannot overlap its transfers: no line for it.
  p.vpp.reset();
  p.pp = 35;
  p.schedule = Schedule::one_f_one_b;
  p.overlap_p2p_comm = true;
  auto e = export_megatron_args(validated(m, t, p));
  REQUIRE_FALSE(e);
  CHECK(e.error().field == "plan.overlap_p2p_comm");
  p.overlap_p2p_comm.reset();
  CHECK(export_megatron_args(validated(m, t, p)).has_value());
}

TEST_CASE("Exporting and importing a Llama-3-70B style setup gives back the model, training and plan",
          "[config]") {
  ModelSpec m;
  m.name = "llama3-70b";
  m.num_layers = 80;
  m.hidden_size = 8192;
  m.ffn_hidden_size = 28672;
  m.num_attention_heads = 64;
  m.num_query_groups = 8;
  m.kv_channels = 128;
  m.vocab_size = 128256;
  m.seq_length = 8192;
  m.activation = Activation::swiglu;
  m.norm = Norm::rmsnorm;
  m.position_embedding = PositionEmbedding::rope;
  m.add_bias_linear = false;
  m.tied_embeddings = false;
  TrainingSpec t;
  t.global_batch_size = 1024;
  t.grad_dtype = Dtype::bf16;
  PlanSpec p;
  p.tp = 8;
  p.pp = 4;
  p.vpp = 4;
  p.cp = 2;
  p.schedule = Schedule::interleaved;
  p.sequence_parallel = true;
  p.distributed_optimizer = true;
  p.overlap_grad_reduce = true;
  p.overlap_param_gather = true;
  p.tp_comm_overlap = true;
  p.recompute.granularity = RecomputeGranularity::selective;
  const Setup s = validated(m, t, p);
  check_round_trip(s);
  const std::string line = *export_megatron_args(s);
  REQUIRE_THAT(line, Catch::Contains("--group-query-attention --num-query-groups 8"));
  REQUIRE_THAT(line, Catch::Contains("--hidden-dropout 0 --attention-dropout 0"));
  REQUIRE_THAT(line, Catch::Contains("--bf16 --grad-reduce-in-bf16"));

  // An interleaved micro-batch group other than pp (16 micro-batches in groups of 8).
  PlanSpec grouped = p;
  grouped.microbatch_group = 8;
  const Setup sg = validated(m, t, grouped);
  CHECK(sg.microbatch_group == 8);
  check_round_trip(sg);
  CHECK_THAT(*export_megatron_args(sg), Catch::Contains("--microbatch-group-size-per-virtual-pipeline-stage 8"));

  // The embedding counted as a layer (--account-for-embedding-in-pipeline-
  // split): 80 + 1 layers over pp 3, 27 a rank, 9 a chunk, 8 on the first.
  PlanSpec counted = p;
  counted.pp = 3;
  counted.vpp = 3;
  counted.dp = 4;
  counted.embedding_in_split = true;
  TrainingSpec tc = t;
  tc.global_batch_size = 1200;
  const Setup sc = validated(m, tc, counted);
  CHECK(sc.layers_on_rank(0) == 26);
  CHECK(sc.chunks[0][0].count == 8);
  check_round_trip(sc);
  CHECK_THAT(*export_megatron_args(sc), Catch::Contains("--account-for-embedding-in-pipeline-split"));
  counted.embedding_in_split = false;   // 80 + 1 with the loss instead: the last chunk gives up the layer
  counted.loss_in_split = true;
  const Setup sl = validated(m, tc, counted);
  CHECK(sl.chunks[2][2].count == 8);
  check_round_trip(sl);
  CHECK_THAT(*export_megatron_args(sl), Catch::Contains("--account-for-loss-in-pipeline-split"));

  // DeepSeek-V3's optimizer: bf16 moments, fp32 master weights kept as remainders.
  TrainingSpec pa = t;
  pa.optimizer_precision.enabled = true;
  pa.optimizer_precision.exp_avg = Dtype::bf16;
  pa.optimizer_precision.exp_avg_sq = Dtype::bf16;
  const Setup s2 = validated(m, pa, p);
  check_round_trip(s2);
  const std::string line2 = *export_megatron_args(s2);
  CHECK_THAT(line2, Catch::Contains("--use-precision-aware-optimizer --main-grads-dtype bf16 --exp-avg-dtype bf16 "
                                    "--exp-avg-sq-dtype bf16"));
  CHECK_THAT(line2, !Catch::Contains("--main-params-dtype") && !Catch::Contains("remainders"));
  pa.optimizer_precision.main_params = Dtype::fp16;
  pa.optimizer_precision.exp_avg = Dtype::fp8;
  pa.optimizer_precision.store_param_remainders = false;
  pa.grad_dtype = Dtype::fp32;
  const Setup s3 = validated(m, pa, p);
  check_round_trip(s3);
  CHECK_THAT(*export_megatron_args(s3), Catch::Contains("--main-params-dtype fp16 --exp-avg-dtype fp8 --exp-avg-sq-dtype bf16 "
                                                        "--no-store-param-remainders"));
}

TEST_CASE("Exporting and importing a DeepSeek-style MoE setup with MLA, MTP and uneven stages round-trips",
          "[config]") {
  ModelSpec m;
  m.name = "deepseek-like";
  m.num_layers = 61;
  m.hidden_size = 7168;
  m.ffn_hidden_size = 18432;
  m.num_attention_heads = 128;
  m.num_query_groups = 128;
  m.kv_channels = 128;
  m.vocab_size = 129280;
  m.seq_length = 4096;
  m.activation = Activation::swiglu;
  m.norm = Norm::rmsnorm;
  m.position_embedding = PositionEmbedding::rope;
  m.add_bias_linear = false;
  m.tied_embeddings = false;
  m.mtp_num_layers = 1;
  MoeSpec e;
  e.num_experts = 256;
  e.top_k = 8;
  e.expert_ffn_hidden = 2048;
  e.shared_expert_ffn_hidden = 2048;
  e.moe_layers.assign(61, true);
  for (int i = 0; i < 3; ++i) e.moe_layers[static_cast<std::size_t>(i)] = false;
  e.capacity_factor = 1.25;
  e.pad_to_capacity = true;
  m.moe = e;
  MlaSpec a;
  a.q_lora_rank = 1536;
  a.kv_lora_rank = 512;
  a.qk_head_dim = 128;
  a.qk_rope_head_dim = 64;
  a.v_head_dim = 128;
  m.mla = a;
  TrainingSpec t;
  t.global_batch_size = 64;
  t.precision = Precision::fp8;
  PlanSpec p;
  p.tp = 2;
  p.pp = 4;
  p.first_stage_layers = 13;
  p.last_stage_layers = 12;
  p.ep = 8;
  p.etp = 1;
  p.dp = 4;
  p.sequence_parallel = true;
  p.distributed_optimizer = true;
  p.recompute = Recompute{RecomputeGranularity::full, RecomputeMethod::uniform, 1};
  p.cp_comm = CpCommType::all_gather;
  p.attention = AttentionKernel::unfused;
  p.moe_shared_expert_overlap = true;
  const Setup s = validated(m, t, p);
  check_round_trip(s);
  const std::string line = *export_megatron_args(s);
  REQUIRE_THAT(line, Catch::Contains("--moe-layer-freq '([0]*3+[1]*58)'"));
  REQUIRE_THAT(line, Catch::Contains("--moe-expert-capacity-factor 1.25 --moe-pad-expert-input-to-capacity"));
  REQUIRE_THAT(line, Catch::Contains("--moe-shared-expert-overlap"));
  REQUIRE_THAT(line, Catch::Contains("--moe-token-dispatcher-type alltoall"));
  PlanSpec gathered = p;
  PlanSpec overlapped = p;
  overlapped.moe_shared_expert_overlap = false;
  overlapped.recompute = Recompute{};
  overlapped.moe_ep_overlap = true;
  overlapped.pp = 1;   // with pp > 1 Megatron-Core wants virtual stages for it
  overlapped.first_stage_layers.reset();
  overlapped.last_stage_layers.reset();
  overlapped.dp = 16;
  const Setup ov = validated(m, t, overlapped);
  check_round_trip(ov);
  REQUIRE_THAT(*export_megatron_args(ov), Catch::Contains("--overlap-moe-expert-parallel-comm"));
  gathered.moe_shared_expert_overlap = false;
  gathered.moe_dispatcher = MoeDispatcher::allgather;
  const Setup g = validated(m, t, gathered);
  check_round_trip(g);
  REQUIRE_THAT(*export_megatron_args(g), Catch::Contains("--moe-token-dispatcher-type allgather"));
  // Selective recomputation of DeepSeek's light modules: named in Megatron-LM's spelling, read back the same.
  PlanSpec modules = p;
  modules.recompute = Recompute{RecomputeGranularity::selective, std::nullopt, std::nullopt,
                                kRecomputeCoreAttn | kRecomputeLayernorm | kRecomputeMlaUpProj | kRecomputeMoeAct};
  const Setup rm = validated(m, t, modules);
  check_round_trip(rm);
  REQUIRE_THAT(*export_megatron_args(rm),
               Catch::Contains("--recompute-granularity selective --recompute-modules core_attn layernorm mla_up_proj moe_act"));
  // DeepEP with group-limited routing: both named, and read back the same.
  ModelSpec grouped = m;
  grouped.moe->num_groups = 8;
  grouped.moe->group_topk = 4;
  PlanSpec deepep = p;
  deepep.moe_dispatcher = MoeDispatcher::flex;
  const Setup f = validated(grouped, t, deepep);
  check_round_trip(f);
  const std::string flex_line = *export_megatron_args(f);
  REQUIRE_THAT(flex_line, Catch::Contains("--moe-token-dispatcher-type flex --moe-enable-deepep"));
  REQUIRE_THAT(flex_line, Catch::Contains("--moe-router-num-groups 8 --moe-router-group-topk 4"));
  REQUIRE_THAT(line, Catch::Contains("--fp8-format hybrid"));
  CHECK(line.find("--fp8-recipe") == std::string::npos);   // delayed, Megatron-LM's default
  REQUIRE_THAT(line, Catch::Contains("--attention-backend unfused"));
  // Each other FP8 recipe is named, and read back the same.
  for (const Fp8Recipe r : {Fp8Recipe::tensorwise, Fp8Recipe::blockwise, Fp8Recipe::mxfp8}) {
    TrainingSpec tr = t;
    tr.fp8_recipe = r;
    ClusterSpec c = test_cluster();
    c.device.mx_formats = r == Fp8Recipe::mxfp8;   // MXFP8 needs Blackwell's MX formats
    auto v = validate_setup(m, c, tr, p);
    if (!v) FAIL(v.error().str());
    const Setup rs = *v;
    check_round_trip(rs);
    REQUIRE_THAT(*export_megatron_args(rs), Catch::Contains(std::string("--fp8-recipe ") + to_string(r)));
  }
}

TEST_CASE("A DeepSeek-V3 pipeline layout string round-trips through import and export unchanged", "[config]") {
  const std::string model =
      "--num-layers 61 --hidden-size 7168 --ffn-hidden-size 18432 --num-attention-heads 128 --kv-channels 128 "
      "--seq-length 4096 --max-position-embeddings 4096 --vocab-size 129280 --swiglu --normalization RMSNorm "
      "--position-embedding-type rope --disable-bias-linear --untie-embeddings-and-output-weights --bf16 "
      "--multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128 --qk-pos-emb-head-dim 64 "
      "--v-head-dim 128 --num-experts 256 --moe-router-topk 8 --moe-ffn-hidden-size 2048 "
      "--moe-shared-expert-intermediate-size 2048 --moe-layer-freq '([0]*3+[1]*58)' --mtp-num-layers 1 "
      "--moe-grouped-gemm --micro-batch-size 1 --global-batch-size 4096 --tensor-model-parallel-size 2 "
      "--expert-model-parallel-size 8 --sequence-parallel --use-distributed-optimizer ";
  // Megatron-Bridge's recipe layouts (MTP with the loss): pp 16, and pp 8 x vpp 2.
  for (const char* pp : {"16", "8"}) {
    const std::string layout = "Et*4|(t*4|)*14,tmL";
    const MegatronLaunch in =
        import_ok(model + "--pipeline-model-parallel-size " + pp + " --pipeline-model-parallel-layout '" + layout + "'");
    REQUIRE(in.plan.layout);
    CHECK(*in.plan.layout == layout);
    CHECK(in.plan.vpp == (std::string(pp) == "8" ? std::optional<int>(2) : std::nullopt));
    const Setup s = validated(in.model, in.training, in.plan);
    CHECK(s.chunks[0][0].count == 4);
    CHECK(s.chunks[0][0].embedding);
    CHECK(s.layout.back() == LayoutStage{1, false, true, 1});
    check_round_trip(s);
    const std::string line = *export_megatron_args(s);
    CHECK_THAT(line, Catch::Contains("--pipeline-model-parallel-layout '" + layout + "'"));
    CHECK_THAT(line, !Catch::Contains("--num-virtual-stages-per-pipeline-rank"));
  }
  // The standalone-MTP layout of Megatron-Core's docs: MTP on virtual stage
  // 30 (rank 14's last chunk), the loss on stage 31.
  const std::string standalone_layout = "Et*3|(tt|)*29,m|L";
  const MegatronLaunch standalone = import_ok(model + "--pipeline-model-parallel-size 16 "
                                                      "--pipeline-model-parallel-layout '" + standalone_layout + "'");
  CHECK(*standalone.plan.layout == standalone_layout);
  CHECK(standalone.plan.vpp == 2);
  CHECK(standalone.plan.schedule == Schedule::interleaved);
  const Setup sa = validated(standalone.model, standalone.training, standalone.plan);
  CHECK(sa.layout[30] == LayoutStage{0, false, false, 1});
  CHECK(sa.layout[31] == LayoutStage{0, false, true, 0});
  check_round_trip(sa);
  CHECK_THAT(*export_megatron_args(sa), Catch::Contains("--pipeline-model-parallel-layout '" + standalone_layout + "'"));
  // Megatron-LM's rules on the layout flag.
  CHECK_THAT(import_error(model + "--pipeline-model-parallel-size 16 --pipeline-model-parallel-layout 'Et*4|(t*4|)*14,tmL' "
                                  "--num-virtual-stages-per-pipeline-rank 2").message,
             Catch::Contains("not both"));
  CHECK_THAT(import_error(model + "--pipeline-model-parallel-size 5 --pipeline-model-parallel-layout 'Et*4|(t*4|)*14,tmL'")
                 .message,
             Catch::Contains("16 stages, which must be a multiple of --pipeline-model-parallel-size (5)"));
  CHECK(import_error(model + "--pipeline-model-parallel-size 16 --pipeline-model-parallel-layout 'Et*4|(t*4|)*14,txL'")
            .field == "megatron.--pipeline-model-parallel-layout");
}

TEST_CASE("Exporting and importing a small GPT with learned positions and unusual options round-trips",
          "[config]") {
  ModelSpec m;
  m.name = "small";
  m.num_layers = 6;
  m.hidden_size = 768;
  m.ffn_hidden_size = 3000;
  m.num_attention_heads = 12;
  m.num_query_groups = 4;
  m.kv_channels = 80;
  m.vocab_size = 50000;
  m.make_vocab_size_divisible_by = 64;
  m.seq_length = 2048;
  m.add_bias_linear = false;
  m.add_qkv_bias = true;
  m.qk_layernorm = true;
  m.hidden_dropout = 0.05;
  m.attention_dropout = 0.0;
  MoeSpec e;
  e.num_experts = 4;
  e.top_k = 1;
  e.expert_ffn_hidden = 1000;
  e.moe_layers = {true, false, true, false, true, false};
  m.moe = e;
  TrainingSpec t;
  t.global_batch_size = 16;
  t.seq_length = 1024;
  t.params_dtype = Dtype::fp32;
  PlanSpec p;
  p.ep = 2;
  p.dp = 8;
  p.micro_batch_size = 2;
  p.recompute = Recompute{RecomputeGranularity::full, RecomputeMethod::block, 2};
  const Setup s = validated(m, t, p);
  check_round_trip(s);
  const std::string line = *export_megatron_args(s);
  REQUIRE_THAT(line, Catch::Contains("--moe-layer-freq 2"));
  REQUIRE_THAT(line, Catch::Contains("--kv-channels 80"));
  REQUIRE_THAT(line, Catch::Contains("--seq-length 1024 --max-position-embeddings 2048"));

  // A pattern that is not a frequency is written as runs.
  Setup runs = s;
  runs.model.moe->moe_layers = {false, true, true, false, false, true};
  const std::string runs_line = *export_megatron_args(runs);
  REQUIRE_THAT(runs_line, Catch::Contains("--moe-layer-freq '([0]*1+[1]*2+[0]*2+[1]*1)'"));
  CHECK(import_ok(runs_line).model.moe->moe_layers == runs.model.moe->moe_layers);
}

TEST_CASE("Exporting a hand-built setup uses its derived vpp and etp", "[config]") {
  Setup s;
  s.model = import_ok(kSmall).model;
  s.training.global_batch_size = 8;
  s.plan.tp = 2;
  s.plan.pp = 4;
  s.plan.schedule = Schedule::interleaved;
  s.vpp = 2;
  s.etp = 2;
  s.seq_length = 1024;
  auto line = export_megatron_args(s);
  REQUIRE(line.has_value());
  REQUIRE_THAT(*line, Catch::Contains("--num-virtual-stages-per-pipeline-rank 2"));
  CHECK_THAT(*line, !Catch::Contains("--expert-tensor-parallel-size"));
  const MegatronLaunch back = import_ok(*line);
  CHECK(back.plan.vpp == 2);
  CHECK(back.plan.schedule == Schedule::interleaved);
}

TEST_CASE("Exporting a zero-bubble, DualPipe or GPipe plan fails on plan.schedule", "[config]") {
  for (Schedule sch : {Schedule::zb_v, Schedule::zb_h1, Schedule::zb_h2, Schedule::dualpipe, Schedule::dualpipev,
                       Schedule::gpipe}) {
    Setup s;
    s.model = import_ok(kSmall).model;
    s.training.global_batch_size = 8;
    s.plan.pp = 4;
    s.plan.schedule = sch;
    s.vpp = default_vpp(sch);
    s.seq_length = 1024;
    auto r = export_megatron_args(s);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().field == "plan.schedule");
    REQUIRE_THAT(r.error().message, Catch::Contains("Megatron-LM has no flag"));
    REQUIRE_THAT(r.error().message, Catch::Contains(to_string(sch)));
  }
}

TEST_CASE("Exporting a plan with optimizer post-validation fails on plan.post_validation", "[config]") {
  Setup s;
  s.model = import_ok(kSmall).model;
  s.training.global_batch_size = 8;
  s.plan.pp = 4;
  s.plan.post_validation = true;
  s.overlap_p2p_comm = false;   // Megatron-LM's 1f1b
  s.seq_length = 1024;
  auto r = export_megatron_args(s);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().field == "plan.post_validation");
}

TEST_CASE("Exporting gradient dtypes Megatron cannot express fails on training.grad_dtype", "[config]") {
  Setup s;
  s.model = import_ok(kSmall).model;
  s.training.global_batch_size = 8;
  s.training.params_dtype = Dtype::bf16;
  s.training.grad_dtype = Dtype::fp16;
  s.seq_length = 1024;
  auto r = export_megatron_args(s);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().field == "training.grad_dtype");
}

// A small GPT of 4 layers, hidden 512, 8 heads, 1024 tokens, 32k vocabulary.
ModelSpec small_gpt(const char* name) {
  ModelSpec m;
  m.name = name;
  m.num_layers = 4;
  m.hidden_size = 512;
  m.ffn_hidden_size = 2048;
  m.num_attention_heads = 8;
  m.num_query_groups = 8;
  m.kv_channels = 64;
  m.vocab_size = 32000;
  m.seq_length = 1024;
  return m;
}

TEST_CASE("A model with sliding windows exports --window-size and --window-attn-skip-freq and round-trips", "[config]") {
  ModelSpec m = small_gpt("gpt-windowed");
  m.window_size = 128;
  m.window_skip_freq = 2;
  TrainingSpec t;
  t.global_batch_size = 4096;
  PlanSpec p;
  const Setup s = validated(m, t, p);
  const std::string line = *export_megatron_args(s);
  CHECK_THAT(line, Catch::Contains("--window-size 128,0 --window-attn-skip-freq 2"));
  check_round_trip(s);
}

TEST_CASE("Sharded data-parallel plans export as Megatron-FSDP or PyTorch FSDP2 flags and round-trip", "[config][zero]") {
  ModelSpec m = small_gpt("gpt-fsdp");
  m.tied_embeddings = false;   // FSDP2 needs untied embeddings
  TrainingSpec t;
  t.global_batch_size = 4096;
  struct Row { const char* plan; const char* flags; };
  for (const Row& r : {Row{"zero=2,overlap_grad_reduce=on", "--use-megatron-fsdp --use-distributed-optimizer "
                                                           "--data-parallel-sharding-strategy optim_grads"},
                       Row{"zero=3,overlap_grad_reduce=on", "--data-parallel-sharding-strategy optim_grads_params"},
                       Row{"zero=3,fsdp_prefetch=0", "--data-parallel-sharding-strategy optim_grads_params"},
                       Row{"zero=3,pp=2,overlap_grad_reduce=on", "--use-megatron-fsdp"},
                       Row{"distopt=on,dp_replicas=2", "--use-distributed-optimizer --num-distributed-optimizer-instances 2"},
                       Row{"zero=3,dp_replicas=4,fsdp_prefetch=0", "--num-distributed-optimizer-instances 4"},
                       Row{"zero=3,reshard_after_forward=off,grad_accum_fusion=off",
                           "--use-torch-fsdp2 --torch-fsdp2-no-reshard-after-forward"}}) {
    auto p = parse_inline_plan(r.plan);
    REQUIRE(p);
    const Setup s = validated(m, t, *p);
    const auto line = export_megatron_args(s);
    INFO(r.plan);
    REQUIRE(line);
    CHECK_THAT(*line, Catch::Contains(r.flags));
    check_round_trip(s);
  }
  // What no flag expresses fails naming the plan key.
  for (auto [plan, field] : {std::pair{"zero=3,fsdp_prefetch=2,overlap_grad_reduce=on", "plan.fsdp_prefetch"},
                             std::pair{"zero=3", "plan.fsdp_prefetch"},   // prefetch needs --overlap-grad-reduce
                             std::pair{"zero=3,reshard_after_forward=off", "plan.grad_accum_fusion"}}) {
    auto p = parse_inline_plan(plan);
    REQUIRE(p);
    const auto line = export_megatron_args(validated(m, t, *p));
    INFO(plan);
    REQUIRE_FALSE(line);
    CHECK(line.error().field == field);
  }
}
