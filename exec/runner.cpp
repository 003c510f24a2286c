// The CPU executor: one rank's interpretation of its StageProgram.
//
// Ops run one at a time in the Program's list order (a valid order: every
// dependency points at an earlier op; ranks of a group meet their
// collectives in the same order because they run the same list). Pipeline
// sends are non-blocking; a receive is posted and waited for at its op.
//
// Numerics per op (docs/executor.md): a layer's forward is "attention" then
// "mlp" compute ops with the TP collectives between them exactly as the
// Program lists them; a collective that completes a sublayer also applies
// its bias, dropout and residual add (and in the backward the norm's
// backward), so that every TP rank continues from the reduced values. A few
// small collectives that the Program does not list run inside the op they
// belong to: the vocab-parallel cross-entropy's max and sums (output op), the
// all-gather of the embedding's input gradient with sequence parallelism
// (embedding weight op), the TP sum of sequence-parallel norm/bias gradients
// and the global gradient norm (optimizer op).
#include "exec/runner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>
#include <set>

#include "core/trace.hpp"
#include "exec/comm.hpp"
#include "exec/data.hpp"
#include "exec/mpi_env.hpp"
#include "exec/params.hpp"
#include "kernels/activation.hpp"
#include "kernels/adamw.hpp"
#include "kernels/attention.hpp"
#include "kernels/cross_entropy.hpp"
#include "kernels/dropout.hpp"
#include "kernels/embedding.hpp"
#include "kernels/matmul.hpp"
#include "kernels/norm.hpp"
#include "kernels/rope.hpp"

namespace megascope::exec {

namespace k = megascope::kernels;
using Vec = std::vector<float>;

namespace {

constexpr float kNormEps = 1e-5f;
constexpr float kRopeTheta = 10000.0f;

Vec zeros(std::int64_t n) { return Vec(static_cast<std::size_t>(n), 0.0f); }

// Saved tensors of one layer and micro-batch, from its forward to its weight gradient.
struct LayerActs {
  Vec x_in, ln1_mean, ln1_rstd, a;             // input (T or Ts rows), ln1 stats, ln1 output (T rows)
  Vec q, kk, v, o, lse;                        // attention (q, k after RoPE)
  Vec y;                                       // a sublayer's partial output before its reduction
  Vec x_mid, ln2_mean, ln2_rstd, b;            // after attention; ln2 stats, ln2 output (T rows)
  Vec h1, act;                                 // fc1 output, activation output
  // backward
  Vec dy, dx_mid, dh2, dh1, dproj, dqkv, dtmp;
  int fwd_step = 0, bwd_step = 0;
};

struct EdgeActs {
  Vec e;                  // embedding output before its reduction
  Vec x_full, y, mean, rstd, logits, row_max, sumexp, dyl;
  int out_fwd_step = 0, out_bwd_step = 0, emb_step = 0;
};

enum class Action : std::uint8_t {
  attn_gather, attn, attn_reduce, mlp_pre, mlp_gather, mlp, mlp_reduce,                 // forward
  b_mlp_gather, b_mlp, b_mlp_reduce, b_attn_gather, b_attn, b_attn_reduce               // backward input
};
struct Step {
  OpKind kind;
  Action action;
};

std::vector<Step> forward_steps(int tp, bool sp) {
  if (tp == 1) return {{OpKind::compute, Action::attn}, {OpKind::compute, Action::mlp}};
  if (!sp)
    return {{OpKind::compute, Action::attn},
            {OpKind::all_reduce, Action::attn_reduce},
            {OpKind::compute, Action::mlp},
            {OpKind::all_reduce, Action::mlp_reduce}};
  return {{OpKind::all_gather, Action::attn_gather}, {OpKind::compute, Action::attn},
          {OpKind::reduce_scatter, Action::attn_reduce}, {OpKind::compute, Action::mlp_pre},
          {OpKind::all_gather, Action::mlp_gather}, {OpKind::compute, Action::mlp},
          {OpKind::reduce_scatter, Action::mlp_reduce}};
}

std::vector<Step> backward_steps(int tp, bool sp) {
  if (tp == 1) return {{OpKind::compute, Action::b_mlp}, {OpKind::compute, Action::b_attn}};
  if (!sp)
    return {{OpKind::compute, Action::b_mlp},
            {OpKind::all_reduce, Action::b_mlp_reduce},
            {OpKind::compute, Action::b_attn},
            {OpKind::all_reduce, Action::b_attn_reduce}};
  return {{OpKind::all_gather, Action::b_mlp_gather}, {OpKind::compute, Action::b_mlp},
          {OpKind::reduce_scatter, Action::b_mlp_reduce}, {OpKind::all_gather, Action::b_attn_gather},
          {OpKind::compute, Action::b_attn}, {OpKind::reduce_scatter, Action::b_attn_reduce}};
}

class ProgramMismatch : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Rank {
 public:
  Rank(const Setup& s, const Program& p, const RunOptions& o, const ByteCorpus& data, MpiGroups& groups)
      : s_(s), p_(p), o_(o), data_(data), groups_(groups), me_(groups.world_rank()), at_(p.grid.coord(me_)),
        d_(layer_shapes(s, at_.tp)), stage_(p.of_rank(me_)), fwd_(forward_steps(d_.tp, d_.sp)),
        bwd_(backward_steps(d_.tp, d_.sp)) {
    chunks_ = make_chunks(s, me_, o.seed);
    const int dpcp = s.dp * s.plan.cp;
    distopt_ = s.plan.distributed_optimizer && dpcp > 1;
    dp_rank_ = groups_.get(CommGroup::dp_cp)->rank();
    for (Chunk& c : chunks_) {
      const std::int64_t n = distopt_ ? static_cast<std::int64_t>(c.w.size()) / dpcp : c.size;
      m_.push_back(zeros(n));
      v_.push_back(zeros(n));
    }
    build_tags();
  }

  std::vector<Chunk>& chunks() { return chunks_; }
  std::vector<Vec>& moments_m() { return m_; }
  std::vector<Vec>& moments_v() { return v_; }

  // One training step; returns (local loss sum over tokens, spans).
  void step(int step_index, std::vector<Span>& spans, double& loss_sum, double& grad_norm) {
    step_ = step_index;
    loss_sum_ = 0;
    for (Chunk& c : chunks_) std::fill(c.g.begin(), c.g.end(), 0.0f);
    acts_.clear();
    edges_.clear();
    hidden_.clear();
    grad_.clear();
    reduced_chunks_.clear();
    gathered_chunks_.clear();
    load_batch();
    const auto t0 = std::chrono::steady_clock::now();
    auto now = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    spans.clear();
    for (std::uint32_t i = 0; i < stage_.ops.size(); ++i) {
      const double start = now();
      run_op(i, stage_.ops[i]);
      spans.push_back({me_, i, start, now()});
    }
    p2p_.wait_all(sends_);
    send_buffers_.clear();
    loss_sum = loss_sum_;
    grad_norm = grad_norm_;
  }

