// One rank of the CPU executor: its parameters, the activations it keeps
// between ops, and what each op of its StageProgram does (exec/runner.cpp
// drives it step by step). Internal to exec/; split over cpu_rank.cpp
// (dispatch, pipeline transfers, gradients, optimizer), cpu_layers.cpp (a
// transformer layer's passes) and cpu_edges.cpp (embedding, output and loss).
#pragma once

#include <cstdint>
#include <map>
#include <memory_resource>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <vector>

#include "core/program/program.hpp"
#include "core/setup.hpp"
#include "core/trace.hpp"
#include "exec/comm.hpp"
#include "exec/data.hpp"
#include "exec/kernel_ops.hpp"
#include "exec/params.hpp"
#include "exec/runner.hpp"

namespace megascope::exec {

// Buffers the kernels read and write: polymorphic-allocator vectors, so that
// the cuda backend can place them all in memory the device and the host both
// reach (std::pmr::set_default_resource, exec/cuda/kernel_ops_cuda.hpp)
// without the rank's code changing; the cpu backend uses the default heap.
using Vec = std::pmr::vector<float>;
using Ids = std::pmr::vector<std::int32_t>;

inline constexpr float kNormEps = 1e-5f;
inline constexpr float kRopeTheta = 10000.0f;

inline Vec zeros(std::int64_t n) { return Vec(static_cast<std::size_t>(n), 0.0f); }

// Saved tensors of one layer and micro-batch, from its forward to its weight gradient.
struct LayerActs {
  Vec x_in, ln1_mean, ln1_rstd, a;             // input (T or Ts rows), ln1 stats, ln1 output (T rows)
  Vec q, kk, v, o, lse;                        // attention (q, k after RoPE)
  Vec kf, vf;                                  // K and V of the whole sequence (all-gathered over CP)
  Vec dq, dkf, dvf;                            // their gradients, before the CP reduction
  // MoE: router outputs, the token permutation, and the rows of the local experts
  Vec probs, scores, perm, dlogits, dprobs;
  Ids experts, row_to_slot, slot_to_row;
  std::pmr::vector<std::int64_t> counts;           // rows per expert sent by this rank (E)
  std::vector<std::int64_t> recv_counts;       // rows per (source EP rank, local expert)
  Vec xe, expert_out;                          // local experts' input rows; all experts' outputs in permuted order
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
  attn_qkv, cp_gather, attn_core, attn_proj,                                            // forward with CP
  b_mlp_gather, b_mlp, b_mlp_reduce, b_attn_gather, b_attn, b_attn_reduce,              // backward input
  b_attn_core, b_cp_reduce, b_cp_join,                                                  // backward with CP
  moe_router, moe_dispatch, moe_experts, moe_combine, moe_finish,                       // MoE forward
  b_moe_unpermute, b_moe_dispatch, b_moe_experts, b_moe_combine, b_moe_router           // MoE backward
};
struct Step {
  OpKind kind;
  Action action;
};

// The ops of a layer pass, in the order build_program emits them.
std::vector<Step> forward_steps(int tp, bool sp, int cp, bool moe = false, int ep = 1);
std::vector<Step> backward_steps(int tp, bool sp, int cp, bool moe = false, int ep = 1);

class ProgramMismatch : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class CpuRank {
 public:
  CpuRank(const Setup& s, const Program& p, const RunOptions& o, const ByteCorpus& data, const GroupSet& groups,
          KernelOps& ops)
      : s_(s), p_(&p), o_(o), data_(data), groups_(groups), ops_(ops), me_(groups.world_rank()), at_(p.grid.coord(me_)),
        d_(layer_shapes(s, at_.tp)), stage_(&p.of_rank(me_)), fwd_(forward_steps(d_.tp, d_.sp, s.plan.cp)),
        bwd_(backward_steps(d_.tp, d_.sp, s.plan.cp)), fwd_moe_(forward_steps(d_.tp, d_.sp, s.plan.cp, true, s.plan.ep)),
        bwd_moe_(backward_steps(d_.tp, d_.sp, s.plan.cp, true, s.plan.ep)) {
    chunks_ = make_chunks(s, me_, o.seed);
    dense_chunks_ = s.chunks.at(static_cast<std::size_t>(at_.pp)).size();
    for (Chunk& c : chunks_) {
      const auto [lo, hi] = owned(c);
      m_.push_back(zeros(hi - lo));
      v_.push_back(zeros(hi - lo));
    }
    build_tags();
  }

