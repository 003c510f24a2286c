// The ops of one transformer layer on one rank: kernels by shape, TP/CP/EP
// collectives, in Megatron-Core's order. Shapes use T = s/cp x b tokens of a
// micro-batch on a CP rank; with sequence parallelism the norms and dropouts
// run on T/tp tokens and TP uses all-gather / reduce-scatter, otherwise
// all-reduce. GEMM shapes are (m x k) @ (k x n): forward (T, out, in),
// input gradient (T, in, out), weight gradient (in, out, T).
#include <algorithm>
#include <array>
#include <optional>
#include <vector>

#include "core/accounting/params.hpp"
#include "core/program/stage_writer.hpp"

namespace megascope::detail {

namespace {

struct Dims {
  double T;            // tokens of the micro-batch on this CP rank
  double Tsp;          // tokens the norms and dropouts see (T / tp with SP)
  std::int64_t Ti;     // T as an integer, for GEMM shapes
  std::int64_t h;
  int t;               // tp
  bool sp;
  Precision prec;
  std::int64_t qkv_out;  // QKV output width per rank
  std::int64_t core_out; // attention output width per rank (input of the projection)
  std::int64_t up;       // 2 for SwiGLU
};

Dims dims_of(const Setup& s) {
  Dims d{};
  const ModelSpec& m = s.model;
  d.Ti = s.seq_length / s.plan.cp * s.plan.micro_batch_size;
  d.T = static_cast<double>(d.Ti);
  d.t = s.plan.tp;
  d.sp = s.sequence_parallel;
  d.Tsp = d.sp ? d.T / d.t : d.T;
  d.h = m.hidden_size;
  d.prec = s.training.precision;
  d.up = m.activation == Activation::swiglu ? 2 : 1;
  const std::int64_t heads = m.num_attention_heads / d.t;
  if (m.mla) {
    d.qkv_out = heads * (m.mla->qk_head_dim + m.mla->qk_rope_head_dim);
    d.core_out = heads * m.mla->v_head_dim;
  } else {
    const std::int64_t kv_heads = m.num_query_groups >= d.t ? m.num_query_groups / d.t : 1;
    d.qkv_out = m.kv_channels * (heads + 2 * kv_heads);
    d.core_out = heads * m.kv_channels;
  }
  return d;
}

AttentionShape attention_shape(const Setup& s) {
  const ModelSpec& m = s.model;
  AttentionShape a;
  a.batch = s.plan.micro_batch_size;
  a.heads = m.num_attention_heads / s.plan.tp;
  a.kv_heads = m.mla ? a.heads : std::max<std::int64_t>(1, m.num_query_groups / s.plan.tp);
  a.seq_q = s.seq_length / s.plan.cp;   // this CP rank's queries ...
  a.seq_kv = s.seq_length;             // ... against every key (cp_attention_calls splits them as CP runs)
  a.head_dim = m.mla ? m.mla->qk_head_dim + m.mla->qk_rope_head_dim : m.kv_channels;
  a.head_dim_v = m.mla ? m.mla->v_head_dim : 0;
  a.causal = true;
  a.dropout = m.attention_dropout > 0;
  return a;
}

// MLA's up-projections from the latents (the query's, when it has a
// latent, then the keys' and values'), forward direction (m = tokens): also
// what recompute_modules mla_up_proj runs again.
std::vector<GemmShape> mla_up_proj_gemms(const Setup& s, const Dims& d) {
  const ModelSpec& m = s.model;
  const MlaSpec& a = *m.mla;
  const std::int64_t heads = m.num_attention_heads / d.t;
  std::vector<GemmShape> g;
  if (a.q_lora_rank) g.push_back({d.Ti, heads * (a.qk_head_dim + a.qk_rope_head_dim), *a.q_lora_rank});
  g.push_back({d.Ti, heads * (a.qk_head_dim + a.v_head_dim), a.kv_lora_rank});
  return g;
}

// GEMMs of the attention block's projections, forward direction (m = tokens).
std::vector<GemmShape> qkv_gemms(const Setup& s, const Dims& d) {
  const ModelSpec& m = s.model;
  if (!m.mla) return {{d.Ti, d.qkv_out, d.h}};
  const MlaSpec& a = *m.mla;
  const std::int64_t heads = m.num_attention_heads / d.t;
  const std::vector<GemmShape> up = mla_up_proj_gemms(s, d);
  std::vector<GemmShape> g;
  if (a.q_lora_rank) {
    g.push_back({d.Ti, *a.q_lora_rank, d.h});
    g.push_back(up.front());
  } else {
    g.push_back({d.Ti, heads * (a.qk_head_dim + a.qk_rope_head_dim), d.h});
  }
  g.push_back({d.Ti, a.kv_lora_rank + a.qk_rope_head_dim, d.h});
  g.push_back(up.back());
  return g;
}

// A norm's forward over this rank's tokens (SP-sharded), read and written in bf16.
Kernel norm_forward(const Dims& d) { return memory(MemoryOp::norm, 4.0 * d.Tsp * static_cast<double>(d.h)); }

// An MLP's activation forward over `tokens` of width `f` (SwiGLU reads two halves).
Kernel activation_forward(const Dims& d, double tokens, std::int64_t f) {
  return memory(MemoryOp::activation, 2.0 * tokens * static_cast<double>(f * (d.up + 1)));
}

double activation_bytes(const Dims& d) { return 2.0 * d.T * static_cast<double>(d.h); }

// An MLP's forward after its input: fc1, the activation, fc2's input
// quantised (FP8) and fc2, over the layer's tokens at width `f` per rank (the
// dense MLP and the shared experts; the forward and their recomputation).
std::vector<Kernel> mlp_forward(const Setup& s, const Dims& d, std::int64_t f) {
  std::vector<Kernel> k = {gemm(d.Ti, d.up * f, d.h, d.prec), activation_forward(d, d.T, f)};
  push_fp8_cast(k, s, d.T * static_cast<double>(f));
  k.push_back(gemm(d.Ti, d.h, f, d.prec));
  return k;
}

// FP8 training (push_fp8_cast): a linear layer's forward quantises its input
// unless a norm fused with it wrote it (Transformer Engine's LayerNormLinear:
// the dense QKV projection and fc1, whose norms write FP8 row- and
// column-wise at the 16-bit output's cost); its backward quantises its output
// gradient. The linear layer keeps its quantised input for its weight
// gradient, so recomputing the norm or activation that produced it does not
// quantise again. The weights' quantisation runs on a step's first
// micro-batch only and is not counted.

// The backward of a bias-dropout-add (Megatron-Core's fused
// bias_dropout_add): the mask applied to the gradient, or the bias gradient's
// sum. Without dropout and bias the residual's gradient passes through and
// no kernel runs (PyTorch's dropout at p = 0 returns its input).
std::optional<Kernel> bda_backward(const ModelSpec& m, const Dims& d) {
  if (!(m.hidden_dropout > 0) && !m.add_bias_linear) return std::nullopt;
  return memory(MemoryOp::dropout_residual, 4.0 * d.Tsp * static_cast<double>(d.h));
}

// The fused-attention calls of one CP rank, as Megatron-Core runs context
// parallelism through Transformer Engine: the sequence cut into 2 cp chunks
// of c = s / (2 cp) tokens, rank r holding chunks r and 2cp - 1 - r, so that
// every rank does the same causal work, s^2 / (2 cp) query-key pairs.
//   p2p (ring): cp steps; step 0 is causal over the rank's own 2c keys, each
//     later step meets one other rank's keys without a mask, its 2c queries
//     against the earlier half of those keys or its later c queries against
//     all 2c of them (2c^2 pairs either way; priced as 2c queries on c keys).
//   all_gather: every key gathered first, then one causal call per chunk:
//     chunk r's c queries on the (r + 1) c keys up to it, chunk 2cp - 1 - r's
//     on (2cp - r) c; priced at rank 0's shapes (kv c and 2cp c), whose pairs
//     sum to every rank's.
//   a2a: the all-to-alls give each rank the whole sequence for heads / cp of
//     the heads; one causal call.
// Without CP: the one call of attention_shape.
std::vector<AttentionShape> cp_attention_calls(const Setup& s) {
  AttentionShape a = attention_shape(s);
  const int cp = s.plan.cp;
  if (cp == 1) return {a};
  const std::int64_t c = s.seq_length / (2 * cp);
  std::vector<AttentionShape> calls;
  switch (s.plan.cp_comm) {
    case CpCommType::p2p: {
      a.seq_q = a.seq_kv = 2 * c;
      calls.push_back(a);
      AttentionShape other = a;
      other.seq_kv = c;
      other.causal = false;
      calls.insert(calls.end(), static_cast<std::size_t>(cp - 1), other);
      break;
    }
    case CpCommType::all_gather: {
      a.seq_q = c;
      a.seq_kv = c;
      calls.push_back(a);
      a.seq_kv = 2 * cp * c;
      calls.push_back(a);
      break;
    }
    case CpCommType::a2a: {
      a.seq_q = a.seq_kv = s.seq_length;
      a.heads /= cp;
      a.kv_heads = std::max<std::int64_t>(1, a.kv_heads / cp);
      calls.push_back(a);
      break;
    }
  }
  return calls;
}

// Attention core kernels. Fused (flash): one kernel each way per call of
// cp_attention_calls. Unfused (as Megatron-LM ran before fused attention):
// batched QK^T and PV GEMMs over the whole score matrix, fused
// scale-mask-softmax and dropout as memory-bound kernels over its
// E = b x heads x s_q x s_kv elements, and their backwards, all marked
// unfused_attention (priced at the profile's unfused efficiency). In BF16
// whatever the linear layers' precision, as fused attention is (Megatron's
// FP8 recipes keep attention out of FP8).
// A layer with sliding-window attention (ModelSpec::is_window_layer): the
// fused kernels skip the blocks outside the window (AttentionShape::window);
// unfused attention computes the whole score matrix and masks it.
// A packed micro-batch (`load`, variable-length training) scales every
// call's pairs and tiles by its documents' share of a full sequence's: each
// document is split into the 2 cp chunks the full sequence would be, so the
// ring's steps keep their shapes and each does that share of the work.
std::vector<Kernel> attention_kernels(const Setup& s, bool backward, int layer, const MicrobatchLoad* load) {
  constexpr Precision p = Precision::bf16;
  const AttentionShape a = attention_shape(s);
  if (s.plan.attention == AttentionKernel::flash) {
    std::vector<Kernel> k;
    for (AttentionShape call : cp_attention_calls(s)) {
      if (load) {
        call.packed = load->attention;
        call.packed_tiles = load->attention_tiles;
      }
      if (s.model.is_window_layer(layer)) call.window = s.model.window_size;
      k.push_back(attention(backward ? KernelKind::attention_bwd : KernelKind::attention_fwd, call));
    }
    return k;
  }
  const std::int64_t rows_q = a.batch * a.heads * a.seq_q;
  const std::int64_t rows_k = a.batch * a.heads * a.seq_kv;
  const std::int64_t dv = a.head_dim_v > 0 ? a.head_dim_v : a.head_dim;
  const double E = static_cast<double>(rows_q) * static_cast<double>(a.seq_kv);
  const bool dropout = s.model.attention_dropout > 0;
  std::vector<Kernel> k;
  if (!backward) {
    k.push_back(gemm(rows_q, a.seq_kv, a.head_dim, p));                       // S = Q K^T
    k.push_back(memory(MemoryOp::activation, 4.0 * E));                      // scale, mask, softmax
    if (dropout) k.push_back(memory(MemoryOp::dropout_residual, 5.0 * E));    // dropout (+ 1-byte mask)
    k.push_back(gemm(rows_q, dv, a.seq_kv, p));                              // O = P V
  } else {
    k.push_back(gemm(rows_q, a.seq_kv, dv, p));                              // dP = dO V^T
    k.push_back(gemm(rows_k, dv, a.seq_q, p));                               // dV = P^T dO
    if (dropout) k.push_back(memory(MemoryOp::dropout_residual, 5.0 * E));
    k.push_back(memory(MemoryOp::activation, 6.0 * E));                      // softmax backward
    k.push_back(gemm(rows_q, a.head_dim, a.seq_kv, p));                      // dQ = dS K
    k.push_back(gemm(rows_k, a.head_dim, a.seq_q, p));                       // dK = dS^T Q
  }
  for (Kernel& kernel : k) kernel.unfused_attention = true;
  return k;
}

// KV of every CP rank, gathered or passed around the ring: 2 tensors x (s b)
// tokens x KV width x 2 bytes (MLA: the per-head keys and values, K's width
// and V's averaged).
double cp_kv_bytes(const Setup& s, const Dims& d) {
  const AttentionShape a = attention_shape(s);
  const double kv_width = s.model.mla ? static_cast<double>(a.heads * (a.head_dim + s.model.mla->v_head_dim)) / 2.0
                                      : static_cast<double>(a.kv_heads * s.model.kv_channels);
  return 2.0 * 2.0 * d.T * s.plan.cp * kv_width;
}

// All-to-all CP: the bytes of one rank's Q, K and V (`qkv`) or of its
// attention output, in 16 bits (a per-rank buffer: each rank keeps 1/cp of it).
double cp_a2a_bytes(const Setup& s, const Dims& d, bool qkv) {
  const AttentionShape a = attention_shape(s);
  const double dv = static_cast<double>(a.head_dim_v > 0 ? a.head_dim_v : a.head_dim);
  const double width = qkv ? static_cast<double>(a.heads * a.head_dim + a.kv_heads * a.head_dim) +
                                 static_cast<double>(a.kv_heads) * dv
                           : static_cast<double>(a.heads) * dv;
  return 2.0 * d.T * width;
}

bool tp_overlap(const Setup& s) { return s.plan.tp_comm_overlap && s.plan.tp > 1; }

// The EP collectives of an MoE layer, the same kinds in the forward and the
// backward (each direction's gradient takes the other's collective): the
// all-to-all of the busiest rank's top-k copies both ways, or Megatron-LM's
// allgather dispatcher, which gathers every token of the EP group on every
// rank (whatever the routing: the bytes do not follow the load) and
// reduce-scatters the outputs back, or the flex dispatcher (DeepEP): two
// all-to-alls each way, one copy of a token to each other scale-up domain
// holding any of its experts (rails), then one to each other EP rank there
// holding any (domain); the combine takes the same hops back. Both scale
// with the busiest rank's load, as the alltoall's copies do.
struct ExpertExchange {
  struct Hop {
    OpKind out, back;   // dispatch's kind, combine's kind
    CommSpan span;
    double bytes;
  };
  std::array<Hop, 2> hops{};
  int count = 0;        // dispatch runs hops[0..count) in order, combine the reverse
  double received = 0;  // the tokens the (busiest) rank receives, in bytes: what the ETP all-gather gathers
};

ExpertExchange expert_exchange(const Setup& s, double routed, double hb, double dispatch) {
  ExpertExchange x;
  x.received = dispatch;
  const auto hop = [&](OpKind out, OpKind back, CommSpan span, double bytes) {
    if (bytes > 0) x.hops[static_cast<std::size_t>(x.count++)] = {out, back, span, bytes};
  };
  switch (s.plan.moe_dispatcher) {
    case MoeDispatcher::allgather:   // every rank receives every token of the group
      x.received = 2.0 * routed * hb * s.plan.ep;
      hop(OpKind::all_gather, OpKind::reduce_scatter, CommSpan::whole, x.received);
      break;
    case MoeDispatcher::flex: {
      const double token = 2.0 * routed * hb * s.expert_load;
      hop(OpKind::all_to_all, OpKind::all_to_all, CommSpan::rails, token * s.flex_rail_copies);
      hop(OpKind::all_to_all, OpKind::all_to_all, CommSpan::domain, token * s.flex_domain_copies);
      break;
    }
    case MoeDispatcher::alltoall: hop(OpKind::all_to_all, OpKind::all_to_all, CommSpan::whole, dispatch); break;
  }
  return x;
}

// A routed experts' GEMM over `tokens` routed copies (rows m, or the
// reduction k of a weight gradient when `tokens_in_k`): one GEMM per local
// expert on its share of the tokens, as Transformer Engine's GroupedLinear
// runs them (every expert takes an equal share: balanced routing, or the
// busiest rank's load spread over its experts).
Kernel expert_gemm(const Setup& s, std::int64_t m, std::int64_t n, std::int64_t k, Precision p, bool tokens_in_k = false) {
  const std::int64_t local = std::max(1, s.model.moe->num_experts / s.plan.ep);
  std::int64_t& tokens = tokens_in_k ? k : m;
  tokens = (tokens + local - 1) / local;
  Kernel g = gemm(m, n, k, p);
  g.groups = static_cast<std::uint32_t>(local);
  return g;
}

// A dropless MoE layer's token counts go to the host every layer (the
// dispatcher's all-to-all splits and GroupedLinear's per-expert sizes are
// host lists): the host waits for the router, and from there its launches
// pace the GPU. Experts padded to a capacity have fixed shapes and need no
// copy. Every op of such a layer, forward and backward, is host-paced.
bool host_paced(const Setup& s, int layer) {
  return s.model.moe && !s.model.moe->pad_to_capacity && s.model.is_moe_layer(layer);
}

// Megatron-Core's token permutations around the expert exchange (its token
// dispatchers and moe_utils.py), each a gather or a scatter that reads and
// writes the tokens it moves; their backwards move the same bytes.
// - `first`: with the alltoall dispatcher, permute-1 sorts this rank's
//   routed copies by expert before the dispatch, whatever ep is (the
//   grouped GEMMs need them sorted; its inverse after the combine, weighted
//   by the gate, is the layer's `unpermute` kernel). The flex dispatcher's
//   DeepEP kernels send the tokens unsorted, once per destination; the
//   allgather dispatcher sends every token unsorted.
// - `second`: permute-2 sorts what arrived by local expert when the rank
//   holds more than one (sort_chunks_by_idxs, a copy even when one rank
//   sent everything), and unpermute-2 restores the order before the
//   combine; the flex dispatcher permutes what DeepEP delivered into its
//   experts' copies and back, and the allgather dispatcher picks its local
//   experts' tokens out of the gathered buffer and puts them back, however
//   many experts the rank holds.
struct Permutes {
  double first = 0, second = 0;   // bytes read + written by each
};
Permutes permutes(const Setup& s, double own, double tokens, double hb) {
  Permutes p;
  const MoeDispatcher disp = s.plan.moe_dispatcher;
  if (disp == MoeDispatcher::alltoall) p.first = 2.0 * own;
  if (disp != MoeDispatcher::alltoall || s.model.moe->num_experts / s.plan.ep > 1) p.second = 2.0 * 2.0 * tokens * hb;
  return p;
}
void push_permute(std::vector<Kernel>& k, double bytes) {
  if (bytes > 0) k.push_back(memory(MemoryOp::other, bytes));
}

// The exchange's ops out (dispatch) or back (combine) after `dep`, on the EP stream.
std::uint32_t exchange(StageWriter& w, const ExpertExchange& xe, bool out, const OpContext& ctx, std::uint32_t dep) {
  for (int k = 0; k < xe.count; ++k) {
    const ExpertExchange::Hop& h = xe.hops[static_cast<std::size_t>(out ? k : xe.count - 1 - k)];
    dep = w.collective(out ? h.out : h.back, Stream::ep, CommGroup::ep, OpLabel::ep_comm, ctx, h.bytes, {dep}, h.span);
  }
  return dep;
}

// A TP all-gather whose result feeds the next compute. With TP communication
// overlap (Transformer Engine's userbuffers) the gather is split into tp
// chunks pipelined with the GEMM: only the first chunk blocks, the rest runs
// beside the compute on the TP stream.
std::uint32_t gather_for_compute(StageWriter& w, const Setup& s, OpKind kind, const OpContext& ctx, double bytes, Deps deps) {
  if (!tp_overlap(s)) return w.collective(kind, Stream::tp, CommGroup::tp, OpLabel::tp_comm, ctx, bytes, deps);
  const double t = s.plan.tp;
  const std::uint32_t first = w.collective(kind, Stream::tp, CommGroup::tp, OpLabel::tp_comm, ctx, bytes / t, deps);
  w.collective(kind, Stream::tp, CommGroup::tp, OpLabel::tp_comm, ctx, bytes * (t - 1) / t, {first});
  return first;
}

// A compute op followed by the TP reduction of its output (reduce-scatter
// with SP, all-reduce without; none at tp = 1). With overlap, all but the
// last chunk of the reduction runs beside the GEMMs that produce it.
std::uint32_t compute_then_reduce(StageWriter& w, const Setup& s, OpLabel label, const OpContext& ctx,
                                  std::span<const Kernel> kernels, Deps deps, OpKind reduce, double bytes) {
  if (s.plan.tp == 1) return w.compute(label, ctx, kernels, deps);
  if (!tp_overlap(s)) {
    const std::uint32_t c = w.compute(label, ctx, kernels, deps);
    return w.collective(reduce, Stream::tp, CommGroup::tp, OpLabel::tp_comm, ctx, bytes, {c});
  }
  const double t = s.plan.tp;
  w.collective(reduce, Stream::tp, CommGroup::tp, OpLabel::tp_comm, ctx, bytes * (t - 1) / t, deps);
  const std::uint32_t c = w.compute(label, ctx, kernels, deps);
  return w.collective(reduce, Stream::tp, CommGroup::tp, OpLabel::tp_comm, ctx, bytes / t, {c});
}

}  // namespace

template <class Emit>
std::uint32_t LayerEmitter::memo(Pass pass, int layer, bool flag, const OpContext& ctx,
                                 std::optional<std::uint32_t> input_dep, Emit emit) {
  if (loads_) return emit();   // every micro-batch's shapes are its own
  Memo& m = memo_[static_cast<std::size_t>(pass) * 16 + (setup_.model.is_window_layer(layer) ? 8 : 0) +
                  (setup_.model.is_moe_layer(layer) ? 4 : 0) + (flag ? 2 : 0) +
                  (input_dep ? 1 : 0)];
  if (m.ops) return w.replay(*m.ops, ctx, input_dep);
  const std::uint32_t first = w.size();
  const std::uint32_t result = emit();
  if (!m.tried) m.ops = w.record(first, ctx, input_dep, result);
  m.tried = true;
  return result;
}

const Setup& LayerEmitter::setup_for(const OpContext& ctx) {
  const MicrobatchLoad* load = load_of(ctx);
  if (!load || load->tokens <= 0 || load->tokens == setup_.seq_length) return setup_;
  auto it = mb_setups_.find(load->tokens);
  if (it == mb_setups_.end()) {
    Setup copy = setup_;
    copy.seq_length = load->tokens;
    it = mb_setups_.emplace(load->tokens, std::move(copy)).first;
  }
  return it->second;
}

const MicrobatchLoad* LayerEmitter::load_of(const OpContext& ctx) const {
  if (!loads_ || !ctx.microbatch || *ctx.microbatch < 0 || static_cast<std::size_t>(*ctx.microbatch) >= loads_->size())
    return nullptr;
  return &(*loads_)[static_cast<std::size_t>(*ctx.microbatch)];
}

namespace {
// The CP ranks a micro-batch's ring spans: the plan's, or with dynamic CP
// the group its sequences were given (MicrobatchLoad::cp).
int ring_size(const Setup& s, const MicrobatchLoad* load) { return load && load->cp > 0 ? load->cp : s.plan.cp; }
// The KV a ring of `ring` ranks passes around, priced on the plan's CP group:
// each rank forwards the blocks of the ring's other ranks (ring - 1 of
// them, of its own tokens' size), where the plan's ring forwards cp - 1.
double ring_kv_bytes(const Setup& s, const Dims& d, int ring) {
  const double full = cp_kv_bytes(s, d);
  return ring == s.plan.cp ? full : full * static_cast<double>(ring - 1) / static_cast<double>(s.plan.cp - 1);
}
}  // namespace

// The context each pass gives its ops (as the emit_ functions set it).
std::uint32_t LayerEmitter::forward(int layer, const OpContext& ctx_in, std::optional<std::uint32_t> input_dep) {
  OpContext ctx = ctx_in;
  ctx.layer = layer;
  return memo(Pass::forward, layer, false, ctx, input_dep, [&] { return emit_forward(layer, ctx_in, input_dep); });
}

std::uint32_t LayerEmitter::backward_input(int layer, const OpContext& ctx_in, std::optional<std::uint32_t> input_dep,
                                           bool selective) {
  OpContext ctx = ctx_in;
  ctx.layer = layer;
  ctx.phase = Phase::backward_input;
  return memo(Pass::backward_input, layer, selective, ctx, input_dep,
              [&] { return emit_backward_input(layer, ctx_in, input_dep, selective); });
}

std::uint32_t LayerEmitter::backward_weight(int layer, const OpContext& ctx_in, std::optional<std::uint32_t> input_dep) {
  OpContext ctx = ctx_in;
  ctx.layer = layer;
  ctx.phase = Phase::backward_weight;
  return memo(Pass::backward_weight, layer, false, ctx, input_dep,
              [&] { return emit_backward_weight(layer, ctx_in, input_dep); });
}

std::uint32_t LayerEmitter::emit_forward(int layer, const OpContext& ctx_in, std::optional<std::uint32_t> input_dep) {
  const Setup& s = setup_for(ctx_in);   // the micro-batch's (variable-length training) or the builder's
  const Dims d = dims_of(s);
  const ModelSpec& m = s.model;
  OpContext ctx = ctx_in;
  ctx.layer = layer;
  ctx.host_paced = host_paced(s, layer);
  const double act = activation_bytes(d);
  std::optional<std::uint32_t> dep = input_dep;

  // --- attention ---
  const double hb = static_cast<double>(d.h);
  const OpKind tp_out = d.sp ? OpKind::reduce_scatter : OpKind::all_reduce;
  if (d.sp) dep = gather_for_compute(w, s, OpKind::all_gather, ctx, act, dep);
  std::vector<Kernel> qkv;
  qkv.push_back(norm_forward(d));
  for (const GemmShape& g : qkv_gemms(s, d)) {
    // MLA's projections from the hidden state are linear layers of their
    // own after a separate norm (Megatron-Core's MLA): each quantises its input.
    if (m.mla && g.k == d.h) push_fp8_cast(qkv, s, static_cast<double>(g.m) * static_cast<double>(g.k));
    qkv.push_back(gemm(g.m, g.n, g.k, d.prec));
  }
  const MicrobatchLoad* load = load_of(ctx_in);
  const int ring = ring_size(s, load);
  const std::vector<Kernel> core = attention_kernels(s, false, layer, load);
  std::vector<Kernel> proj;   // the projection, its input quantised first in FP8
  push_fp8_cast(proj, s, d.T * static_cast<double>(d.core_out));
  proj.push_back(gemm(d.Ti, d.h, d.core_out, d.prec));
  if (s.plan.cp > 1 && s.plan.cp_comm == CpCommType::a2a) {
    // All-to-all CP: Q, K and V trade their sequence split for a head split
    // before attention, its output trades back before the projection.
    const std::uint32_t c1 = w.compute(OpLabel::attention, ctx, std::span<const Kernel>(qkv), dep);
    const std::uint32_t in = w.collective(OpKind::all_to_all, Stream::cp, CommGroup::cp, OpLabel::cp_comm, ctx,
                                          cp_a2a_bytes(s, d, true), {c1});
    const std::uint32_t c2 = w.compute(OpLabel::attention, ctx, std::span<const Kernel>(core), {in});
    const std::uint32_t out = w.collective(OpKind::all_to_all, Stream::cp, CommGroup::cp, OpLabel::cp_comm, ctx,
                                           cp_a2a_bytes(s, d, false), {c2});
    dep = compute_then_reduce(w, s, OpLabel::attention, ctx, std::span<const Kernel>(proj), {out}, tp_out, act);
  } else if (s.plan.cp > 1 && ring > 1) {
    std::uint32_t c1 = w.compute(OpLabel::attention, ctx, std::span<const Kernel>(qkv), dep);
    const std::uint32_t cpx = w.collective(OpKind::all_gather, Stream::cp, CommGroup::cp, OpLabel::cp_comm, ctx,
                                           ring_kv_bytes(s, d, ring), {c1});
    // Ring (p2p): the exchange overlaps the attention of the blocks already here;
    // all-gather: attention waits for the whole KV.
    const std::uint32_t c2 = s.plan.cp_comm == CpCommType::all_gather
                                 ? w.compute(OpLabel::attention, ctx, std::span<const Kernel>(core), {cpx})
                                 : w.compute(OpLabel::attention, ctx, std::span<const Kernel>(core));
    dep = compute_then_reduce(w, s, OpLabel::attention, ctx, std::span<const Kernel>(proj), {cpx, c2}, tp_out, act);
  } else {
    qkv.insert(qkv.end(), core.begin(), core.end());
    qkv.insert(qkv.end(), proj.begin(), proj.end());
    dep = compute_then_reduce(w, s, OpLabel::attention, ctx, std::span<const Kernel>(qkv), dep, tp_out, act);
  }

  // --- MLP or MoE ---
  // Bias-dropout-add (Megatron-Core's fused bias_dropout_add) after the
  // attention and after the MLP. Each is charged to the compute op before its
  // TP reduction rather than after it: the same work on the compute stream,
  // and each layer (and so each pipeline stage) carries its own two.
  const Kernel pre_drop = memory(MemoryOp::dropout_residual, 6.0 * d.Tsp * hb);
  const Kernel post_drop = pre_drop;
  const Kernel pre_norm = norm_forward(d);
  if (!m.is_moe_layer(layer)) {
    const std::int64_t f = m.ffn_hidden_size / d.t;
    std::vector<Kernel> k;
    if (d.sp) {
      dep = w.compute(OpLabel::mlp, ctx, {pre_drop, pre_norm}, {*dep});
      dep = gather_for_compute(w, s, OpKind::all_gather, ctx, act, {*dep});
    } else {
      k = {pre_drop, pre_norm};
    }
    for (const Kernel& kk : mlp_forward(s, d, f)) k.push_back(kk);   // fc1, activation, fc2
    k.push_back(post_drop);
    dep = compute_then_reduce(w, s, OpLabel::mlp, ctx, std::span<const Kernel>(k), {*dep}, tp_out, act);
    return *dep;
  }
  return emit_moe_forward(ctx, *dep, false);
}

std::uint32_t LayerEmitter::emit_moe_forward(const OpContext& ctx, std::optional<std::uint32_t> dep_in, bool recompute) {
  const Setup& s = setup_for(ctx);   // the micro-batch's (variable-length training) or the builder's
  const Dims d = dims_of(s);
  const ModelSpec& m = s.model;
  const double act = activation_bytes(d);
  const double hb = static_cast<double>(d.h);
  const OpKind tp_out = d.sp ? OpKind::reduce_scatter : OpKind::all_reduce;
  std::optional<std::uint32_t> dep = dep_in;
  // The attention's bias-dropout-add and the norm before the block; the
  // block's own bias-dropout-add after it (emit_forward).
  const Kernel pre_drop = memory(MemoryOp::dropout_residual, 6.0 * d.Tsp * hb);
  const Kernel post_drop = pre_drop;
  const Kernel pre_norm = norm_forward(d);
  const MoeSpec& e = *m.moe;
  const double routed = d.Tsp;                              // tokens this rank routes
  // Tokens its local experts process: top_k x its share, times the busiest
  // rank's load over the mean (Setup::expert_load; 1 when balanced). Every
  // EP rank is priced as the busiest one, which sets when the combine ends.
  const double tokens = routed * e.top_k * s.etp * s.expert_load;
  const std::int64_t fe = e.expert_ffn_hidden / s.etp;
  const auto tok = static_cast<std::int64_t>(tokens);
  const double own = 2.0 * routed * e.top_k * hb;          // bytes of this rank's routed copies
  const Permutes perm = permutes(s, own, tokens, hb);
  {
    std::vector<Kernel> k;
    if (!recompute) k = {pre_drop, pre_norm};
    k.push_back(gemm(static_cast<std::int64_t>(routed), e.num_experts, d.h, Precision::bf16));   // router
    k.push_back(memory(MemoryOp::other, 8.0 * routed * e.num_experts));                          // top-k
    push_permute(k, perm.first);
    dep = w.compute(OpLabel::moe, ctx, std::span<const Kernel>(k), dep);
  }
  const double dispatch = own * s.expert_load;              // bytes the busiest rank receives (and returns)
  const ExpertExchange xe = expert_exchange(s, routed, hb, dispatch);
  // The shared experts: their input quantised (FP8), fc1, the activation
  // and fc2's input quantised (`shared`), then fc2 (`shared_fc2`).
  std::vector<Kernel> shared, shared_fc2;
  if (e.shared_expert_ffn_hidden > 0) {
    push_fp8_cast(shared, s, d.T * hb);
    for (const Kernel& kk : mlp_forward(s, d, e.shared_expert_ffn_hidden / d.t)) shared.push_back(kk);
    shared_fc2.push_back(shared.back());   // fc2 runs apart, after the combine
    shared.pop_back();
  }
  // --moe-shared-expert-overlap: the shared experts' fc1 runs while the
  // dispatch is in flight and their fc2 while the combine is, posted ahead of
  // the routed experts on the compute stream; with TP their gather and
  // reduction go beside the all-to-alls on the TP stream.
  const bool overlap = s.plan.moe_shared_expert_overlap && !shared.empty() && (s.plan.ep > 1 || s.etp > 1);
  std::optional<std::uint32_t> sh;
  if (overlap) sh = d.t > 1 && d.sp ? gather_for_compute(w, s, OpKind::all_gather, ctx, act, {*dep}) : *dep;
  if (s.plan.ep > 1) dep = exchange(w, xe, true, ctx, *dep);
  if (overlap) sh = w.compute(OpLabel::moe, ctx, std::span<const Kernel>(shared), {*sh});
  if (s.etp > 1) dep = w.collective(OpKind::all_gather, Stream::tp, CommGroup::etp, OpLabel::ep_comm, ctx, xe.received * s.etp, {*dep});
  std::vector<Kernel> ek;
  push_permute(ek, perm.second);                                  // permute-2
  push_fp8_cast(ek, s, tokens * hb);                                   // the experts' input
  ek.push_back(expert_gemm(s, tok, d.up * fe, d.h, d.prec));
  ek.push_back(activation_forward(d, tokens, fe));
  push_fp8_cast(ek, s, tokens * static_cast<double>(fe));              // fc2's input
  ek.push_back(expert_gemm(s, tok, d.h, fe, d.prec));
  push_permute(ek, perm.second);                                  // unpermute-2
  // Without TP the shared experts need no collective: they run with the routed ones.
  if (d.t == 1 && !overlap) {
    ek.insert(ek.end(), shared.begin(), shared.end());
    ek.insert(ek.end(), shared_fc2.begin(), shared_fc2.end());
  }
  dep = w.compute(OpLabel::moe, ctx, std::span<const Kernel>(ek), {*dep});
  if (s.etp > 1) dep = w.collective(OpKind::reduce_scatter, Stream::tp, CommGroup::etp, OpLabel::ep_comm, ctx, xe.received * s.etp, {*dep});
  if (s.plan.ep > 1) dep = exchange(w, xe, false, ctx, *dep);
  if (overlap || d.t == 1 || shared.empty()) {
    Deps last{*dep};
    if (overlap) last.push(compute_then_reduce(w, s, OpLabel::moe, ctx, std::span<const Kernel>(shared_fc2), {*sh}, tp_out, act));
    if (recompute) return w.compute(OpLabel::moe, ctx, {memory(MemoryOp::other, 2.0 * own)}, last);
    return w.compute(OpLabel::moe, ctx, {memory(MemoryOp::other, 2.0 * own), post_drop}, last);
  }
  // With TP the shared experts are a TP-split MLP on the layer's input
  // (Megatron-Core's SharedExpertMLP, after the routed tokens are back when
  // not overlapped): its input gathered with SP, its output reduced like the
  // dense MLP's, then added to the routed output.
  if (d.sp) dep = gather_for_compute(w, s, OpKind::all_gather, ctx, act, {*dep});
  shared.insert(shared.end(), shared_fc2.begin(), shared_fc2.end());
  shared.push_back(memory(MemoryOp::other, 2.0 * own));
  if (!recompute) shared.push_back(post_drop);
  return compute_then_reduce(w, s, OpLabel::moe, ctx, std::span<const Kernel>(shared), {*dep}, tp_out, act);
}

std::uint32_t LayerEmitter::emit_backward_input(int layer, const OpContext& ctx_in,
                                                std::optional<std::uint32_t> input_dep, bool selective) {
  const Setup& s = setup_for(ctx_in);   // the micro-batch's (variable-length training) or the builder's
  const Dims d = dims_of(s);
  const ModelSpec& m = s.model;
  // Selective recomputation: each module's forward kernels run again in the
  // backward op that needs their outputs.
  const unsigned modules = selective ? recompute_modules(s.plan.recompute) : 0;
  const bool recomputed_core = modules & kRecomputeCoreAttn;
  const std::optional<Kernel> norm_again = modules & kRecomputeLayernorm ? std::optional(norm_forward(d)) : std::nullopt;
  OpContext ctx = ctx_in;
  ctx.layer = layer;
  ctx.host_paced = host_paced(s, layer);
  ctx.phase = Phase::backward_input;
  const bool tp = d.t > 1;
  const double act = activation_bytes(d);
  const double hb = static_cast<double>(d.h);
  std::optional<std::uint32_t> dep = input_dep;
  const OpKind in_tp = d.sp ? OpKind::all_gather : OpKind::all_reduce;   // gradient of the forward's RS / AR output side
  const OpKind out_tp = d.sp ? OpKind::reduce_scatter : OpKind::all_reduce;

  // --- MLP or MoE backward ---
  if (!m.is_moe_layer(layer)) {
    const std::int64_t f = m.ffn_hidden_size / d.t;
    if (modules & kRecomputeMlp) {
      // The checkpointed MLP's forward again (its norm fused into fc1), TP
      // collectives included, before its gradients.
      if (d.sp) dep = gather_for_compute(w, s, OpKind::all_gather, ctx, act, dep);
      std::vector<Kernel> r = {norm_forward(d)};
      for (const Kernel& kk : mlp_forward(s, d, f)) r.push_back(kk);
      dep = compute_then_reduce(w, s, OpLabel::mlp, ctx, std::span<const Kernel>(r), dep, out_tp, act);
    }
    if (d.sp) dep = gather_for_compute(w, s, in_tp, ctx, act, dep);
    std::vector<Kernel> k;
    if (const auto b = bda_backward(m, d)) k.push_back(*b);   // the MLP's bias-dropout-add
    if (norm_again && !(modules & kRecomputeMlp)) k.push_back(*norm_again);   // the pre-MLP norm's output, for fc1's gradients (mlp: recomputed with it)
    push_fp8_cast(k, s, d.T * hb);                                 // fc2's output gradient
    k.push_back(gemm(d.Ti, f, d.h, d.prec));
    k.push_back(memory(MemoryOp::activation, 2.0 * d.T * static_cast<double>(f) * static_cast<double>(2 * d.up + 1)));
    push_fp8_cast(k, s, d.T * static_cast<double>(d.up * f));      // fc1's output gradient
    k.push_back(gemm(d.Ti, d.h, d.up * f, d.prec));
    dep = compute_then_reduce(w, s, OpLabel::mlp, ctx, std::span<const Kernel>(k), dep, out_tp, act);
  } else {
    const MoeSpec& e = *m.moe;
    // The checkpointed block's forward again, dispatch and combine included;
    // or only the shared experts', their TP collectives included.
    if (modules & kRecomputeMoe) {
      dep = emit_moe_forward(ctx, dep, true);
    } else if ((modules & kRecomputeSharedExperts) && e.shared_expert_ffn_hidden > 0) {
      std::vector<Kernel> r;
      push_fp8_cast(r, s, d.T * hb);
      for (const Kernel& kk : mlp_forward(s, d, e.shared_expert_ffn_hidden / d.t)) r.push_back(kk);
      if (tp && d.sp) dep = gather_for_compute(w, s, OpKind::all_gather, ctx, act, dep);
      dep = tp ? compute_then_reduce(w, s, OpLabel::moe, ctx, std::span<const Kernel>(r), dep, out_tp, act)
               : w.compute(OpLabel::moe, ctx, std::span<const Kernel>(r), dep);
    }
    const double routed = d.Tsp;
    const double tokens = routed * e.top_k * s.etp * s.expert_load;   // the busiest rank's, as in the forward
    const std::int64_t fe = e.expert_ffn_hidden / s.etp;
    const auto tok = static_cast<std::int64_t>(tokens);
    const double own = 2.0 * routed * e.top_k * hb;
    const double dispatch = own * s.expert_load;
    const ExpertExchange xe = expert_exchange(s, routed, hb, dispatch);
    // The shared experts' fc2 and activation gradients (`shared`), then
    // fc1's (`shared_fc1`); each GEMM's output gradient quantised first in FP8.
    std::vector<Kernel> shared, shared_fc1;
    if (e.shared_expert_ffn_hidden > 0) {
      const std::int64_t fs = e.shared_expert_ffn_hidden / d.t;
      push_fp8_cast(shared, s, d.T * hb);
      shared.push_back(gemm(d.Ti, fs, d.h, d.prec));
      shared.push_back(memory(MemoryOp::activation, 2.0 * d.T * static_cast<double>(fs) * static_cast<double>(2 * d.up + 1)));
      push_fp8_cast(shared, s, d.T * static_cast<double>(d.up * fs));
      shared_fc1.push_back(gemm(d.Ti, d.h, d.up * fs, d.prec));
    }
    std::vector<Kernel> unpermute;
    if (const auto b = bda_backward(m, d)) unpermute.push_back(*b);   // the MoE block's bias-dropout-add
    // With the overlap the shared experts' backward runs on their own
    // stream beside the routed path's all-to-alls, as their forward did.
    // Without it, under TP, it runs first (their output was added last): the
    // output gradient gathered with SP, the input gradient reduced. Without
    // TP it runs with the routed experts.
    const bool overlap = s.plan.moe_shared_expert_overlap && !shared.empty() && (s.plan.ep > 1 || s.etp > 1);
    if (!overlap && d.t > 1 && !shared.empty()) {
      if (!unpermute.empty()) dep = w.compute(OpLabel::moe, ctx, std::span<const Kernel>(unpermute), dep);
      unpermute.clear();
      if (d.sp) dep = gather_for_compute(w, s, in_tp, ctx, act, dep);
      shared.insert(shared.end(), shared_fc1.begin(), shared_fc1.end());
      dep = compute_then_reduce(w, s, OpLabel::moe, ctx, std::span<const Kernel>(shared), dep, out_tp, act);
      shared.clear();
      shared_fc1.clear();
    }
    unpermute.push_back(memory(MemoryOp::other, 2.0 * own));
    dep = w.compute(OpLabel::moe, ctx, std::span<const Kernel>(unpermute), dep);
    std::optional<std::uint32_t> sh;
    if (overlap) sh = d.t > 1 && d.sp ? gather_for_compute(w, s, in_tp, ctx, act, {*dep}) : *dep;
    if (s.plan.ep > 1) dep = exchange(w, xe, true, ctx, *dep);
    if (overlap) sh = w.compute(OpLabel::moe, ctx, std::span<const Kernel>(shared), {*sh});
    if (s.etp > 1) dep = w.collective(OpKind::all_gather, Stream::tp, CommGroup::etp, OpLabel::ep_comm, ctx, xe.received * s.etp, {*dep});
    const Permutes perm = permutes(s, own, tokens, hb);
    std::vector<Kernel> ek;
    push_permute(ek, perm.second);                                            // unpermute-2's backward
    if ((modules & kRecomputeMoeAct) && !(modules & kRecomputeMoe))   // the activation's output, fc2's input, before fc2's gradients (moe: recomputed with the block)
      ek.push_back(activation_forward(d, tokens, fe));
    push_fp8_cast(ek, s, tokens * hb);                                             // fc2's output gradient
    ek.push_back(expert_gemm(s, tok, fe, d.h, d.prec));
    ek.push_back(memory(MemoryOp::activation, 2.0 * tokens * static_cast<double>(fe * (2 * d.up + 1))));
    push_fp8_cast(ek, s, tokens * static_cast<double>(d.up * fe));                 // fc1's output gradient
    ek.push_back(expert_gemm(s, tok, d.h, d.up * fe, d.prec));
    push_permute(ek, perm.second);                                            // permute-2's backward
    if (!overlap) {   // tp = 1: beside the routed experts
      ek.insert(ek.end(), shared.begin(), shared.end());
      ek.insert(ek.end(), shared_fc1.begin(), shared_fc1.end());
    }
    dep = w.compute(OpLabel::moe, ctx, std::span<const Kernel>(ek), {*dep});
    if (s.etp > 1) dep = w.collective(OpKind::reduce_scatter, Stream::tp, CommGroup::etp, OpLabel::ep_comm, ctx, xe.received * s.etp, {*dep});
    if (s.plan.ep > 1) dep = exchange(w, xe, false, ctx, *dep);
    Deps router_deps{*dep};
    if (overlap) router_deps.push(compute_then_reduce(w, s, OpLabel::moe, ctx, std::span<const Kernel>(shared_fc1), {*sh}, out_tp, act));
    std::vector<Kernel> router = {gemm(static_cast<std::int64_t>(routed), d.h, e.num_experts, Precision::bf16)};
    if (norm_again) router.insert(router.begin(), *norm_again);   // the pre-MLP norm's output: the router's and experts' input
    push_permute(router, perm.first);                             // permute-1's backward: the copies' gradients summed per token
    dep = w.compute(OpLabel::moe, ctx, std::span<const Kernel>(router), router_deps);
  }

  // --- attention backward ---
  if (d.sp) dep = gather_for_compute(w, s, in_tp, ctx, act, {*dep});
  std::vector<Kernel> k;
  k.push_back(memory(MemoryOp::norm, 6.0 * d.Tsp * hb));            // ln2 backward
  if (const auto b = bda_backward(m, d)) k.push_back(*b);            // the attention's bias-dropout-add
  push_fp8_cast(k, s, d.T * hb);                                          // the projection's output gradient
  k.push_back(gemm(d.Ti, d.core_out, d.h, d.prec));                  // projection dgrad
  if (modules & kRecomputeMlaUpProj)   // the queries, keys and values from their latents
    for (const GemmShape& g : mla_up_proj_gemms(s, d)) k.push_back(gemm(g.m, g.n, g.k, d.prec));
  const bool a2a = s.plan.cp > 1 && s.plan.cp_comm == CpCommType::a2a;
  if (a2a) {   // the output gradient trades its sequence split for the head split first
    dep = w.compute(OpLabel::attention, ctx, std::span<const Kernel>(k), {*dep});
    dep = w.collective(OpKind::all_to_all, Stream::cp, CommGroup::cp, OpLabel::cp_comm, ctx, cp_a2a_bytes(s, d, false), {*dep});
    k.clear();
  }
  const MicrobatchLoad* load = load_of(ctx_in);
  const int ring = ring_size(s, load);
  if (recomputed_core)
    for (const Kernel& kk : attention_kernels(s, false, layer, load)) k.push_back(kk);
  for (const Kernel& kk : attention_kernels(s, true, layer, load)) k.push_back(kk);
  if (a2a) {   // and the gradients of Q, K and V trade back
    dep = w.compute(OpLabel::attention, ctx, std::span<const Kernel>(k), {*dep});
    dep = w.collective(OpKind::all_to_all, Stream::cp, CommGroup::cp, OpLabel::cp_comm, ctx, cp_a2a_bytes(s, d, true), {*dep});
    k.clear();
  }
  if (norm_again) k.push_back(*norm_again);                          // the input norm's output, for the QKV gradients
  for (const GemmShape& g : qkv_gemms(s, d)) {
    push_fp8_cast(k, s, static_cast<double>(g.m) * static_cast<double>(g.n));   // its output gradient
    k.push_back(gemm(g.m, g.k, g.n, d.prec));                              // dgrad: (T, in, out)
  }
  k.push_back(memory(MemoryOp::norm, 6.0 * d.Tsp * hb));            // ln1 backward
  if (s.plan.cp == 1 || a2a || ring == 1)
    return compute_then_reduce(w, s, OpLabel::attention, ctx, std::span<const Kernel>(k), {*dep}, out_tp, act);
  // The gradients of the KV blocks go back to the ranks that own them. The
  // ring (p2p) passes them on step by step beside the attention backward, so
  // the exchange starts with the backward and the layer waits for both;
  // all-gather reduce-scatters them once the gradients are complete.
  const std::uint32_t start = *dep;
  const std::uint32_t c = w.compute(OpLabel::attention, ctx, std::span<const Kernel>(k), {start});
  const std::uint32_t rs = w.collective(OpKind::reduce_scatter, Stream::cp, CommGroup::cp, OpLabel::cp_comm, ctx,
                                        ring_kv_bytes(s, d, ring), {s.plan.cp_comm == CpCommType::p2p ? start : c});
  if (tp) return w.collective(out_tp, Stream::tp, CommGroup::tp, OpLabel::tp_comm, ctx, act, {c, rs});
  return w.compute(OpLabel::attention, ctx, std::span<const Kernel>(), {c, rs});
}

std::uint32_t LayerEmitter::emit_backward_weight(int layer, const OpContext& ctx_in,
                                                 std::optional<std::uint32_t> input_dep) {
  const Setup& s = setup_for(ctx_in);   // the micro-batch's (variable-length training) or the builder's
  const Dims d = dims_of(s);
  const ModelSpec& m = s.model;
  OpContext ctx = ctx_in;
  ctx.layer = layer;
  ctx.host_paced = host_paced(s, layer);
  ctx.phase = Phase::backward_weight;
  std::vector<Kernel> k;
  for (const GemmShape& g : qkv_gemms(s, d)) k.push_back(gemm(g.k, g.n, g.m, d.prec));   // wgrad: (in, out, T)
  k.push_back(gemm(d.core_out, d.h, d.Ti, d.prec));
  if (!m.is_moe_layer(layer)) {
    const std::int64_t f = m.ffn_hidden_size / d.t;
    k.push_back(gemm(d.h, d.up * f, d.Ti, d.prec));
    k.push_back(gemm(f, d.h, d.Ti, d.prec));
  } else {
    const MoeSpec& e = *m.moe;
    const auto tok = static_cast<std::int64_t>(d.Tsp * e.top_k * s.etp * s.expert_load);
    const std::int64_t fe = e.expert_ffn_hidden / s.etp;
    k.push_back(expert_gemm(s, d.h, d.up * fe, tok, d.prec, true));
    k.push_back(expert_gemm(s, fe, d.h, tok, d.prec, true));
    k.push_back(gemm(d.h, e.num_experts, static_cast<std::int64_t>(d.Tsp), Precision::bf16));
    if (e.shared_expert_ffn_hidden > 0) {
      const std::int64_t fs = e.shared_expert_ffn_hidden / d.t;
      k.push_back(gemm(d.h, d.up * fs, d.Ti, d.prec));
      k.push_back(gemm(fs, d.h, d.Ti, d.prec));
    }
  }
  // Without gradient accumulation fusion each of the layer's weight
  // gradients on this rank is added to its main gradient by a separate
  // kernel, every micro-batch.
  if (!s.plan.grad_accum_fusion)
    k.push_back(memory(MemoryOp::other,
                       grad_add_bytes(s) * layer_params(m, layer, Sharding{s.plan.tp, s.etp, s.plan.ep}).total()));
  return w.compute(m.is_moe_layer(layer) ? OpLabel::moe : OpLabel::mlp, ctx, std::span<const Kernel>(k), input_dep);
}

}  // namespace megascope::detail
