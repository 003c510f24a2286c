#include "exec/params.hpp"

#include <fmt/format.h>

#include <cmath>

#include "core/rank_grid.hpp"
#include "kernels/philox.hpp"

namespace megascope::exec {

LayerShapes layer_shapes(const Setup& s, int tp_rank) {
  const ModelSpec& m = s.model;
  LayerShapes d;
  d.tp = s.plan.tp;
  d.tp_rank = tp_rank;
  d.T = s.seq_length / s.plan.cp * s.plan.micro_batch_size;   // this CP rank's tokens
  d.sp = s.sequence_parallel && d.tp > 1;
  d.Ts = d.sp ? d.T / d.tp : d.T;
  d.h = m.hidden_size;
  d.d = m.kv_channels;
  d.hq = m.num_attention_heads / d.tp;
  d.hkv = m.num_query_groups / d.tp;
  d.q = d.hq * d.d;
  d.kv = d.hkv * d.d;
  d.up = m.activation == Activation::swiglu ? 2 : 1;
  d.f = m.ffn_hidden_size / d.tp;
  d.vocab = s.padded_vocab / d.tp;
  d.vocab_start = d.vocab * tp_rank;
  return d;
}

Result<void> check_supported(const Setup& s) {
  const ModelSpec& m = s.model;
  const PlanSpec& p = s.plan;
  auto no = [](std::string field, std::string what) {
    return fail(std::move(field), what + " is not supported by the executor yet");
  };
  // Variable-length training: packed (THD, attention causal within each
  // document) or padded sequences, on every plan but dynamic CP's regrouping.
  if (s.training.varlen && p.dynamic_cp)
    return no("plan.dynamic_cp", "dynamic context parallelism (CP groups regrouped per micro-batch; the executor "
                                 "packs with the static dp_balanced scheduler and splits each pack over the plan's cp)");
  if (m.moe && p.tp > 1) return no("plan.tp", "tensor parallelism in a mixture-of-experts model");
  if (m.moe && m.moe->shared_expert_ffn_hidden > 0) return no("model.moe.shared_expert_ffn_hidden", "shared experts");
  if (m.moe && m.moe->capacity_factor)
    return no("model.moe.capacity_factor", "an expert capacity (dropping or padding tokens)");
  if (m.moe && m.moe->load_imbalance != 1.0)
    return no("model.moe.load_imbalance",
              "a set expert load imbalance (the executor's router decides each expert's load; measure it instead)");
  if (m.moe && p.moe_dispatcher == MoeDispatcher::flex)
    return no("plan.moe_dispatcher", "the flex dispatcher (DeepEP's two-hop exchange)");
  if (recompute_modules(p.recompute) & ~kRecomputeCoreAttn)
    return no("plan.recompute_modules", "recomputing modules other than core_attn");
  if (m.moe && m.moe->num_groups > 0)
    return no("model.moe.num_groups", "group-limited routing (the executor's router picks from every expert)");
  if (m.mla) return no("model.mla", "multi-latent attention");
  if (m.activation == Activation::squared_relu) return no("model.activation", "the squared-ReLU MLP");
  if (m.qk_layernorm) return no("model.qk_layernorm", "QK layer norm");
  if (m.mtp_num_layers > 0) return no("model.mtp_num_layers", "multi-token prediction");
  if (m.attention_dropout > 0) return no("model.attention_dropout", "dropout on attention probabilities");
  if (m.num_query_groups % p.tp != 0)
    return fail("plan.tp", fmt::format("tp = {} must divide num_query_groups = {} in the executor (KV heads are not "
                                       "replicated across TP ranks)", p.tp, m.num_query_groups));
  if (p.cp > 1 && s.seq_length % (2 * p.cp) != 0)
    return fail("plan.cp", fmt::format("seq_length {} must be divisible by 2 x cp = {} (load-balanced context chunks)",
                                       s.seq_length, 2 * p.cp));
  if (p.cp > 1 && p.cp_comm == CpCommType::a2a)
    return no("plan.cp_comm", "all-to-all context parallelism (cp_comm a2a)");
  if (p.tp_comm_overlap) return no("plan.tp_comm_overlap", "TP communication overlap (chunked collectives)");
  if (p.schedule == Schedule::dualpipe || p.schedule == Schedule::dualpipev)
    return no("plan.schedule", fmt::format("the {} schedule", to_string(p.schedule)));
  if (p.distributed_optimizer && s.dp * p.cp > 1 && p.pp > 1 && m.tied_embeddings)
    return no("plan.distributed_optimizer",
              "the distributed optimizer with tied embeddings split over pipeline stages");
  if ((s.seq_length / p.cp * p.micro_batch_size) % p.tp != 0)
    return fail("plan.tp", "micro-batch tokens must be divisible by tp for sequence parallelism");
  return {};
}

namespace {

std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

float init_normal(std::uint64_t seed, const std::string& tensor, std::uint64_t index) {
  const std::uint64_t key = seed ^ fnv1a(tensor);
  const kernels::Philox4x32 ctr{{static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32), 0u, 0u}};
  const kernels::Philox4x32 r =
      kernels::philox4x32_10(ctr, static_cast<std::uint32_t>(key), static_cast<std::uint32_t>(key >> 32));
  // Box-Muller on two 32-bit uniforms in (0, 1].
  const double u1 = (static_cast<double>(r.v[0]) + 1.0) / 4294967296.0;
  const double u2 = static_cast<double>(r.v[1]) / 4294967296.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * 3.14159265358979323846 * u2));
}

