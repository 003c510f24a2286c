// CpuRank: a transformer layer's forward, input-gradient and weight-gradient
// passes, op by op (exec/cpu_rank.hpp, docs/executor.md).
#include "exec/cpu_rank.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "exec/mpi_env.hpp"
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

// As build_program emits a layer (core/program/layer_ops.cpp): with CP the
// attention compute is cut around the all-gather of K and V (forward) and
// followed by the reduce-scatter of their gradients (backward), which the
// layer's output waits for beside the compute: with tp > 1 in the TP
// collective, otherwise in an empty compute op.
std::vector<Step> forward_steps(int tp, bool sp, int cp, bool moe, int ep) {
  std::vector<Step> attn = {{OpKind::compute, Action::attn}};
  if (cp > 1)
    attn = {{OpKind::compute, Action::attn_qkv}, {OpKind::all_gather, Action::cp_gather},
            {OpKind::compute, Action::attn_core}, {OpKind::compute, Action::attn_proj}};
  std::vector<Step> out;
  if (sp) out.push_back({OpKind::all_gather, Action::attn_gather});
  out.insert(out.end(), attn.begin(), attn.end());
  if (tp > 1) out.push_back({sp ? OpKind::reduce_scatter : OpKind::all_reduce, Action::attn_reduce});
  if (moe) {   // tp = 1 (check_supported)
    out.push_back({OpKind::compute, Action::moe_router});
    if (ep > 1) out.push_back({OpKind::all_to_all, Action::moe_dispatch});
    out.push_back({OpKind::compute, Action::moe_experts});
    if (ep > 1) out.push_back({OpKind::all_to_all, Action::moe_combine});
    out.push_back({OpKind::compute, Action::moe_finish});
    return out;
  }
  if (sp) {
    out.push_back({OpKind::compute, Action::mlp_pre});
    out.push_back({OpKind::all_gather, Action::mlp_gather});
  }
  out.push_back({OpKind::compute, Action::mlp});
  if (tp > 1) out.push_back({sp ? OpKind::reduce_scatter : OpKind::all_reduce, Action::mlp_reduce});
  return out;
}

std::vector<Step> backward_steps(int tp, bool sp, int cp, bool moe, int ep) {
  std::vector<Step> out;
  if (moe) {
    out.push_back({OpKind::compute, Action::b_moe_unpermute});
    if (ep > 1) out.push_back({OpKind::all_to_all, Action::b_moe_dispatch});
    out.push_back({OpKind::compute, Action::b_moe_experts});
    if (ep > 1) out.push_back({OpKind::all_to_all, Action::b_moe_combine});
    out.push_back({OpKind::compute, Action::b_moe_router});
  } else {
    if (sp) out.push_back({OpKind::all_gather, Action::b_mlp_gather});
    out.push_back({OpKind::compute, Action::b_mlp});
    if (tp > 1) out.push_back({sp ? OpKind::reduce_scatter : OpKind::all_reduce, Action::b_mlp_reduce});
  }
  if (sp) out.push_back({OpKind::all_gather, Action::b_attn_gather});
  if (cp > 1) {
    out.push_back({OpKind::compute, Action::b_attn_core});
    out.push_back({OpKind::reduce_scatter, Action::b_cp_reduce});
    if (tp == 1) out.push_back({OpKind::compute, Action::b_cp_join});
  } else {
    out.push_back({OpKind::compute, Action::b_attn});
  }
  if (tp > 1) out.push_back({sp ? OpKind::reduce_scatter : OpKind::all_reduce, Action::b_attn_reduce});
  return out;
}

void CpuRank::bda(Vec& out, const Vec& y, const float* bias, const Vec& x, std::int64_t rows, int layer, int site, int mb,
         std::int64_t row0) {
  out.resize(static_cast<std::size_t>(rows * d_.h));
  for_runs(mb, row0, rows, [&](std::int64_t r, std::int64_t n, std::uint64_t offset) {
    const std::int64_t at = r * d_.h;
    ops_.bias_dropout_add_forward(out.data() + at, y.data() + at, bias, x.data() + at, n, d_.h, p_drop(),
                                seed_of(layer, site), offset);
  });
}

