// import_megatron_args: what the flags mean. Whole launch lines (GPT-3 530B,
// Llama-3-70B behind torchrun, DeepSeek-V3), Megatron's defaults, required
// flags and the rules for vocab, pipeline, precision, recompute and features
// that are not modelled. Command-line syntax is in megatron_cmdline_test.cpp,
// export in megatron_export_test.cpp.
#include "config/megatron_args.hpp"

#include <catch2/catch.hpp>

#include "config/megatron_support.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "config/plan_settings.hpp"

using namespace megascope;
using namespace megascope::test;

namespace {

// 530B, Narayanan et al. 2021, Table 1 style (interleaved: 105 / 35 = 3 layers per stage, 1 per chunk).
const char* const k530B =
    "python pretrain_gpt.py --num-layers 105 --hidden-size 20480 --num-attention-heads 128 "
    "--seq-length 2048 --max-position-embeddings 2048 --tensor-model-parallel-size 8 "
    "--pipeline-model-parallel-size 35 --num-layers-per-virtual-pipeline-stage 1 --micro-batch-size 1 "
    "--global-batch-size 2520 --vocab-file x --merge-file y --tokenizer-type GPT2BPETokenizer --lr 6e-5 "
    "--min-lr 6e-6 --lr-decay-style cosine --lr-warmup-samples 183105 --train-samples 146484375 "
    "--weight-decay 0.1 --clip-grad 1.0 --adam-beta1 0.9 --adam-beta2 0.95 --init-method-std 0.006 --fp16 "
    "--data-path 0.5 /data/a_text_document 0.5 /data/b_text_document --split 949,50,1 --log-interval 1 "
    "--save-interval 1000 --eval-interval 1000 --eval-iters 10 --save /ckpt --load /ckpt --DDP-impl local "
    "--no-masked-softmax-fusion --seed 1234";

// Llama-3-70B style, behind a torchrun launcher, written as a shell script.
const char* const kLlama70B = R"(CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nproc_per_node 8 --nnodes 32 \
    --node_rank 0 --master_addr "node-0" --master_port 6000 --rdzv_backend c10d \
    pretrain_gpt.py \
    --num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 \
    --num-attention-heads 64 --group-query-attention --num-query-groups 8 \
    --swiglu --normalization RMSNorm --norm-epsilon 1e-5 \
    --position-embedding-type rope --rotary-base 500000 --use-rope-scaling \
    --untie-embeddings-and-output-weights --disable-bias-linear \
    --vocab-size 128256 --tokenizer-type HuggingFaceTokenizer --tokenizer-model 'meta-llama/Meta-Llama-3-70B' \
    --seq-length 8192 --max-position-embeddings 8192 \
    --hidden-dropout 0.0 --attention-dropout 0.0 \
    --micro-batch-size 1 --global-batch-size 1024 --bf16 \
    --tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 \
    --num-layers-per-virtual-pipeline-stage 5 --context-parallel-size 2 \
    --sequence-parallel --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather \
    --tp-comm-overlap --recompute-activations --use-flash-attn \
    --transformer-impl transformer_engine --use-mcore-models --attention-softmax-in-fp32 \
    --lr=1.5e-4 --train-iters 1000 --mock-data   # a comment
)";

// DeepSeek-V3 style MoE with MLA and MTP.
const char* const kDeepSeek =
    "torchrun --nproc_per_node 8 pretrain_gpt.py "
    "--num-layers 61 --hidden-size 7168 --ffn-hidden-size 18432 --num-attention-heads 128 "
    "--multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128 "
    "--qk-pos-emb-head-dim 64 --v-head-dim 128 --kv-channels 128 "
    "--num-experts 256 --moe-router-topk 8 --moe-ffn-hidden-size 2048 "
    "--moe-shared-expert-intermediate-size 2048 --moe-layer-freq \"([0]*3+[1]*58)\" "
    "--moe-router-score-function sigmoid --moe-router-enable-expert-bias "
    "--moe-router-load-balancing-type seq_aux_loss --moe-aux-loss-coeff 1e-4 --moe-grouped-gemm "
    "--moe-token-dispatcher-type alltoall --moe-router-dtype fp32 "
    "--mtp-num-layers 1 --swiglu --normalization RMSNorm --position-embedding-type rope "
    "--untie-embeddings-and-output-weights --disable-bias-linear --vocab-size 129280 "
    "--seq-length 4096 --max-position-embeddings 4096 --hidden-dropout 0 --attention-dropout 0 "
    "--micro-batch-size 1 --global-batch-size 8192 --bf16 --fp8-format hybrid --fp8-recipe blockwise "
    "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 16 "
    "--decoder-first-pipeline-num-layers 3 --decoder-last-pipeline-num-layers 2 "
    "--expert-model-parallel-size 64 --expert-tensor-parallel-size 1 --sequence-parallel "
    "--use-distributed-optimizer --recompute-granularity full --recompute-method uniform "
    "--recompute-num-layers 1 --cp-comm-type all_gather";

}  // namespace