  std::vector<Chunk>& chunks() { return chunks_; }
  std::vector<Vec>& moments_m() { return m_; }
  std::vector<Vec>& moments_v() { return v_; }

  // One training step; returns (local loss sum over tokens, spans).
  // Variable-length training passes the step's batch (exec/data.hpp) and,
  // with packing, a Program of the batch's micro-batch count (the same Setup
  // and grid but num_microbatches, and the same on every rank).
  void step(int step_index, std::vector<Span>& spans, double& loss_sum, double& grad_norm,
            const VarlenBatch* batch = nullptr, const Program* program = nullptr);

 private:
  // ---- data ----
  void load_batch();
  // Variable-length training: the micro-batches' documents (varlen_batch).
  void load_varlen_batch(const VarlenBatch& batch);
  // Switches to another Program of the same Setup (a step's micro-batch
  // count): its stage's ops and what is derived from them.
  void use_program(const Program& p);
  // Global index of the first sample of micro-batch `mb` on this rank's DP slice.
  [[nodiscard]] std::int64_t first_sample(int mb) const;
  const std::int32_t* tokens(int mb) const { return tokens_.data() + static_cast<std::size_t>(mb) * static_cast<std::size_t>(d_.T); }
  const std::int32_t* targets(int mb) const { return targets_.data() + static_cast<std::size_t>(mb) * static_cast<std::size_t>(d_.T); }

  // Dropout stream of a site: seed per (step, layer, site); each element
  // draws at its index in the unsharded (sample, position, feature) tensor
  // (for_runs), so any sharding draws the same mask.
  [[nodiscard]] std::uint64_t seed_of(int layer, int site) const;
  [[nodiscard]] std::int64_t shard_row0() const { return d_.sp ? d_.tp_rank * d_.Ts : 0; }
  [[nodiscard]] float p_drop() const { return static_cast<float>(s_.model.hidden_dropout); }

  // ---- p2p tags: the rank of an op's 64-bit tag among all tags between the same two ranks ----
  void build_tags();

  // ---- state keyed by (chunk, micro-batch[, layer]) ----
  static std::int64_t key(int chunk, int mb, int layer = -1);
  LayerActs& acts(int chunk, int mb, int layer) { return acts_[key(chunk, mb, layer)]; }
  EdgeActs& edge(int chunk, int mb) { return edges_[key(chunk, mb)]; }
  Chunk& chunk(const Op& op) { return chunks_.at(static_cast<std::size_t>(op.chunk.value_or(0))); }
  // The chunk on this rank holding virtual stage `vs`, if any.
  std::optional<int> chunk_of_stage(int vs) const;
  // The activation entering chunk `c` for micro-batch `mb`: set by the
  // embedding, a receive, or handed over by the chunk before it on this rank.
  Vec& hidden_in(int c, int mb);
  Vec& grad_in(int c, int mb);

  // ---- dispatch ----
  void run_op(std::uint32_t index, const Op& op);

  void dispatch(const Op& op);

  Communicator& tp() { return *groups_.get(CommGroup::tp); }

  // ---- pipeline transfers ----
  void p2p(const Op& op);

  // ---- helpers on sublayer outputs ----
  // x_out = x + dropout(y + bias) over `rows` rows starting at row0 of the micro-batch.
  void bda(Vec& out, const Vec& y, const float* bias, const Vec& x, std::int64_t rows, int layer, int site, int mb,
           std::int64_t row0);
  void bda_backward(Vec& dy_in, const Vec& dout, float* dbias, std::int64_t rows, int layer, int site, int mb,
                    std::int64_t row0);
  void norm_forward(Vec& out, Vec& mean, Vec& rstd, const Vec& in, const float* w, const float* b, std::int64_t rows);
  // dx += norm_backward(dout).
  void norm_backward_add(Vec& dx, const Vec& dout, const Vec& in, const Vec& mean, const Vec& rstd, const float* w,
                         float* dw, float* db, std::int64_t rows);
  void gather_rows(Vec& full, const Vec& shard);
  void scatter_rows(Vec& shard, const Vec& full);

  struct LW {
    float *ln1w, *ln1b, *qkvw, *qkvb, *projw, *projb, *ln2w, *ln2b, *fc1w, *fc1b, *fc2w, *fc2b;
  };
  LW weights(Chunk& c, int l, bool grads);