void CpuRank::bda_backward(Vec& dy_in, const Vec& dout, float* dbias, std::int64_t rows, int layer, int site, int mb,
                  std::int64_t row0) {
  dy_in.resize(static_cast<std::size_t>(rows * d_.h));
  for_runs(mb, row0, rows, [&](std::int64_t r, std::int64_t n, std::uint64_t offset) {
    const std::int64_t at = r * d_.h;
    ops_.bias_dropout_add_backward(dy_in.data() + at, dbias, dout.data() + at, n, d_.h, p_drop(), seed_of(layer, site),
                                 offset);
  });
}

void CpuRank::norm_forward(Vec& out, Vec& mean, Vec& rstd, const Vec& in, const float* w, const float* b, std::int64_t rows) {
  out.resize(static_cast<std::size_t>(rows * d_.h));
  rstd.resize(static_cast<std::size_t>(rows));
  if (s_.model.norm == Norm::layernorm) {
    mean.resize(static_cast<std::size_t>(rows));
    ops_.layernorm_forward(out.data(), mean.data(), rstd.data(), in.data(), w, b, rows, d_.h, kNormEps);
  } else {
    ops_.rmsnorm_forward(out.data(), rstd.data(), in.data(), w, rows, d_.h, kNormEps);
  }
}

void CpuRank::norm_backward_add(Vec& dx, const Vec& dout, const Vec& in, const Vec& mean, const Vec& rstd, const float* w,
                       float* dw, float* db, std::int64_t rows) {
  Vec tmp = zeros(rows * d_.h);
  if (s_.model.norm == Norm::layernorm)
    ops_.layernorm_backward(tmp.data(), dw, db, dout.data(), in.data(), w, mean.data(), rstd.data(), rows, d_.h);
  else
    ops_.rmsnorm_backward(tmp.data(), dw, dout.data(), in.data(), w, rstd.data(), rows, d_.h);
  for (std::size_t i = 0; i < dx.size(); ++i) dx[i] += tmp[i];
}

void CpuRank::gather_rows(Vec& full, const Vec& shard) {
  full.resize(static_cast<std::size_t>(d_.T * d_.h));
  tp().all_gather(full.data(), shard.data(), d_.Ts * d_.h);
}

void CpuRank::scatter_rows(Vec& shard, const Vec& full) {
  shard.resize(static_cast<std::size_t>(d_.Ts * d_.h));
  tp().reduce_scatter(shard.data(), full.data(), d_.Ts * d_.h);
}

CpuRank::LW CpuRank::weights(Chunk& c, int l, bool grads) {
  const std::string L = fmt::format("layer.{}.", l);
  auto get = [&](const char* n) { return grads ? c.grad(L + n) : c.weight(L + n); };
  return {get("ln1.weight"), get("ln1.bias"), get("qkv.weight"), get("qkv.bias"), get("proj.weight"),
          get("proj.bias"),  get("ln2.weight"), get("ln2.bias"), get("fc1.weight"), get("fc1.bias"),
          get("fc2.weight"), get("fc2.bias")};
}

