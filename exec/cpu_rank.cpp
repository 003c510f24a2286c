// CpuRank: the step loop, op dispatch, pipeline transfers, gradient synchronisation,
// the optimizer and the distributed optimizer's parameter gather (exec/cpu_rank.hpp).
#include "exec/cpu_rank.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <cstdio>
#include <tuple>

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

void CpuRank::step(int step_index, std::vector<Span>& spans, double& loss_sum, double& grad_norm,
                   const VarlenBatch* batch, const Program* program) {
  if (program && program != p_) use_program(*program);
  step_ = step_index;
  loss_sum_ = 0;
  for (Chunk& c : chunks_) std::fill(c.g.begin(), c.g.end(), 0.0f);
  acts_.clear();
  edges_.clear();
  hidden_.clear();
  grad_.clear();
  grad_buckets_seen_.clear();
  mb_buckets_seen_.clear();
  mb_done_.clear();
  grad_shard_.clear();
  gathered_chunks_.clear();
  if (batch) load_varlen_batch(*batch);
  else load_batch();
  const auto t0 = std::chrono::steady_clock::now();
  auto now = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  spans.clear();
  for (std::uint32_t i = 0; i < stage_->ops.size(); ++i) {
    const double start = now();
    run_op(i, stage_->ops[i]);
    spans.push_back({me_, i, start, now()});
  }
  p2p_.wait_all(sends_);
  send_buffers_.clear();
  loss_sum = loss_sum_;
  grad_norm = grad_norm_;
}

// Megatron's load-balanced context parallelism: the sequence is cut into
// 2 cp chunks and CP rank r holds chunks r and 2cp-1-r, so that every rank
// gets the same share of the causal attention work.
std::int32_t CpuRank::position(int cp_rank, std::int64_t t) const {
  const int cp = s_.plan.cp;
  const std::int64_t seg = s_.seq_length / (2 * cp);
  const std::int64_t p = t < seg ? cp_rank * seg + t : (2 * cp - 1 - cp_rank) * seg + (t - seg);
  return static_cast<std::int32_t>(p);
}

void CpuRank::load_batch() {
  const std::int64_t S = s_.seq_length, b = s_.plan.micro_batch_size, Tl = S / s_.plan.cp;
  const int m = s_.num_microbatches;
  packed_.clear();
  positions_.resize(static_cast<std::size_t>(d_.T));
  for (std::int64_t t = 0; t < d_.T; ++t) positions_[static_cast<std::size_t>(t)] = position(at_.cp, t % Tl);
  tokens_.assign(static_cast<std::size_t>(m * b * Tl), 0);
  targets_.assign(tokens_.size(), 0);
  std::vector<std::int32_t> tok(static_cast<std::size_t>(S)), tgt(static_cast<std::size_t>(S));
  for (int mb = 0; mb < m; ++mb)
    for (std::int64_t i = 0; i < b; ++i) {
      data_.sample(step_ - 1, s_.training.global_batch_size, first_sample(mb) + i, tok.data(), tgt.data());
      for (std::int64_t t = 0; t < Tl; ++t) {
        const auto at = static_cast<std::size_t>((mb * b + i) * Tl + t);
        const auto p = static_cast<std::size_t>(position(at_.cp, t));
        tokens_[at] = tok[p];
        targets_[at] = tgt[p];
      }
    }
}

