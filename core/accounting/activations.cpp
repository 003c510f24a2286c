#include "core/accounting/activations.hpp"

#include <numeric>

namespace megascope {

namespace {

struct Shape {
  double T;        // tokens of one micro-batch on one CP rank: s/cp * b
  double s_full;   // keys one query attends to: the whole sequence
  double h;
  double t;        // tensor-parallel size
  double sp;       // divisor of replicated tensors: tp with SP, else 1
  bool hidden_dropout;
  bool attention_dropout;
};

Shape shape_of(const Setup& st) {
  Shape sh{};
  sh.T = static_cast<double>(st.seq_length) / st.plan.cp * st.plan.micro_batch_size;
  sh.s_full = static_cast<double>(st.seq_length);
  sh.h = static_cast<double>(st.model.hidden_size);
  sh.t = st.plan.tp;
  sh.sp = st.sequence_parallel ? st.plan.tp : 1.0;
  sh.hidden_dropout = st.model.hidden_dropout > 0;
  sh.attention_dropout = st.model.attention_dropout > 0;
  return sh;
}

constexpr double kAct = 2.0;   // bytes per activation element (bf16/fp16)

}  // namespace

LayerActivations layer_activations(const Setup& st, int layer) {
  const ModelSpec& m = st.model;
  const Shape x = shape_of(st);
  // Selective recomputation drops what its modules recompute in backward.
  const unsigned modules = recompute_modules(st.plan.recompute);
  const bool core_recomputed = modules & kRecomputeCoreAttn;
  const bool norms_recomputed = modules & kRecomputeLayernorm;
  const bool up_proj_recomputed = modules & kRecomputeMlaUpProj;
  const bool expert_act_recomputed = modules & kRecomputeMoeAct;
  // Checkpointed submodules keep only their input (docs/accounting.md).
  const bool mlp_recomputed = (modules & kRecomputeMlp) && !m.is_moe_layer(layer);
  const bool moe_recomputed = (modules & kRecomputeMoe) && m.is_moe_layer(layer);
  const bool shared_recomputed = moe_recomputed || ((modules & kRecomputeSharedExperts) && m.is_moe_layer(layer));
  const bool flash = st.plan.attention == AttentionKernel::flash;
  LayerActivations out;
  auto add = [&](const char* name, double bytes) {
    if (bytes > 0) out.terms.push_back({name, bytes});
  };
  auto add_w = [&](double bytes) { out.weight_grad_state += bytes; };
  // FP8 training (Transformer Engine's linear layers): a linear layer keeps
  // the FP8 copy of its input that its forward GEMM ran on (one byte an
  // element) for its weight gradient, and its output gradient, cast to FP8
  // for both backward GEMMs, likewise; what other kernels keep (norm inputs,
  // the activation function's input, attention's tensors, the router's and
  // the gate's) stays 16-bit. The norm fused with the dense QKV projection
  // and fc1 writes its output in FP8 directly. Recomputing the norm or
  // activation that produced a linear layer's input frees only its 16-bit
  // output: the layer's FP8 copy stays. docs/accounting.md section 3.
  const bool fp8 = st.training.precision == Precision::fp8;
  const double gin = fp8 ? 1.0 : kAct;

  // --- attention block ---
  add("ln1_input", kAct * x.T * x.h / x.sp);
  // MLA's projections from the hidden state are two linear layers after a
  // separate norm: in BF16 they share the norm's output, in FP8 each keeps
  // its own copy.
  const double qkv_copies = m.mla && fp8 ? 2.0 : 1.0;
  if (!norms_recomputed || fp8)
    add("qkv_input", qkv_copies * gin * x.T * x.h / x.sp);   // SP: kept sharded, all-gathered again in backward
  add_w(qkv_copies * gin * x.T * x.h);                       // the W pass needs the gathered input
  double heads = m.num_attention_heads / x.t;  // query heads per rank
  double core_out_width = 0;                   // width of the attention output per rank
  if (m.mla) {
    const MlaSpec& a = *m.mla;
    const double dqk = static_cast<double>(a.qk_head_dim + a.qk_rope_head_dim);
    const double rkv = static_cast<double>(a.kv_lora_rank);
    if (a.q_lora_rank) {
      const double rq = static_cast<double>(*a.q_lora_rank);
      add("q_latent", (kAct + gin) * x.T * rq);  // norm input and up-projection input
      add_w(gin * x.T * rq);
    }
    add("kv_latent", (kAct + gin) * x.T * rkv);
    add_w(gin * x.T * rkv);
    if (!up_proj_recomputed) {   // else rebuilt from the latents in backward
      add("q", kAct * x.T * heads * dqk);
      add("k", kAct * x.T * heads * dqk);
      add("v", kAct * x.T * heads * static_cast<double>(a.v_head_dim));
    }
    core_out_width = heads * static_cast<double>(a.v_head_dim);
  } else {
    const double d = static_cast<double>(m.kv_channels);
    const double kv_heads = m.num_query_groups >= st.plan.tp ? m.num_query_groups / x.t : 1.0;
    add("q", kAct * x.T * heads * d);
    add("k", kAct * x.T * kv_heads * d);
    add("v", kAct * x.T * kv_heads * d);
    core_out_width = heads * d;
    add_w(gin * x.T * d * (heads + 2.0 * kv_heads));    // gradient of the QKV output
  }
  if (st.plan.cp > 1 && st.plan.cp_comm == CpCommType::all_gather) {
    // The gathered keys and values of the whole sequence are kept for backward.
    const double kv_width = m.mla ? heads * static_cast<double>(m.mla->qk_head_dim + m.mla->qk_rope_head_dim +
                                                                m.mla->v_head_dim)
                                  : 2.0 * (m.num_query_groups >= st.plan.tp ? m.num_query_groups / x.t : 1.0) *
                                        static_cast<double>(m.kv_channels);
    add("gathered_kv", kAct * x.T * (st.plan.cp - 1) * kv_width);
  }
  if (!core_recomputed) {
    const double scores = heads * x.T * x.s_full;   // a/t x (s/cp) x s x b
    if (flash) {
      add("softmax_lse", 4.0 * heads * x.T);        // fp32 log-sum-exp per query and head
    } else {
      add("softmax_output", kAct * scores);
      if (x.attention_dropout) {
        add("attention_dropout_mask", 1.0 * scores);
        add("attention_dropout_output", kAct * scores);
      }
    }
  }
  add("proj_input", gin * x.T * core_out_width);
  add_w(gin * x.T * core_out_width + gin * x.T * x.h);     // input and output gradient of the projection
  if (x.hidden_dropout) add("attn_residual_dropout_mask", 1.0 * x.T * x.h / x.sp);
  add("ln2_input", kAct * x.T * x.h / x.sp);

  // --- MLP block ---
  const double up = m.activation == Activation::swiglu ? 2.0 : 1.0;
  // The MLP's input: fc1's (FP8 from the fused norm in FP8). An MoE layer's
  // norm stands alone: its 16-bit output is the router's input (and, in
  // BF16, the shared experts'); in FP8 the shared experts keep their own copy.
  // A checkpointed MLP (its norm fused into fc1) keeps nothing beyond the
  // residual, ln2_input; a checkpointed MoE block keeps its input, the norm's
  // output, unless the norm is recomputed too (Megatron-Core frees it after
  // the block and rebuilds it in backward).
  if (!m.is_moe_layer(layer)) {
    if ((!norms_recomputed || fp8) && !mlp_recomputed) add("fc1_input", gin * x.T * x.h / x.sp);
  } else {
    const bool shared_copy = fp8 && m.moe->shared_expert_ffn_hidden > 0 && !shared_recomputed;
    add("fc1_input", ((norms_recomputed ? 0.0 : kAct) + (shared_copy ? gin : 0.0)) * x.T * x.h / x.sp);
  }
  // An MLP's activation input and fc2's input; a checkpointed one keeps
  // neither, though the W pass still needs its GEMMs' inputs and gradients.
  auto mlp = [&](const char* act_name, const char* fc2_name, double tokens, double f_local, bool act_recomputed,
                 bool kept) {
    if (kept) add(act_name, kAct * tokens * up * f_local);
    if (kept && (!act_recomputed || fp8)) add(fc2_name, gin * tokens * f_local);
    add_w(gin * tokens * x.h + gin * tokens * up * f_local);   // fc1 input + output gradient
    add_w(gin * tokens * f_local + gin * tokens * x.h);        // fc2 input + output gradient
  };
  if (!m.is_moe_layer(layer)) {
    mlp("activation_input", "fc2_input", x.T, static_cast<double>(m.ffn_hidden_size) / x.t, false, !mlp_recomputed);
  } else {
    const MoeSpec& e = *m.moe;
    // Tokens this rank routes (SP shards them over TP), then, after the EP
    // all-to-all and the ETP all-gather, the tokens its local experts process:
    // routed * k * etp under balanced routing, times the busiest EP rank's
    // load over the mean (Setup::expert_load), whose memory is the peak.
    const double routed = x.T / x.sp;
    const double expert_tokens = routed * e.top_k * st.etp * st.expert_load;
    if (!moe_recomputed) {
      add("router_probs", 4.0 * routed * e.num_experts);      // fp32 softmax output
      add("expert_fc1_input", gin * expert_tokens * x.h);
    }
    mlp("expert_activation_input", "expert_fc2_input", expert_tokens, static_cast<double>(e.expert_ffn_hidden) / st.etp,
        expert_act_recomputed, !moe_recomputed);
    if (!moe_recomputed) add("expert_output", kAct * expert_tokens * x.h);   // for the gradient of the gate weights
    if (e.shared_expert_ffn_hidden > 0)
      mlp("shared_activation_input", "shared_fc2_input", x.T, static_cast<double>(e.shared_expert_ffn_hidden) / x.t,
          false, !shared_recomputed);
  }
  if (x.hidden_dropout) add("mlp_residual_dropout_mask", 1.0 * x.T * x.h / x.sp);

  out.stored = 0;
  for (const ActivationTerm& term : out.terms) out.stored += term.bytes;
  out.checkpoint = kAct * x.T * x.h / x.sp;   // the layer input (SP-sharded under SP)
  return out;
}

EdgeActivations edge_activations(const Setup& st) {
  const Shape x = shape_of(st);
  EdgeActivations e;
  e.embedding.push_back({"input_ids", 8.0 * x.T});   // int64 token ids, every TP rank
  if (x.hidden_dropout) e.embedding.push_back({"embedding_dropout_mask", 1.0 * x.T * x.h / x.sp});
  e.output.push_back({"final_norm_input", kAct * x.T * x.h / x.sp});
  e.output.push_back({"output_layer_input", kAct * x.T * x.h / x.sp});
  e.output.push_back({"logits_fp32", 4.0 * x.T * static_cast<double>(st.padded_vocab) / x.t});
  return e;
}

double EdgeActivations::embedding_bytes() const {
  return std::accumulate(embedding.begin(), embedding.end(), 0.0,
                         [](double a, const ActivationTerm& t) { return a + t.bytes; });
}
double EdgeActivations::output_bytes() const {
  return std::accumulate(output.begin(), output.end(), 0.0,
                         [](double a, const ActivationTerm& t) { return a + t.bytes; });
}

}  // namespace megascope