TEST_CASE("The 530B launch line imports as GPT-3 style model, fp16 training and an interleaved 8x35 plan",
          "[config]") {
  const MegatronLaunch l = import_ok(k530B);
  const ModelSpec& m = l.model;
  CHECK(m.num_layers == 105);
  CHECK(m.hidden_size == 20480);
  CHECK(m.ffn_hidden_size == 4 * 20480);
  CHECK(m.num_attention_heads == 128);
  CHECK(m.num_query_groups == 128);
  CHECK(m.kv_channels == 160);
  CHECK(m.vocab_size == 50257);
  CHECK(m.make_vocab_size_divisible_by == 128);
  CHECK(m.seq_length == 2048);
  CHECK(m.activation == Activation::gelu);
  CHECK(m.norm == Norm::layernorm);
  CHECK(m.position_embedding == PositionEmbedding::learned);
  CHECK(m.add_bias_linear);
  CHECK(m.add_qkv_bias);
  CHECK(m.tied_embeddings);
  CHECK_FALSE(m.qk_layernorm);
  CHECK(m.hidden_dropout == 0.1);
  CHECK(m.attention_dropout == 0.1);
  CHECK(m.mtp_num_layers == 0);
  CHECK_FALSE(m.moe.has_value());
  CHECK_FALSE(m.mla.has_value());
  CHECK(m.padded_vocab(8) == 51200);

  CHECK(l.training.global_batch_size == 2520);
  CHECK(l.training.seq_length == 2048);
  CHECK(l.training.precision == Precision::bf16);
  CHECK(l.training.params_dtype == Dtype::fp16);
  // fp16 without --accumulate-allreduce-grads-in-fp32: Megatron's grad buffer is fp16.
  CHECK(l.training.grad_dtype == Dtype::fp16);

  const PlanSpec& p = l.plan;
  CHECK(p.tp == 8);
  CHECK(p.pp == 35);
  CHECK(p.vpp == 3);
  CHECK(p.schedule == Schedule::interleaved);
  CHECK_FALSE(p.dp.has_value());
  CHECK(p.cp == 1);
  CHECK(p.ep == 1);
  CHECK_FALSE(p.etp.has_value());
  CHECK(p.micro_batch_size == 1);
  CHECK_FALSE(p.sequence_parallel);
  CHECK(p.recompute == Recompute{});
  CHECK_FALSE(p.distributed_optimizer);
  CHECK_FALSE(p.overlap_grad_reduce);
  CHECK_FALSE(p.overlap_param_gather);
  CHECK_FALSE(p.tp_comm_overlap);
  CHECK(p.attention == AttentionKernel::flash);
  CHECK(p.cp_comm == CpCommType::p2p);
  CHECK_FALSE(p.first_stage_layers.has_value());
  CHECK_FALSE(p.last_stage_layers.has_value());

  for (const char* flag : {"--vocab-file", "--merge-file", "--tokenizer-type", "--lr", "--min-lr", "--data-path",
                           "--split", "--save", "--load", "--DDP-impl", "--seed", "--no-masked-softmax-fusion"})
    CHECK(contains(l.ignored, flag));
  CHECK_FALSE(contains(l.ignored, "--num-layers"));
  REQUIRE(l.warnings.size() == 1);
  REQUIRE_THAT(l.warnings[0], Catch::Contains("50257"));
}

TEST_CASE("The Llama-3-70B launch line behind torchrun imports GQA, SwiGLU, RMSNorm, RoPE and the full plan",
          "[config]") {
  const MegatronLaunch l = import_ok(kLlama70B);
  const ModelSpec& m = l.model;
  CHECK(m.num_layers == 80);
  CHECK(m.hidden_size == 8192);
  CHECK(m.ffn_hidden_size == 28672);
  CHECK(m.num_attention_heads == 64);
  CHECK(m.num_query_groups == 8);
  CHECK(m.kv_channels == 128);
  CHECK(m.vocab_size == 128256);
  CHECK(m.make_vocab_size_divisible_by == 128);
  CHECK(m.seq_length == 8192);
  CHECK(m.activation == Activation::swiglu);
  CHECK(m.norm == Norm::rmsnorm);
  CHECK(m.position_embedding == PositionEmbedding::rope);
  CHECK_FALSE(m.add_bias_linear);
  CHECK_FALSE(m.add_qkv_bias);
  CHECK_FALSE(m.tied_embeddings);
  CHECK_FALSE(m.qk_layernorm);
  CHECK(m.hidden_dropout == 0.0);
  CHECK(m.attention_dropout == 0.0);
  CHECK(m.mtp_num_layers == 0);
  CHECK_FALSE(m.moe.has_value());
  CHECK_FALSE(m.mla.has_value());

  CHECK(l.training.global_batch_size == 1024);
  CHECK(l.training.seq_length == 8192);
  CHECK(l.training.precision == Precision::bf16);
  CHECK(l.training.params_dtype == Dtype::bf16);
  CHECK(l.training.grad_dtype == Dtype::fp32);

  const PlanSpec& p = l.plan;
  CHECK(p.tp == 8);
  CHECK(p.pp == 4);
  CHECK(p.vpp == 4);  // 80 / 4 = 20 layers per stage, 5 per chunk
  CHECK(p.schedule == Schedule::interleaved);
  CHECK(p.cp == 2);
  CHECK(p.ep == 1);
  CHECK_FALSE(p.etp.has_value());
  CHECK_FALSE(p.dp.has_value());
  CHECK(p.micro_batch_size == 1);
  CHECK(p.sequence_parallel);
  CHECK(p.distributed_optimizer);
  CHECK(p.overlap_grad_reduce);
  CHECK(p.overlap_param_gather);
  CHECK(p.tp_comm_overlap);
  CHECK(p.recompute.granularity == RecomputeGranularity::selective);
  CHECK(p.attention == AttentionKernel::flash);

  for (const char* flag : {"--norm-epsilon", "--rotary-base", "--use-rope-scaling", "--tokenizer-type",
                           "--tokenizer-model", "--transformer-impl", "--lr", "--train-iters", "--mock-data"})
    CHECK(contains(l.ignored, flag));
  CHECK(l.warnings.empty());
}

