// CpuRank: the mixture-of-experts sublayer (tp = 1), op by op as
// build_program emits it: router and permutation (compute), dispatch
// (all-to-all over EP), the local experts (compute), combine (all-to-all),
// and the weighted sum back into the residual stream (compute).
//
// The all-to-all uses fixed-size blocks: to each EP rank, the row counts of
// its experts and up to T k rows (every token could pick that rank's
// experts), so no capacity limit drops tokens and one collective carries
// both counts and rows. Balanced routing would send T k / ep rows; the
// executor's message is larger than the Program's (docs/executor.md).
// Does not: auxiliary load-balancing loss, capacity factors, shared
// experts, expert tensor parallelism.
#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "exec/cpu_rank.hpp"
#include "kernels/activation.hpp"
#include "kernels/dropout.hpp"
#include "kernels/matmul.hpp"
#include "kernels/moe.hpp"

namespace megascope::exec {

namespace k = megascope::kernels;

namespace {

struct ExpertW {
  float *fc1w, *fc1b, *fc2w, *fc2b;
};

ExpertW expert_weights(Chunk& ch, int l, int e, bool grads) {
  const std::string E = fmt::format("layer.{}.expert.{}.", l, e);
  auto get = [&](const char* n) { return grads ? ch.grad(E + n) : ch.weight(E + n); };
  return {get("fc1.weight"), get("fc1.bias"), get("fc2.weight"), get("fc2.bias")};
}

// Rows local expert j received, summed over the P source ranks
// (recv_counts is (source, local expert), El experts per rank).
std::int64_t expert_rows(const std::vector<std::int64_t>& recv_counts, int P, std::int64_t El, std::int64_t j) {
  std::int64_t n = 0;
  for (int src = 0; src < P; ++src) n += recv_counts[static_cast<std::size_t>(src * El + j)];
  return n;
}

// Where the rows of (source, local expert j) start inside that source's block.
std::int64_t block_offset(const std::vector<std::int64_t>& recv_counts, std::int64_t El, int src, std::int64_t j) {
  std::int64_t off = 0;
  for (std::int64_t jj = 0; jj < j; ++jj) off += recv_counts[static_cast<std::size_t>(src * El + jj)];
  return off;
}

}  // namespace

Vec CpuRank::moe_dispatch_rows(LayerActs& A, const Vec& rows, std::int64_t width, bool forward) {
  Communicator& ep = *groups_.get(CommGroup::ep);
  const int P = ep.size();
  const std::int64_t E = s_.model.moe->num_experts, El = E / P, cap = d_.T * s_.model.moe->top_k;
  const std::int64_t block = El + cap * width;
  Vec send = zeros(P * block), recv = zeros(P * block);
  std::int64_t start = 0;   // first row of destination d's experts in `rows`
  for (int dst = 0; dst < P; ++dst) {
    std::int64_t n = 0;
    for (std::int64_t j = 0; j < El; ++j) {
      send[static_cast<std::size_t>(dst * block + j)] = static_cast<float>(A.counts[static_cast<std::size_t>(dst * El + j)]);
      n += A.counts[static_cast<std::size_t>(dst * El + j)];
    }
    std::copy(rows.begin() + start * width, rows.begin() + (start + n) * width, send.begin() + dst * block + El);
    start += n;
  }
  ep.all_to_all(recv.data(), send.data(), block);
  if (forward) {
    A.recv_counts.assign(static_cast<std::size_t>(P * El), 0);
    for (int src = 0; src < P; ++src)
      for (std::int64_t j = 0; j < El; ++j)
        A.recv_counts[static_cast<std::size_t>(src * El + j)] =
            static_cast<std::int64_t>(recv[static_cast<std::size_t>(src * block + j)]);
  }
  // Local rows grouped by local expert, then by source rank.
  std::int64_t total = 0;
  for (std::int64_t c : A.recv_counts) total += c;
  Vec out = zeros(total * width);
  std::int64_t at = 0;
  for (std::int64_t j = 0; j < El; ++j)
    for (int src = 0; src < P; ++src) {
      const std::int64_t off = block_offset(A.recv_counts, El, src, j);
      const std::int64_t n = A.recv_counts[static_cast<std::size_t>(src * El + j)];
      const auto from = recv.begin() + src * block + El + off * width;
      std::copy(from, from + n * width, out.begin() + at * width);
      at += n;
    }
  return out;
}

Vec CpuRank::moe_combine_rows(LayerActs& A, const Vec& local, std::int64_t width) {
  Communicator& ep = *groups_.get(CommGroup::ep);
  const int P = ep.size();
  const std::int64_t E = s_.model.moe->num_experts, El = E / P, cap = d_.T * s_.model.moe->top_k;
  const std::int64_t block = El + cap * width;
  Vec send = zeros(P * block), recv = zeros(P * block);
  std::int64_t at = 0;
  for (std::int64_t j = 0; j < El; ++j)
    for (int src = 0; src < P; ++src) {
      const std::int64_t off = block_offset(A.recv_counts, El, src, j);
      const std::int64_t n = A.recv_counts[static_cast<std::size_t>(src * El + j)];
      std::copy(local.begin() + at * width, local.begin() + (at + n) * width, send.begin() + src * block + El + off * width);
      at += n;
    }
  ep.all_to_all(recv.data(), send.data(), block);
  const std::int64_t rows = d_.T * s_.model.moe->top_k;
  Vec out = zeros(rows * width);
  std::int64_t start = 0;
  for (int dst = 0; dst < P; ++dst) {
    std::int64_t n = 0;
    for (std::int64_t j = 0; j < El; ++j) n += A.counts[static_cast<std::size_t>(dst * El + j)];
    std::copy(recv.begin() + dst * block + El, recv.begin() + dst * block + El + n * width, out.begin() + start * width);
    start += n;
  }
  return out;
}

void CpuRank::moe_forward(Action a, LayerActs& A, int c, int mb, int l, bool recompute) {
  const MoeSpec& moe = *s_.model.moe;
  const std::int64_t T = d_.T, h = d_.h, E = moe.num_experts, K = moe.top_k, fe = moe.expert_ffn_hidden;
  Chunk& ch = chunks_[static_cast<std::size_t>(c)];
  const std::string L = fmt::format("layer.{}.", l);
  const bool ep = s_.plan.ep > 1;
  switch (a) {
    case Action::moe_router: {
      norm_forward(A.b, A.ln2_mean, A.ln2_rstd, A.x_mid, ch.weight(L + "ln2.weight"), ch.weight(L + "ln2.bias"), T);
      Vec logits = zeros(T * E);
      ops_.matmul_forward(logits.data(), A.b.data(), ch.weight(L + "router.weight"), ch.weight(L + "router.bias"), T, h, E);
      A.probs = zeros(T * K);
      A.scores = zeros(T * E);
      A.experts.assign(static_cast<std::size_t>(T * K), 0);
      ops_.moe_router_forward(A.probs.data(), A.experts.data(), A.scores.data(), logits.data(), T, E, K, true);
      A.row_to_slot.assign(static_cast<std::size_t>(T * K), 0);
      A.slot_to_row.assign(static_cast<std::size_t>(T * K), 0);
      A.counts.assign(static_cast<std::size_t>(E), 0);
      ops_.moe_permute_indices(A.row_to_slot.data(), A.slot_to_row.data(), A.counts.data(), A.experts.data(), T, E, K);
      A.perm = zeros(T * K * h);
      ops_.moe_permute_forward(A.perm.data(), A.b.data(), A.row_to_slot.data(), T, h, K);
      if (!ep) A.xe = moe_dispatch_rows(A, A.perm, h, true);   // no Program op: one EP rank
      break;
    }
    case Action::moe_dispatch:
      A.xe = moe_dispatch_rows(A, A.perm, h, true);
      break;
    case Action::moe_experts: {
      const LocalExperts lx = local_experts(s_, me_);
      const std::int64_t rows = static_cast<std::int64_t>(A.xe.size()) / h;
      A.h1 = zeros(rows * d_.up * fe);
      A.act = zeros(rows * fe);
      A.y = zeros(rows * h);
      std::int64_t at = 0;
      for (int j = 0; j < lx.count; ++j) {
        const std::int64_t n = expert_rows(A.recv_counts, s_.plan.ep, lx.count, j);
        const ExpertW w = expert_weights(experts_of(c), l, lx.first + j, false);
        float* h1 = A.h1.data() + at * d_.up * fe;
        float* act = A.act.data() + at * fe;
        ops_.matmul_forward(h1, A.xe.data() + at * h, w.fc1w, w.fc1b, n, h, d_.up * fe);
        if (d_.up == 2) ops_.swiglu_forward(act, h1, n, fe);
        else ops_.gelu_forward(act, h1, n * fe);
        ops_.matmul_forward(A.y.data() + at * h, act, w.fc2w, w.fc2b, n, fe, h);
        at += n;
      }
      if (!ep) A.expert_out = moe_combine_rows(A, A.y, h);
      break;
    }
    case Action::moe_combine:
      A.expert_out = moe_combine_rows(A, A.y, h);
      break;
    case Action::moe_finish: {
      Vec out = zeros(T * h);
      ops_.moe_unpermute_forward(out.data(), A.expert_out.data(), A.probs.data(), A.slot_to_row.data(), T, h, K);
      finish_layer(A, c, mb, l, recompute, out, T, 0);
      break;
    }
    default:
      throw ProgramMismatch("not an MoE forward step");
  }
}

void CpuRank::moe_backward(Action a, LayerActs& A, int c, int mb, int l) {
  const MoeSpec& moe = *s_.model.moe;
  const std::int64_t T = d_.T, h = d_.h, E = moe.num_experts, K = moe.top_k, fe = moe.expert_ffn_hidden;
  Chunk& ch = chunks_[static_cast<std::size_t>(c)];
  const std::string L = fmt::format("layer.{}.", l);
  const bool ep = s_.plan.ep > 1;
  switch (a) {
    case Action::b_moe_unpermute: {
      Vec dout;
      bda_backward(dout, A.dy, nullptr, T, l, 1, mb, 0);
      Vec dexpert = zeros(T * K * h);
      A.dprobs = zeros(T * K);
      ops_.moe_unpermute_backward(dexpert.data(), A.dprobs.data(), dout.data(), A.expert_out.data(), A.probs.data(),
                                A.slot_to_row.data(), T, h, K);
      A.expert_out = std::move(dexpert);   // now its gradient, in permuted order
      if (!ep) A.dh2 = moe_dispatch_rows(A, A.expert_out, h, false);
      break;
    }
    case Action::b_moe_dispatch:
      A.dh2 = moe_dispatch_rows(A, A.expert_out, h, false);
      break;
    case Action::b_moe_experts: {
      const LocalExperts lx = local_experts(s_, me_);
      const std::int64_t rows = static_cast<std::int64_t>(A.xe.size()) / h;
      A.dh1 = zeros(rows * d_.up * fe);
      Vec dxe = zeros(rows * h), dact = zeros(rows * fe);
      std::int64_t at = 0;
      for (int j = 0; j < lx.count; ++j) {
        const std::int64_t n = expert_rows(A.recv_counts, s_.plan.ep, lx.count, j);
        const ExpertW w = expert_weights(experts_of(c), l, lx.first + j, false);
        ops_.matmul_backward_input(dact.data() + at * fe, A.dh2.data() + at * h, w.fc2w, n, fe, h);
        if (d_.up == 2)
          ops_.swiglu_backward(A.dh1.data() + at * d_.up * fe, A.h1.data() + at * d_.up * fe, dact.data() + at * fe, n, fe);
        else
          ops_.gelu_backward(A.dh1.data() + at * fe, A.h1.data() + at * fe, dact.data() + at * fe, n * fe);
        ops_.matmul_backward_input(dxe.data() + at * h, A.dh1.data() + at * d_.up * fe, w.fc1w, n, h, d_.up * fe);
        at += n;
      }
      A.dtmp = std::move(dxe);
      if (!ep) A.perm = moe_combine_rows(A, A.dtmp, h);   // perm now holds its gradient
      break;
    }
    case Action::b_moe_combine:
      A.perm = moe_combine_rows(A, A.dtmp, h);
      break;
    case Action::b_moe_router: {
      Vec db = zeros(T * h);
      ops_.moe_permute_backward(db.data(), A.perm.data(), A.slot_to_row.data(), T, h, K);
      A.dlogits = zeros(T * E);
      ops_.moe_router_backward(A.dlogits.data(), A.dprobs.data(), A.experts.data(), A.scores.data(), T, E, K, true);
      Vec dbr = zeros(T * h);
      ops_.matmul_backward_input(dbr.data(), A.dlogits.data(), ch.weight(L + "router.weight"), T, h, E);
      for (std::size_t i = 0; i < db.size(); ++i) db[i] += dbr[i];
      A.dx_mid = A.dy;
      norm_backward_add(A.dx_mid, db, A.x_mid, A.ln2_mean, A.ln2_rstd, ch.weight(L + "ln2.weight"),
                        ch.grad(L + "ln2.weight"), ch.grad(L + "ln2.bias"), T);
      A.dtmp.clear();
      A.perm.clear();
      break;
    }
    default:
      throw ProgramMismatch("not an MoE backward step");
  }
}

void CpuRank::moe_weight(LayerActs& A, int c, int l) {
  const std::int64_t T = d_.T, h = d_.h, E = s_.model.moe->num_experts, fe = s_.model.moe->expert_ffn_hidden;
  Chunk& ch = chunks_[static_cast<std::size_t>(c)];
  const std::string L = fmt::format("layer.{}.", l);
  ops_.matmul_backward_weight(ch.grad(L + "router.weight"), ch.grad(L + "router.bias"), A.dlogits.data(), A.b.data(), T, h,
                            E);
  const LocalExperts lx = local_experts(s_, me_);
  std::int64_t at = 0;
  for (int j = 0; j < lx.count; ++j) {
    const std::int64_t n = expert_rows(A.recv_counts, s_.plan.ep, lx.count, j);
    const ExpertW g = expert_weights(experts_of(c), l, lx.first + j, true);
    ops_.matmul_backward_weight(g.fc2w, g.fc2b, A.dh2.data() + at * h, A.act.data() + at * fe, n, fe, h);
    ops_.matmul_backward_weight(g.fc1w, g.fc1b, A.dh1.data() + at * d_.up * fe, A.xe.data() + at * h, n, h, d_.up * fe);
    at += n;
  }
}

}  // namespace megascope::exec
