#include "core/accounting/flops.hpp"

#include <algorithm>

#include "core/program/work.hpp"

namespace megascope {

ForwardFlops layer_forward_flops(const ModelSpec& m, int layer, std::int64_t s_in, bool causal) {
  ForwardFlops f;
  const double s = static_cast<double>(s_in);
  const double h = static_cast<double>(m.hidden_size);
  const double a = m.num_attention_heads;
  // The query-key pairs over s^2: half when causal; on a sliding-window
  // layer (causal) the window's pairs (AttentionShape's count).
  double half = causal ? 0.5 : 1.0;
  if (causal && m.is_window_layer(layer) && m.window_size < s_in) {
    AttentionShape w;
    w.seq_q = w.seq_kv = s_in;
    w.window = m.window_size;
    half = attention_pairs(w) / (s * s);
  }
  if (m.mla) {
    const MlaSpec& l = *m.mla;
    const double dqk = static_cast<double>(l.qk_head_dim + l.qk_rope_head_dim);
    const double dv = static_cast<double>(l.v_head_dim);
    const double rkv = static_cast<double>(l.kv_lora_rank);
    double q = 0;
    if (l.q_lora_rank) {
      const double rq = static_cast<double>(*l.q_lora_rank);
      q = h * rq + rq * a * dqk;
    } else {
      q = h * a * dqk;
    }
    const double kv = h * (rkv + static_cast<double>(l.qk_rope_head_dim)) +
                      rkv * a * static_cast<double>(l.qk_head_dim + l.v_head_dim);
    f.attention_proj = 2.0 * s * (q + kv + a * dv * h);
    f.attention_core = 2.0 * s * s * a * (dqk + dv) * half;
  } else {
    const double q = static_cast<double>(m.q_width());
    const double kv = static_cast<double>(m.kv_width());
    f.attention_proj = 2.0 * s * (h * (q + 2.0 * kv) + q * h);
    f.attention_core = 2.0 * 2.0 * s * s * q * half;    // QK^T and PV, each 2 s^2 q
  }
  const double c = m.activation == Activation::swiglu ? 3.0 : 2.0;   // GEMMs of width f per MLP
  if (!m.is_moe_layer(layer)) {
    f.mlp = 2.0 * s * h * static_cast<double>(m.ffn_hidden_size) * c;
  } else {
    const MoeSpec& e = *m.moe;
    f.mlp = 2.0 * s * h * static_cast<double>(e.shared_expert_ffn_hidden) * c;
    f.experts = 2.0 * s * h * static_cast<double>(e.expert_ffn_hidden) * c * e.top_k;
  }
  return f;
}

namespace {
void add(ForwardFlops& a, const ForwardFlops& b, double scale = 1.0) {
  a.attention_proj += scale * b.attention_proj;
  a.attention_core += scale * b.attention_core;
  a.mlp += scale * b.mlp;
  a.experts += scale * b.experts;
  a.logits += scale * b.logits;
  a.mtp_proj += scale * b.mtp_proj;
}
}  // namespace

ForwardFlops model_forward_flops(const ModelSpec& m, std::int64_t s_in, std::int64_t vocab, bool causal) {
  ForwardFlops f;
  for (int l = 0; l < m.num_layers; ++l) add(f, layer_forward_flops(m, l, s_in, causal));
  const double s = static_cast<double>(s_in);
  const double h = static_cast<double>(m.hidden_size);
  // MTP layers: a layer shaped like the last one, the 2h -> h projection and its own logits.
  add(f, layer_forward_flops(m, m.num_layers - 1, s_in, causal), m.mtp_num_layers);
  f.mtp_proj = 2.0 * s * 2.0 * h * h * m.mtp_num_layers;
  f.logits = 2.0 * s * h * static_cast<double>(vocab) * (1 + m.mtp_num_layers);
  return f;
}

double mla_up_proj_flops(const ModelSpec& m, std::int64_t s_in) {
  if (!m.mla) return 0;
  const MlaSpec& l = *m.mla;
  const double s = static_cast<double>(s_in);
  const double a = m.num_attention_heads;
  double f = 2.0 * s * static_cast<double>(l.kv_lora_rank) * a * static_cast<double>(l.qk_head_dim + l.v_head_dim);
  if (l.q_lora_rank)
    f += 2.0 * s * static_cast<double>(*l.q_lora_rank) * a * static_cast<double>(l.qk_head_dim + l.qk_rope_head_dim);
  return f;
}

namespace {
// Forward work that recomputation repeats, for one sequence.
double recompute_forward(const Setup& st, std::int64_t s, bool causal) {
  const ModelSpec& m = st.model;
  const Recompute& rc = st.plan.recompute;
  double extra = 0;
  if (rc.granularity == RecomputeGranularity::selective) {
    // Norms and activations are memory-bound: no GEMM FLOPs to count.
    const unsigned modules = recompute_modules(rc);
    for (int l = 0; l < m.num_layers; ++l) {
      const ForwardFlops f = layer_forward_flops(m, l, s, causal);
      if (modules & kRecomputeCoreAttn) extra += f.attention_core;
      if (modules & kRecomputeMlaUpProj) extra += mla_up_proj_flops(m, s);
      // Checkpointed submodules run their GEMMs again (the router's is not counted, as in the model FLOPs).
      if (m.is_moe_layer(l)) {
        if (modules & kRecomputeMoe) extra += f.experts + f.mlp;
        else if (modules & kRecomputeSharedExperts) extra += f.mlp;
      } else if (modules & kRecomputeMlp) {
        extra += f.mlp;
      }
    }
  } else if (rc.granularity == RecomputeGranularity::full) {
    // uniform: every layer is recomputed (in groups of recompute_layers);
    // block: the first recompute_layers layers of each model chunk.
    for (const auto& rank : st.chunks) {
      for (const ChunkLayers& c : rank) {
        const int n = *rc.method == RecomputeMethod::uniform ? c.count : std::min(c.count, *rc.num_layers);
        for (int l = c.first; l < c.first + n; ++l) extra += layer_forward_flops(m, l, s, causal).layers();
      }
    }
    // DualPipe holds two copies of every stage; count the model once.
    if (st.plan.schedule == Schedule::dualpipe) extra /= 2.0;
  }
  return extra;
}
}  // namespace

IterationFlops iteration_flops(const Setup& st) {
  IterationFlops out;
  const double batch = static_cast<double>(st.training.global_batch_size);
  const std::int64_t s = st.seq_length;
  for (bool causal : {true, false}) {
    const ForwardFlops fwd = model_forward_flops(st.model, s, st.padded_vocab, causal);
    const double model = 3.0 * fwd.total() * batch;
    const double hardware = model + recompute_forward(st, s, causal) * batch;
    if (causal) {
      out.model = model;
      out.hardware = hardware;
      add(out.forward, fwd, batch);
    } else {
      out.model_no_causal = model;
      out.hardware_no_causal = hardware;
    }
  }
  return out;
}

}  // namespace megascope