TEST_CASE("The DeepSeek-V3 launch line imports MLA, MoE with the ([0]*3+[1]*58) layer pattern and MTP",
          "[config]") {
  const MegatronLaunch l = import_ok(kDeepSeek);
  const ModelSpec& m = l.model;
  CHECK(m.num_layers == 61);
  CHECK(m.hidden_size == 7168);
  CHECK(m.ffn_hidden_size == 18432);
  CHECK(m.num_attention_heads == 128);
  CHECK(m.num_query_groups == 128);
  CHECK(m.kv_channels == 128);
  CHECK(m.vocab_size == 129280);
  CHECK(m.seq_length == 4096);
  CHECK(m.activation == Activation::swiglu);
  CHECK(m.norm == Norm::rmsnorm);
  CHECK(m.position_embedding == PositionEmbedding::rope);
  CHECK_FALSE(m.add_bias_linear);
  CHECK_FALSE(m.tied_embeddings);
  CHECK(m.hidden_dropout == 0.0);
  CHECK(m.attention_dropout == 0.0);
  CHECK(m.mtp_num_layers == 1);

  REQUIRE(m.moe.has_value());
  CHECK(m.moe->num_experts == 256);
  CHECK(m.moe->top_k == 8);
  CHECK(m.moe->expert_ffn_hidden == 2048);
  CHECK(m.moe->shared_expert_ffn_hidden == 2048);
  REQUIRE(m.moe->moe_layers.size() == 61);
  CHECK(m.num_moe_layers() == 58);
  CHECK_FALSE(m.is_moe_layer(0));
  CHECK_FALSE(m.is_moe_layer(2));
  CHECK(m.is_moe_layer(3));
  CHECK(m.is_moe_layer(60));

  REQUIRE(m.mla.has_value());
  CHECK(m.mla->q_lora_rank == 1536);
  CHECK(m.mla->kv_lora_rank == 512);
  CHECK(m.mla->qk_head_dim == 128);
  CHECK(m.mla->qk_rope_head_dim == 64);
  CHECK(m.mla->v_head_dim == 128);

  CHECK(l.training.global_batch_size == 8192);
  CHECK(l.training.seq_length == 4096);
  CHECK(l.training.precision == Precision::fp8);
  CHECK(l.training.params_dtype == Dtype::bf16);
  CHECK(l.training.grad_dtype == Dtype::fp32);

  const PlanSpec& p = l.plan;
  CHECK(p.tp == 2);
  CHECK(p.pp == 16);
  CHECK_FALSE(p.vpp.has_value());
  CHECK(p.schedule == Schedule::one_f_one_b);
  CHECK(p.first_stage_layers == 3);
  CHECK(p.last_stage_layers == 2);
  CHECK(p.ep == 64);
  CHECK(p.etp == 1);
  CHECK(p.cp == 1);
  CHECK(p.cp_comm == CpCommType::all_gather);
  CHECK(p.sequence_parallel);
  CHECK(p.distributed_optimizer);
  CHECK(p.recompute.granularity == RecomputeGranularity::full);
  CHECK(p.recompute.method == RecomputeMethod::uniform);
  CHECK(p.recompute.num_layers == 1);

  for (const char* flag : {"--moe-router-score-function", "--moe-router-enable-expert-bias",
                           "--moe-router-load-balancing-type", "--moe-aux-loss-coeff",
                           "--moe-router-dtype"})
    CHECK(contains(l.ignored, flag));
  // Read, not ignored: the recipe prices the FP8 quantisation kernels.
  CHECK_FALSE(contains(l.ignored, "--fp8-recipe"));
  CHECK(l.training.fp8_recipe == Fp8Recipe::blockwise);
  // Read, not ignored: the Program runs each rank's experts as one grouped GEMM.
  CHECK_FALSE(contains(l.ignored, "--moe-grouped-gemm"));
}

