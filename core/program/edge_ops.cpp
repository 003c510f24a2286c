// The work at the ends of the model (edge_ops.hpp): the embedding, the
// output layer and loss, and the multi-token-prediction depths.
#include "core/program/edge_ops.hpp"

#include <vector>

namespace megascope::detail {

double word_params(const Setup& s) {
  return static_cast<double>(s.padded_vocab) * static_cast<double>(s.model.hidden_size) / s.plan.tp;
}

double tokens_of(const Setup& s) {
  return static_cast<double>(s.seq_length) / s.plan.cp * s.plan.micro_batch_size;
}

namespace {

// The embedding dropout's bytes (read, write and a 1-byte mask per element,
// on the sequence-parallel shard with SP); none without dropout, where
// PyTorch's dropout returns its input. No executor kernel has exactly this
// shape: calibration prices it at the dropout_residual bandwidth, and the
// GPU replay stands in a bias-dropout-add of the nearest byte count.
double embedding_dropout_bytes(const Setup& s, double per_element) {
  if (!(s.model.hidden_dropout > 0)) return 0;
  const double rows = s.sequence_parallel ? tokens_of(s) / s.plan.tp : tokens_of(s);
  return per_element * rows * static_cast<double>(s.model.hidden_size);
}

}  // namespace

// The embedding lookup of one micro-batch, its TP reduction and its dropout
// (charged with the lookup, before the reduction: the same work on the
// compute stream).
std::uint32_t embedding_forward(StageWriter& w, const Setup& s, const OpContext& ctx, Deps deps) {
  const double tokens = tokens_of(s), h = static_cast<double>(s.model.hidden_size);
  std::vector<Kernel> k = {memory(MemoryOp::embedding, 4.0 * tokens * h)};
  if (const double b = embedding_dropout_bytes(s, 5.0); b > 0) k.push_back(memory(MemoryOp::dropout_residual, b));
  std::uint32_t dep = w.compute(OpLabel::embedding, ctx, std::span<const Kernel>(k), deps);
  if (s.plan.tp > 1)
    dep = w.collective(s.sequence_parallel ? OpKind::reduce_scatter : OpKind::all_reduce, Stream::tp, CommGroup::tp,
                       OpLabel::tp_comm, ctx, 2.0 * tokens * h, {dep});
  return dep;
}

// Final norm, output layer and loss of one micro-batch (SP: after gathering the sequence).
std::uint32_t output_forward(StageWriter& w, const Setup& s, const OpContext& ctx, std::optional<std::uint32_t> dep) {
  const double tokens = tokens_of(s), h = static_cast<double>(s.model.hidden_size);
  const std::int64_t T = static_cast<std::int64_t>(tokens);
  const std::int64_t V = s.padded_vocab / s.plan.tp;
  if (s.sequence_parallel)
    dep = w.collective(OpKind::all_gather, Stream::tp, CommGroup::tp, OpLabel::tp_comm, ctx, 2.0 * tokens * h, dep);
  return w.compute(OpLabel::output_loss, ctx,
                   {memory(MemoryOp::norm, 4.0 * tokens * h), gemm(T, V, s.model.hidden_size, s.training.precision),
                    memory(MemoryOp::cross_entropy, kCrossEntropyFwdBytesPerLogit * tokens * static_cast<double>(V))},
                   dep);
}

// Loss and output-layer input gradient, and its TP reduction.
std::uint32_t output_backward(StageWriter& w, const Setup& s, const OpContext& ctx, std::optional<std::uint32_t> dep) {
  const double tokens = tokens_of(s), h = static_cast<double>(s.model.hidden_size);
  const std::int64_t T = static_cast<std::int64_t>(tokens);
  const std::int64_t V = s.padded_vocab / s.plan.tp;
  std::uint32_t out = w.compute(OpLabel::output_loss, ctx,
                                {memory(MemoryOp::cross_entropy, kCrossEntropyBwdBytesPerLogit * tokens * static_cast<double>(V)),
                                 gemm(T, s.model.hidden_size, V, s.training.precision)},
                                dep);
  if (s.plan.tp > 1)
    out = w.collective(s.sequence_parallel ? OpKind::reduce_scatter : OpKind::all_reduce, Stream::tp, CommGroup::tp,
                       OpLabel::tp_comm, ctx, 2.0 * tokens * h, {out});
  return out;
}

namespace {

// Tied embeddings on a single stage: the embedding and the output layer share
// one weight, and so one gradient and one DDP hook.
bool shared_word_weight(const Setup& s) { return s.model.tied_embeddings && s.virtual_stages == 1; }

}  // namespace

// The output layer's weight gradient, and the work around it outside the GEMM:
// without gradient accumulation fusion, its addition to the main gradient
// (for a shared weight, once, with the embedding's); with fusion, a weight
// shared on one stage still returns a zero-filled gradient for autograd to
// sum with the embedding's (Megatron's zero_out_wgrad).
std::uint32_t output_weight(StageWriter& w, const Setup& s, const OpContext& ctx, Deps deps) {
  std::vector<Kernel> k;
  for (int head = 0; head <= s.model.mtp_num_layers; ++head)   // the main head and one per MTP depth
    k.push_back(gemm(s.model.hidden_size, s.padded_vocab / s.plan.tp, static_cast<std::int64_t>(tokens_of(s)),
                     s.training.precision));
  const bool shared = shared_word_weight(s);
  const double per_param = s.plan.grad_accum_fusion ? (shared ? grad_write_bytes(s) : 0.0)
                                                    : (shared ? 0.0 : grad_add_bytes(s));
  if (per_param > 0) k.push_back(memory(MemoryOp::other, per_param * word_params(s)));
  return w.compute(OpLabel::output_loss, ctx, std::span<const Kernel>(k), deps);
}

// The embedding dropout's backward, then the tables' gradients, never fused:
// PyTorch's dense embedding backward adds the micro-batch's rows into a
// zero-filled gradient of the whole local table, and the DDP hook adds that
// to the main gradient, every micro-batch. A word table shared with the
// output layer on this stage first gets the output layer's gradient summed
// in (read both, write one). A learned position table (replicated over TP)
// goes the same way.
std::uint32_t embedding_weight(StageWriter& w, const Setup& s, const OpContext& ctx, Deps deps) {
  std::vector<Kernel> k;
  if (const double b = embedding_dropout_bytes(s, 5.0); b > 0) k.push_back(memory(MemoryOp::dropout_residual, b));
  const double h = static_cast<double>(s.model.hidden_size);
  k.push_back(memory(MemoryOp::embedding, 6.0 * tokens_of(s) * h));
  const double table = grad_write_bytes(s) + grad_add_bytes(s);
  double bytes = table * word_params(s);
  if (shared_word_weight(s)) bytes += 3.0 * grad_write_bytes(s) * word_params(s);
  if (s.model.position_embedding == PositionEmbedding::learned) bytes += table * static_cast<double>(s.model.seq_length) * h;
  k.push_back(memory(MemoryOp::other, bytes));
  return w.compute(OpLabel::embedding, ctx, std::span<const Kernel>(k), deps);
}

// Multi-token prediction (DeepSeek-V3; Megatron-Core's MultiTokenPredictionBlock)
// on the last virtual stage, after the decoder. Depth k (from 0) looks up the
// tokens k + 1 ahead in the stage's copy of the word embedding, normalises
// that and the previous depth's hidden state (on the SP shard), projects
// their concatenation 2h -> h (column-parallel: with SP its input gathered;
// its output gathered over TP, then re-sharded) and runs one transformer
// layer shaped like the model's last, numbered num_layers + k
// (ModelSpec::is_moe_layer). Every depth then has its own head and loss on
// the shared output layer. MTP layers are not recomputed (as the FLOPs and
// memory accounting count them).
int mtp_layer(const Setup& s, int k) { return s.model.num_layers + k; }

namespace {

double mtp_rows(const Setup& s) { return s.sequence_parallel ? tokens_of(s) / s.plan.tp : tokens_of(s); }

}  // namespace

namespace {

std::uint32_t mtp_forward(StageWriter& w, LayerEmitter& layers, const Setup& s, const OpContext& ctx, int k,
                          std::optional<std::uint32_t> dep) {
  const double tokens = tokens_of(s), h = static_cast<double>(s.model.hidden_size), rows = mtp_rows(s);
  const std::int64_t T = static_cast<std::int64_t>(tokens);
  Deps d;
  if (dep) d.push(*dep);
  std::uint32_t x = embedding_forward(w, s, ctx, d);
  x = w.compute(OpLabel::output_loss, ctx,
                {memory(MemoryOp::norm, 4.0 * rows * h), memory(MemoryOp::norm, 4.0 * rows * h),
                 memory(MemoryOp::other, 8.0 * rows * h)},   // enorm, hnorm, the concatenation
                {x});
  if (s.sequence_parallel)
    x = w.collective(OpKind::all_gather, Stream::tp, CommGroup::tp, OpLabel::tp_comm, ctx, 2.0 * tokens * 2.0 * h, {x});
  {
    std::vector<Kernel> proj;
    push_fp8_cast(proj, s, tokens * 2.0 * h);   // the projection's input (FP8)
    proj.push_back(gemm(T, s.model.hidden_size / s.plan.tp, 2 * s.model.hidden_size, s.training.precision));
    x = w.compute(OpLabel::output_loss, ctx, std::span<const Kernel>(proj), {x});
  }
  if (s.plan.tp > 1)
    x = w.collective(OpKind::all_gather, Stream::tp, CommGroup::tp, OpLabel::tp_comm, ctx, 2.0 * tokens * h, {x});
  return layers.forward(mtp_layer(s, k), ctx, x);
}

}  // namespace

// The input gradients of depth k after its layer's: the projection's, its
// input gradient reduced over TP (reduce-scatter with SP), and the norms'.
std::uint32_t mtp_projection_backward(StageWriter& w, const Setup& s, const OpContext& ctx, std::uint32_t dep) {
  const double tokens = tokens_of(s), h = static_cast<double>(s.model.hidden_size), rows = mtp_rows(s);
  const std::int64_t T = static_cast<std::int64_t>(tokens);
  std::vector<Kernel> k;
  push_fp8_cast(k, s, tokens * h / s.plan.tp);   // its output gradient (FP8)
  k.push_back(gemm(T, 2 * s.model.hidden_size, s.model.hidden_size / s.plan.tp, s.training.precision));
  std::uint32_t x = w.compute(OpLabel::output_loss, ctx, std::span<const Kernel>(k), {dep});
  if (s.plan.tp > 1)
    x = w.collective(s.sequence_parallel ? OpKind::reduce_scatter : OpKind::all_reduce, Stream::tp, CommGroup::tp,
                     OpLabel::tp_comm, ctx, 2.0 * tokens * 2.0 * h, {x});
  return w.compute(OpLabel::output_loss, ctx,
                   {memory(MemoryOp::other, 8.0 * rows * h), memory(MemoryOp::norm, 6.0 * rows * h),
                    memory(MemoryOp::norm, 6.0 * rows * h)},
                   {x});
}

// Depth k's weight gradients: its layer's, the projection's, and the table
// gradient of its embedding lookup (every micro-batch, as the first stage's).
std::uint32_t mtp_weight(StageWriter& w, LayerEmitter& layers, const Setup& s, const OpContext& ctx, int k,
                         std::optional<std::uint32_t> deps) {
  const double h = static_cast<double>(s.model.hidden_size);
  std::uint32_t x = layers.backward_weight(mtp_layer(s, k), ctx, deps);
  std::vector<Kernel> kk = {gemm(2 * s.model.hidden_size, s.model.hidden_size / s.plan.tp,
                                 static_cast<std::int64_t>(tokens_of(s)), s.training.precision)};
  if (!s.plan.grad_accum_fusion) kk.push_back(memory(MemoryOp::other, grad_add_bytes(s) * 2.0 * h * h / s.plan.tp));
  x = w.compute(OpLabel::output_loss, ctx, std::span<const Kernel>(kk), {x});
  return embedding_weight(w, s, ctx, {x});
}

namespace {

// The MTP depths in order after `dep` (the decoder's output), each first
// waiting for its bucket's parameter gather where `gates` has one; returns
// the last depth's output.
std::uint32_t mtp_depths(StageWriter& w, LayerEmitter& layers, const Setup& s, const OpContext& ctx,
                         std::optional<std::uint32_t> dep, const std::map<int, std::uint32_t>* gates) {
  for (int k = 0; k < s.model.mtp_num_layers; ++k) {
    if (gates)
      if (auto g = gates->find(mtp_layer(s, k)); g != gates->end()) {
        Deps join;
        if (dep) join.push(*dep);
        join.push(g->second);
        dep = w.compute(OpLabel::attention, ctx, {}, join);   // wait for this bucket's parameters
      }
    dep = mtp_forward(w, layers, s, ctx, k, dep);
  }
  return *dep;
}

}  // namespace

// After the decoder on the last virtual stage: the MTP depths, then every
// head (the MTP depths' and the main one).
std::uint32_t last_stage_forward(StageWriter& w, LayerEmitter& layers, const Setup& s, const OpContext& ctx,
                                 std::optional<std::uint32_t> dep, const std::map<int, std::uint32_t>* gates) {
  if (s.model.mtp_num_layers == 0) return output_forward(w, s, ctx, dep);
  const std::optional<std::uint32_t> decoder = dep;
  std::uint32_t out = mtp_depths(w, layers, s, ctx, dep, gates);
  for (int head = 0; head < s.model.mtp_num_layers; ++head) out = output_forward(w, s, ctx, out);
  Deps both{out};
  if (decoder) both.push(*decoder);
  return output_forward(w, s, ctx, w.compute(OpLabel::output_loss, ctx, {}, both));   // the main head
}

std::uint32_t mtp_stage_forward(StageWriter& w, LayerEmitter& layers, const Setup& s, const OpContext& ctx,
                                std::optional<std::uint32_t> dep, const std::map<int, std::uint32_t>* gates) {
  Deps both{mtp_depths(w, layers, s, ctx, dep, gates)};
  if (dep) both.push(*dep);   // the decoder's output
  return w.compute(OpLabel::output_loss, ctx, {}, both);   // the hidden states of every depth, sent together
}

std::uint32_t heads_forward(StageWriter& w, const Setup& s, const OpContext& ctx, std::optional<std::uint32_t> dep) {
  for (int head = 0; head < s.model.mtp_num_layers; ++head) dep = output_forward(w, s, ctx, dep);
  return output_forward(w, s, ctx, dep);   // the main head
}

}  // namespace megascope::detail