void CpuRank::layer_forward(const Op& op, int c, int mb, int l, bool recompute) {
  LayerActs& A = acts(c, mb, l);
  if (!recompute && A.fwd_step == 0) {
    // The layer's input: the chunk's running activation.
    A.x_in = (l == chunks_[static_cast<std::size_t>(c)].layers.first) ? hidden_in(c, mb) : hidden_out_.at(key(c, mb));
  }
  const std::vector<Step>& steps = s_.model.is_moe_layer(l) ? fwd_moe_ : fwd_;
  if (recompute && A.fwd_step == static_cast<int>(steps.size())) A.fwd_step = 0;   // a recompute pass starts
  if (A.fwd_step >= static_cast<int>(steps.size())) throw ProgramMismatch("more forward ops than the layer has");
  const Step st = steps[static_cast<std::size_t>(A.fwd_step++)];
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
    case Action::attn:
      attn_qkv(A, w, mb);
      attn_core(A, mb);
      attn_proj(A, w, l, mb);
      break;
    case Action::attn_qkv:
      attn_qkv(A, w, mb);
      break;
    case Action::cp_gather:
      cp_gather_kv(A);
      break;
    case Action::attn_core:
      attn_core(A, mb);
      break;
    case Action::attn_proj:
      attn_proj(A, w, l, mb);
      break;
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
      ops_.matmul_forward(A.h1.data(), A.b.data(), w.fc1w, w.fc1b, T, h, d_.up * d_.f);
      A.act = zeros(T * d_.f);
      if (d_.up == 2) ops_.swiglu_forward(A.act.data(), A.h1.data(), T, d_.f);
      else ops_.gelu_forward(A.act.data(), A.h1.data(), T * d_.f);
      A.y = zeros(T * h);
      ops_.matmul_forward(A.y.data(), A.act.data(), w.fc2w, nullptr, T, d_.f, h);
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
    case Action::moe_router:
    case Action::moe_dispatch:
    case Action::moe_experts:
    case Action::moe_combine:
    case Action::moe_finish:
      moe_forward(st.action, A, c, mb, l, recompute);
      break;
    default:
      throw ProgramMismatch("a backward step in the forward");
  }
}

// ln1 (without SP), the QKV GEMM, and RoPE on q and k at the tokens'
// positions (packed sequences: within their documents, per sequence).
void CpuRank::attn_qkv(LayerActs& A, const LW& w, int mb) {
  const std::int64_t T = d_.T, h = d_.h;
  if (!d_.sp) norm_forward(A.a, A.ln1_mean, A.ln1_rstd, A.x_in, w.ln1w, w.ln1b, T);
  const std::int64_t width = d_.q + 2 * d_.kv;
  Vec qkv = zeros(T * width);
  ops_.matmul_forward(qkv.data(), A.a.data(), w.qkvw, w.qkvb, T, h, width);
  A.q = zeros(T * d_.q);
  A.kk = zeros(T * d_.kv);
  A.v = zeros(T * d_.kv);
  for (std::int64_t t = 0; t < T; ++t) {
    const float* row = qkv.data() + t * width;
    std::copy(row, row + d_.q, A.q.data() + t * d_.q);
    std::copy(row + d_.q, row + d_.q + d_.kv, A.kk.data() + t * d_.kv);
    std::copy(row + d_.q + d_.kv, row + width, A.v.data() + t * d_.kv);
  }
  if (s_.model.position_embedding == PositionEmbedding::rope) {
    const std::int64_t B = s_.plan.micro_batch_size, Tl = T / B;
    if (const Packed* pk = packed(mb)) {
      for (std::int64_t b = 0; b < B; ++b) {
        const std::int32_t* pos = pk->doc_pos.data() + b * Tl;
        float* q = A.q.data() + b * Tl * d_.q;
        float* kk = A.kk.data() + b * Tl * d_.kv;
        ops_.rope_forward(q, q, pos, 1, Tl, d_.hq, d_.d, kRopeTheta);
        ops_.rope_forward(kk, kk, pos, 1, Tl, d_.hkv, d_.d, kRopeTheta);
      }
      return;
    }
    ops_.rope_forward(A.q.data(), A.q.data(), positions_.data(), B, Tl, d_.hq, d_.d, kRopeTheta);
    ops_.rope_forward(A.kk.data(), A.kk.data(), positions_.data(), B, Tl, d_.hkv, d_.d, kRopeTheta);
  }
}

