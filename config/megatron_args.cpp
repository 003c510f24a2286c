// Megatron-LM launch lines <-> ModelSpec + TrainingSpec + PlanSpec.
//
// Does: give the parsed flags their meaning (interpret), find where the
// Megatron-LM flags start in a launch line (import), and write a setup back
// as flags (export). Defaults mirror validate_args(): ffn 4h (SwiGLU:
// int(8h/3/64)*64), kv_channels h/a, one query group with GQA, dropout 0.1,
// vocab padded to a multiple of 128 x TP, top-k 2, every layer MoE.
// Does not: hold the flag tables (megatron_flags.cpp), nor tokenize, parse
// flags or read --moe-layer-freq (megatron_cmdline.cpp).
#include "config/megatron_args.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "config/megatron_cmdline.hpp"
#include "core/pipeline_layout.hpp"
#include "config/megatron_flags.hpp"
#include "config/megatron_sharding.hpp"
#include "config/megatron_varlen.hpp"

namespace megascope {

using megatron_detail::Args;
using megatron_detail::Arity;
using megatron_detail::ends_with;
using megatron_detail::field_of;
using megatron_detail::flag_table;
using megatron_detail::is_flag;
using megatron_detail::moe_layer_freq_text;
using megatron_detail::moe_layer_pattern;
using megatron_detail::parse_flags;
using megatron_detail::Reader;
using megatron_detail::tokenize;

namespace {

// ---------------------------------------------------------------------------
// Flags -> specs.

Result<MegatronLaunch> interpret(Args& args) {
  MegatronLaunch out;
  Reader rd(args);

  // Every numeric value first, so that a bad one is reported before anything
  // that depends on it.
  auto num_layers = rd.count("--num-layers");
  if (!args.has("--num-layers")) num_layers = rd.count("--encoder-num-layers");
  const auto hidden = rd.integer("--hidden-size");
  const auto ffn = rd.integer("--ffn-hidden-size");
  const auto heads = rd.count("--num-attention-heads");
  const auto groups = rd.count("--num-query-groups");
  const auto kv_channels = rd.integer("--kv-channels");
  auto seq = rd.integer("--seq-length");
  if (!args.has("--seq-length")) seq = rd.integer("--encoder-seq-length");
  const auto max_pos = rd.integer("--max-position-embeddings");
  const auto vocab = rd.integer("--vocab-size");
  const auto divisor = rd.count("--make-vocab-size-divisible-by");
  const auto hidden_dropout = rd.real("--hidden-dropout");
  const auto attention_dropout = rd.real("--attention-dropout");
  const auto mtp = rd.count("--mtp-num-layers", 0);
  const auto experts = rd.count("--num-experts", 0);
  const auto topk = rd.count("--moe-router-topk");
  const auto moe_ffn = rd.integer("--moe-ffn-hidden-size");
  const auto shared_ffn = rd.integer("--moe-shared-expert-intermediate-size");
  const auto capacity = rd.real("--moe-expert-capacity-factor");
  const auto router_groups = rd.count("--moe-router-num-groups", 0);
  const auto router_group_topk = rd.count("--moe-router-group-topk", 0);
  const auto q_lora = rd.integer("--q-lora-rank");
  const auto kv_lora = rd.integer("--kv-lora-rank");
  const auto qk_head = rd.integer("--qk-head-dim");
  const auto qk_rope = rd.integer("--qk-pos-emb-head-dim");
  const auto v_head = rd.integer("--v-head-dim");
  const auto mbs = rd.count("--micro-batch-size");
  const auto gbs = rd.integer("--global-batch-size");
  const auto tp = rd.count("--tensor-model-parallel-size");
  const auto pp = rd.count("--pipeline-model-parallel-size");
  const auto layers_per_vstage = rd.count("--num-layers-per-virtual-pipeline-stage");
  const auto vstages = rd.count("--num-virtual-stages-per-pipeline-rank");
  const auto first_layers = rd.count("--decoder-first-pipeline-num-layers");
  const auto last_layers = rd.count("--decoder-last-pipeline-num-layers");
  const auto microbatch_group = rd.count("--microbatch-group-size-per-virtual-pipeline-stage");
  const auto cp = rd.count("--context-parallel-size");
  const auto ep = rd.count("--expert-model-parallel-size");
  const auto etp = rd.count("--expert-tensor-parallel-size");
  auto recompute_layers = rd.count("--recompute-num-layers");
  if (!recompute_layers) recompute_layers = rd.count("--activations-checkpoint-num-layers");
  if (!recompute_layers) recompute_layers = rd.count("--checkpoint-num-layers");
  const auto optimizer_instances = rd.count("--num-distributed-optimizer-instances");
  const auto offload_layers = rd.count("--cpu-offloading-num-layers", 0);

  const auto normalization = rd.choice("--normalization", {"LayerNorm", "RMSNorm"});
  const auto position = rd.choice("--position-embedding-type", {"learned_absolute", "rope", "none", "mrope", "relative"});
  const auto fp8 = rd.choice("--fp8-format", {"e4m3", "hybrid"});
  const auto fp8_recipe = rd.choice("--fp8-recipe", {"delayed", "tensorwise", "blockwise", "mxfp8"});
  const auto granularity = rd.choice("--recompute-granularity", {"full", "selective"});
  auto method = rd.choice("--recompute-method", {"uniform", "block"});
  if (!method) method = rd.choice("--activations-checkpoint-method", {"uniform", "block"});
  const auto backend = rd.choice("--attention-backend", {"flash", "fused", "unfused", "local", "auto"});
  const auto dispatcher = rd.choice("--moe-token-dispatcher-type", {"allgather", "alltoall", "alltoall_seq", "flex"});
  const auto flex_backend = rd.choice("--moe-flex-dispatcher-backend", {"deepep", "hybridep"});
  const auto optimizer = rd.choice("--optimizer", {"adam", "sgd", "muon", "dist_muon"});
  const auto main_grads = rd.choice("--main-grads-dtype", {"fp32", "bf16"});
  const auto main_params = rd.choice("--main-params-dtype", {"fp32", "fp16"});
  const auto exp_avg = rd.choice("--exp-avg-dtype", {"fp32", "fp16", "bf16", "fp8"});
  const auto exp_avg_sq = rd.choice("--exp-avg-sq-dtype", {"fp32", "fp16", "bf16", "fp8"});
  const auto sharding = rd.choice("--data-parallel-sharding-strategy", {"no_shard", "optim", "optim_grads", "optim_grads_params"});
  if (rd.error) return tl::unexpected(*rd.error);

  // Required flags.
  auto required = [&](bool present, std::string_view flag, std::string_view what) -> Result<void> {
    if (present) return {};
    return fail(field_of(flag), fmt::format("{} is required ({})", flag, what));
  };
  if (auto r = required(num_layers.has_value(), "--num-layers", "transformer layers"); !r) return tl::unexpected(r.error());
  if (auto r = required(hidden.has_value(), "--hidden-size", "hidden size"); !r) return tl::unexpected(r.error());
  if (auto r = required(heads.has_value(), "--num-attention-heads", "attention heads"); !r) return tl::unexpected(r.error());
  if (auto r = required(seq.has_value(), "--seq-length", "tokens per sequence"); !r) return tl::unexpected(r.error());
  if (auto r = required(mbs.has_value(), "--micro-batch-size", "sequences per micro-batch"); !r)
    return tl::unexpected(r.error());
  if (!gbs)
    return fail("megatron.--global-batch-size",
                "--global-batch-size is required: without it Megatron-LM uses micro-batch-size x data-parallel "
                "size, which depends on the device count");

  // Flags Megascope models only at their default.
  if (optimizer && *optimizer != "adam")
    return fail("megatron.--optimizer", fmt::format("--optimizer {} is not modelled; only adam is", *optimizer));
  if (optimizer) args.note_ignored("--optimizer");
  // Optimizer state dtypes: Megatron-LM takes them only with the precision-aware optimizer.
  const bool precision_aware = args.has("--use-precision-aware-optimizer");
  auto needs_precision_aware = [&](std::string_view flag, const std::optional<std::string>& v) -> Result<void> {
    if (v && *v != "fp32" && !precision_aware)
      return fail(field_of(flag), fmt::format("{} {} needs --use-precision-aware-optimizer (Megatron-LM keeps this state in "
                                              "fp32 without it)",
                                              flag, *v));
    return {};
  };
  for (const auto& [flag, v] : {std::pair{"--main-grads-dtype", &main_grads}, std::pair{"--main-params-dtype", &main_params},
                                std::pair{"--exp-avg-dtype", &exp_avg}, std::pair{"--exp-avg-sq-dtype", &exp_avg_sq}})
    if (auto r = needs_precision_aware(flag, *v); !r) return tl::unexpected(r.error());
  const bool megatron_fsdp = args.has("--use-megatron-fsdp");
  if (precision_aware && !args.has("--use-distributed-optimizer") && !megatron_fsdp)
    return fail("megatron.--use-precision-aware-optimizer",
                "--use-precision-aware-optimizer needs --use-distributed-optimizer (Megatron-LM asserts it)");
  if (args.has("--no-store-param-remainders") && !precision_aware)
    return fail("megatron.--no-store-param-remainders", "--no-store-param-remainders needs --use-precision-aware-optimizer");
  if (optimizer_instances && *optimizer_instances > 1 && !args.has("--use-distributed-optimizer") &&
      !args.has("--use-megatron-fsdp"))
    return fail("megatron.--num-distributed-optimizer-instances",
                "--num-distributed-optimizer-instances needs --use-distributed-optimizer (or --use-megatron-fsdp)");
  if (offload_layers && *offload_layers != 0)
    return fail("megatron.--cpu-offloading-num-layers", "activation CPU offloading is not modelled");
  if (position && (*position == "mrope" || *position == "relative"))
    return fail("megatron.--position-embedding-type",
                fmt::format("--position-embedding-type {} is not modelled; use learned_absolute, rope or none",
                            *position));
  if (args.has("--num-layers-per-virtual-pipeline-stage") && args.has("--num-virtual-stages-per-pipeline-rank"))
    return fail("megatron.--num-layers-per-virtual-pipeline-stage",
                "give only one of --num-layers-per-virtual-pipeline-stage and "
                "--num-virtual-stages-per-pipeline-rank");
  if (max_pos && *max_pos < *seq)
    return fail("megatron.--max-position-embeddings",
                fmt::format("--max-position-embeddings ({}) must be >= --seq-length ({})", *max_pos, *seq));

  // ---- model
  ModelSpec m;
  m.name = "megatron-lm";
  m.num_layers = *num_layers;
  m.hidden_size = *hidden;
  m.num_attention_heads = *heads;
  const bool swiglu = args.has("--swiglu");
  if (swiglu && args.has("--squared-relu"))
    return fail(field_of("--squared-relu"), "--swiglu and --squared-relu both set the MLP's activation; give one");
  m.activation = swiglu ? Activation::swiglu : args.has("--squared-relu") ? Activation::squared_relu : Activation::gelu;
  // Megatron: int((4 * h * 2 / 3) / 64) * 64 for SwiGLU, else 4h.
  m.ffn_hidden_size = ffn ? *ffn : (swiglu ? (8 * m.hidden_size) / 192 * 64 : 4 * m.hidden_size);
  if (kv_channels) {
    m.kv_channels = *kv_channels;
  } else {
    if (m.hidden_size % m.num_attention_heads != 0)
      return fail("megatron.--kv-channels",
                  fmt::format("--hidden-size ({}) is not a multiple of --num-attention-heads ({}); give --kv-channels",
                              m.hidden_size, m.num_attention_heads));
    m.kv_channels = m.hidden_size / m.num_attention_heads;
  }
  if (args.has("--group-query-attention")) {
    m.num_query_groups = groups.value_or(1);
  } else {
    m.num_query_groups = m.num_attention_heads;
    if (groups) {
      out.warnings.push_back("--num-query-groups has no effect without --group-query-attention (Megatron-LM "
                             "ignores it); the model uses one KV head per attention head");
      args.note_ignored("--num-query-groups");
    }
  }
  m.norm = (normalization && *normalization == "RMSNorm") ? Norm::rmsnorm : Norm::layernorm;
  m.position_embedding = PositionEmbedding::learned;
  if (position && *position == "rope") m.position_embedding = PositionEmbedding::rope;
  if (position && *position == "none") m.position_embedding = PositionEmbedding::none;
  if (args.has("--use-rotary-position-embeddings")) m.position_embedding = PositionEmbedding::rope;
  if (args.has("--no-position-embedding") && m.position_embedding != PositionEmbedding::rope)
    m.position_embedding = PositionEmbedding::none;
  m.tied_embeddings = !args.has("--untie-embeddings-and-output-weights");
  m.add_bias_linear = !args.has("--disable-bias-linear");
  m.add_qkv_bias = args.has("--add-qkv-bias");
  m.qk_layernorm = args.has("--qk-layernorm");
  m.hidden_dropout = hidden_dropout.value_or(0.1);
  m.attention_dropout = attention_dropout.value_or(0.1);
  m.mtp_num_layers = mtp.value_or(0);
  // Sliding windows: --window-size "(W, 0)" (Megatron-LM's tuple_type; -1 an
  // unbounded side) and --window-attn-skip-freq N (every N-th layer full).
  if (const std::string* text = args.value("--window-size")) {
    std::string t;
    for (char c : *text)
      if (c != '(' && c != ')' && c != ' ') t += c;
    const auto comma = t.find(',');
    long long left = 0, right = 0;
    try {
      std::size_t used = 0;
      if (comma == std::string::npos) throw std::invalid_argument("no comma");
      left = std::stoll(t.substr(0, comma), &used);
      if (used != comma) throw std::invalid_argument("left");
      right = std::stoll(t.substr(comma + 1), &used);
      if (used != t.size() - comma - 1) throw std::invalid_argument("right");
    } catch (const std::exception&) {
      return fail("megatron.--window-size", fmt::format("expected two integers \"W,0\" (left and right of each "
                                                        "query), found \"{}\"", *text));
    }
    if (right != 0)
      return fail("megatron.--window-size", fmt::format("a window reaching {} keys right of the query is not modelled "
                                                        "(causal attention: the right side is 0)", right));
    if (left == 0 || left < -1)
      return fail("megatron.--window-size", fmt::format("the left side must be a key count >= 1, or -1 for no bound; "
                                                        "found {}", left));
    if (left > 0) m.window_size = left;
  }
  if (const std::string* text = args.value("--window-attn-skip-freq")) {
    std::size_t used = 0;
    long long n = 0;
    try {
      n = std::stoll(*text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != text->size() || n < 1 || n > 1'000'000)
      return fail("megatron.--window-attn-skip-freq",
                  fmt::format("expected an integer N >= 1 (every N-th layer attends to the whole sequence); a list "
                              "pattern is not modelled; found \"{}\"", *text));
    if (m.window_size > 0) m.window_skip_freq = static_cast<int>(n);
  }
  m.make_vocab_size_divisible_by = divisor.value_or(128);
  m.seq_length = max_pos.value_or(*seq);

  if (vocab) {
    m.vocab_size = *vocab;
  } else {
    const std::string* tokenizer = args.value("--tokenizer-type");
    const bool gpt2 = (tokenizer && *tokenizer == "GPT2BPETokenizer") || (!tokenizer && args.has("--merge-file"));
    if (!gpt2)
      return fail("megatron.--vocab-size",
                  tokenizer ? fmt::format("--vocab-size is required: the vocabulary size of --tokenizer-type {} is "
                                          "not known without reading its files",
                                          *tokenizer)
                            : std::string("--vocab-size is required (the vocabulary size before padding)"));
    m.vocab_size = 50257;
    out.warnings.push_back(tokenizer ? "no --vocab-size: using 50257, the size of the GPT-2 BPE vocabulary "
                                       "(--tokenizer-type GPT2BPETokenizer)"
                                     : "no --vocab-size or --tokenizer-type: --merge-file implies the GPT-2 BPE "
                                       "tokenizer, so using its 50257 tokens");
  }

  static constexpr std::string_view kMoeFlags[] = {"--moe-router-topk", "--moe-ffn-hidden-size",
                                                   "--moe-shared-expert-intermediate-size", "--moe-layer-freq",
                                                   "--moe-expert-capacity-factor",
                                                   "--moe-pad-expert-input-to-capacity",
                                                   "--moe-shared-expert-overlap", "--moe-token-dispatcher-type",
                                                   "--moe-router-num-groups", "--moe-router-group-topk",
                                                   "--moe-enable-deepep", "--moe-flex-dispatcher-backend",
                                                   "--overlap-moe-expert-parallel-comm"};
  if (experts && *experts > 0) {
    MoeSpec e;
    e.num_experts = *experts;
    e.top_k = topk.value_or(2);
    e.expert_ffn_hidden = moe_ffn.value_or(m.ffn_hidden_size);
    e.shared_expert_ffn_hidden = shared_ffn.value_or(0);
    e.capacity_factor = capacity;
    e.pad_to_capacity = args.has("--moe-pad-expert-input-to-capacity");
    // Group-limited routing: Megatron-LM leaves it off unless both are set
    // (a group top-k of 0, or one group, routes over every expert).
    if (router_groups && router_group_topk && *router_groups > 1 && *router_group_topk > 0) {
      e.num_groups = *router_groups;
      e.group_topk = *router_group_topk;
    }
    if (e.pad_to_capacity && !capacity)
      return fail("megatron.--moe-pad-expert-input-to-capacity",
                  "--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor");
    auto layers = moe_layer_pattern(args.value("--moe-layer-freq"), m.num_layers);
    if (!layers) return tl::unexpected(layers.error());
    e.moe_layers = std::move(*layers);
    m.moe = std::move(e);
  } else {
    for (std::string_view f : kMoeFlags)
      if (args.has(f)) args.note_ignored(f);
  }

  static constexpr std::string_view kMlaFlags[] = {"--q-lora-rank", "--kv-lora-rank", "--qk-head-dim",
                                                   "--qk-pos-emb-head-dim", "--v-head-dim"};
  if (args.has("--multi-latent-attention")) {
    MlaSpec a;  // Megatron's defaults: kv_lora_rank 32, qk 128, rope 64, v 128
    a.q_lora_rank = q_lora;
    a.kv_lora_rank = kv_lora.value_or(32);
    a.qk_head_dim = qk_head.value_or(128);
    a.qk_rope_head_dim = qk_rope.value_or(64);
    a.v_head_dim = v_head.value_or(128);
    m.mla = a;
  } else {
    for (std::string_view f : kMlaFlags)
      if (args.has(f)) args.note_ignored(f);
  }

  auto model = validate_model(m);
  if (!model) return tl::unexpected(model.error());
  out.model = std::move(*model);

  // ---- training
  TrainingSpec t;
  t.global_batch_size = *gbs;
  t.seq_length = *seq;
  const bool bf16 = args.has("--bf16");
  const bool fp16 = args.has("--fp16");
  if (bf16 && fp16) return fail("megatron.--fp16", "--fp16 and --bf16 cannot both be given");
  t.params_dtype = bf16 ? Dtype::bf16 : fp16 ? Dtype::fp16 : Dtype::fp32;
  if (!bf16 && !fp16)
    out.warnings.push_back("neither --bf16 nor --fp16: Megatron-LM keeps the weights in fp32 (params_dtype fp32)");
  t.precision = fp8 ? Precision::fp8 : Precision::bf16;
  // Megatron-LM reads --fp8-recipe only with --fp8-format.
  if (fp8 && fp8_recipe) t.fp8_recipe = *parse_fp8_recipe(*fp8_recipe);
  // Megatron's gradient buffer: fp32 when accumulate_allreduce_grads_in_fp32
  // is set (forced on for bf16 unless --grad-reduce-in-bf16), else the
  // parameter dtype.
  if (bf16) {
    const bool bf16_grads = args.has("--grad-reduce-in-bf16") || (main_grads && *main_grads == "bf16");
    t.grad_dtype = bf16_grads ? Dtype::bf16 : Dtype::fp32;
  } else if (fp16) {
    t.grad_dtype = args.has("--accumulate-allreduce-grads-in-fp32") ? Dtype::fp32 : Dtype::fp16;
  } else {
    t.grad_dtype = Dtype::fp32;
  }
  if (main_grads && *main_grads == "bf16" && args.has("--accumulate-allreduce-grads-in-fp32"))
    return fail("megatron.--main-grads-dtype",
                "--main-grads-dtype bf16 contradicts --accumulate-allreduce-grads-in-fp32 (Megatron-LM asserts fp32 then)");
  if (precision_aware && t.grad_dtype == Dtype::fp16)
    return fail("megatron.--use-precision-aware-optimizer",
                "--use-precision-aware-optimizer with --fp16 gradients is not modelled (it reads fp32 or bf16 main "
                "gradients; add --accumulate-allreduce-grads-in-fp32)");
  if (precision_aware) {
    // The flags' choices (read above) are dtype names.
    const auto dtype = [](const std::optional<std::string>& v) { return v ? *parse_dtype_name(*v) : Dtype::fp32; };
    OptimizerPrecision& op = t.optimizer_precision;
    op.enabled = true;
    op.main_params = dtype(main_params);
    op.exp_avg = dtype(exp_avg);
    op.exp_avg_sq = dtype(exp_avg_sq);
    op.store_param_remainders = !args.has("--no-store-param-remainders");
  }
  auto training = validate_training(t);
  if (!training) return tl::unexpected(training.error());
  out.training = std::move(*training);

  // ---- plan
  PlanSpec p;
  p.tp = tp.value_or(1);
  p.pp = pp.value_or(1);
  p.cp = cp.value_or(1);
  p.ep = ep.value_or(1);
  p.etp = etp;
  p.micro_batch_size = *mbs;
  p.first_stage_layers = first_layers;
  p.last_stage_layers = last_layers;
  if (p.ep > 1 && !out.model.moe)
    return fail("megatron.--num-experts",
                fmt::format("--expert-model-parallel-size {} needs an MoE model: give --num-experts", p.ep));

  p.embedding_in_split = args.has("--account-for-embedding-in-pipeline-split");
  p.loss_in_split = args.has("--account-for-loss-in-pipeline-split");
  const long long counted_layers =
      static_cast<long long>(m.num_layers) + (p.embedding_in_split ? 1 : 0) + (p.loss_in_split ? 1 : 0);
  int vpp = 1;
  if (const std::string* layout = args.value("--pipeline-model-parallel-layout")) {
    // Megatron-LM: the layout gives the virtual stages itself, and the
    // first/last-stage and embedding/loss split flags do not apply with it.
    for (const char* other : {"--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
                              "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
                              "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"})
      if (args.has(other))
        return fail("megatron.--pipeline-model-parallel-layout",
                    fmt::format("give either --pipeline-model-parallel-layout or {}, not both", other));
    auto stages = parse_pipeline_layout(*layout, "megatron.--pipeline-model-parallel-layout");
    if (!stages) return tl::unexpected(stages.error());
    if (stages->size() % static_cast<std::size_t>(p.pp) != 0)
      return fail("megatron.--pipeline-model-parallel-layout",
                  fmt::format("the layout has {} stages, which must be a multiple of --pipeline-model-parallel-size "
                              "({})", stages->size(), p.pp));
    p.layout = *layout;
    vpp = static_cast<int>(stages->size()) / p.pp;
  } else if (layers_per_vstage) {
    if (first_layers || last_layers)
      return fail("megatron.--num-layers-per-virtual-pipeline-stage",
                  "with --decoder-first/last-pipeline-num-layers, give the virtual stages with "
                  "--num-virtual-stages-per-pipeline-rank");
    if (counted_layers % p.pp != 0)
      return fail("megatron.--num-layers-per-virtual-pipeline-stage",
                  fmt::format("--num-layers ({}{}) must be divisible by --pipeline-model-parallel-size ({}) to use "
                              "--num-layers-per-virtual-pipeline-stage",
                              m.num_layers, counted_layers != m.num_layers ? " with the embedding and loss counted" : "",
                              p.pp));
    const int per_stage = static_cast<int>(counted_layers / p.pp);
    if (per_stage % *layers_per_vstage != 0)
      return fail("megatron.--num-layers-per-virtual-pipeline-stage",
                  fmt::format("the {} layers of a pipeline stage must be divisible by "
                              "--num-layers-per-virtual-pipeline-stage ({})",
                              per_stage, *layers_per_vstage));
    vpp = per_stage / *layers_per_vstage;
  } else if (vstages) {
    vpp = *vstages;
  }
  if (vpp > 1) {  // Megatron treats one virtual stage as no interleaving
    p.vpp = vpp;
    p.schedule = Schedule::interleaved;
    p.microbatch_group = microbatch_group;
  } else {
    if (microbatch_group) args.note_ignored("--microbatch-group-size-per-virtual-pipeline-stage");
    p.schedule = Schedule::one_f_one_b;
  }

  if (const std::string* c = args.value("--cp-comm-type")) {
    const auto& all = args.values.at("--cp-comm-type");
    if (std::any_of(all.begin(), all.end(), [&](const std::string& x) { return x != *c; }))
      return fail("megatron.--cp-comm-type", "per-layer CP communication types are not modelled; give one type");
    if (*c == "p2p") p.cp_comm = CpCommType::p2p;
    else if (*c == "all_gather" || *c == "allgather") p.cp_comm = CpCommType::all_gather;
    else if (*c == "a2a") p.cp_comm = CpCommType::a2a;
    else if (*c == "a2a+p2p")
      return fail("megatron.--cp-comm-type", "--cp-comm-type a2a+p2p (hierarchical context parallelism, "
                                             "--hierarchical-context-parallel-sizes) is not modelled; use p2p, "
                                             "all_gather or a2a");
    else
      return fail("megatron.--cp-comm-type",
                  fmt::format("--cp-comm-type must be one of p2p, all_gather, a2a, a2a+p2p, found '{}'", *c));
  }

  p.sequence_parallel = args.has("--sequence-parallel");
  p.distributed_optimizer = args.has("--use-distributed-optimizer");
  p.overlap_grad_reduce = args.has("--overlap-grad-reduce");
  p.overlap_param_gather = args.has("--overlap-param-gather");
  p.fp8_param_gather = args.has("--fp8-param-gather");
  if (auto ok = megatron_detail::import_sharding(args, out.model, sharding, p); !ok) return tl::unexpected(ok.error());
  // Hybrid sharding: each instance shards over its share of DP x CP.
  p.dp_replicas = static_cast<int>(optimizer_instances.value_or(1));
  p.tp_comm_overlap = args.has("--tp-comm-overlap");
  p.tp_grad_overlap = !args.has("--no-async-tensor-model-parallel-allreduce");
  p.grad_accum_fusion = !args.has("--no-gradient-accumulation-fusion");
  p.moe_shared_expert_overlap = out.model.moe && args.has("--moe-shared-expert-overlap");
  p.moe_ep_overlap = out.model.moe && args.has("--overlap-moe-expert-parallel-comm");
  // Megatron-LM's token dispatcher: allgather unless the line says otherwise.
  if (out.model.moe) {
    // flex runs DeepEP (--moe-enable-deepep, or --moe-flex-dispatcher-backend
    // deepep); its HybridEP backend is not modelled.
    if (dispatcher && *dispatcher == "flex") {
      if (flex_backend && *flex_backend == "hybridep")
        return fail("megatron.--moe-flex-dispatcher-backend",
                    "the flex dispatcher's HybridEP backend is not modelled; DeepEP (deepep) is");
      if (!flex_backend && !args.has("--moe-enable-deepep"))
        return fail("megatron.--moe-token-dispatcher-type",
                    "--moe-token-dispatcher-type flex needs a backend: --moe-enable-deepep (or "
                    "--moe-flex-dispatcher-backend deepep)");
      p.moe_dispatcher = MoeDispatcher::flex;
    } else {
      p.moe_dispatcher = dispatcher && (*dispatcher == "alltoall" || *dispatcher == "alltoall_seq")
                             ? MoeDispatcher::alltoall
                             : MoeDispatcher::allgather;
    }
  }
  // Megatron-LM overlaps pipeline communication only in the interleaved
  // schedule; its 1f1b always waits. The overlap was opt-in when it came
  // (--overlap-p2p-communication, 2023) and is on by default today
  // (--no-overlap-p2p-communication turns it off). A line with neither
  // keeps the schedule's default: today's.
  if (args.has("--no-overlap-p2p-communication")) p.overlap_p2p_comm = false;
  else if (args.has("--overlap-p2p-communication") && p.schedule == Schedule::interleaved) p.overlap_p2p_comm = true;
  // Read by the interleaved schedule only; Megatron-Core's 1f1b never looks at it.
  if (args.has("--overlap-p2p-communication-warmup-flush") && p.schedule == Schedule::interleaved)
    p.overlap_p2p_warmup_flush = true;
  // pp_scatter_gather stays off: a launch line runs on Megatron-Core, which
  // sends whole tensors whatever --no-scatter-gather-tensors-in-pipeline says.

  if (granularity == "full") p.recompute.granularity = RecomputeGranularity::full;
  if (granularity == "selective") p.recompute.granularity = RecomputeGranularity::selective;
  if (args.has("--checkpoint-activations") && !granularity) {
    // Pre-2023 Megatron: full recompute of groups of --checkpoint-num-layers (1).
    p.recompute.granularity = RecomputeGranularity::full;
    if (!method) p.recompute.method = RecomputeMethod::uniform;
    if (!recompute_layers) p.recompute.num_layers = 1;
    out.warnings.push_back("--checkpoint-activations is the old spelling of --recompute-granularity full");
  }
  if (args.has("--recompute-activations")) p.recompute.granularity = RecomputeGranularity::selective;
  if (method) p.recompute.method = *method == "block" ? RecomputeMethod::block : RecomputeMethod::uniform;
  if (recompute_layers) p.recompute.num_layers = recompute_layers;
  if (args.has("--recompute-modules") && p.recompute.granularity != RecomputeGranularity::selective) {
    args.note_ignored("--recompute-modules");   // Megatron-LM reads them with selective granularity only
  } else if (args.has("--recompute-modules")) {
    unsigned modules = 0;
    for (const std::string& name : args.values.at("--recompute-modules")) {
      const auto bit = parse_recompute_modules(name);
      if (!bit)
        return fail("megatron.--recompute-modules",
                    fmt::format("'{}' is not a module this import reads ({})", name, recompute_module_names()));
      modules |= *bit;
    }
    if ((modules & kRecomputeMoeAct) && !args.has("--moe-grouped-gemm"))
      return fail("megatron.--recompute-modules",
                  "moe_act needs --moe-grouped-gemm (Megatron-Core raises without it)");
    // Megatron-Core accepts, and ignores, mlp without dense layers and
    // shared_experts without shared experts: dropped with a warning.
    const ModelSpec& mm = out.model;
    if ((modules & kRecomputeMlp) && mm.num_moe_layers() == mm.num_layers) {
      modules &= ~kRecomputeMlp;
      out.warnings.push_back("--recompute-modules mlp has no effect: every layer is a MoE layer (moe recomputes those)");
    }
    if ((modules & kRecomputeSharedExperts) && !(mm.moe && mm.moe->shared_expert_ffn_hidden > 0)) {
      modules &= ~kRecomputeSharedExperts;
      out.warnings.push_back("--recompute-modules shared_experts has no effect: the model has no shared experts");
    }
    if (modules == 0) modules = kRecomputeCoreAttn;
    if (modules != kRecomputeCoreAttn) p.recompute.modules = modules;
  }

  if (args.has("--use-flash-attn")) p.attention = AttentionKernel::flash;
  if (backend) p.attention = (*backend == "unfused" || *backend == "local") ? AttentionKernel::unfused
                                                                           : AttentionKernel::flash;
  if (auto ok = megatron_detail::import_varlen(args, *seq, out.training, p); !ok) return tl::unexpected(ok.error());
  out.plan = p;
  out.ignored = args.ignored;
  return out;
}

}  // namespace

Result<MegatronLaunch> import_megatron_args(std::string_view command_line) {
  auto tokens = tokenize(command_line);
  if (!tokens) return tl::unexpected(tokens.error());
  // Skip the launcher: everything up to the training script (a token ending
  // in .py), or, without one, every token before the first --flag.
  std::size_t start = 0;
  // A .py token that is the value of a Megatron flag (--tokenizer-model x.py)
  // is not the script.
  const auto& table = flag_table();
  auto is_script = [&](std::size_t k) {
    const std::string& tok = (*tokens)[k];
    if (!ends_with(tok, ".py") || is_flag(tok)) return false;
    if (k == 0) return true;
    const auto it = table.find((*tokens)[k - 1]);
    return it == table.end() || it->second.arity == Arity::none;
  };
  std::size_t script = 0;
  while (script < tokens->size() && !is_script(script)) ++script;
  if (script < tokens->size()) {
    start = script + 1;
  } else {
    while (start < tokens->size() && !is_flag((*tokens)[start])) ++start;
  }
  if (start >= tokens->size()) return fail("megatron", "no Megatron-LM flags found in the command line");
  auto args = parse_flags(*tokens, start);
  if (!args) return tl::unexpected(args.error());
  return interpret(*args);
}

namespace {

// A value as one shell word: single-quoted unless it is plain.
std::string shell_quote(std::string_view v) {
  const bool plain = !v.empty() && std::all_of(v.begin(), v.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
           c == '.' || c == '/' || c == ':' || c == '=' || c == '+';
  });
  if (plain) return std::string(v);
  std::string out = "'";
  for (char c : v) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

Result<std::string> export_megatron_args(const Setup& setup) {
  const ModelSpec& m = setup.model;
  const TrainingSpec& t = setup.training;
  const PlanSpec& p = setup.plan;

  if (p.schedule == Schedule::one_f_one_b && p.pp > 1 && setup.overlap_p2p_comm)
    return fail("plan.overlap_p2p_comm", "Megatron-LM's 1f1b schedule always waits for its pipeline transfers; it "
                                         "has no flag for overlap_p2p_comm=on (only the interleaved schedule overlaps)");
  switch (p.schedule) {
    case Schedule::one_f_one_b:
    case Schedule::interleaved:
      break;
    default:
      return fail("plan.schedule",
                  fmt::format("Megatron-LM has no flag for the {} schedule; it runs 1f1b, or interleaved 1f1b "
                              "with --num-virtual-stages-per-pipeline-rank",
                              to_string(p.schedule)));
  }

  if (p.post_validation)
    return fail("plan.post_validation", "Megatron-LM has no optimizer post-validation; its optimizer step "
                                        "synchronises every stage");
  std::vector<std::string> a;
  auto sw = [&a](std::string_view flag) { a.emplace_back(flag); };
  auto kv = [&a](std::string_view flag, const auto& value) { a.push_back(fmt::format("{} {}", flag, value)); };

  // ---- model
  kv("--num-layers", m.num_layers);
  kv("--hidden-size", m.hidden_size);
  kv("--ffn-hidden-size", m.ffn_hidden_size);
  kv("--num-attention-heads", m.num_attention_heads);
  if (m.num_query_groups != m.num_attention_heads) {
    sw("--group-query-attention");
    kv("--num-query-groups", m.num_query_groups);
  }
  if (m.hidden_size % m.num_attention_heads != 0 || m.kv_channels != m.hidden_size / m.num_attention_heads)
    kv("--kv-channels", m.kv_channels);
  if (m.activation == Activation::swiglu) sw("--swiglu");
  if (m.activation == Activation::squared_relu) sw("--squared-relu");
  if (m.norm == Norm::rmsnorm) kv("--normalization", "RMSNorm");
  if (!m.tied_embeddings) sw("--untie-embeddings-and-output-weights");
  if (!m.add_bias_linear) sw("--disable-bias-linear");
  if (!m.add_bias_linear && m.add_qkv_bias) sw("--add-qkv-bias");
  if (m.qk_layernorm) sw("--qk-layernorm");
  if (m.position_embedding == PositionEmbedding::rope) kv("--position-embedding-type", "rope");
  if (m.position_embedding == PositionEmbedding::none) kv("--position-embedding-type", "none");
  kv("--vocab-size", m.vocab_size);
  if (m.make_vocab_size_divisible_by != 128) kv("--make-vocab-size-divisible-by", m.make_vocab_size_divisible_by);
  if (m.hidden_dropout != 0.1) kv("--hidden-dropout", m.hidden_dropout);
  if (m.attention_dropout != 0.1) kv("--attention-dropout", m.attention_dropout);
  const std::int64_t seq = setup.seq_length > 0 ? setup.seq_length : t.seq_length.value_or(m.seq_length);
  kv("--seq-length", seq);
  kv("--max-position-embeddings", std::max(m.seq_length, seq));  // Megatron requires >= seq-length
  if (m.moe) {
    const MoeSpec& e = *m.moe;
    kv("--num-experts", e.num_experts);
    kv("--moe-router-topk", e.top_k);
    kv("--moe-ffn-hidden-size", e.expert_ffn_hidden);
    sw("--moe-grouped-gemm");   // the Program runs each rank's experts as one GEMM; recompute module moe_act needs it
    if (e.shared_expert_ffn_hidden > 0) kv("--moe-shared-expert-intermediate-size", e.shared_expert_ffn_hidden);
    if (e.capacity_factor) kv("--moe-expert-capacity-factor", *e.capacity_factor);
    if (e.pad_to_capacity) sw("--moe-pad-expert-input-to-capacity");
    if (e.num_groups > 0) {
      kv("--moe-router-num-groups", e.num_groups);
      kv("--moe-router-group-topk", e.group_topk);
    }
    const std::string freq = moe_layer_freq_text(e.moe_layers);
    if (!freq.empty()) kv("--moe-layer-freq", freq.front() == '(' ? "'" + freq + "'" : freq);
  }
  if (m.mla) {
    const MlaSpec& l = *m.mla;
    sw("--multi-latent-attention");
    if (l.q_lora_rank) kv("--q-lora-rank", *l.q_lora_rank);
    kv("--kv-lora-rank", l.kv_lora_rank);
    kv("--qk-head-dim", l.qk_head_dim);
    kv("--qk-pos-emb-head-dim", l.qk_rope_head_dim);
    kv("--v-head-dim", l.v_head_dim);
  }
  if (m.mtp_num_layers > 0) kv("--mtp-num-layers", m.mtp_num_layers);
  if (m.window_size > 0) {
    kv("--window-size", fmt::format("{},0", m.window_size));
    if (m.window_skip_freq > 0) kv("--window-attn-skip-freq", m.window_skip_freq);
  }

  // ---- batch and precision
  kv("--micro-batch-size", p.micro_batch_size);
  kv("--global-batch-size", t.global_batch_size);
  switch (t.params_dtype) {
    case Dtype::bf16:
      sw("--bf16");
      if (t.grad_dtype == Dtype::bf16) sw("--grad-reduce-in-bf16");
      else if (t.grad_dtype != Dtype::fp32)
        return fail("training.grad_dtype",
                    fmt::format("Megatron-LM has no flag for {} gradients with bf16 weights (fp32 or bf16)",
                                to_string(t.grad_dtype)));
      break;
    case Dtype::fp16:
      sw("--fp16");
      if (t.grad_dtype == Dtype::fp32) sw("--accumulate-allreduce-grads-in-fp32");
      else if (t.grad_dtype != Dtype::fp16)
        return fail("training.grad_dtype",
                    fmt::format("Megatron-LM has no flag for {} gradients with fp16 weights (fp32 or fp16)",
                                to_string(t.grad_dtype)));
      break;
    case Dtype::fp32:
      if (t.grad_dtype != Dtype::fp32)
        return fail("training.grad_dtype", "Megatron-LM keeps fp32 gradients for fp32 weights");
      break;
    case Dtype::fp8:
      return fail("training.params_dtype", "Megatron-LM has no fp8 parameter dtype; use precision fp8");
  }
  if (t.precision == Precision::fp8) kv("--fp8-format", "hybrid");
  if (t.precision == Precision::fp8 && t.fp8_recipe != Fp8Recipe::delayed) kv("--fp8-recipe", to_string(t.fp8_recipe));
  if (const OptimizerPrecision& op = t.optimizer_precision; op.enabled) {
    sw("--use-precision-aware-optimizer");
    if (t.grad_dtype == Dtype::bf16) kv("--main-grads-dtype", "bf16");
    if (op.main_params != Dtype::fp32) kv("--main-params-dtype", to_string(op.main_params));
    if (op.exp_avg != Dtype::fp32) kv("--exp-avg-dtype", to_string(op.exp_avg));
    if (op.exp_avg_sq != Dtype::fp32) kv("--exp-avg-sq-dtype", to_string(op.exp_avg_sq));
    if (!op.store_param_remainders) sw("--no-store-param-remainders");
  }

  // ---- parallelism
  kv("--tensor-model-parallel-size", p.tp);
  kv("--pipeline-model-parallel-size", p.pp);
  const int vpp = setup.vpp > 0 ? setup.vpp : p.vpp.value_or(1);
  if (p.layout) kv("--pipeline-model-parallel-layout", shell_quote(*p.layout));   // as given; it implies vpp
  else if (vpp > 1) kv("--num-virtual-stages-per-pipeline-rank", vpp);
  if (p.microbatch_group) kv("--microbatch-group-size-per-virtual-pipeline-stage", *p.microbatch_group);
  if (p.first_stage_layers) kv("--decoder-first-pipeline-num-layers", *p.first_stage_layers);
  if (p.last_stage_layers) kv("--decoder-last-pipeline-num-layers", *p.last_stage_layers);
  if (p.embedding_in_split) sw("--account-for-embedding-in-pipeline-split");
  if (p.loss_in_split) sw("--account-for-loss-in-pipeline-split");
  if (p.cp > 1) kv("--context-parallel-size", p.cp);
  if (p.cp_comm == CpCommType::all_gather) kv("--cp-comm-type", "all_gather");   // Transformer Engine's spelling
  if (p.cp_comm == CpCommType::a2a) kv("--cp-comm-type", "a2a");
  if (p.ep > 1) kv("--expert-model-parallel-size", p.ep);
  const int etp = setup.etp > 0 ? setup.etp : p.etp.value_or(p.tp);
  if (p.etp || etp != p.tp) kv("--expert-tensor-parallel-size", etp);
  if (p.sequence_parallel) sw("--sequence-parallel");
  const int zero = zero_stage(p);
  auto sharding_flags = megatron_detail::export_sharding(setup);
  if (!sharding_flags) return tl::unexpected(sharding_flags.error());
  for (std::string& flag : *sharding_flags) a.push_back(std::move(flag));
  for (std::string& flag : megatron_detail::export_varlen(setup)) a.push_back(std::move(flag));
  if (p.fp8_param_gather) sw("--fp8-param-gather");
  if (p.recompute.granularity != RecomputeGranularity::none)
    kv("--recompute-granularity", to_string(p.recompute.granularity));
  if (p.recompute.method) kv("--recompute-method", to_string(*p.recompute.method));
  if (p.recompute.num_layers) kv("--recompute-num-layers", *p.recompute.num_layers);
  if (p.recompute.modules && p.recompute.granularity == RecomputeGranularity::selective) {
    std::string names = format_recompute_modules(*p.recompute.modules);
    std::replace(names.begin(), names.end(), '+', ' ');
    kv("--recompute-modules", names);
  }
  if (p.overlap_grad_reduce) sw("--overlap-grad-reduce");
  if (p.overlap_param_gather || (zero == 3 && p.fsdp_prefetch >= 1 && p.reshard_after_forward))
    sw("--overlap-param-gather");
  if (p.tp_comm_overlap) sw("--tp-comm-overlap");
  if (!p.tp_grad_overlap) sw("--no-async-tensor-model-parallel-allreduce");
  if (!p.grad_accum_fusion) sw("--no-gradient-accumulation-fusion");
  if (p.schedule == Schedule::interleaved && !setup.overlap_p2p_comm) sw("--no-overlap-p2p-communication");
  if (p.overlap_p2p_warmup_flush) sw("--overlap-p2p-communication-warmup-flush");
  if (p.moe_shared_expert_overlap) sw("--moe-shared-expert-overlap");
  if (p.moe_ep_overlap) sw("--overlap-moe-expert-parallel-comm");
  // Always named: Megatron-LM's default (allgather) is not Megascope's.
  if (setup.model.moe) kv("--moe-token-dispatcher-type", to_string(p.moe_dispatcher));
  if (setup.model.moe && p.moe_dispatcher == MoeDispatcher::flex) sw("--moe-enable-deepep");
  // pp_scatter_gather has no flag: pre-Core Megatron-LM did it by default
  // (--no-scatter-gather-tensors-in-pipeline turned it off), Megatron-Core cannot.
  if (p.attention == AttentionKernel::unfused) kv("--attention-backend", "unfused");

  std::string line;
  for (const auto& item : a) {
    if (!line.empty()) line += ' ';
    line += item;
  }
  return line;
}

}  // namespace megascope