const Param* Chunk::find(const std::string& name) const {
  for (const Param& p : params)
    if (p.name == name) return &p;
  return nullptr;
}

float* Chunk::weight(const std::string& name) {
  const Param* p = find(name);
  return p ? w.data() + p->offset : nullptr;
}

float* Chunk::grad(const std::string& name) {
  const Param* p = find(name);
  return p ? g.data() + p->offset : nullptr;
}

namespace {

struct Builder {
  const Setup& s;
  const LayerShapes d;
  Chunk& c;

  void add(Param p) {
    p.offset = (c.size + kParamAlign - 1) / kParamAlign * kParamAlign;
    c.size = p.offset + p.size();
    c.params.push_back(std::move(p));
  }
  // A vector of `n` elements, the whole logical tensor on every TP rank.
  void vec(const std::string& name, std::int64_t n, Init init, TpSync sync) {
    Param p;
    p.name = name;
    p.rows = n;
    p.cols = 1;
    p.parts = {{name, n, 1, 0, n, 0, 1}};
    p.sync = sync;
    p.init = init;
    p.init_std = 0;
    add(std::move(p));
  }
  // Rows [row0, row0+rows) of a (full_rows, cols) matrix per part, stacked.
  Param rows_of(const std::string& name, std::vector<ParamPart> parts, float std_dev) {
    Param p;
    p.name = name;
    p.cols = parts.front().cols;
    for (const ParamPart& q : parts) p.rows += q.rows;
    p.parts = std::move(parts);
    p.decay = true;
    p.init_std = std_dev;
    return p;
  }

  void norm(const std::string& name, TpSync sync) {
    vec(name + ".weight", d.h, Init::ones, sync);
    if (s.model.norm == Norm::layernorm) vec(name + ".bias", d.h, Init::zeros, sync);
  }