 private:
  // ---- data ----
  void load_batch() {
    const std::int64_t S = s_.seq_length, b = s_.plan.micro_batch_size;
    const int m = s_.num_microbatches;
    tokens_.assign(static_cast<std::size_t>(m * b * S), 0);
    targets_.assign(tokens_.size(), 0);
    for (int mb = 0; mb < m; ++mb)
      for (std::int64_t i = 0; i < b; ++i) {
        const std::int64_t sample = first_sample(mb) + i;
        const std::size_t at = static_cast<std::size_t>((mb * b + i) * S);
        data_.sample(step_ - 1, s_.training.global_batch_size, sample, tokens_.data() + at, targets_.data() + at);
      }
    positions_.resize(static_cast<std::size_t>(d_.T));
    for (std::int64_t t = 0; t < d_.T; ++t) positions_[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(t % S);
  }
  // Global index of the first sample of micro-batch `mb` on this rank's DP slice.
  [[nodiscard]] std::int64_t first_sample(int mb) const {
    const std::int64_t per_dp = s_.training.global_batch_size / s_.dp;
    return at_.dp * per_dp + static_cast<std::int64_t>(mb) * s_.plan.micro_batch_size;
  }
  const std::int32_t* tokens(int mb) const { return tokens_.data() + static_cast<std::size_t>(mb) * static_cast<std::size_t>(d_.T); }
  const std::int32_t* targets(int mb) const { return targets_.data() + static_cast<std::size_t>(mb) * static_cast<std::size_t>(d_.T); }

  // Dropout stream of a site: seed per (step, layer, site); offset = global
  // element index of the first row, so any sharding draws the same mask.
  [[nodiscard]] std::uint64_t seed_of(int layer, int site) const {
    return o_.seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(step_) * 1000003ull +
           static_cast<std::uint64_t>(layer + 1) * 7919ull + static_cast<std::uint64_t>(site);
  }
  [[nodiscard]] std::uint64_t offset_of(int mb, std::int64_t row0) const {
    return static_cast<std::uint64_t>((first_sample(mb) * s_.seq_length + row0) * d_.h);
  }
  [[nodiscard]] std::int64_t shard_row0() const { return d_.sp ? d_.tp_rank * d_.Ts : 0; }
  [[nodiscard]] float p_drop() const { return static_cast<float>(s_.model.hidden_dropout); }

  // ---- p2p tags: the rank of an op's 64-bit tag among all tags between the same two ranks ----
  void build_tags() {
    std::map<int, std::set<std::uint64_t>> sends, recvs;
    for (const Op& op : stage_.ops) {
      if (op.kind == OpKind::send) sends[op.peer_stage].insert(op.tag);
      if (op.kind == OpKind::recv) recvs[op.peer_stage].insert(op.tag);
    }
    for (auto& [peer, set] : sends) {
      int i = 0;
      for (std::uint64_t t : set) send_tag_[{peer, t}] = i++;
    }
    for (auto& [peer, set] : recvs) {
      int i = 0;
      for (std::uint64_t t : set) recv_tag_[{peer, t}] = i++;
    }
  }

  // ---- state keyed by (chunk, micro-batch[, layer]) ----
  static std::int64_t key(int chunk, int mb, int layer = -1) {
    return (static_cast<std::int64_t>(chunk) << 40) | (static_cast<std::int64_t>(mb) << 20) | (layer + 1);
  }
  LayerActs& acts(int chunk, int mb, int layer) { return acts_[key(chunk, mb, layer)]; }
  EdgeActs& edge(int chunk, int mb) { return edges_[key(chunk, mb)]; }
  Chunk& chunk(const Op& op) { return chunks_.at(static_cast<std::size_t>(op.chunk.value_or(0))); }
  // The chunk on this rank holding virtual stage `vs`, if any.
  std::optional<int> chunk_of_stage(int vs) const {
    for (const Chunk& c : chunks_)
      if (c.layers.virtual_stage == vs) return c.index;
    return std::nullopt;
  }
  // The activation entering chunk `c` for micro-batch `mb`: set by the
  // embedding, a receive, or handed over by the chunk before it on this rank.
  Vec& hidden_in(int c, int mb) {
    auto it = hidden_.find(key(c, mb));
    if (it != hidden_.end()) return it->second;
    const int vs = chunks_[static_cast<std::size_t>(c)].layers.virtual_stage;
    if (auto prev = chunk_of_stage(vs - 1); vs > 0 && prev) {   // handed over on this rank
      auto p = hidden_out_.find(key(*prev, mb));
      if (p != hidden_out_.end()) {
        Vec v = std::move(p->second);
        hidden_out_.erase(p);
        return hidden_[key(c, mb)] = std::move(v);
      }
    }
    throw ProgramMismatch(fmt::format("no input activation for chunk {} micro-batch {}", c, mb));
  }
  Vec& grad_in(int c, int mb) {
    auto it = grad_.find(key(c, mb));
    if (it != grad_.end()) return it->second;
    const int vs = chunks_[static_cast<std::size_t>(c)].layers.virtual_stage;
    if (auto next = chunk_of_stage(vs + 1); next) {
      auto p = grad_.find(key(*next, mb));
      if (p != grad_.end()) return grad_[key(c, mb)] = p->second;
    }
    throw ProgramMismatch(fmt::format("no output gradient for chunk {} micro-batch {}", c, mb));
  }

  // ---- dispatch ----
  void run_op(std::uint32_t index, const Op& op) {
    try {
      dispatch(op);
    } catch (const ProgramMismatch& e) {
      throw ProgramMismatch(fmt::format("rank {} op {} ({} {} {}): {}", me_, index, to_string(op.phase),
                                        to_string(op.label), to_string(op.kind), e.what()));
    }
  }

  void dispatch(const Op& op) {
    if (op.kind == OpKind::send || op.kind == OpKind::recv) return p2p(op);
    const int c = op.chunk.value_or(0);
    const int mb = op.microbatch.value_or(0);
    switch (op.phase) {
      case Phase::forward:
      case Phase::recompute:
        if (op.layer) return layer_forward(op, c, mb, *op.layer, op.phase == Phase::recompute);
        if (op.label == OpLabel::embedding) return embedding_forward(op, c, mb);
        if (op.label == OpLabel::output_loss) return output_forward(op, c, mb);
        if (op.label == OpLabel::tp_comm)   // the embedding's reduction, or the output's gather
          return edge(c, mb).e.empty() ? output_forward(op, c, mb) : embedding_forward(op, c, mb);
        if (op.kind == OpKind::compute && op.kernel_count == 0) return;   // a gate: waits only
        break;
      case Phase::backward_input:
        if (op.layer) return layer_backward(op, c, mb, *op.layer);
        if (op.label == OpLabel::output_loss || op.label == OpLabel::tp_comm) return output_backward(op, c, mb);
        break;
      case Phase::backward_weight:
        if (op.layer) return layer_weight(c, mb, *op.layer);
        if (op.label == OpLabel::output_loss) return output_weight(c, mb);
        if (op.label == OpLabel::embedding) return embedding_weight(c, mb);
        break;
      case Phase::gradient_sync:
        if (op.label == OpLabel::dp_grad) return grad_sync(op);
        if (op.label == OpLabel::embedding_grad) return embedding_grad_sync();
        break;
      case Phase::optimizer:
        return optimizer();
      case Phase::param_sync:
        return param_sync(op);
    }
    throw ProgramMismatch("an op the executor does not know");
  }

  Communicator& tp() { return *groups_.get(CommGroup::tp); }

  // ---- pipeline transfers ----
  void p2p(const Op& op) {
    const int c = op.chunk.value_or(0);
    const int mb = op.microbatch.value_or(0);
    const int peer = p_.grid.on_stage(me_, op.peer_stage);
    const std::int64_t n = d_.Ts * d_.h;
    const bool activation = op.label == OpLabel::pp_activation;
    if (op.kind == OpKind::send) {
      const Vec& src = activation ? hidden_out_.at(key(c, mb)) : grad_in(c, mb);
      MEGASCOPE_CHECK(static_cast<std::int64_t>(src.size()) == n, "pipeline tensor of the wrong size");
      send_buffers_.push_back(std::make_unique<Vec>(src));
      sends_.push_back(p2p_.send(send_buffers_.back()->data(), n, peer, send_tag_.at({op.peer_stage, op.tag})));
      if (activation) hidden_out_.erase(key(c, mb));
      else grad_.erase(key(c, mb));
      return;
    }
    Vec buf = zeros(n);
    auto req = p2p_.recv(buf.data(), n, peer, recv_tag_.at({op.peer_stage, op.tag}));
    if (!p2p_.wait(req, o_.recv_timeout_s)) {
      std::fprintf(stderr, "megascope run: rank %d: no %s from rank %d (pipeline stage %d) after %.0f s; "
                   "that rank has stopped or hangs. Aborting the job.\n",
                   me_, activation ? "activation" : "gradient", peer, op.peer_stage, o_.recv_timeout_s);
      MpiEnv::get().abort(4);
    }
    if (activation) hidden_[key(c, mb)] = std::move(buf);
    else grad_[key(c, mb)] = std::move(buf);
  }

  // ---- helpers on sublayer outputs ----
  // x_out = x + dropout(y + bias) over `rows` rows starting at row0 of the micro-batch.
  void bda(Vec& out, const Vec& y, const float* bias, const Vec& x, std::int64_t rows, int layer, int site, int mb,
           std::int64_t row0) {
    out.resize(static_cast<std::size_t>(rows * d_.h));
    k::bias_dropout_add_forward(out.data(), y.data(), bias, x.data(), rows, d_.h, p_drop(), seed_of(layer, site),
                                offset_of(mb, row0));
  }
  void bda_backward(Vec& dy_in, const Vec& dout, float* dbias, std::int64_t rows, int layer, int site, int mb,
                    std::int64_t row0) {
    dy_in.resize(static_cast<std::size_t>(rows * d_.h));
    k::bias_dropout_add_backward(dy_in.data(), dbias, dout.data(), rows, d_.h, p_drop(), seed_of(layer, site),
                                 offset_of(mb, row0));
  }
  void norm_forward(Vec& out, Vec& mean, Vec& rstd, const Vec& in, const float* w, const float* b, std::int64_t rows) {
    out.resize(static_cast<std::size_t>(rows * d_.h));
    rstd.resize(static_cast<std::size_t>(rows));
    if (s_.model.norm == Norm::layernorm) {
      mean.resize(static_cast<std::size_t>(rows));
      k::layernorm_forward(out.data(), mean.data(), rstd.data(), in.data(), w, b, rows, d_.h, kNormEps);
    } else {
      k::rmsnorm_forward(out.data(), rstd.data(), in.data(), w, rows, d_.h, kNormEps);
    }
  }
  // dx += norm_backward(dout).
  void norm_backward_add(Vec& dx, const Vec& dout, const Vec& in, const Vec& mean, const Vec& rstd, const float* w,
                         float* dw, float* db, std::int64_t rows) {
    Vec tmp = zeros(rows * d_.h);
    if (s_.model.norm == Norm::layernorm)
      k::layernorm_backward(tmp.data(), dw, db, dout.data(), in.data(), w, mean.data(), rstd.data(), rows, d_.h);
    else
      k::rmsnorm_backward(tmp.data(), dw, dout.data(), in.data(), w, rstd.data(), rows, d_.h);
    for (std::size_t i = 0; i < dx.size(); ++i) dx[i] += tmp[i];
  }
  void gather_rows(Vec& full, const Vec& shard) {
    full.resize(static_cast<std::size_t>(d_.T * d_.h));
    tp().all_gather(full.data(), shard.data(), d_.Ts * d_.h);
  }
  void scatter_rows(Vec& shard, const Vec& full) {
    shard.resize(static_cast<std::size_t>(d_.Ts * d_.h));
    tp().reduce_scatter(shard.data(), full.data(), d_.Ts * d_.h);
  }

  struct LW {
    float *ln1w, *ln1b, *qkvw, *qkvb, *projw, *projb, *ln2w, *ln2b, *fc1w, *fc1b, *fc2w, *fc2b;
  };
  LW weights(Chunk& c, int l, bool grads) {
    const std::string L = fmt::format("layer.{}.", l);
    auto get = [&](const char* n) { return grads ? c.grad(L + n) : c.weight(L + n); };
    return {get("ln1.weight"), get("ln1.bias"), get("qkv.weight"), get("qkv.bias"), get("proj.weight"),
            get("proj.bias"),  get("ln2.weight"), get("ln2.bias"), get("fc1.weight"), get("fc1.bias"),
            get("fc2.weight"), get("fc2.bias")};
  }

  // ---- a transformer layer ----
  void layer_forward(const Op& op, int c, int mb, int l, bool recompute) {
    LayerActs& A = acts(c, mb, l);
    if (!recompute && A.fwd_step == 0) {
      // The layer's input: the chunk's running activation.
      A.x_in = (l == chunks_[static_cast<std::size_t>(c)].layers.first) ? hidden_in(c, mb) : hidden_out_.at(key(c, mb));
    }
    if (recompute && A.fwd_step == static_cast<int>(fwd_.size())) A.fwd_step = 0;   // a recompute pass starts
    if (A.fwd_step >= static_cast<int>(fwd_.size())) throw ProgramMismatch("more forward ops than the layer has");
    const Step st = fwd_[static_cast<std::size_t>(A.fwd_step++)];
    if (st.kind != op.kind) throw ProgramMismatch(fmt::format("expected a {} here", to_string(st.kind)));
    Chunk& ch = chunks_[static_cast<std::size_t>(c)];
    const LW w = weights(ch, l, false);
    const std::int64_t T = d_.T, Ts = d_.Ts, h = d_.h;
    switch (st.action) {
      case Action::attn_gather: {
        Vec a_shard;
        norm_forward(a_shard, A.ln1_mean, A.ln1_rstd, A.x_in, w.ln1w, w.ln1b, Ts);
        gather_rows(A.a, a_shard);
        break;
      }
      case Action::attn: {
        if (!d_.sp) norm_forward(A.a, A.ln1_mean, A.ln1_rstd, A.x_in, w.ln1w, w.ln1b, T);
        const std::int64_t width = d_.q + 2 * d_.kv;
        Vec qkv = zeros(T * width);
        k::matmul_forward(qkv.data(), A.a.data(), w.qkvw, w.qkvb, T, h, width);
        A.q = zeros(T * d_.q);
        A.kk = zeros(T * d_.kv);
        A.v = zeros(T * d_.kv);
        for (std::int64_t t = 0; t < T; ++t) {
          const float* row = qkv.data() + t * width;
          std::copy(row, row + d_.q, A.q.data() + t * d_.q);
          std::copy(row + d_.q, row + d_.q + d_.kv, A.kk.data() + t * d_.kv);
          std::copy(row + d_.q + d_.kv, row + width, A.v.data() + t * d_.kv);
        }
        const std::int64_t B = s_.plan.micro_batch_size, S = s_.seq_length;
        if (s_.model.position_embedding == PositionEmbedding::rope) {
          k::rope_forward(A.q.data(), A.q.data(), nullptr, B, S, d_.hq, d_.d, kRopeTheta);
          k::rope_forward(A.kk.data(), A.kk.data(), nullptr, B, S, d_.hkv, d_.d, kRopeTheta);
        }
        A.o = zeros(T * d_.q);
        A.lse = zeros(B * d_.hq * S);
        k::attention_forward(A.o.data(), A.lse.data(), A.q.data(), A.kk.data(), A.v.data(), nullptr, nullptr, B, S, S,
                             d_.hq, d_.hkv, d_.d);
        A.y = zeros(T * h);
        k::matmul_forward(A.y.data(), A.o.data(), w.projw, nullptr, T, d_.q, h);
        if (d_.tp == 1) bda(A.x_mid, A.y, w.projb, A.x_in, T, l, 0, mb, 0);
        break;
      }
      case Action::attn_reduce: {
        if (op.kind == OpKind::all_reduce) {
          tp().all_reduce(A.y.data(), T * h);
          bda(A.x_mid, A.y, w.projb, A.x_in, T, l, 0, mb, 0);
        } else {
          Vec ys;
          scatter_rows(ys, A.y);
          bda(A.x_mid, ys, w.projb, A.x_in, Ts, l, 0, mb, shard_row0());
        }
        break;
      }
      case Action::mlp_pre: {
        Vec b_shard;
        norm_forward(b_shard, A.ln2_mean, A.ln2_rstd, A.x_mid, w.ln2w, w.ln2b, Ts);
        A.b = std::move(b_shard);   // gathered by the next op
        break;
      }
      case Action::mlp_gather: {
        Vec shard = std::move(A.b);
        gather_rows(A.b, shard);
        break;
      }
      case Action::mlp: {
        if (!d_.sp) norm_forward(A.b, A.ln2_mean, A.ln2_rstd, A.x_mid, w.ln2w, w.ln2b, T);
        A.h1 = zeros(T * d_.up * d_.f);
        k::matmul_forward(A.h1.data(), A.b.data(), w.fc1w, w.fc1b, T, h, d_.up * d_.f);
        A.act = zeros(T * d_.f);
        if (d_.up == 2) k::swiglu_forward(A.act.data(), A.h1.data(), T, d_.f);
        else k::gelu_forward(A.act.data(), A.h1.data(), T * d_.f);
        A.y = zeros(T * h);
        k::matmul_forward(A.y.data(), A.act.data(), w.fc2w, nullptr, T, d_.f, h);
        if (d_.tp == 1) finish_layer(A, c, mb, l, recompute, A.y, T, 0);
        break;
      }
      case Action::mlp_reduce: {
        if (op.kind == OpKind::all_reduce) {
          tp().all_reduce(A.y.data(), T * h);
          finish_layer(A, c, mb, l, recompute, A.y, T, 0);
        } else {
          Vec ys;
          scatter_rows(ys, A.y);
          finish_layer(A, c, mb, l, recompute, ys, Ts, shard_row0());
        }
        break;
      }
      default:
        throw ProgramMismatch("a backward step in the forward");
    }
  }

  void finish_layer(LayerActs& A, int c, int mb, int l, bool recompute, const Vec& y, std::int64_t rows,
                    std::int64_t row0) {
    const LW w = weights(chunks_[static_cast<std::size_t>(c)], l, false);
    Vec out;
    bda(out, y, w.fc2b, A.x_mid, rows, l, 1, mb, row0);
    A.y.clear();
    if (!recompute) hidden_out_[key(c, mb)] = std::move(out);
  }

  void layer_backward(const Op& op, int c, int mb, int l) {
    LayerActs& A = acts(c, mb, l);
    if (A.bwd_step == 0) A.dy = grad_in(c, mb);
    if (A.bwd_step >= static_cast<int>(bwd_.size())) throw ProgramMismatch("more backward ops than the layer has");
    const Step st = bwd_[static_cast<std::size_t>(A.bwd_step++)];
    if (st.kind != op.kind) throw ProgramMismatch(fmt::format("expected a {} here", to_string(st.kind)));
    Chunk& ch = chunks_[static_cast<std::size_t>(c)];
    const LW w = weights(ch, l, false);
    const LW g = weights(ch, l, true);
    const std::int64_t T = d_.T, Ts = d_.Ts, h = d_.h;
    switch (st.action) {
      case Action::b_mlp_gather: {
        Vec shard;
        bda_backward(shard, A.dy, g.fc2b, Ts, l, 1, mb, shard_row0());
        gather_rows(A.dh2, shard);
        break;
      }
      case Action::b_mlp: {
        if (!d_.sp) bda_backward(A.dh2, A.dy, g.fc2b, T, l, 1, mb, 0);
        Vec dact = zeros(T * d_.f);
        k::matmul_backward_input(dact.data(), A.dh2.data(), w.fc2w, T, d_.f, h);
        A.dh1 = zeros(T * d_.up * d_.f);
        if (d_.up == 2) k::swiglu_backward(A.dh1.data(), A.h1.data(), dact.data(), T, d_.f);
        else k::gelu_backward(A.dh1.data(), A.h1.data(), dact.data(), T * d_.f);
        A.dtmp = zeros(T * h);
        k::matmul_backward_input(A.dtmp.data(), A.dh1.data(), w.fc1w, T, h, d_.up * d_.f);
        if (d_.tp == 1) mlp_norm_backward(A, w, g, A.dtmp, T);
        break;
      }
      case Action::b_mlp_reduce: {
        if (op.kind == OpKind::all_reduce) {
          tp().all_reduce(A.dtmp.data(), T * h);
          mlp_norm_backward(A, w, g, A.dtmp, T);
        } else {
          Vec ds;
          scatter_rows(ds, A.dtmp);
          mlp_norm_backward(A, w, g, ds, Ts);
        }
        A.dtmp.clear();
        break;
      }
      case Action::b_attn_gather: {
        Vec shard;
        bda_backward(shard, A.dx_mid, g.projb, Ts, l, 0, mb, shard_row0());
        gather_rows(A.dproj, shard);
        break;
      }
      case Action::b_attn: {
        if (!d_.sp) bda_backward(A.dproj, A.dx_mid, g.projb, T, l, 0, mb, 0);
        Vec dO = zeros(T * d_.q);
        k::matmul_backward_input(dO.data(), A.dproj.data(), w.projw, T, d_.q, h);
        const std::int64_t B = s_.plan.micro_batch_size, S = s_.seq_length;
        Vec dq = zeros(T * d_.q), dk = zeros(T * d_.kv), dv = zeros(T * d_.kv);
        k::attention_backward(dq.data(), dk.data(), dv.data(), dO.data(), A.q.data(), A.kk.data(), A.v.data(),
                              A.o.data(), A.lse.data(), nullptr, nullptr, B, S, S, d_.hq, d_.hkv, d_.d);
        if (s_.model.position_embedding == PositionEmbedding::rope) {
          k::rope_backward(dq.data(), dq.data(), nullptr, B, S, d_.hq, d_.d, kRopeTheta);
          k::rope_backward(dk.data(), dk.data(), nullptr, B, S, d_.hkv, d_.d, kRopeTheta);
        }
        const std::int64_t width = d_.q + 2 * d_.kv;
        A.dqkv = zeros(T * width);
        for (std::int64_t t = 0; t < T; ++t) {
          float* row = A.dqkv.data() + t * width;
          std::copy(dq.data() + t * d_.q, dq.data() + (t + 1) * d_.q, row);
          std::copy(dk.data() + t * d_.kv, dk.data() + (t + 1) * d_.kv, row + d_.q);
          std::copy(dv.data() + t * d_.kv, dv.data() + (t + 1) * d_.kv, row + d_.q + d_.kv);
        }
        A.dtmp = zeros(T * h);
        k::matmul_backward_input(A.dtmp.data(), A.dqkv.data(), w.qkvw, T, h, width);
        if (d_.tp == 1) attn_norm_backward(A, c, mb, w, g, A.dtmp, T);
        break;
      }
      case Action::b_attn_reduce: {
        if (op.kind == OpKind::all_reduce) {
          tp().all_reduce(A.dtmp.data(), T * h);
          attn_norm_backward(A, c, mb, w, g, A.dtmp, T);
        } else {
          Vec ds;
          scatter_rows(ds, A.dtmp);
          attn_norm_backward(A, c, mb, w, g, ds, Ts);
        }
        A.dtmp.clear();
        break;
      }
      default:
        throw ProgramMismatch("a forward step in the backward");
    }
  }

  void mlp_norm_backward(LayerActs& A, const LW& w, const LW& g, const Vec& db, std::int64_t rows) {
    A.dx_mid = A.dy;
    norm_backward_add(A.dx_mid, db, A.x_mid, A.ln2_mean, A.ln2_rstd, w.ln2w, g.ln2w, g.ln2b, rows);
  }
  void attn_norm_backward(LayerActs& A, int c, int mb, const LW& w, const LW& g, const Vec& da, std::int64_t rows) {
    Vec dx = A.dx_mid;
    norm_backward_add(dx, da, A.x_in, A.ln1_mean, A.ln1_rstd, w.ln1w, g.ln1w, g.ln1b, rows);
    grad_[key(c, mb)] = std::move(dx);
  }

  void layer_weight(int c, int mb, int l) {
    auto it = acts_.find(key(c, mb, l));
    if (it == acts_.end()) throw ProgramMismatch("weight gradient before the layer's backward");
    LayerActs& A = it->second;
    const LW g = weights(chunks_[static_cast<std::size_t>(c)], l, true);
    const std::int64_t T = d_.T, h = d_.h;
    k::matmul_backward_weight(g.fc2w, static_cast<float*>(nullptr), A.dh2.data(), A.act.data(), T, d_.f, h);
    k::matmul_backward_weight(g.fc1w, g.fc1b, A.dh1.data(), A.b.data(), T, h, d_.up * d_.f);
    k::matmul_backward_weight(g.projw, static_cast<float*>(nullptr), A.dproj.data(), A.o.data(), T, d_.q, h);
    k::matmul_backward_weight(g.qkvw, g.qkvb, A.dqkv.data(), A.a.data(), T, h, d_.q + 2 * d_.kv);
    acts_.erase(it);
  }

  // ---- the ends of the model ----
  void embedding_forward(const Op& op, int c, int mb) {
    EdgeActs& E = edge(c, mb);
    Chunk& ch = chunks_[static_cast<std::size_t>(c)];
    if (op.kind == OpKind::compute) {
      E.e = zeros(d_.T * d_.h);
      k::embedding_forward(E.e.data(), tokens(mb), ch.weight("embedding.weight"), static_cast<const float*>(nullptr),
                           static_cast<const std::int32_t*>(nullptr), d_.T, d_.h, d_.vocab_start,
                           d_.vocab_start + d_.vocab);
      if (d_.tp == 1) embedding_finish(ch, E.e, c, mb, d_.T, 0);
    } else if (op.kind == OpKind::all_reduce) {
      tp().all_reduce(E.e.data(), d_.T * d_.h);
      embedding_finish(ch, E.e, c, mb, d_.T, 0);
    } else {
      Vec es;
      scatter_rows(es, E.e);
      embedding_finish(ch, es, c, mb, d_.Ts, shard_row0());
    }
    if (op.kind != OpKind::compute || d_.tp == 1) E.e.clear();
  }
  // Adds the position embedding of rows [row0, row0+rows) and applies the embedding dropout.
  void embedding_finish(Chunk& ch, Vec& e, int c, int mb, std::int64_t rows, std::int64_t row0) {
    if (const float* wpe = ch.weight("embedding.position"))
      for (std::int64_t r = 0; r < rows; ++r) {
        const std::int64_t pos = positions_[static_cast<std::size_t>(row0 + r)];
        for (std::int64_t j = 0; j < d_.h; ++j) e[static_cast<std::size_t>(r * d_.h + j)] += wpe[pos * d_.h + j];
      }
    Vec x(e.size());
    k::dropout_forward(x.data(), e.data(), rows * d_.h, p_drop(), seed_of(-1, 2), offset_of(mb, row0));
    hidden_[key(c, mb)] = std::move(x);
  }

  void embedding_weight(int c, int mb) {
    Chunk& ch = chunks_[static_cast<std::size_t>(c)];
    Vec dx = grad_in(c, mb);
    Vec de(dx.size());
    k::dropout_backward(de.data(), dx.data(), static_cast<std::int64_t>(dx.size()), p_drop(), seed_of(-1, 2),
                        offset_of(mb, shard_row0()));
    if (d_.sp) {   // the embedding's input gradient for every token (not a Program op)
      Vec full;
      gather_rows(full, de);
      de = std::move(full);
    }
    k::embedding_backward(ch.grad("embedding.weight"), ch.grad("embedding.position"), de.data(), tokens(mb),
                          positions_.data(), d_.T, d_.h, d_.vocab_start, d_.vocab_start + d_.vocab);
    grad_.erase(key(c, mb));
  }

  // The output layer's weight: its own, the last stage's tied copy, or the
  // embedding itself when this rank holds both ends of the model.
  float* output_weight_ptr(Chunk& ch, bool grad) {
    if (ch.find("output.weight")) return grad ? ch.grad("output.weight") : ch.weight("output.weight");
    for (Chunk& other : chunks_)
      if (other.find("embedding.weight")) return grad ? other.grad("embedding.weight") : other.weight("embedding.weight");
    throw ProgramMismatch("no output weight on the last stage");
  }

  void output_forward(const Op& op, int c, int mb) {
    EdgeActs& E = edge(c, mb);
    Chunk& ch = chunks_[static_cast<std::size_t>(c)];
    const std::int64_t T = d_.T, h = d_.h, V = d_.vocab;
    const Vec& x = hidden_out_or_in(c, mb);
    if (op.kind == OpKind::all_gather) {
      gather_rows(E.x_full, x);
      return;
    }
    if (!d_.sp) E.x_full = x;
    norm_forward(E.y, E.mean, E.rstd, E.x_full, ch.weight("final_norm.weight"), ch.weight("final_norm.bias"), T);
    E.logits = zeros(T * V);
    k::matmul_forward(E.logits.data(), E.y.data(), output_weight_ptr(ch, false), nullptr, T, h, V);
    E.row_max = zeros(T);
    k::cross_entropy_local_max(E.row_max.data(), E.logits.data(), T, V);
    if (d_.tp > 1) tp().all_reduce(E.row_max.data(), T, ReduceOp::max);
    Vec sums = zeros(2 * T);
    k::cross_entropy_local_sumexp(sums.data(), E.logits.data(), E.row_max.data(), T, V);
    k::cross_entropy_local_target(sums.data() + T, E.logits.data(), targets(mb), T, V, d_.vocab_start);
    if (d_.tp > 1) tp().all_reduce(sums.data(), 2 * T);
    E.sumexp.assign(sums.begin(), sums.begin() + T);
    Vec loss = zeros(T);
    k::cross_entropy_loss(loss.data(), E.row_max.data(), E.sumexp.data(), sums.data() + T, T);
    if (d_.tp_rank == 0)
      for (float l : loss) loss_sum_ += l;
    hidden_out_.erase(key(c, mb));
  }
  const Vec& hidden_out_or_in(int c, int mb) {
    auto it = hidden_out_.find(key(c, mb));
    if (it != hidden_out_.end()) return it->second;
    return hidden_in(c, mb);   // a chunk without layers
  }

  void output_backward(const Op& op, int c, int mb) {
    EdgeActs& E = edge(c, mb);
    Chunk& ch = chunks_[static_cast<std::size_t>(c)];
    const std::int64_t T = d_.T, h = d_.h, V = d_.vocab;
    if (op.kind == OpKind::compute) {
      const float scale = 1.0f / static_cast<float>(s_.training.global_batch_size * s_.seq_length);
      Vec dloss(static_cast<std::size_t>(T), scale);
      k::cross_entropy_backward(E.logits.data(), E.logits.data(), E.row_max.data(), E.sumexp.data(), targets(mb),
                                dloss.data(), T, V, d_.vocab_start);   // logits now hold dlogits
      E.dyl = zeros(T * h);
      k::matmul_backward_input(E.dyl.data(), E.logits.data(), output_weight_ptr(ch, false), T, h, V);
      if (d_.tp == 1) output_norm_backward(E, ch, c, mb, E.dyl, T, 0);
    } else if (op.kind == OpKind::all_reduce) {
      tp().all_reduce(E.dyl.data(), T * h);
      output_norm_backward(E, ch, c, mb, E.dyl, T, 0);
    } else {
      Vec ds;
      scatter_rows(ds, E.dyl);
      output_norm_backward(E, ch, c, mb, ds, d_.Ts, shard_row0());
    }
  }
  void output_norm_backward(EdgeActs& E, Chunk& ch, int c, int mb, const Vec& dy, std::int64_t rows,
                            std::int64_t row0) {
    const auto sub = [&](const Vec& v, std::int64_t width) {
      return Vec(v.begin() + row0 * width, v.begin() + (row0 + rows) * width);
    };
    Vec dx = zeros(rows * d_.h);
    const Vec mean = s_.model.norm == Norm::layernorm ? sub(E.mean, 1) : Vec{};
    norm_backward_add(dx, dy, sub(E.x_full, d_.h), mean, sub(E.rstd, 1), ch.weight("final_norm.weight"),
                      ch.grad("final_norm.weight"), ch.grad("final_norm.bias"), rows);
    grad_[key(c, mb)] = std::move(dx);
    E.dyl.clear();
  }

  void output_weight(int c, int mb) {
    EdgeActs& E = edge(c, mb);
    Chunk& ch = chunks_[static_cast<std::size_t>(c)];
    k::matmul_backward_weight(output_weight_ptr(ch, true), static_cast<float*>(nullptr), E.logits.data(), E.y.data(),
                              d_.T, d_.h, d_.vocab);
    edges_.erase(key(c, mb));
  }

  // ---- gradients, optimizer, parameters ----
  void grad_sync(const Op& op) {
    const int c = op.chunk.value_or(0);
    if (!reduced_chunks_.insert(c).second) return;   // the chunk's buffer went in its first bucket
    Chunk& ch = chunks_[static_cast<std::size_t>(c)];
    Communicator& dp = *groups_.get(CommGroup::dp_cp);
    if (op.kind == OpKind::all_reduce) {
      dp.all_reduce(ch.g.data(), static_cast<std::int64_t>(ch.g.size()));
    } else {
      const std::int64_t n = static_cast<std::int64_t>(ch.g.size()) / dp.size();
      Vec shard = zeros(n);
      dp.reduce_scatter(shard.data(), ch.g.data(), n);
      std::copy(shard.begin(), shard.end(), ch.g.begin() + dp.rank() * n);
    }
  }

  void embedding_grad_sync() {
    Communicator* emb = groups_.get(CommGroup::embedding);
    if (!emb) throw ProgramMismatch("an embedding-group all-reduce on a rank outside the group");
    for (Chunk& ch : chunks_) {
      const Param* p = ch.find(ch.find("embedding.weight") ? "embedding.weight" : "output.weight");
      if (p && (p->name == "embedding.weight" || p->tied_copy)) {
        emb->all_reduce(ch.g.data() + p->offset, p->size());
        return;
      }
    }
    throw ProgramMismatch("no word embedding to synchronise");
  }

  // Elements [lo, hi) of a chunk's buffers this rank updates.
  std::pair<std::int64_t, std::int64_t> owned(const Chunk& ch) const {
    if (!distopt_) return {0, ch.size};
    const std::int64_t n = static_cast<std::int64_t>(ch.w.size()) / (s_.dp * s_.plan.cp);
    return {dp_rank_ * n, std::min(ch.size, (dp_rank_ + 1) * n)};
  }

  void optimizer() {
    // Sequence-parallel norm and bias gradients: sum over TP (not a Program op).
    if (d_.sp) {
      Vec buf;
      for (Chunk& ch : chunks_)
        for (const Param& p : ch.params)
          if (p.sync == TpSync::partial) buf.insert(buf.end(), ch.g.begin() + p.offset, ch.g.begin() + p.offset + p.size());
      tp().all_reduce(buf.data(), static_cast<std::int64_t>(buf.size()));
      std::size_t at = 0;
      for (Chunk& ch : chunks_)
        for (const Param& p : ch.params)
          if (p.sync == TpSync::partial) {
            std::copy(buf.begin() + static_cast<std::ptrdiff_t>(at), buf.begin() + static_cast<std::ptrdiff_t>(at + static_cast<std::size_t>(p.size())),
                      ch.g.begin() + p.offset);
            at += static_cast<std::size_t>(p.size());
          }
    }
    // Global gradient norm over unique elements (Megatron's clip_grad_norm_fp32).
    double sq = 0;
    const bool dp_owner = distopt_ || dp_rank_ == 0;
    for (Chunk& ch : chunks_) {
      const auto [lo, hi] = owned(ch);
      for (const Param& p : ch.params) {
        if (p.tied_copy || !dp_owner || (p.sync != TpSync::sharded && d_.tp_rank != 0)) continue;
        const std::int64_t a = std::max(lo, p.offset), b = std::min(hi, p.offset + p.size());
        if (a < b) k::sum_squares(&sq, ch.g.data() + a, b - a);
      }
    }
    MPI_Allreduce(MPI_IN_PLACE, &sq, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    grad_norm_ = std::sqrt(sq);
    const float scale = o_.clip_grad > 0 ? k::clip_coefficient(grad_norm_, o_.clip_grad) : 1.0f;
    for (std::size_t ci = 0; ci < chunks_.size(); ++ci) {
      Chunk& ch = chunks_[ci];
      const auto [lo, hi] = owned(ch);
      const std::int64_t base = distopt_ ? dp_rank_ * (static_cast<std::int64_t>(ch.w.size()) / (s_.dp * s_.plan.cp)) : 0;
      for (const Param& p : ch.params) {
        const std::int64_t a = std::max(lo, p.offset), b = std::min(hi, p.offset + p.size());
        if (a >= b) continue;
        k::adamw_update(ch.w.data() + a, ch.g.data() + a, m_[ci].data() + (a - base), v_[ci].data() + (a - base), b - a,
                        o_.lr, o_.beta1, o_.beta2, o_.eps, p.decay ? o_.weight_decay : 0.0f, step_, scale);
      }
    }
  }

  void param_sync(const Op& op) {
    if (!distopt_) return;
    std::vector<int> which;
    if (op.chunk) which = {*op.chunk};
    else
      for (const Chunk& ch : chunks_) which.push_back(ch.index);
    Communicator& dp = *groups_.get(CommGroup::dp_cp);
    for (int c : which) {
      if (!gathered_chunks_.insert(c).second) continue;
      Chunk& ch = chunks_[static_cast<std::size_t>(c)];
      const std::int64_t n = static_cast<std::int64_t>(ch.w.size()) / dp.size();
      Vec shard(ch.w.begin() + dp.rank() * n, ch.w.begin() + (dp.rank() + 1) * n);
      dp.all_gather(ch.w.data(), shard.data(), n);
    }
  }

  const Setup& s_;
  const Program& p_;
  const RunOptions& o_;
  const ByteCorpus& data_;
  MpiGroups& groups_;
  int me_;
  GridCoord at_;
  LayerShapes d_;
  const StageProgram& stage_;
  std::vector<Step> fwd_, bwd_;
  std::vector<Chunk> chunks_;
  std::vector<Vec> m_, v_;
  bool distopt_ = false;
  int dp_rank_ = 0;
  int step_ = 0;
  double loss_sum_ = 0, grad_norm_ = 0;
  std::vector<std::int32_t> tokens_, targets_, positions_;
  std::map<std::int64_t, LayerActs> acts_;
  std::map<std::int64_t, EdgeActs> edges_;
  std::map<std::int64_t, Vec> hidden_, hidden_out_, grad_;
  std::set<int> reduced_chunks_, gathered_chunks_;
  std::map<std::pair<int, std::uint64_t>, int> send_tag_, recv_tag_;
  PointToPoint p2p_;
  std::vector<PointToPoint::Request> sends_;
  std::vector<std::unique_ptr<Vec>> send_buffers_;
};

}  // namespace

namespace {

// ---- checkpoints: one file per rank per step, written then renamed ----

std::string checkpoint_header(const RunOptions& o, int world, int rank) {
  return fmt::format("megascope-checkpoint 1\nplan {}\nmodel {}\nworld {}\nrank {}\n", o.plan_text, o.model_name, world,
                     rank);
}

std::filesystem::path rank_file(const std::string& dir, int step, int rank) {
  return std::filesystem::path(dir) / fmt::format("step-{}", step) / fmt::format("rank-{}.bin", rank);
}

template <class T>
void write_pod(std::ofstream& f, const T& v) {
  f.write(reinterpret_cast<const char*>(&v), sizeof(T));
}
void write_vec(std::ofstream& f, const Vec& v) {
  const auto n = static_cast<std::int64_t>(v.size());
  write_pod(f, n);
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
}
bool read_vec(std::ifstream& f, Vec& v) {
  std::int64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), sizeof(n));
  if (!f || n != static_cast<std::int64_t>(v.size())) return false;
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  return static_cast<bool>(f);
}

Result<void> save_rank(const std::string& dir, int step, int rank, int world, const RunOptions& o,
                       std::vector<Chunk>& chunks, std::vector<Vec>& m, std::vector<Vec>& v) {
  const auto path = rank_file(dir, step, rank);
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  const auto tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return fail("--checkpoint-dir", fmt::format("{}: cannot write", tmp));
    const std::string h = checkpoint_header(o, world, rank);
    f << h;
    write_pod(f, static_cast<std::int32_t>(step));
    for (std::size_t c = 0; c < chunks.size(); ++c) {
      write_vec(f, chunks[c].w);
      write_vec(f, m[c]);
      write_vec(f, v[c]);
    }
    if (!f) return fail("--checkpoint-dir", fmt::format("{}: write failed", tmp));
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) return fail("--checkpoint-dir", fmt::format("{}: cannot rename: {}", tmp, ec.message()));
  return {};
}

Result<void> load_rank(const std::string& dir, int step, int rank, int world, const RunOptions& o,
                       std::vector<Chunk>& chunks, std::vector<Vec>& m, std::vector<Vec>& v) {
  const auto path = rank_file(dir, step, rank);
  std::ifstream f(path, std::ios::binary);
  if (!f) return fail("--resume", fmt::format("{}: cannot read the checkpoint", path.string()));
  const std::string want = checkpoint_header(o, world, rank);
  std::string got(want.size(), '\0');
  f.read(got.data(), static_cast<std::streamsize>(got.size()));
  if (got != want)
    return fail("--resume", fmt::format("{}: written by another plan, model or world size (expected:\n{}found:\n{})",
                                        path.string(), want, got));
  std::int32_t saved = 0;
  f.read(reinterpret_cast<char*>(&saved), sizeof(saved));
  if (saved != step) return fail("--resume", fmt::format("{}: holds step {}, expected {}", path.string(), saved, step));
  for (std::size_t c = 0; c < chunks.size(); ++c)
    if (!read_vec(f, chunks[c].w) || !read_vec(f, m[c]) || !read_vec(f, v[c]))
      return fail("--resume", fmt::format("{}: truncated or of the wrong shape", path.string()));
  return {};
}

std::optional<int> latest_step(const std::string& dir) {
  std::ifstream f(std::filesystem::path(dir) / "latest");
  int step = 0;
  if (f >> step) return step;
  return std::nullopt;
}

// Every rank's verdict: the first error anywhere fails all ranks together.
Result<void> agree(Result<void> mine, const MpiEnv& env) {
  int ok = mine ? 1 : 0, all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (all) return {};
  if (!mine) return mine;
  (void)env;
  return fail("--resume", "another rank failed to load its checkpoint (see its message)");
}

}  // namespace

