// CpuRank: the ends of the model: the vocab-parallel embedding, the final
// norm, output layer and vocab-parallel cross-entropy (exec/cpu_rank.hpp).
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

void CpuRank::embedding_forward(const Op& op, int c, int mb) {
  EdgeActs& E = edge(c, mb);
  Chunk& ch = chunks_[static_cast<std::size_t>(c)];
  if (op.kind == OpKind::compute) {
    E.e = zeros(d_.T * d_.h);
    ops_.embedding_forward(E.e.data(), tokens(mb), ch.weight("embedding.weight"), static_cast<const float*>(nullptr),
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

void CpuRank::embedding_finish(Chunk& ch, Vec& e, int c, int mb, std::int64_t rows, std::int64_t row0) {
  // Learned positions: in the sequence, or in its document (packed sequences).
  const Packed* pk = packed(mb);
  const Ids& pos_of = pk ? pk->doc_pos : positions_;
  if (const float* wpe = ch.weight("embedding.position"))
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t pos = pos_of[static_cast<std::size_t>(row0 + r)];
      for (std::int64_t j = 0; j < d_.h; ++j) e[static_cast<std::size_t>(r * d_.h + j)] += wpe[pos * d_.h + j];
    }
  Vec x(e.size());
  for_runs(mb, row0, rows, [&](std::int64_t r, std::int64_t n, std::uint64_t offset) {
    ops_.dropout_forward(x.data() + r * d_.h, e.data() + r * d_.h, n * d_.h, p_drop(), seed_of(-1, 2), offset);
  });
  hidden_[key(c, mb)] = std::move(x);
}

void CpuRank::embedding_weight(int c, int mb) {
  Chunk& ch = chunks_[static_cast<std::size_t>(c)];
  Vec dx = grad_in(c, mb);
  Vec de(dx.size());
  for_runs(mb, shard_row0(), static_cast<std::int64_t>(dx.size()) / d_.h,
           [&](std::int64_t r, std::int64_t n, std::uint64_t offset) {
             ops_.dropout_backward(de.data() + r * d_.h, dx.data() + r * d_.h, n * d_.h, p_drop(), seed_of(-1, 2), offset);
           });
  if (d_.sp) {   // the embedding's input gradient for every token (not a Program op)
    Vec full;
    gather_rows(full, de);
    de = std::move(full);
  }
  const Packed* pk = packed(mb);
  ops_.embedding_backward(ch.grad("embedding.weight"), ch.grad("embedding.position"), de.data(), tokens(mb),
                        pk ? pk->doc_pos.data() : positions_.data(), d_.T, d_.h, d_.vocab_start,
                        d_.vocab_start + d_.vocab);
  grad_.erase(key(c, mb));
}

float* CpuRank::output_weight_ptr(Chunk& ch, bool grad) {
  if (ch.find("output.weight")) return grad ? ch.grad("output.weight") : ch.weight("output.weight");
  for (Chunk& other : chunks_)
    if (other.find("embedding.weight")) return grad ? other.grad("embedding.weight") : other.weight("embedding.weight");
  throw ProgramMismatch("no output weight on the last stage");
}

void CpuRank::output_forward(const Op& op, int c, int mb) {
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
  ops_.matmul_forward(E.logits.data(), E.y.data(), output_weight_ptr(ch, false), nullptr, T, h, V);
  E.row_max = zeros(T);
  ops_.cross_entropy_local_max(E.row_max.data(), E.logits.data(), T, V);
  if (d_.tp > 1) tp().all_reduce(E.row_max.data(), T, ReduceOp::max);
  Vec sums = zeros(2 * T);
  ops_.cross_entropy_local_sumexp(sums.data(), E.logits.data(), E.row_max.data(), T, V);
  ops_.cross_entropy_local_target(sums.data() + T, E.logits.data(), targets(mb), T, V, d_.vocab_start);
  if (d_.tp > 1) tp().all_reduce(sums.data(), 2 * T);
  E.sumexp.assign(sums.begin(), sums.begin() + T);
  Vec loss = zeros(T);
  ops_.cross_entropy_loss(loss.data(), E.row_max.data(), E.sumexp.data(), sums.data() + T, T);
  if (const Packed* pk = packed(mb)) {   // the tokens with a target only
    if (d_.tp_rank == 0)
      for (std::int64_t t = 0; t < T; ++t)
        if (pk->mask[static_cast<std::size_t>(t)] != 0.0f) loss_sum_ += loss[static_cast<std::size_t>(t)];
  } else if (d_.tp_rank == 0) {
    for (float l : loss) loss_sum_ += l;
  }
  hidden_out_.erase(key(c, mb));
}

const Vec& CpuRank::hidden_out_or_in(int c, int mb) {
  auto it = hidden_out_.find(key(c, mb));
  if (it != hidden_out_.end()) return it->second;
  return hidden_in(c, mb);   // a chunk without layers
}

void CpuRank::output_backward(const Op& op, int c, int mb) {
  EdgeActs& E = edge(c, mb);
  Chunk& ch = chunks_[static_cast<std::size_t>(c)];
  const std::int64_t T = d_.T, h = d_.h, V = d_.vocab;
  if (op.kind == OpKind::compute) {
    const float scale = 1.0f / static_cast<float>(s_.training.global_batch_size * s_.seq_length);
    Vec dloss(static_cast<std::size_t>(T), scale);
    if (const Packed* pk = packed(mb)) {
      // The mean over the global batch's tokens with a target (Megatron-LM's
      // --calculate-per-token-loss): the same on every plan. None (every
      // document of length 1): no gradient.
      const float per_token = loss_tokens_ > 0 ? 1.0f / static_cast<float>(loss_tokens_) : 0.0f;
      for (std::int64_t t = 0; t < T; ++t)
        dloss[static_cast<std::size_t>(t)] = pk->mask[static_cast<std::size_t>(t)] * per_token;
    }
    ops_.cross_entropy_backward(E.logits.data(), E.logits.data(), E.row_max.data(), E.sumexp.data(), targets(mb),
                              dloss.data(), T, V, d_.vocab_start);   // logits now hold dlogits
    E.dyl = zeros(T * h);
    ops_.matmul_backward_input(E.dyl.data(), E.logits.data(), output_weight_ptr(ch, false), T, h, V);
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

void CpuRank::output_norm_backward(EdgeActs& E, Chunk& ch, int c, int mb, const Vec& dy, std::int64_t rows,
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

void CpuRank::output_weight(int c, int mb) {
  EdgeActs& E = edge(c, mb);
  Chunk& ch = chunks_[static_cast<std::size_t>(c)];
  ops_.matmul_backward_weight(output_weight_ptr(ch, true), static_cast<float*>(nullptr), E.logits.data(), E.y.data(),
                            d_.T, d_.h, d_.vocab);
  edges_.erase(key(c, mb));
}

}  // namespace megascope::exec