void CpuRank::load_varlen_batch(const VarlenBatch& batch) {
  const std::int64_t S = s_.seq_length, b = s_.plan.micro_batch_size, Tl = S / s_.plan.cp, cp = s_.plan.cp;
  const int m = batch.microbatches;
  const std::vector<SlotDocs>& mine = batch.slots.at(static_cast<std::size_t>(at_.dp));
  if (static_cast<std::int64_t>(mine.size()) != m * b)
    throw ProgramMismatch(fmt::format("the batch has {} sequence slots for replica {}, the step {} micro-batches of {}",
                                      mine.size(), at_.dp, m, b));
  loss_tokens_ = batch.loss_tokens;
  // Sequence positions (causality and the CP chunks) as for fixed lengths.
  positions_.resize(static_cast<std::size_t>(d_.T));
  for (std::int64_t t = 0; t < d_.T; ++t) positions_[static_cast<std::size_t>(t)] = position(at_.cp, t % Tl);
  if (cp > 1) {
    kv_pos_.resize(static_cast<std::size_t>(S));
    for (int r = 0; r < cp; ++r)
      for (std::int64_t t = 0; t < Tl; ++t) kv_pos_[static_cast<std::size_t>(r * Tl + t)] = position(r, t);
  }
  tokens_.assign(static_cast<std::size_t>(m * b * Tl), 0);
  targets_.assign(tokens_.size(), 0);
  packed_.assign(static_cast<std::size_t>(m), Packed{});
  // One slot's sequence: documents from position 0, then padding (token 0,
  // no target, a document of its own).
  std::vector<std::int32_t> tok(static_cast<std::size_t>(S)), tgt(static_cast<std::size_t>(S)),
      doc(static_cast<std::size_t>(S)), doc_pos(static_cast<std::size_t>(S)), cu;
  std::vector<float> mask(static_cast<std::size_t>(S));
  std::vector<std::int64_t> element(static_cast<std::size_t>(S));
  for (int mb = 0; mb < m; ++mb) {
    Packed& pk = packed_[static_cast<std::size_t>(mb)];
    pk.doc.resize(static_cast<std::size_t>(d_.T));
    pk.doc_pos.resize(static_cast<std::size_t>(d_.T));
    pk.mask.resize(static_cast<std::size_t>(d_.T));
    pk.element.resize(static_cast<std::size_t>(d_.T));
    if (cp > 1) pk.kv_doc.resize(static_cast<std::size_t>(b * S));
    for (std::int64_t i = 0; i < b; ++i) {
      const std::int64_t slot = mb * b + i;
      const SlotDocs& docs = mine[static_cast<std::size_t>(slot)];
      std::fill(tok.begin(), tok.end(), 0);
      std::fill(tgt.begin(), tgt.end(), 0);
      std::fill(mask.begin(), mask.end(), 0.0f);
      cu.assign(1, 0);
      for (std::size_t k = 0; k < docs.lengths.size(); ++k) {
        const std::int64_t at = cu.back(), L = docs.lengths[k];
        if (at + L > S) throw ProgramMismatch(fmt::format("a slot holds {} tokens, over seq_length {}", at + L, S));
        data_.document(docs.offsets[k], L, tok.data() + at, tgt.data() + at);
        for (std::int64_t t = 0; t + 1 < L; ++t) mask[static_cast<std::size_t>(at + t)] = 1.0f;
        for (std::int64_t t = 0; t < L; ++t)
          element[static_cast<std::size_t>(at + t)] = docs.offsets[k] - batch.stream_base + t;
        cu.push_back(static_cast<std::int32_t>(at + L));
      }
      // Padding's dropout elements: after every token of the step, by the
      // slot's global index (any plan-fixed choice would do: padding feeds
      // nothing real).
      const std::int64_t global_slot = static_cast<std::int64_t>(at_.dp) * m * b + slot;
      for (std::int64_t p = cu.back(); p < S; ++p)
        element[static_cast<std::size_t>(p)] = batch.stream_tokens + global_slot * S + p;
      k::document_ids(doc.data(), doc_pos.data(), cu.data(), static_cast<std::int64_t>(cu.size()) - 1, S);
      for (std::int64_t t = 0; t < Tl; ++t) {
        const auto row = static_cast<std::size_t>(i * Tl + t);
        const auto p = static_cast<std::size_t>(position(at_.cp, t));
        tokens_[static_cast<std::size_t>(mb * b * Tl) + row] = tok[p];
        targets_[static_cast<std::size_t>(mb * b * Tl) + row] = tgt[p];
        pk.doc[row] = doc[p];
        pk.doc_pos[row] = doc_pos[p];
        pk.mask[row] = mask[p];
        pk.element[row] = element[p];
      }
      // The gathered keys' documents, in cp_gather_kv's (B, S) CP-rank order.
      for (std::int64_t j = 0; j < S && cp > 1; ++j) {
        const auto p = static_cast<std::size_t>(kv_pos_[static_cast<std::size_t>(j)]);
        pk.kv_doc[static_cast<std::size_t>(i * S + j)] = doc[p];
      }
    }
  }
}

