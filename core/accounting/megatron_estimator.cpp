#include "core/accounting/megatron_estimator.hpp"

#include <algorithm>

namespace megascope {

MegatronMemoryEstimate megatron_theoretical_memory(const Setup& st) {
  const ModelSpec& m = st.model;
  const double h = static_cast<double>(m.hidden_size);
  const double a = m.num_attention_heads;
  const double g = m.num_query_groups;
  const double q = static_cast<double>(m.q_width());
  const double L = m.num_layers;
  const double t = st.plan.tp;
  const double p = st.plan.pp;
  const double V = static_cast<double>(st.padded_vocab);
  const double gamma = m.activation == Activation::swiglu ? 1.5 : 1.0;
  const double n_norm = m.norm == Norm::layernorm ? 2.0 : 1.0;

  // 1.1 parameters per layer (biases ignored).
  double attn = 2.0 * h * q * (1.0 + g / a);
  if (m.mla) {
    const MlaSpec& l = *m.mla;
    const double dqk = static_cast<double>(l.qk_head_dim), dr = static_cast<double>(l.qk_rope_head_dim);
    const double dv = static_cast<double>(l.v_head_dim), rkv = static_cast<double>(l.kv_lora_rank);
    const double q_term = l.q_lora_rank ? static_cast<double>(*l.q_lora_rank) *
                                              (h + a * (dqk + dr) + n_norm)
                                        : h * a * (dqk + dr);
    attn = q_term + rkv * (h + a * (dqk + dv) + n_norm) + h * dr + a * dv * h;
  }
  double tp_block = 0, rep_block = 0, exp_block = 0;
  for (int l = 0; l < m.num_layers; ++l) {
    tp_block += attn;
    rep_block += 2.0 * h * n_norm;
    if (m.is_moe_layer(l)) {
      const MoeSpec& e = *m.moe;
      tp_block += 2.0 * h * static_cast<double>(e.shared_expert_ffn_hidden) * gamma;
      exp_block += 2.0 * h * static_cast<double>(e.expert_ffn_hidden) * e.num_experts * gamma;
      rep_block += h * e.num_experts + (m.add_bias_linear ? e.num_experts : 0.0);
    } else {
      tp_block += 2.0 * h * static_cast<double>(m.ffn_hidden_size) * gamma;
    }
  }
  rep_block += n_norm * h;   // final norm, counted in the block

  // 1.2 sharding onto the first stage (MTP ignored: Megascope places it on the last).
  double n_tp = (tp_block / p + V * h) / t;
  if (!m.tied_embeddings && st.plan.pp == 1) n_tp += V * h / t;
  const double n_rep = rep_block / p;
  const double n_exp = exp_block / p / (st.etp * st.plan.ep);

  // 1.3 bytes per parameter (bf16 params, fp32 grads and optimizer).
  const double D = st.dp;
  const double De = st.edp;
  auto bytes = [&](double d) { return st.plan.distributed_optimizer ? 6.0 + 12.0 / d : 18.0; };
  MegatronMemoryEstimate out;
  out.weight_and_optimizer_bytes = (n_tp + n_rep) * bytes(D) + n_exp * bytes(De);

  // 1.4 activations.
  const double s = static_cast<double>(st.seq_length);
  const double b = st.plan.micro_batch_size;
  const double f = static_cast<double>(m.ffn_hidden_size);
  const double mb = st.num_microbatches;
  const bool path_a = st.plan.sequence_parallel &&
                      st.plan.recompute.granularity == RecomputeGranularity::selective;
  const bool interleaved = st.plan.vpp.has_value() && st.vpp > 1;
  double A = 0;
  if (path_a) {
    A = L * s * b * h * (18.0 + 4.0 * f / h);
    A += 8.0 * s * b * p + s * b * h * p;
    if (interleaved) A *= 1.0 + (p - 1.0) / (p * st.vpp);
    else if (p > 1) A *= std::min(1.0, mb / p);
    if (st.plan.pp == 1) A += 4.0 * s * b * h * (1.0 + V / h);
    A /= t;
  } else {
    A = L * s * b * h * (10.0 + 24.0 / t);
    A += 8.0 * s * b * p + s * b * h * p;
    if (interleaved) A *= 1.0 + (p - 1.0) / (p * st.vpp);
    else if (p > 1) A *= std::min(1.0, mb / p);
    if (st.plan.pp == 1) A += 2.0 * (s * b * V / t + s * b * h);
    A *= 1.05;
  }
  out.activation_bytes = A;
  return out;
}

}  // namespace megascope
