#include "core/accounting/params.hpp"

#include <algorithm>

namespace megascope {

namespace {

double norm_params(const ModelSpec& m, std::int64_t width) {
  return static_cast<double>(width) * (m.norm == Norm::layernorm ? 2.0 : 1.0);
}

// Attention block of one layer on one TP rank.
double attention_params(const ModelSpec& m, int tp) {
  const double h = static_cast<double>(m.hidden_size);
  const double t = tp;
  if (m.mla) {
    const MlaSpec& a = *m.mla;
    const double heads = static_cast<double>(m.num_attention_heads) / t;
    const double dqk = static_cast<double>(a.qk_head_dim + a.qk_rope_head_dim);
    double q = 0;
    if (a.q_lora_rank) {
      const double rq = static_cast<double>(*a.q_lora_rank);
      // Down projection and its norm are replicated; the up projection is column-parallel.
      q = h * rq + norm_params(m, *a.q_lora_rank) + rq * heads * dqk;
    } else {
      q = h * heads * dqk;                               // column-parallel
    }
    const double rkv = static_cast<double>(a.kv_lora_rank);
    const double kv_down = h * (rkv + static_cast<double>(a.qk_rope_head_dim));  // replicated
    const double kv_up = rkv * heads * static_cast<double>(a.qk_head_dim + a.v_head_dim);
    const double out = heads * static_cast<double>(a.v_head_dim) * h;
    return q + kv_down + norm_params(m, a.kv_lora_rank) + kv_up + out;
  }
  const double d = static_cast<double>(m.kv_channels);
  const double q_heads = static_cast<double>(m.num_attention_heads) / t;
  const double kv_heads = m.num_query_groups >= tp ? static_cast<double>(m.num_query_groups) / t : 1.0;
  const double qkv_out = d * (q_heads + 2.0 * kv_heads);
  double p = h * qkv_out + q_heads * d * h;              // QKV (column) + output projection (row)
  if (m.add_qkv_bias) p += qkv_out;                      // column-parallel bias: sharded
  if (m.add_bias_linear) p += h;                         // row-parallel bias: replicated
  if (m.qk_layernorm) p += 2.0 * norm_params(m, m.kv_channels);
  return p;
}

// A gated or plain MLP of width f split over `tp` ranks.
double mlp_params(const ModelSpec& m, std::int64_t f, int tp, bool bias) {
  const double h = static_cast<double>(m.hidden_size);
  const double fl = static_cast<double>(f) / tp;
  const double up = m.activation == Activation::swiglu ? 2.0 : 1.0;
  double p = h * up * fl + fl * h;
  if (bias) p += up * fl + h;                            // fc1 bias sharded, fc2 bias replicated
  return p;
}

}  // namespace

ParamSplit layer_params(const ModelSpec& m, int layer, Sharding sh) {
  ParamSplit p;
  p.dense = attention_params(m, sh.tp) + 2.0 * norm_params(m, m.hidden_size);
  if (!m.is_moe_layer(layer)) {
    p.dense += mlp_params(m, m.ffn_hidden_size, sh.tp, m.add_bias_linear);
    return p;
  }
  const MoeSpec& e = *m.moe;
  const double h = static_cast<double>(m.hidden_size);
  p.dense += h * e.num_experts;                          // router, replicated
  if (m.add_bias_linear) p.dense += e.num_experts;
  if (e.shared_expert_ffn_hidden > 0) p.dense += mlp_params(m, e.shared_expert_ffn_hidden, sh.tp, m.add_bias_linear);
  const double local_experts = static_cast<double>(e.num_experts) / sh.ep;
  p.expert = local_experts * mlp_params(m, e.expert_ffn_hidden, sh.etp, m.add_bias_linear);
  return p;
}

ParamSplit mtp_layer_params(const ModelSpec& m, Sharding sh) {
  ParamSplit p = layer_params(m, m.num_layers - 1, sh);
  const double h = static_cast<double>(m.hidden_size);
  p.dense += 3.0 * norm_params(m, m.hidden_size);       // enorm, hnorm, final norm of the MTP block
  p.dense += 2.0 * h * h / sh.tp;                        // eh_proj: 2h -> h, column-parallel
  return p;
}

ModelParams model_params(const ModelSpec& m, std::optional<std::int64_t> vocab) {
  ModelParams out;
  const double h = static_cast<double>(m.hidden_size);
  const double v = static_cast<double>(vocab.value_or(m.vocab_size));
  out.embedding = v * h;
  if (m.position_embedding == PositionEmbedding::learned) out.embedding += static_cast<double>(m.seq_length) * h;
  out.output = m.tied_embeddings ? 0.0 : v * h;
  out.final_norm = norm_params(m, m.hidden_size);
  for (int l = 0; l < m.num_layers; ++l) out.layers += layer_params(m, l);
  for (int i = 0; i < m.mtp_num_layers; ++i) out.mtp += mtp_layer_params(m);
  return out;
}

double active_params(const ModelSpec& m) {
  ModelParams all = model_params(m);
  if (!m.moe) return all.total();
  const double ratio = static_cast<double>(m.moe->top_k) / m.moe->num_experts;
  return all.total() - (all.layers.expert + all.mtp.expert) * (1.0 - ratio);
}

ParamSplit RankParamParts::total() const {
  ParamSplit t = layers;
  t += mtp;
  t.dense += embedding + output + final_norm;
  return t;
}

RankParamParts rank_param_parts(const Setup& s, int pp_rank) {
  const ModelSpec& m = s.model;
  const Sharding sh{s.plan.tp, s.etp, s.plan.ep};
  RankParamParts r;
  for (const ChunkLayers& c : s.chunks.at(static_cast<std::size_t>(pp_rank)))
    for (int l = c.first; l < c.first + c.count; ++l) r.layers += layer_params(m, l, sh);
  const double h = static_cast<double>(m.hidden_size);
  const double word = static_cast<double>(s.padded_vocab) * h / s.plan.tp;   // vocab-parallel
  const bool first = s.holds_embedding(pp_rank);
  const bool last = s.holds_output(pp_rank);
  // Standalone MTP (its layers on a stage before the loss's): that rank holds
  // them and its own copy of the word embedding to look the tokens ahead up in.
  bool standalone = false, mtp_here = false;
  for (const auto& rank_chunks : s.chunks)
    for (const ChunkLayers& c : rank_chunks) standalone = standalone || (c.mtp > 0 && !c.loss);
  for (const ChunkLayers& c : s.chunks.at(static_cast<std::size_t>(pp_rank))) mtp_here = mtp_here || c.mtp > 0;
  if (first) {
    r.embedding = word;
    if (m.position_embedding == PositionEmbedding::learned) r.embedding += static_cast<double>(m.seq_length) * h;
  }
  if (last) {
    r.final_norm = norm_params(m, m.hidden_size);
    // Untied: the output layer's own weight. Tied: the last stage keeps a copy
    // of the word embedding (synchronised by the embedding group), unless the
    // same rank already holds it. MTP on the last stage also needs the embedding.
    if (!m.tied_embeddings) r.output += word;
    const bool needs_copy = (m.tied_embeddings || (m.mtp_num_layers > 0 && !standalone)) && !first;
    if (needs_copy) r.output += word;
    if (!standalone)
      for (int i = 0; i < m.mtp_num_layers; ++i) r.mtp += mtp_layer_params(m, sh);
  }
  if (standalone && mtp_here) {
    for (int i = 0; i < m.mtp_num_layers; ++i) r.mtp += mtp_layer_params(m, sh);
    if (!first) r.mtp.dense += word;
  }
  return r;
}

ParamSplit rank_params(const Setup& s, int pp_rank) { return rank_param_parts(s, pp_rank).total(); }

}  // namespace megascope