  void layer(int l) {
    const ModelSpec& m = s.model;
    const std::string L = fmt::format("layer.{}.", l);
    const TpSync sp = d.sp ? TpSync::partial : TpSync::replicated;
    const std::int64_t H = m.hidden_size, Q = m.q_width(), KV = m.kv_width();
    const int r = d.tp_rank;
    const float out_std = 0.02f / std::sqrt(2.0f * static_cast<float>(m.num_layers));
    norm(L + "ln1", sp);
    add(rows_of(L + "qkv.weight",
                {{L + "wq", Q, H, r * d.q, d.q, 0, H}, {L + "wk", KV, H, r * d.kv, d.kv, 0, H},
                 {L + "wv", KV, H, r * d.kv, d.kv, 0, H}},
                0.02f));
    if (m.add_bias_linear || m.add_qkv_bias) {
      Param b = rows_of(L + "qkv.bias",
                        {{L + "bq", Q, 1, r * d.q, d.q, 0, 1}, {L + "bk", KV, 1, r * d.kv, d.kv, 0, 1},
                         {L + "bv", KV, 1, r * d.kv, d.kv, 0, 1}},
                        0);
      b.decay = false;
      b.init = Init::zeros;
      add(std::move(b));
    }
    add(rows_of(L + "proj.weight", {{L + "wo", H, Q, 0, H, r * d.q, d.q}}, out_std));
    if (m.add_bias_linear) vec(L + "proj.bias", H, Init::zeros, sp);
    norm(L + "ln2", sp);
    if (m.is_moe_layer(l)) {   // the router here; the experts in the chunk's expert part
      add(rows_of(L + "router.weight", {{L + "router", m.moe->num_experts, H, 0, m.moe->num_experts, 0, H}}, 0.02f));
      c.params.back().sync = TpSync::replicated;
      if (m.add_bias_linear) vec(L + "router.bias", m.moe->num_experts, Init::zeros, TpSync::replicated);
      return;
    }
    const std::int64_t F = m.ffn_hidden_size;
    std::vector<ParamPart> fc1{{L + "fc1", F, H, r * d.f, d.f, 0, H}};
    std::vector<ParamPart> fc1b{{L + "fc1b", F, 1, r * d.f, d.f, 0, 1}};
    if (d.up == 2) {
      fc1 = {{L + "fc1_gate", F, H, r * d.f, d.f, 0, H}, {L + "fc1_up", F, H, r * d.f, d.f, 0, H}};
      fc1b = {{L + "fc1b_gate", F, 1, r * d.f, d.f, 0, 1}, {L + "fc1b_up", F, 1, r * d.f, d.f, 0, 1}};
    }
    add(rows_of(L + "fc1.weight", fc1, 0.02f));
    if (m.add_bias_linear) {
      Param b = rows_of(L + "fc1.bias", fc1b, 0);
      b.decay = false;
      b.init = Init::zeros;
      add(std::move(b));
    }
    add(rows_of(L + "fc2.weight", {{L + "fc2", H, F, 0, H, r * d.f, d.f}}, out_std));
    if (m.add_bias_linear) vec(L + "fc2.bias", H, Init::zeros, sp);
  }

  // The routed experts [first, first + count) of a layer: per expert its fc1 and fc2.
  void experts(int l, LocalExperts ex) {
    const ModelSpec& m = s.model;
    const std::int64_t H = m.hidden_size, F = m.moe->expert_ffn_hidden;
    const float out_std = 0.02f / std::sqrt(2.0f * static_cast<float>(m.num_layers));
    for (int e = ex.first; e < ex.first + ex.count; ++e) {
      const std::string E = fmt::format("layer.{}.expert.{}.", l, e);
      std::vector<ParamPart> fc1{{E + "fc1", F, H, 0, F, 0, H}};
      if (d.up == 2) fc1 = {{E + "fc1_gate", F, H, 0, F, 0, H}, {E + "fc1_up", F, H, 0, F, 0, H}};
      add(rows_of(E + "fc1.weight", fc1, 0.02f));
      if (m.add_bias_linear) vec(E + "fc1.bias", d.up * F, Init::zeros, TpSync::sharded);
      add(rows_of(E + "fc2.weight", {{E + "fc2", H, F, 0, H, 0, F}}, out_std));
      if (m.add_bias_linear) vec(E + "fc2.bias", H, Init::zeros, TpSync::sharded);
    }
    for (Param& p : c.params) p.expert = true;
  }