  // ---- a transformer layer ----
  void layer_forward(const Op& op, int c, int mb, int l, bool recompute);

  void attn_qkv(LayerActs& A, const LW& w, int mb);
  void attn_core(LayerActs& A, int mb);
  void attn_proj(LayerActs& A, const LW& w, int l, int mb);
  void cp_gather_kv(LayerActs& A);
  void b_attn_core(LayerActs& A, const LW& w, const LW& g, int l, int mb);
  void b_cp_reduce_kv(LayerActs& A);
  void b_attn_qkv(LayerActs& A, int c, int mb, const LW& w, const LW& g);
  // The global position of local row `t` of a sample (load-balanced CP chunks).
  [[nodiscard]] std::int32_t position(int cp_rank, std::int64_t t) const;
  // Calls f(first, count, element offset) for each run of rows [row0, row0+rows)
  // of micro-batch `mb` that is contiguous in the unsharded sequence.
  template <class F>
  void for_runs(int mb, std::int64_t row0, std::int64_t rows, F f) const;
  // MoE (exec/cpu_moe.cpp).
  void moe_forward(Action a, LayerActs& A, int c, int mb, int l, bool recompute);
  void moe_backward(Action a, LayerActs& A, int c, int mb, int l);
  void moe_weight(LayerActs& A, int c, int l);
  // Rows grouped by expert (this rank's routing) to the experts' EP ranks;
  // returns the local experts' rows grouped by (local expert, source rank).
  Vec moe_dispatch_rows(LayerActs& A, const Vec& rows, std::int64_t width, bool forward);
  // The inverse: local experts' rows back to the ranks that routed them.
  Vec moe_combine_rows(LayerActs& A, const Vec& local, std::int64_t width);
  void finish_layer(LayerActs& A, int c, int mb, int l, bool recompute, const Vec& y, std::int64_t rows,
                    std::int64_t row0);

  void layer_backward(const Op& op, int c, int mb, int l);

  void mlp_norm_backward(LayerActs& A, const LW& w, const LW& g, const Vec& db, std::int64_t rows);
  void attn_norm_backward(LayerActs& A, int c, int mb, const LW& w, const LW& g, const Vec& da, std::int64_t rows);

  void layer_weight(int c, int mb, int l);

  // ---- the ends of the model ----
  void embedding_forward(const Op& op, int c, int mb);
  // Adds the position embedding of rows [row0, row0+rows) and applies the embedding dropout.
  void embedding_finish(Chunk& ch, Vec& e, int c, int mb, std::int64_t rows, std::int64_t row0);

  void embedding_weight(int c, int mb);

  // The output layer's weight: its own, the last stage's tied copy, or the
  // embedding itself when this rank holds both ends of the model.
  float* output_weight_ptr(Chunk& ch, bool grad);

  void output_forward(const Op& op, int c, int mb);
  const Vec& hidden_out_or_in(int c, int mb);

  void output_backward(const Op& op, int c, int mb);
  void output_norm_backward(EdgeActs& E, Chunk& ch, int c, int mb, const Vec& dy, std::int64_t rows,
                            std::int64_t row0);

  void output_weight(int c, int mb);

  // ---- gradients, optimizer, parameters ----
  void grad_sync(const Op& op);

  void embedding_grad_sync();

  // Elements [lo, hi) of a chunk's buffers this rank updates.
  std::pair<std::int64_t, std::int64_t> owned(const Chunk& ch) const;
  // The group a chunk's gradients are reduced over: DP x CP, or expert-DP for
  // experts; with hybrid sharding (dp_replicas) the rank's replica of DP x CP.
  [[nodiscard]] Communicator& group_of(const Chunk& ch) const;
  // Hybrid sharding: the group that all-reduces a dense chunk's gradient
  // shard across the replicas; nullptr without it.
  [[nodiscard]] Communicator* replicas_of(const Chunk& ch) const;
  // Whether the distributed optimizer shards the chunk (over group_of).
  [[nodiscard]] bool sharded(const Chunk& ch) const;
  Chunk& experts_of(int c) { return chunks_.at(dense_chunks_ + static_cast<std::size_t>(c)); }

  void optimizer();

  void param_sync(const Op& op);
  // zero 3: one unit's parameters (a layer's, or the chunk's others)
  // gathered from the DP shards before a pass uses them.
  void gather_unit(const Op& op, Chunk& ch);
  // zero 2 and 3: one micro-batch's gradients of a chunk, complete,
  // reduce-scattered into the rank's accumulated shard.
  void reduce_microbatch(const Op& op, Chunk& ch, bool expert);