// K and V of every CP rank, arranged as (B, S, Hkv, D) in CP-rank order, with
// their positions in kv_pos_.
void CpuRank::cp_gather_kv(LayerActs& A) {
  Communicator& cp = *groups_.get(CommGroup::cp);
  const std::int64_t n = d_.T * d_.kv, B = s_.plan.micro_batch_size, Tl = d_.T / B;
  Vec mine(static_cast<std::size_t>(2 * n));
  std::copy(A.kk.begin(), A.kk.end(), mine.begin());
  std::copy(A.v.begin(), A.v.end(), mine.begin() + n);
  Vec all(static_cast<std::size_t>(2 * n * cp.size()));
  cp.all_gather(all.data(), mine.data(), 2 * n);
  const std::int64_t S = Tl * cp.size();
  A.kf = zeros(B * S * d_.kv);
  A.vf = zeros(B * S * d_.kv);
  kv_pos_.resize(static_cast<std::size_t>(S));
  for (int r = 0; r < cp.size(); ++r) {
    for (std::int64_t t = 0; t < Tl; ++t) kv_pos_[static_cast<std::size_t>(r * Tl + t)] = position(r, t);
    for (std::int64_t b = 0; b < B; ++b) {
      const float* kr = all.data() + static_cast<std::int64_t>(r) * 2 * n + b * Tl * d_.kv;
      std::copy(kr, kr + Tl * d_.kv, A.kf.data() + (b * S + r * Tl) * d_.kv);
      std::copy(kr + n, kr + n + Tl * d_.kv, A.vf.data() + (b * S + r * Tl) * d_.kv);
    }
  }
}

void CpuRank::attn_core(LayerActs& A, int mb) {
  const std::int64_t B = s_.plan.micro_batch_size, Tl = d_.T / B;
  const bool cp = s_.plan.cp > 1;
  const std::int64_t Tk = cp ? Tl * s_.plan.cp : Tl;
  A.o = zeros(d_.T * d_.q);
  A.lse = zeros(B * d_.hq * Tl);
  if (const Packed* pk = packed(mb))   // causal within each document only
    return ops_.attention_forward_packed(A.o.data(), A.lse.data(), A.q.data(), cp ? A.kf.data() : A.kk.data(),
                                         cp ? A.vf.data() : A.v.data(), positions_.data(),
                                         cp ? kv_pos_.data() : positions_.data(), pk->doc.data(),
                                         cp ? pk->kv_doc.data() : pk->doc.data(), B, Tl, Tk, d_.hq, d_.hkv, d_.d);
  ops_.attention_forward(A.o.data(), A.lse.data(), A.q.data(), cp ? A.kf.data() : A.kk.data(),
                       cp ? A.vf.data() : A.v.data(), positions_.data(), cp ? kv_pos_.data() : positions_.data(), B,
                       Tl, Tk, d_.hq, d_.hkv, d_.d);
}

void CpuRank::attn_proj(LayerActs& A, const LW& w, int l, int mb) {
  A.y = zeros(d_.T * d_.h);
  ops_.matmul_forward(A.y.data(), A.o.data(), w.projw, nullptr, d_.T, d_.q, d_.h);
  if (d_.tp == 1) bda(A.x_mid, A.y, w.projb, A.x_in, d_.T, l, 0, mb, 0);
}

// Up to the attention backward: dq, and dk, dv of every key the queries saw.
void CpuRank::b_attn_core(LayerActs& A, const LW& w, const LW& g, int l, int mb) {
  if (!d_.sp) bda_backward(A.dproj, A.dx_mid, g.projb, d_.T, l, 0, mb, 0);
  Vec dO = zeros(d_.T * d_.q);
  ops_.matmul_backward_input(dO.data(), A.dproj.data(), w.projw, d_.T, d_.q, d_.h);
  const std::int64_t B = s_.plan.micro_batch_size, Tl = d_.T / B;
  const bool cp = s_.plan.cp > 1;
  const std::int64_t Tk = cp ? Tl * s_.plan.cp : Tl;
  A.dq = zeros(d_.T * d_.q);
  A.dkf = zeros(B * Tk * d_.kv);
  A.dvf = zeros(B * Tk * d_.kv);
  if (const Packed* pk = packed(mb))
    return ops_.attention_backward_packed(A.dq.data(), A.dkf.data(), A.dvf.data(), dO.data(), A.q.data(),
                                          cp ? A.kf.data() : A.kk.data(), cp ? A.vf.data() : A.v.data(), A.o.data(),
                                          A.lse.data(), positions_.data(), cp ? kv_pos_.data() : positions_.data(),
                                          pk->doc.data(), cp ? pk->kv_doc.data() : pk->doc.data(), B, Tl, Tk, d_.hq,
                                          d_.hkv, d_.d);
  ops_.attention_backward(A.dq.data(), A.dkf.data(), A.dvf.data(), dO.data(), A.q.data(), cp ? A.kf.data() : A.kk.data(),
                        cp ? A.vf.data() : A.v.data(), A.o.data(), A.lse.data(), positions_.data(),
                        cp ? kv_pos_.data() : positions_.data(), B, Tl, Tk, d_.hq, d_.hkv, d_.d);
}