  Param word(const std::string& name, const std::string& tensor) {
    return rows_of(name, {{tensor, s.padded_vocab, s.model.hidden_size, d.vocab_start, d.vocab, 0, s.model.hidden_size}},
                   0.02f);
  }
};

void initialise(Chunk& c, std::uint64_t seed, int dp_cp) {
  const std::int64_t padded = (c.size + dp_cp - 1) / dp_cp * dp_cp;
  c.w.assign(static_cast<std::size_t>(padded), 0.0f);
  c.g.assign(static_cast<std::size_t>(padded), 0.0f);
  for (const Param& p : c.params) {
    float* out = c.w.data() + p.offset;
    if (p.init != Init::normal) {
      std::fill(out, out + p.size(), p.init == Init::ones ? 1.0f : 0.0f);
      continue;
    }
    std::int64_t row = 0;
    for (const ParamPart& part : p.parts)
      for (std::int64_t i = 0; i < part.rows; ++i, ++row)
        for (std::int64_t j = 0; j < part.cols; ++j) {
          const auto index = static_cast<std::uint64_t>((part.row0 + i) * part.full_cols + part.col0 + j);
          out[row * p.cols + j] = p.init_std * init_normal(seed, part.tensor, index);
        }
  }
}

}  // namespace

LocalExperts local_experts(const Setup& s, int rank) {
  if (!s.model.moe) return {};
  const RankGrid grid{s.plan.tp, s.plan.cp, s.dp, s.plan.pp, s.etp, s.plan.ep, s.edp};
  const int per = s.model.moe->num_experts / s.plan.ep;
  return {grid.coord(rank).ep * per, per};
}

std::vector<Chunk> make_chunks(const Setup& s, int rank, std::uint64_t seed) {
  const RankGrid grid{s.plan.tp, s.plan.cp, s.dp, s.plan.pp, s.etp, s.plan.ep, s.edp};
  const GridCoord at = grid.coord(rank);
  const LayerShapes d = layer_shapes(s, at.tp);
  std::vector<Chunk> out;
  const auto& chunks = s.chunks.at(static_cast<std::size_t>(at.pp));
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    Chunk c;
    c.index = static_cast<int>(i);
    c.layers = chunks[i];
    c.embedding = chunks[i].embedding;
    c.output = chunks[i].loss;
    Builder b{s, d, c};
    // Backward order: output piece, layers last to first, embedding piece.
    if (c.output) {
      b.norm("final_norm", d.sp ? TpSync::partial : TpSync::replicated);
      if (!s.model.tied_embeddings) {
        b.add(b.word("output.weight", "output"));
      } else if (!s.holds_embedding(at.pp)) {   // a rank holding both ends uses the embedding itself
        Param copy = b.word("output.weight", "wte");
        copy.tied_copy = true;
        b.add(std::move(copy));
      }
    }
    for (int l = c.layers.first + c.layers.count - 1; l >= c.layers.first; --l) b.layer(l);
    if (c.embedding) {
      b.add(b.word("embedding.weight", "wte"));
      if (s.model.position_embedding == PositionEmbedding::learned) {
        Param wpe = b.rows_of("embedding.position", {{"wpe", s.model.seq_length, s.model.hidden_size, 0,
                                                      s.model.seq_length, 0, s.model.hidden_size}},
                              0.02f);
        wpe.sync = TpSync::replicated;
        b.add(std::move(wpe));
      }
    }
    initialise(c, seed, s.dp * s.plan.cp);
    out.push_back(std::move(c));
  }
  if (s.model.moe) {
    const std::size_t dense = out.size();
    for (std::size_t i = 0; i < dense; ++i) {
      Chunk c;
      c.index = static_cast<int>(i);
      c.layers = chunks[i];
      c.expert = true;
      Builder b{s, d, c};
      for (int l = c.layers.first + c.layers.count - 1; l >= c.layers.first; --l)
        if (s.model.is_moe_layer(l)) b.experts(l, local_experts(s, rank));
      initialise(c, seed, s.edp);
      out.push_back(std::move(c));
    }
  }
  return out;
}

}  // namespace megascope::exec