  const Setup& s_;
  const Program* p_;
  const RunOptions& o_;
  const ByteCorpus& data_;
  const GroupSet& groups_;
  KernelOps& ops_;
  int me_;
  GridCoord at_;
  LayerShapes d_;
  const StageProgram* stage_;
  std::vector<Step> fwd_, bwd_, fwd_moe_, bwd_moe_;
  std::vector<Chunk> chunks_;          // the model chunks (dense parameters), then their experts
  std::size_t dense_chunks_ = 0;
  std::vector<Vec> m_, v_;
  int step_ = 0;
  double loss_sum_ = 0, grad_norm_ = 0;
  Ids tokens_, targets_, positions_;   // per local row of a micro-batch
  Ids kv_pos_;                                                // positions of the CP-gathered keys
  // Variable-length training (empty without): per micro-batch, per local row
  // its document id, its position within the document (RoPE, learned
  // positions), its loss mask (0 on a document's last token and on padding)
  // and its dropout element (the token's index in the step's stream,
  // plan-independent; padding after all of them); and the document ids of
  // the CP-gathered keys (kv_pos_'s order).
  struct Packed {
    Ids doc, doc_pos, kv_doc;
    Vec mask;
    std::vector<std::int64_t> element;
  };
  std::vector<Packed> packed_;
  std::int64_t loss_tokens_ = 0;                              // the global batch's tokens with a target
  [[nodiscard]] const Packed* packed(int mb) const {
    return packed_.empty() ? nullptr : &packed_.at(static_cast<std::size_t>(mb));
  }
  std::map<std::int64_t, LayerActs> acts_;
  std::map<std::int64_t, EdgeActs> edges_;
  std::map<std::int64_t, Vec> hidden_, hidden_out_, grad_;
  std::set<std::pair<int, bool>> gathered_chunks_;   // (chunk, expert part)
  // Gradient buckets of each (chunk, expert part) in the stage's Program, and
  // how many of them this step has reached: the whole buffer is reduced at
  // the last one, when every gradient of the chunk is complete.
  std::map<std::pair<int, bool>, int> grad_buckets_, grad_buckets_seen_;
  // Sharded gradients: buckets per (chunk, expert part, micro-batch), those
  // reached, the micro-batches each (chunk, part) reduces, and its shard of
  // the gradients summed over the micro-batches reduced so far.
  std::map<std::tuple<int, bool, int>, int> mb_buckets_, mb_buckets_seen_;
  std::map<std::pair<int, bool>, int> mb_count_, mb_done_;
  std::map<std::pair<int, bool>, Vec> grad_shard_;
  std::map<std::pair<int, std::uint64_t>, int> send_tag_, recv_tag_;
  PointToPoint p2p_;
  // Host copies of the messages (MPI never touches a Vec), declared before
  // the requests so that they outlive them.
  std::vector<std::unique_ptr<std::vector<float>>> send_buffers_;
  std::vector<PointToPoint::Request> sends_;
};

template <class F>
void CpuRank::for_runs(int mb, std::int64_t row0, std::int64_t rows, F f) const {
  if (const Packed* pk = packed(mb)) {   // runs of consecutive tokens of the step's stream
    std::int64_t r = 0;
    while (r < rows) {
      const std::int64_t e = pk->element[static_cast<std::size_t>(row0 + r)];
      std::int64_t n = 1;
      while (r + n < rows && pk->element[static_cast<std::size_t>(row0 + r + n)] == e + n) ++n;
      f(r, n, static_cast<std::uint64_t>(e * d_.h));
      r += n;
    }
    return;
  }
  const std::int64_t Tl = s_.seq_length / s_.plan.cp;   // rows of one sample on this rank
  std::int64_t r = 0;
  while (r < rows) {
    const std::int64_t row = row0 + r;
    const std::int64_t sample = first_sample(mb) + row / Tl;
    const std::int64_t pos = positions_[static_cast<std::size_t>(row)];
    std::int64_t n = 1;   // extend while the next row is the next position of the same sample
    while (r + n < rows && (row + n) / Tl == row / Tl && positions_[static_cast<std::size_t>(row + n)] == pos + n) ++n;
    f(r, n, static_cast<std::uint64_t>((sample * s_.seq_length + pos) * d_.h));
    r += n;
  }
}

}  // namespace megascope::exec