TEST_CASE("Megatron's defaults fill the flags a line leaves out", "[config]") {
  const MegatronLaunch l = import_ok(kSmall);
  CHECK(l.model.ffn_hidden_size == 4096);
  CHECK(l.model.kv_channels == 64);
  CHECK(l.model.num_query_groups == 16);
  CHECK(l.model.hidden_dropout == 0.1);
  CHECK(l.model.attention_dropout == 0.1);
  CHECK(l.model.make_vocab_size_divisible_by == 128);
  CHECK(l.plan == PlanSpec{});
  CHECK(l.ignored.empty());

  // SwiGLU: int((4h * 2/3) / 64) * 64, as Megatron computes it (a repeated flag: the last one wins).
  CHECK(import_ok(kSmall + "--swiglu --hidden-size 4096").model.ffn_hidden_size == 10880);
  CHECK(import_ok(kSmall + "--swiglu --hidden-size 5120 --num-attention-heads 40").model.ffn_hidden_size ==
        13632);
  // GQA without --num-query-groups is one query group (MQA).
  CHECK(import_ok(kSmall + "--group-query-attention").model.num_query_groups == 1);
  // MoE defaults: top-2, expert width = ffn, every layer MoE.
  const MegatronLaunch moe = import_ok(kSmall + "--num-experts 8");
  REQUIRE(moe.model.moe.has_value());
  CHECK(moe.model.moe->top_k == 2);
  CHECK(moe.model.moe->expert_ffn_hidden == 4096);
  CHECK(moe.model.moe->shared_expert_ffn_hidden == 0);
  CHECK(moe.model.num_moe_layers() == 4);
  // MLA defaults.
  const MegatronLaunch mla = import_ok(kSmall + "--multi-latent-attention");
  REQUIRE(mla.model.mla.has_value());
  CHECK_FALSE(mla.model.mla->q_lora_rank.has_value());
  CHECK(mla.model.mla->kv_lora_rank == 32);
  CHECK(mla.model.mla->qk_head_dim == 128);
  CHECK(mla.model.mla->qk_rope_head_dim == 64);
  CHECK(mla.model.mla->v_head_dim == 128);
}

TEST_CASE("A launch line with --squared-relu imports a squared-ReLU MLP of 4h, and with --swiglu is an error", "[config]") {
  const MegatronLaunch l = import_ok(kSmall + "--squared-relu");
  CHECK(l.model.activation == Activation::squared_relu);
  CHECK(l.model.ffn_hidden_size == 4 * l.model.hidden_size);   // not gated: Megatron's 4h default
  CHECK(l.ignored.empty());
  const Error both = import_error(kSmall + "--squared-relu --swiglu");
  CHECK(both.field == "megatron.--squared-relu");
  REQUIRE_THAT(both.message, Catch::Contains("--swiglu"));
}

TEST_CASE("model.seq_length is --max-position-embeddings when given, else --seq-length", "[config]") {
  const MegatronLaunch a = import_ok(kSmall + "--max-position-embeddings 4096");
  CHECK(a.model.seq_length == 4096);
  CHECK(a.training.seq_length == 1024);
  const MegatronLaunch b = import_ok(
      "--num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 512 --vocab-size 1000 "
      "--micro-batch-size 1 --global-batch-size 4");
  CHECK(b.model.seq_length == 512);
  CHECK(b.training.seq_length == 512);
  CHECK(b.training.params_dtype == Dtype::fp32);
  REQUIRE(b.warnings.size() == 1);
  REQUIRE_THAT(b.warnings[0], Catch::Contains("fp32"));
}

TEST_CASE("Missing shape, sequence and batch flags are errors naming the flag", "[config]") {
  const Error layers = import_error("--hidden-size 1024 --num-attention-heads 16 --seq-length 1024 --vocab-size 10 "
                                    "--micro-batch-size 1 --global-batch-size 8");
  CHECK(layers.field == "megatron.--num-layers");
  REQUIRE_THAT(layers.message, Catch::Contains("--num-layers is required"));

  const Error gbs = import_error("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 "
                                 "--vocab-size 10 --micro-batch-size 1");
  CHECK(gbs.field == "megatron.--global-batch-size");
  REQUIRE_THAT(gbs.message, Catch::Contains("device count"));

  const Error seq = import_error("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --vocab-size 10 "
                                 "--micro-batch-size 1 --global-batch-size 8");
  CHECK(seq.field == "megatron.--seq-length");

  const Error none = import_error("torchrun pretrain_gpt.py");
  CHECK(none.field == "megatron");
  REQUIRE_THAT(none.message, Catch::Contains("no Megatron-LM flags"));
}