// The gradients of the gathered K and V, summed over the CP ranks that used
// them, back to their owners (the inverse of cp_gather_kv).
void CpuRank::b_cp_reduce_kv(LayerActs& A) {
  Communicator& cp = *groups_.get(CommGroup::cp);
  const std::int64_t n = d_.T * d_.kv, B = s_.plan.micro_batch_size, Tl = d_.T / B, S = Tl * cp.size();
  Vec all(static_cast<std::size_t>(2 * n * cp.size()));
  for (int r = 0; r < cp.size(); ++r)
    for (std::int64_t b = 0; b < B; ++b) {
      float* out = all.data() + static_cast<std::int64_t>(r) * 2 * n + b * Tl * d_.kv;
      const float* dk = A.dkf.data() + (b * S + r * Tl) * d_.kv;
      const float* dv = A.dvf.data() + (b * S + r * Tl) * d_.kv;
      std::copy(dk, dk + Tl * d_.kv, out);
      std::copy(dv, dv + Tl * d_.kv, out + n);
    }
  Vec mine(static_cast<std::size_t>(2 * n));
  cp.reduce_scatter(mine.data(), all.data(), 2 * n);
  A.dkf.assign(mine.begin(), mine.begin() + n);
  A.dvf.assign(mine.begin() + n, mine.end());
}

// RoPE backward, the QKV input gradient, and (without TP) ln1's backward.
void CpuRank::b_attn_qkv(LayerActs& A, int c, int mb, const LW& w, const LW& g) {
  const std::int64_t T = d_.T, B = s_.plan.micro_batch_size, Tl = T / B;
  if (s_.model.position_embedding == PositionEmbedding::rope) {
    if (const Packed* pk = packed(mb)) {
      for (std::int64_t b = 0; b < B; ++b) {
        const std::int32_t* pos = pk->doc_pos.data() + b * Tl;
        float* dq = A.dq.data() + b * Tl * d_.q;
        float* dk = A.dkf.data() + b * Tl * d_.kv;
        ops_.rope_backward(dq, dq, pos, 1, Tl, d_.hq, d_.d, kRopeTheta);
        ops_.rope_backward(dk, dk, pos, 1, Tl, d_.hkv, d_.d, kRopeTheta);
      }
    } else {
      ops_.rope_backward(A.dq.data(), A.dq.data(), positions_.data(), B, Tl, d_.hq, d_.d, kRopeTheta);
      ops_.rope_backward(A.dkf.data(), A.dkf.data(), positions_.data(), B, Tl, d_.hkv, d_.d, kRopeTheta);
    }
  }
  const std::int64_t width = d_.q + 2 * d_.kv;
  A.dqkv = zeros(T * width);
  for (std::int64_t t = 0; t < T; ++t) {
    float* row = A.dqkv.data() + t * width;
    std::copy(A.dq.data() + t * d_.q, A.dq.data() + (t + 1) * d_.q, row);
    std::copy(A.dkf.data() + t * d_.kv, A.dkf.data() + (t + 1) * d_.kv, row + d_.q);
    std::copy(A.dvf.data() + t * d_.kv, A.dvf.data() + (t + 1) * d_.kv, row + d_.q + d_.kv);
  }
  A.dq.clear();
  A.dkf.clear();
  A.dvf.clear();
  A.dtmp = zeros(T * d_.h);
  ops_.matmul_backward_input(A.dtmp.data(), A.dqkv.data(), w.qkvw, T, d_.h, width);
  if (d_.tp == 1) attn_norm_backward(A, c, mb, w, g, A.dtmp, T);
}

void CpuRank::finish_layer(LayerActs& A, int c, int mb, int l, bool recompute, const Vec& y, std::int64_t rows,
                  std::int64_t row0) {
  const LW w = weights(chunks_[static_cast<std::size_t>(c)], l, false);
  Vec out;
  bda(out, y, w.fc2b, A.x_mid, rows, l, 1, mb, row0);
  A.y.clear();
  if (!recompute) hidden_out_[key(c, mb)] = std::move(out);
}