void CpuRank::use_program(const Program& p) {
  p_ = &p;
  stage_ = &p.of_rank(me_);
  send_tag_.clear();
  recv_tag_.clear();
  build_tags();
  grad_buckets_.clear();
  mb_buckets_.clear();
  mb_count_.clear();
}

std::int64_t CpuRank::first_sample(int mb) const {
  const std::int64_t per_dp = s_.training.global_batch_size / s_.dp;
  return at_.dp * per_dp + static_cast<std::int64_t>(mb) * s_.plan.micro_batch_size;
}

std::uint64_t CpuRank::seed_of(int layer, int site) const {
  return o_.seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(step_) * 1000003ull +
         static_cast<std::uint64_t>(layer + 1) * 7919ull + static_cast<std::uint64_t>(site);
}


void CpuRank::build_tags() {
  std::map<int, std::set<std::uint64_t>> sends, recvs;
  for (const Op& op : stage_->ops) {
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

std::int64_t CpuRank::key(int chunk, int mb, int layer) {
  return (static_cast<std::int64_t>(chunk) << 40) | (static_cast<std::int64_t>(mb) << 20) | (layer + 1);
}

std::optional<int> CpuRank::chunk_of_stage(int vs) const {
  for (const Chunk& c : chunks_)
    if (!c.expert && c.layers.virtual_stage == vs) return c.index;
  return std::nullopt;
}

Vec& CpuRank::hidden_in(int c, int mb) {
  auto it = hidden_.find(key(c, mb));
  if (it != hidden_.end()) return it->second;
  const int vs = chunks_[static_cast<std::size_t>(c)].layers.virtual_stage;
  if (auto prev = chunk_of_stage(vs - 1); vs > 0 && prev) {   // handed over on this rank
    // The previous chunk's output, or, when it has no layers, what it
    // received or embedded.
    for (auto* from : {&hidden_out_, &hidden_}) {
      auto p = from->find(key(*prev, mb));
      if (p == from->end()) continue;
      Vec v = std::move(p->second);
      from->erase(p);
      return hidden_[key(c, mb)] = std::move(v);
    }
  }
  throw ProgramMismatch(fmt::format("no input activation for chunk {} micro-batch {}", c, mb));
}

Vec& CpuRank::grad_in(int c, int mb) {
  auto it = grad_.find(key(c, mb));
  if (it != grad_.end()) return it->second;
  const int vs = chunks_[static_cast<std::size_t>(c)].layers.virtual_stage;
  if (auto next = chunk_of_stage(vs + 1); next) {
    auto p = grad_.find(key(*next, mb));
    if (p != grad_.end()) return grad_[key(c, mb)] = p->second;
  }
  throw ProgramMismatch(fmt::format("no output gradient for chunk {} micro-batch {}", c, mb));
}

void CpuRank::run_op(std::uint32_t index, const Op& op) {
  try {
    dispatch(op);
  } catch (const ProgramMismatch& e) {
    throw ProgramMismatch(fmt::format("rank {} op {} ({} {} {}): {}", me_, index, to_string(op.phase),
                                      to_string(op.label), to_string(op.kind), e.what()));
  }
}

void CpuRank::dispatch(const Op& op) {
  if (op.kind == OpKind::send || op.kind == OpKind::recv) return p2p(op);
  // A gate (a compute op with no kernels and no layer: the first layer
  // waiting for a receive or a parameter gather, or the next layer's
  // backward joining a collective and weight gradients) only waits.
  if (op.kind == OpKind::compute && op.kernel_count == 0 && !op.layer) return;
  // pp_scatter_gather's all-gather of a received slice: the executor receives
  // the whole activation (or gradient) already, so there is nothing to gather.
  if (op.kind == OpKind::all_gather && (op.label == OpLabel::pp_activation || op.label == OpLabel::pp_gradient)) return;
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

void CpuRank::p2p(const Op& op) {
  const int c = op.chunk.value_or(0);
  const int mb = op.microbatch.value_or(0);
  const int peer = p_->grid.on_stage(me_, op.peer_stage);
  const std::int64_t n = d_.Ts * d_.h;
  const bool activation = op.label == OpLabel::pp_activation;
  if (op.kind == OpKind::send) {
    // A chunk without transformer layers (only the embedding, or nothing)
    // sends what it received or embedded.
    const bool layerless = activation && hidden_out_.find(key(c, mb)) == hidden_out_.end();
    const Vec& src = activation ? hidden_out_or_in(c, mb) : grad_in(c, mb);
    MEGASCOPE_CHECK(static_cast<std::int64_t>(src.size()) == n, "pipeline tensor of the wrong size");
    send_buffers_.push_back(std::make_unique<std::vector<float>>(src.begin(), src.end()));
    sends_.push_back(p2p_.send(send_buffers_.back()->data(), n, peer, send_tag_.at({op.peer_stage, op.tag})));
    if (layerless) hidden_.erase(key(c, mb));
    else if (activation) hidden_out_.erase(key(c, mb));
    else grad_.erase(key(c, mb));
    return;
  }
  std::vector<float> host(static_cast<std::size_t>(n));
  auto req = p2p_.recv(host.data(), n, peer, recv_tag_.at({op.peer_stage, op.tag}));
  if (!p2p_.wait(req, o_.recv_timeout_s)) {
    std::fprintf(stderr, "megascope run: rank %d: no %s from rank %d (pipeline stage %d) after %.0f s; "
                 "that rank has stopped or hangs. Aborting the job.\n",
                 me_, activation ? "activation" : "gradient", peer, op.peer_stage, o_.recv_timeout_s);
    MpiEnv::get().abort(4);
  }
  Vec buf(host.begin(), host.end());
  if (activation) hidden_[key(c, mb)] = std::move(buf);
  else grad_[key(c, mb)] = std::move(buf);
}

void CpuRank::grad_sync(const Op& op) {
  const int c = op.chunk.value_or(0);
  const bool expert = op.group == CommGroup::edp;
  if (zero_stage(s_.plan) >= 2) {
    Chunk& ch = expert ? experts_of(c) : chunks_[static_cast<std::size_t>(c)];
    // Reduce-scatters, and with hybrid sharding the replicas' all-reduces.
    const bool replica = op.kind == OpKind::all_reduce && op.group == CommGroup::dp_replica;
    if ((op.kind != OpKind::reduce_scatter && !replica) || !op.microbatch)
      throw ProgramMismatch("sharded gradients are reduce-scattered per micro-batch");
    return reduce_microbatch(op, ch, expert);
  }
  if (grad_buckets_.empty())
    for (const Op& o : stage_->ops)
      if (o.phase == Phase::gradient_sync && o.label == OpLabel::dp_grad)
        ++grad_buckets_[{o.chunk.value_or(0), o.group == CommGroup::edp}];
  // The buckets of a chunk are reduced as the backward completes them; the
  // executor reduces the whole buffer once, at the last, when no gradient of
  // the chunk is still to come.
  if (++grad_buckets_seen_[{c, expert}] < grad_buckets_[{c, expert}]) return;
  Chunk& ch = expert ? experts_of(c) : chunks_[static_cast<std::size_t>(c)];
  Communicator& dp = group_of(ch);
  if (!s_.plan.distributed_optimizer) {
    dp.all_reduce(ch.g.data(), static_cast<std::int64_t>(ch.g.size()));
  } else {
    // Reduce-scattered over the group; with hybrid sharding the shard is
    // then summed across the replicas (the Program's replica all-reduce).
    const std::int64_t n = static_cast<std::int64_t>(ch.g.size()) / dp.size();
    Vec shard = zeros(n);
    dp.reduce_scatter(shard.data(), ch.g.data(), n);
    if (Communicator* rep = replicas_of(ch)) rep->all_reduce(shard.data(), n);
    std::copy(shard.begin(), shard.end(), ch.g.begin() + dp.rank() * n);
  }
}

void CpuRank::embedding_grad_sync() {
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

Communicator& CpuRank::group_of(const Chunk& ch) const {
  if (ch.expert) return *groups_.get(CommGroup::edp);
  return *groups_.get(s_.plan.dp_replicas > 1 ? CommGroup::dp_shard : CommGroup::dp_cp);
}

Communicator* CpuRank::replicas_of(const Chunk& ch) const {
  if (ch.expert || s_.plan.dp_replicas <= 1) return nullptr;
  Communicator* r = groups_.get(CommGroup::dp_replica);
  if (!r) throw ProgramMismatch("a hybrid-sharded plan on a rank outside a replica group");
  return r;
}

bool CpuRank::sharded(const Chunk& ch) const {
  return s_.plan.distributed_optimizer && group_of(ch).size() > 1;
}

std::pair<std::int64_t, std::int64_t> CpuRank::owned(const Chunk& ch) const {
  if (!sharded(ch)) return {0, ch.size};
  const Communicator& g = group_of(ch);
  const std::int64_t n = static_cast<std::int64_t>(ch.w.size()) / g.size();
  return {g.rank() * n, std::min(ch.size, (g.rank() + 1) * n)};
}

void CpuRank::optimizer() {
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
  for (Chunk& ch : chunks_) {
    // With hybrid sharding every replica holds the same shard: the first counts it.
    const Communicator* rep = replicas_of(ch);
    const bool dp_owner = (sharded(ch) || group_of(ch).rank() == 0) && (!rep || rep->rank() == 0);
    const auto [lo, hi] = owned(ch);
    for (const Param& p : ch.params) {
      if (p.tied_copy || !dp_owner || (p.sync != TpSync::sharded && d_.tp_rank != 0)) continue;
      const std::int64_t a = std::max(lo, p.offset), b = std::min(hi, p.offset + p.size());
      if (a < b) sq += ops_.sum_squares(ch.g.data() + a, b - a);
    }
  }
  if (o_.fail == RunOptions::Fail::nan && o_.fail_rank == me_ && step_ == o_.fail_step && !chunks_.empty()) {
    // Fault injection: a NaN gradient on this rank, counted in the norm.
    Chunk& ch = chunks_.front();
    if (!ch.g.empty()) ch.g[static_cast<std::size_t>(owned(ch).first)] = std::numeric_limits<float>::quiet_NaN();
    sq = std::numeric_limits<double>::quiet_NaN();
  }
  world_allreduce(MPI_IN_PLACE, &sq, 1, MPI_DOUBLE, MPI_SUM, o_.recv_timeout_s, "the gradient norm");
  grad_norm_ = std::sqrt(sq);
  // Not finite: with skip_nonfinite no update (the moments neither); the
  // runner reports the step as skipped. Without it the runner stops the run.
  const bool skip = o_.skip_nonfinite && !std::isfinite(grad_norm_);
  const float scale = o_.clip_grad > 0 ? k::clip_coefficient(grad_norm_, o_.clip_grad) : 1.0f;
  for (std::size_t ci = 0; ci < chunks_.size(); ++ci) {
    Chunk& ch = chunks_[ci];
    const auto [lo, hi] = owned(ch);
    const std::int64_t base = lo;
    for (const Param& p : ch.params) {
      const std::int64_t a = std::max(lo, p.offset), b = std::min(hi, p.offset + p.size());
      if (a >= b) continue;
      if (skip) continue;
      ops_.adamw_update(ch.w.data() + a, ch.g.data() + a, m_[ci].data() + (a - base), v_[ci].data() + (a - base), b - a,
                      o_.lr, o_.beta1, o_.beta2, o_.eps, p.decay ? o_.weight_decay : 0.0f, step_, scale);
    }
    // zero 3: a rank keeps its shard of the weights only. The rest is
    // cleared, so that a pass reading a parameter no gather restored gets
    // zeros (and a different loss) instead of a stale copy.
    if (zero_stage(s_.plan) >= 3 && sharded(ch)) {
      std::fill(ch.w.begin(), ch.w.begin() + lo, 0.0f);
      std::fill(ch.w.begin() + hi, ch.w.end(), 0.0f);
    }
  }
}

void CpuRank::reduce_microbatch(const Op& op, Chunk& ch, bool expert) {
  const int c = op.chunk.value_or(0);
  if (mb_buckets_.empty()) {
    std::set<std::tuple<int, bool, int>> seen;
    for (const Op& o : stage_->ops)
      if (o.phase == Phase::gradient_sync && o.label == OpLabel::dp_grad) {
        const std::tuple<int, bool, int> k{o.chunk.value_or(0), o.group == CommGroup::edp, o.microbatch.value_or(-1)};
        ++mb_buckets_[k];
        if (seen.insert(k).second) ++mb_count_[{std::get<0>(k), std::get<1>(k)}];
      }
  }
  // Each micro-batch's buckets are reduced as its backward completes them;
  // the executor reduces the chunk's whole buffer at the micro-batch's last.
  const std::tuple<int, bool, int> k{c, expert, *op.microbatch};
  if (++mb_buckets_seen_[k] < mb_buckets_.at(k)) return;
  Communicator& dp = group_of(ch);
  const std::int64_t n = static_cast<std::int64_t>(ch.g.size()) / dp.size();
  Vec part = zeros(n);
  dp.reduce_scatter(part.data(), ch.g.data(), n);
  Vec& acc = grad_shard_[{c, expert}];
  if (acc.empty()) acc = zeros(n);
  for (std::int64_t i = 0; i < n; ++i) acc[static_cast<std::size_t>(i)] += part[static_cast<std::size_t>(i)];
  // Only the shard is kept: the next micro-batch accumulates from zero.
  std::fill(ch.g.begin(), ch.g.end(), 0.0f);
  if (++mb_done_[{c, expert}] == mb_count_.at({c, expert})) {
    // Hybrid sharding: the step's shard summed across the replicas.
    if (Communicator* rep = replicas_of(ch)) rep->all_reduce(acc.data(), n);
    std::copy(acc.begin(), acc.end(), ch.g.begin() + dp.rank() * n);
  }
}

void CpuRank::gather_unit(const Op& op, Chunk& ch) {
  if (!sharded(ch)) return;
  Communicator& dp = group_of(ch);
  const std::int64_t n = static_cast<std::int64_t>(ch.w.size()) / dp.size();
  Vec shard(ch.w.begin() + dp.rank() * n, ch.w.begin() + (dp.rank() + 1) * n);
  Vec full = zeros(static_cast<std::int64_t>(ch.w.size()));
  dp.all_gather(full.data(), shard.data(), n);
  // The unit: layer l's parameters ("layer.<l>."), or, without a layer, the
  // chunk's parameters outside its transformer layers.
  const auto layer_of = [](const std::string& name) -> std::optional<int> {
    if (name.rfind("layer.", 0) != 0) return std::nullopt;
    const std::size_t dot = name.find('.', 6);
    return std::stoi(name.substr(6, dot - 6));
  };
  const ChunkLayers& layers = ch.layers;
  for (const Param& p : ch.params) {
    const std::optional<int> l = layer_of(p.name);
    const bool in_chunk_layers = l && *l >= layers.first && *l < layers.first + layers.count;
    const bool in_unit = op.layer ? (l && *l == *op.layer) : !in_chunk_layers;
    if (in_unit)
      std::copy(full.begin() + p.offset, full.begin() + p.offset + p.size(), ch.w.begin() + p.offset);
  }
}

void CpuRank::param_sync(const Op& op) {
  const bool expert = op.group == CommGroup::edp;
  if (zero_stage(s_.plan) >= 3) {
    const int c = op.chunk.value_or(0);
    return gather_unit(op, expert ? experts_of(c) : chunks_[static_cast<std::size_t>(c)]);
  }
  std::vector<int> which;
  if (op.chunk) which = {*op.chunk};
  else
    for (std::size_t c = 0; c < dense_chunks_; ++c) which.push_back(static_cast<int>(c));
  for (int c : which) {
    Chunk& ch = expert ? experts_of(c) : chunks_[static_cast<std::size_t>(c)];
    if (!sharded(ch) || !gathered_chunks_.insert({c, expert}).second) continue;
    Communicator& dp = group_of(ch);
    const std::int64_t n = static_cast<std::int64_t>(ch.w.size()) / dp.size();
    Vec shard(ch.w.begin() + dp.rank() * n, ch.w.begin() + (dp.rank() + 1) * n);
    dp.all_gather(ch.w.data(), shard.data(), n);
  }
}

}  // namespace megascope::exec