TEST_CASE("A missing vocabulary size is an error unless the tokenizer is GPT-2 BPE", "[config]") {
  const std::string base = "--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 "
                           "--micro-batch-size 1 --global-batch-size 8 --bf16 ";
  const Error hf = import_error(base + "--tokenizer-type HuggingFaceTokenizer --tokenizer-model x");
  CHECK(hf.field == "megatron.--vocab-size");
  REQUIRE_THAT(hf.message, Catch::Contains("HuggingFaceTokenizer"));

  const Error bare = import_error(base);
  CHECK(bare.field == "megatron.--vocab-size");
  REQUIRE_THAT(bare.message, Catch::Contains("--vocab-size is required"));

  const MegatronLaunch gpt2 = import_ok(base + "--tokenizer-type GPT2BPETokenizer --vocab-file v --merge-file m");
  CHECK(gpt2.model.vocab_size == 50257);
  REQUIRE(gpt2.warnings.size() == 1);
  REQUIRE_THAT(gpt2.warnings[0], Catch::Contains("GPT2BPETokenizer"));

  const MegatronLaunch merges = import_ok(base + "--vocab-file v --merge-file m");
  CHECK(merges.model.vocab_size == 50257);
  REQUIRE_THAT(merges.warnings.at(0), Catch::Contains("--merge-file"));
}

TEST_CASE("Virtual pipeline flags give vpp and the interleaved schedule, with Megatron's divisibility rules",
          "[config]") {
  const std::string base = "--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 "
                           "--vocab-size 32000 --micro-batch-size 1 --global-batch-size 8 --bf16 ";
  const MegatronLaunch v = import_ok(base + "--pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 3");
  CHECK(v.plan.vpp == 3);
  CHECK(v.plan.schedule == Schedule::interleaved);

  const MegatronLaunch n = import_ok(base + "--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 6");
  CHECK_FALSE(n.plan.vpp.has_value());  // one chunk per rank: plain 1F1B
  CHECK(n.plan.schedule == Schedule::one_f_one_b);

  const Error pp = import_error(base + "--pipeline-model-parallel-size 5 --num-layers-per-virtual-pipeline-stage 1");
  CHECK(pp.field == "megatron.--num-layers-per-virtual-pipeline-stage");
  REQUIRE_THAT(pp.message, Catch::Contains("--num-layers (24) must be divisible by --pipeline-model-parallel-size (5)"));

  const Error chunk = import_error(base + "--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 4");
  CHECK(chunk.field == "megatron.--num-layers-per-virtual-pipeline-stage");
  REQUIRE_THAT(chunk.message, Catch::Contains("the 6 layers of a pipeline stage"));

  const Error both = import_error(base + "--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 2 "
                                         "--num-virtual-stages-per-pipeline-rank 3");
  CHECK(both.field == "megatron.--num-layers-per-virtual-pipeline-stage");
  REQUIRE_THAT(both.message, Catch::Contains("only one of"));
}

TEST_CASE("Expert parallelism without --num-experts is an error", "[config]") {
  const Error e = import_error(kSmall + "--expert-model-parallel-size 4");
  CHECK(e.field == "megatron.--num-experts");
  REQUIRE_THAT(e.message, Catch::Contains("--num-experts"));
}

TEST_CASE("The expert capacity factor and padding to capacity are read, and padding alone is an error", "[config]") {
  const MegatronLaunch l = import_ok(std::string(kDeepSeek) +
                                     " --moe-expert-capacity-factor 1.25 --moe-pad-expert-input-to-capacity "
                                     "--moe-shared-expert-overlap");
  CHECK(l.plan.moe_shared_expert_overlap);
  CHECK_FALSE(import_ok(kDeepSeek).plan.moe_shared_expert_overlap);
  // --overlap-moe-expert-parallel-comm is modelled (moe_ep_overlap), not noted as ignored.
  const MegatronLaunch o = import_ok(std::string(kDeepSeek) + " --overlap-moe-expert-parallel-comm");
  CHECK(o.plan.moe_ep_overlap);
  CHECK_FALSE(l.plan.moe_ep_overlap);
  for (const std::string& f : o.ignored) CHECK(f != "--overlap-moe-expert-parallel-comm");
  CHECK(l.plan.moe_dispatcher == MoeDispatcher::alltoall);   // the line names alltoall
  REQUIRE(l.model.moe.has_value());
  REQUIRE(l.model.moe->capacity_factor.has_value());
  CHECK(*l.model.moe->capacity_factor == 1.25);
  CHECK(l.model.moe->pad_to_capacity);
  CHECK(l.model.moe->load_imbalance == 1.0);
  CHECK_FALSE(import_ok(kDeepSeek).model.moe->capacity_factor.has_value());
  const Error pad = import_error(std::string(kDeepSeek) + " --moe-pad-expert-input-to-capacity");
  CHECK(pad.field == "megatron.--moe-pad-expert-input-to-capacity");
  REQUIRE_THAT(pad.message, Catch::Contains("--moe-expert-capacity-factor"));
}