void CpuRank::layer_backward(const Op& op, int c, int mb, int l) {
  LayerActs& A = acts(c, mb, l);
  if (A.bwd_step == 0) A.dy = grad_in(c, mb);
  const std::vector<Step>& steps = s_.model.is_moe_layer(l) ? bwd_moe_ : bwd_;
  if (A.bwd_step >= static_cast<int>(steps.size())) throw ProgramMismatch("more backward ops than the layer has");
  const Step st = steps[static_cast<std::size_t>(A.bwd_step++)];
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
      ops_.matmul_backward_input(dact.data(), A.dh2.data(), w.fc2w, T, d_.f, h);
      A.dh1 = zeros(T * d_.up * d_.f);
      if (d_.up == 2) ops_.swiglu_backward(A.dh1.data(), A.h1.data(), dact.data(), T, d_.f);
      else ops_.gelu_backward(A.dh1.data(), A.h1.data(), dact.data(), T * d_.f);
      A.dtmp = zeros(T * h);
      ops_.matmul_backward_input(A.dtmp.data(), A.dh1.data(), w.fc1w, T, h, d_.up * d_.f);
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
    case Action::b_attn:
      b_attn_core(A, w, g, l, mb);
      b_attn_qkv(A, c, mb, w, g);
      break;
    case Action::b_attn_core:
      b_attn_core(A, w, g, l, mb);
      break;
    case Action::b_cp_reduce:
      b_cp_reduce_kv(A);
      b_attn_qkv(A, c, mb, w, g);
      break;
    case Action::b_cp_join: break;   // nothing to compute: the layer's gradient is complete
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
    case Action::b_moe_unpermute:
    case Action::b_moe_dispatch:
    case Action::b_moe_experts:
    case Action::b_moe_combine:
    case Action::b_moe_router:
      moe_backward(st.action, A, c, mb, l);
      break;
    default:
      throw ProgramMismatch("a forward step in the backward");
  }
}

void CpuRank::mlp_norm_backward(LayerActs& A, const LW& w, const LW& g, const Vec& db, std::int64_t rows) {
  A.dx_mid = A.dy;
  norm_backward_add(A.dx_mid, db, A.x_mid, A.ln2_mean, A.ln2_rstd, w.ln2w, g.ln2w, g.ln2b, rows);
}

void CpuRank::attn_norm_backward(LayerActs& A, int c, int mb, const LW& w, const LW& g, const Vec& da, std::int64_t rows) {
  Vec dx = A.dx_mid;
  norm_backward_add(dx, da, A.x_in, A.ln1_mean, A.ln1_rstd, w.ln1w, g.ln1w, g.ln1b, rows);
  grad_[key(c, mb)] = std::move(dx);
}

void CpuRank::layer_weight(int c, int mb, int l) {
  auto it = acts_.find(key(c, mb, l));
  if (it == acts_.end()) throw ProgramMismatch("weight gradient before the layer's backward");
  LayerActs& A = it->second;
  const LW g = weights(chunks_[static_cast<std::size_t>(c)], l, true);
  const std::int64_t T = d_.T, h = d_.h;
  if (s_.model.is_moe_layer(l)) {
    moe_weight(A, c, l);
  } else {
    ops_.matmul_backward_weight(g.fc2w, static_cast<float*>(nullptr), A.dh2.data(), A.act.data(), T, d_.f, h);
    ops_.matmul_backward_weight(g.fc1w, g.fc1b, A.dh1.data(), A.b.data(), T, h, d_.up * d_.f);
  }
  ops_.matmul_backward_weight(g.projw, static_cast<float*>(nullptr), A.dproj.data(), A.o.data(), T, d_.q, h);
  ops_.matmul_backward_weight(g.qkvw, g.qkvb, A.dqkv.data(), A.a.data(), T, h, d_.q + 2 * d_.kv);
  acts_.erase(it);
}

}  // namespace megascope::exec