Result<std::vector<StepLog>> run_cpu(const Setup& s, const Program& p, const RunOptions& o, std::ostream& out) {
  if (auto ok = check_supported(s); !ok) return tl::unexpected(ok.error());
  MpiEnv& env = MpiEnv::get();
  if (env.size() != p.grid.world())
    return fail("--plan", fmt::format("the plan runs on {} ranks (tp {} x cp {} x dp {} x pp {}) but the MPI job has {}; "
                                      "launch with mpirun -np {}",
                                      p.grid.world(), p.grid.tp, p.grid.cp, p.grid.dp, p.grid.pp, env.size(),
                                      p.grid.world()));
  auto corpus = ByteCorpus::load(o.data.empty() ? kDefaultCorpus : o.data, s.seq_length);
  if (!corpus) return tl::unexpected(corpus.error());
  if (s.model.vocab_size < 256)
    return fail("model.vocab_size", fmt::format("{} is below 256: the executor trains on bytes", s.model.vocab_size));
  MpiGroups groups(p.grid);
  Rank rank(s, p, o, *corpus, groups);
  const int me = env.rank();

  int first = 1;
  if (o.resume) {
    if (!o.checkpoint_dir) return fail("--resume", "needs --checkpoint-dir");
    const std::optional<int> latest = latest_step(*o.checkpoint_dir);
    Result<void> mine = latest ? load_rank(*o.checkpoint_dir, *latest, me, env.size(), o, rank.chunks(),
                                           rank.moments_m(), rank.moments_v())
                               : fail("--resume", fmt::format("{}: no checkpoint (no 'latest' file)", *o.checkpoint_dir));
    if (auto ok = agree(mine, env); !ok) return tl::unexpected(ok.error());
    first = *latest + 1;
    if (me == 0) out << fmt::format("resumed from {} at step {}\n", *o.checkpoint_dir, *latest);
  }

  std::vector<StepLog> logs;
  std::vector<Span> spans;
  const int last = first + o.steps - 1;
  for (int step = first; step <= last; ++step) {
    double loss_sum = 0, grad_norm = 0;
    rank.step(step, spans, loss_sum, grad_norm);
    double sums[2] = {loss_sum, spans.empty() ? 0.0 : spans.back().end};
    double total_loss = 0, step_time = 0;
    MPI_Allreduce(&sums[0], &total_loss, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&sums[1], &step_time, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    StepLog log{step, total_loss / static_cast<double>(s.training.global_batch_size * s.seq_length), grad_norm, step_time};
    logs.push_back(log);
    if (me == 0)
      out << fmt::format("step {:>4}  loss {:.6f}  grad norm {:.6f}  time {:.3f} s\n", log.step, log.loss,
                         log.grad_norm, log.step_time_s)
          << std::flush;
    const bool save = o.checkpoint_dir && ((o.save_every > 0 && step % o.save_every == 0) || step == last);
    if (save) {
      auto ok = agree(save_rank(*o.checkpoint_dir, step, me, env.size(), o, rank.chunks(), rank.moments_m(),
                                rank.moments_v()),
                      env);
      if (!ok) return tl::unexpected(ok.error());
      if (me == 0) {   // every rank's file is complete: move the pointer
        const auto dir = std::filesystem::path(*o.checkpoint_dir);
        { std::ofstream f(dir / "latest.tmp", std::ios::trunc); f << step << "\n"; }
        std::error_code ec;
        std::filesystem::rename(dir / "latest.tmp", dir / "latest", ec);
      }
      env.barrier();
    }
    if (o.stop_after > 0 && static_cast<int>(logs.size()) >= o.stop_after) break;
  }

  if (o.trace) {   // the last step's spans of every rank, written by rank 0
    std::string mine(reinterpret_cast<const char*>(spans.data()), spans.size() * sizeof(Span));
    const std::vector<std::string> all = env.gather(mine, 0);
    Result<void> ok;
    if (me == 0) {
      std::vector<Span> every;
      for (const std::string& b : all) {
        const std::size_t n = b.size() / sizeof(Span);
        const std::size_t at = every.size();
        every.resize(at + n);
        std::memcpy(every.data() + at, b.data(), n * sizeof(Span));
      }
      std::vector<int> ranks(static_cast<std::size_t>(env.size()));
      for (int r = 0; r < env.size(); ++r) ranks[static_cast<std::size_t>(r)] = r;
      TraceInfo info{TraceSource::measured, logs.empty() ? 0.0 : logs.back().step_time_s, o.plan_text, o.model_name,
                     env.size()};
      ok = write_trace(*o.trace, p, info, ranks, every);
    }
    if (auto agreed = agree(ok, env); !agreed) return tl::unexpected(agreed.error());
  }
  return logs;
}

}  // namespace megascope::exec