TEST_CASE("The MoE token dispatcher is Megatron-LM's allgather unless the line names alltoall, flex runs DeepEP",
          "[config]") {
  std::string line = kDeepSeek;
  const std::string flag = "--moe-token-dispatcher-type alltoall ";
  REQUIRE(line.find(flag) != std::string::npos);
  const std::string without = std::string(line).erase(line.find(flag), flag.size());
  CHECK(import_ok(without).plan.moe_dispatcher == MoeDispatcher::allgather);
  std::string gather = line, flex = line;
  gather.replace(line.find(flag), flag.size(), "--moe-token-dispatcher-type allgather ");
  flex.replace(line.find(flag), flag.size(), "--moe-token-dispatcher-type flex ");
  CHECK(import_ok(gather).plan.moe_dispatcher == MoeDispatcher::allgather);
  // flex needs its backend named: DeepEP is modelled, HybridEP is not.
  const Error none = import_error(flex);
  CHECK(none.field == "megatron.--moe-token-dispatcher-type");
  REQUIRE_THAT(none.message, Catch::Contains("--moe-enable-deepep"));
  CHECK(import_ok(flex + " --moe-enable-deepep").plan.moe_dispatcher == MoeDispatcher::flex);
  CHECK(import_ok(flex + " --moe-flex-dispatcher-backend deepep").plan.moe_dispatcher == MoeDispatcher::flex);
  const Error hybrid = import_error(flex + " --moe-flex-dispatcher-backend hybridep");
  CHECK(hybrid.field == "megatron.--moe-flex-dispatcher-backend");
  REQUIRE_THAT(hybrid.message, Catch::Contains("not modelled"));
}

TEST_CASE("Group-limited routing is read from --moe-router-num-groups and --moe-router-group-topk", "[config]") {
  CHECK(import_ok(kDeepSeek).model.moe->num_groups == 0);
  const MegatronLaunch r = import_ok(std::string(kDeepSeek) + " --moe-router-num-groups 8 --moe-router-group-topk 4");
  CHECK(r.model.moe->num_groups == 8);
  CHECK(r.model.moe->group_topk == 4);
  // Megatron-LM routes over every expert with a group top-k of 0 or one group.
  CHECK(import_ok(std::string(kDeepSeek) + " --moe-router-num-groups 8 --moe-router-group-topk 0").model.moe->num_groups == 0);
  CHECK(import_ok(std::string(kDeepSeek) + " --moe-router-num-groups 1 --moe-router-group-topk 1").model.moe->num_groups == 0);
  const Error e = import_error(std::string(kDeepSeek) + " --moe-router-num-groups 7 --moe-router-group-topk 4");
  CHECK(e.field == "model.moe.num_groups");
}

TEST_CASE("All-to-all context parallelism is imported, and hierarchical CP and other unmodelled Megatron features are errors",
          "[config]") {
  CHECK(import_ok(kSmall + "--context-parallel-size 2 --cp-comm-type a2a").plan.cp_comm == CpCommType::a2a);
  const Error a2a = import_error(kSmall + "--context-parallel-size 2 --cp-comm-type a2a+p2p");
  CHECK(a2a.field == "megatron.--cp-comm-type");
  REQUIRE_THAT(a2a.message, Catch::Contains("not modelled"));
  REQUIRE_THAT(a2a.message, Catch::Contains("--hierarchical-context-parallel-sizes"));

  const Error hsdp = import_error(kSmall + "--use-megatron-fsdp --enable-full-sharding-in-hsdp");
  CHECK(hsdp.field == "megatron.--enable-full-sharding-in-hsdp");
  REQUIRE_THAT(hsdp.message, Catch::Contains("not modelled"));

  const Error rope = import_error(kSmall + "--position-embedding-type mrope");
  CHECK(rope.field == "megatron.--position-embedding-type");

  const Error opt = import_error(kSmall + "--optimizer sgd");
  CHECK(opt.field == "megatron.--optimizer");

  const Error both = import_error(kSmall + "--fp16");
  CHECK(both.field == "megatron.--fp16");
  REQUIRE_THAT(both.message, Catch::Contains("cannot both"));

  const Error norm = import_error(kSmall + "--normalization BatchNorm");
  CHECK(norm.field == "megatron.--normalization");
  REQUIRE_THAT(norm.message, Catch::Contains("LayerNorm, RMSNorm"));
}

TEST_CASE("Gradient dtype follows Megatron's rules for bf16 and fp16", "[config]") {
  CHECK(import_ok(kSmall).training.grad_dtype == Dtype::fp32);
  CHECK(import_ok(kSmall + "--grad-reduce-in-bf16").training.grad_dtype == Dtype::bf16);
  const std::string fp16 =
      "--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 --vocab-size 32000 "
      "--micro-batch-size 1 --global-batch-size 8 --fp16 ";
  CHECK(import_ok(fp16).training.grad_dtype == Dtype::fp16);
  CHECK(import_ok(fp16 + "--accumulate-allreduce-grads-in-fp32").training.grad_dtype == Dtype::fp32);
}

TEST_CASE("The precision-aware optimizer's state dtypes are read with it, and are errors without it or the distributed optimizer",
          "[config]") {
  const std::string line = kSmall + "--use-distributed-optimizer --use-precision-aware-optimizer ";
  const OptimizerPrecision plain = import_ok(kSmall).training.optimizer_precision;
  CHECK_FALSE(plain.enabled);
  const MegatronLaunch ds = import_ok(line + "--main-grads-dtype bf16 --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16");
  const OptimizerPrecision& op = ds.training.optimizer_precision;
  CHECK(op.enabled);
  CHECK(op.main_params == Dtype::fp32);
  CHECK(op.exp_avg == Dtype::bf16);
  CHECK(op.exp_avg_sq == Dtype::bf16);
  CHECK(op.store_param_remainders);
  CHECK(ds.training.grad_dtype == Dtype::bf16);
  const OptimizerPrecision low =
      import_ok(line + "--main-params-dtype fp16 --exp-avg-dtype fp8 --no-store-param-remainders").training.optimizer_precision;
  CHECK(low.main_params == Dtype::fp16);
  CHECK(low.exp_avg == Dtype::fp8);
  CHECK(low.exp_avg_sq == Dtype::fp32);
  CHECK_FALSE(low.store_param_remainders);
  // Megatron-LM's rules: state dtypes only with the precision-aware optimizer, and it only with the distributed one.
  for (const char* flags : {"--exp-avg-dtype bf16", "--exp-avg-sq-dtype fp16", "--main-params-dtype fp16", "--main-grads-dtype bf16"}) {
    INFO(flags);
    const Error e = import_error(kSmall + flags);
    CHECK(e.field == "megatron." + std::string(flags).substr(0, std::string(flags).find(' ')));
    CHECK_THAT(e.message, Catch::Contains("needs --use-precision-aware-optimizer"));
  }
  CHECK(import_error(kSmall + "--no-store-param-remainders").field == "megatron.--no-store-param-remainders");
  CHECK(import_error(line + "--main-grads-dtype bf16 --accumulate-allreduce-grads-in-fp32").field == "megatron.--main-grads-dtype");
  const std::string fp16 = "--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 --vocab-size 32000 "
                           "--micro-batch-size 1 --global-batch-size 8 --fp16 --use-distributed-optimizer --use-precision-aware-optimizer ";
  CHECK(import_error(fp16).field == "megatron.--use-precision-aware-optimizer");
  CHECK(import_ok(fp16 + "--accumulate-allreduce-grads-in-fp32").training.optimizer_precision.enabled);
  const Error nodist = import_error(kSmall + "--use-precision-aware-optimizer");
  CHECK(nodist.field == "megatron.--use-precision-aware-optimizer");
  CHECK_THAT(nodist.message, Catch::Contains("--use-distributed-optimizer"));
}

TEST_CASE("Recompute modules are read with selective granularity, an unknown one is an error", "[config]") {
  const std::string sel = kSmall + "--recompute-granularity selective ";
  CHECK_FALSE(import_ok(sel).plan.recompute.modules);
  CHECK_FALSE(import_ok(sel + "--recompute-modules core_attn").plan.recompute.modules);   // the default, left unset
  const MegatronLaunch l = import_ok(sel + "--recompute-modules layernorm core_attn");
  REQUIRE(l.plan.recompute.modules);
  CHECK(*l.plan.recompute.modules == (kRecomputeCoreAttn | kRecomputeLayernorm));
  // The checkpointed submodules: read as their bits (whether the model has
  // the layers they recompute is checked at validation).
  const MegatronLaunch mlp = import_ok(sel + "--recompute-modules core_attn mlp");
  REQUIRE(mlp.plan.recompute.modules);
  CHECK(*mlp.plan.recompute.modules == (kRecomputeCoreAttn | kRecomputeMlp));
  // Megatron-Core ignores mlp when every layer is MoE and shared_experts
  // without shared experts: dropped with a warning each, not an error.
  const MegatronLaunch moe = import_ok(sel + "--num-experts 8 --recompute-modules core_attn mlp shared_experts moe");
  REQUIRE(moe.plan.recompute.modules);
  CHECK(*moe.plan.recompute.modules == (kRecomputeCoreAttn | kRecomputeMoe));
  CHECK(moe.warnings.size() >= 2);
  const Error unknown = import_error(sel + "--recompute-modules attn");
  CHECK(unknown.field == "megatron.--recompute-modules");
  CHECK_THAT(unknown.message, Catch::Contains("'attn'"));
  CHECK_THAT(unknown.message, Catch::Contains("shared_experts"));
  // moe_act needs grouped GEMMs, as Megatron-Core raises (the import's moe_act
  // then fails on the dense model's missing experts, checked at validation).
  const Error grouped = import_error(sel + "--recompute-modules moe_act");
  CHECK(grouped.field == "megatron.--recompute-modules");
  CHECK_THAT(grouped.message, Catch::Contains("--moe-grouped-gemm"));
  // With full granularity Megatron-LM does not read them: listed as ignored.
  const MegatronLaunch full = import_ok(kSmall + "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 "
                                                 "--recompute-modules moe_act");
  CHECK_FALSE(full.plan.recompute.modules);
  CHECK(std::find(full.ignored.begin(), full.ignored.end(), "--recompute-modules") != full.ignored.end());
}

TEST_CASE("Attention backends map to the flash or unfused kernel", "[config]") {
  CHECK(import_ok(kSmall).plan.attention == AttentionKernel::flash);
  CHECK(import_ok(kSmall + "--use-flash-attn").plan.attention == AttentionKernel::flash);
  for (const char* b : {"flash", "fused", "auto"})
    CHECK(import_ok(kSmall + "--attention-backend " + b).plan.attention == AttentionKernel::flash);
  for (const char* b : {"unfused", "local"})
    CHECK(import_ok(kSmall + "--attention-backend " + b).plan.attention == AttentionKernel::unfused);
}

TEST_CASE("The old --checkpoint-activations flag imports as full recompute of one layer per group", "[config]") {
  const MegatronLaunch l = import_ok(kSmall + "--checkpoint-activations");
  CHECK(l.plan.recompute.granularity == RecomputeGranularity::full);
  CHECK(l.plan.recompute.method == RecomputeMethod::uniform);
  CHECK(l.plan.recompute.num_layers == 1);
}

TEST_CASE("MoE and MLA flags without --num-experts or --multi-latent-attention are listed as ignored", "[config]") {
  const MegatronLaunch l = import_ok(kSmall + "--moe-router-topk 4 --kv-lora-rank 512 --num-query-groups 4");
  CHECK_FALSE(l.model.moe.has_value());
  CHECK_FALSE(l.model.mla.has_value());
  CHECK(l.model.num_query_groups == 16);
  CHECK(contains(l.ignored, "--moe-router-topk"));
  CHECK(contains(l.ignored, "--kv-lora-rank"));
  CHECK(contains(l.ignored, "--num-query-groups"));
  REQUIRE(l.warnings.size() == 1);
  REQUIRE_THAT(l.warnings[0], Catch::Contains("--group-query-attention"));
}

TEST_CASE("A model Megatron accepts but validate_model rejects is an error naming the model field", "[config]") {
  const Error e = import_error(kSmall + "--group-query-attention --num-query-groups 5");
  CHECK(e.field == "model.num_query_groups");
}

TEST_CASE("Pipeline communication flags: off where the line says so, overlap only for the interleaved schedule",
          "[config]") {
  const std::string base = "--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 "
                           "--vocab-size 32000 --micro-batch-size 1 --global-batch-size 8 --bf16 "
                           "--pipeline-model-parallel-size 4 ";
  const std::string vpp = "--num-virtual-stages-per-pipeline-rank 3 ";
  CHECK_FALSE(import_ok(base + vpp).plan.overlap_p2p_comm.has_value());   // the schedule's default
  CHECK(import_ok(base + vpp + "--no-overlap-p2p-communication").plan.overlap_p2p_comm == false);
  CHECK(import_ok(base + vpp + "--overlap-p2p-communication").plan.overlap_p2p_comm == true);
  // Megatron-LM's 1f1b always waits: the flag changes nothing.
  CHECK_FALSE(import_ok(base + "--overlap-p2p-communication").plan.overlap_p2p_comm.has_value());
  CHECK(import_ok(base + "--no-overlap-p2p-communication").plan.overlap_p2p_comm == false);
  // Warm-up and flush overlapped: read by the interleaved schedule only.
  CHECK_FALSE(import_ok(base + vpp).plan.overlap_p2p_warmup_flush);
  CHECK(import_ok(base + vpp + "--overlap-p2p-communication-warmup-flush").plan.overlap_p2p_warmup_flush);
  CHECK_FALSE(import_ok(base + "--overlap-p2p-communication-warmup-flush").plan.overlap_p2p_warmup_flush);
}

TEST_CASE("A launch line runs Megatron-Core's pipeline transfers: no scatter-gather, whatever its flag says", "[config]") {
  CHECK_FALSE(import_ok(kSmall).plan.pp_scatter_gather);
  CHECK_FALSE(import_ok(kSmall + "--no-scatter-gather-tensors-in-pipeline").plan.pp_scatter_gather);
  // Megatron-LM never had the positive spelling: an unknown flag.
  const Error e = import_error(kSmall + "--scatter-gather-tensors-in-pipeline");
  REQUIRE_THAT(e.str(), Catch::Contains("--scatter-gather-tensors-in-pipeline"));
}

TEST_CASE("Sliding windows: --window-size W,0 and --window-attn-skip-freq N import, export and come back", "[config]") {
  const std::string base = kSmall;
  const MegatronLaunch l = import_ok(base + "--window-size '(128, 0)' --window-attn-skip-freq 2");
  CHECK(l.model.window_size == 128);
  CHECK(l.model.window_skip_freq == 2);
  CHECK(import_ok(base + "--window-size 256,0").model.window_size == 256);
  CHECK(import_ok(base + "--window-size 256,0").model.window_skip_freq == 0);
  CHECK(import_ok(base + "--window-size '(-1,0)'").model.window_size == 0);   // unbounded: no window
  CHECK(import_error(base + "--window-size 128,4").field == "megatron.--window-size");
  CHECK_THAT(import_error(base + "--window-size 128,4").message, Catch::Contains("right"));
  CHECK(import_error(base + "--window-size 128").field == "megatron.--window-size");
  CHECK(import_error(base + "--window-size 0,0").field == "megatron.--window-size");
  CHECK(import_error(base + "--window-size 128,0 --window-attn-skip-freq '[1,1,0]'").field ==
        "megatron.--window-attn-skip-freq");
}
