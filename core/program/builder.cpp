// build_program: walks each pipeline rank's schedule (core/schedule) and
// emits, per step, the receive, the embedding / layers / output-and-loss
// work (edge_ops.cpp, layer_ops.cpp), and the send; then gradient synchronisation, the
// optimizer step and, with the distributed optimizer, the parameter
// all-gather.
//
// Gradient buckets: one per model chunk (dense and expert parameters apart),
// reduced over DP x CP (dense) or expert-DP (experts). With
// overlap_grad_reduce a chunk's bucket is reduced as soon as its last weight
// gradient is done; otherwise all buckets are reduced after the last backward.
// With overlap_param_gather the parameter all-gather of a chunk runs at the
// start of the iteration and only that chunk's first forward waits for it.
#include "core/program/builder.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <span>
#include <vector>

#include "core/accounting/memory.hpp"
#include "core/accounting/params.hpp"
#include "core/program/edge_ops.hpp"
#include "core/program/stage_writer.hpp"

namespace megascope {

using detail::Deps;
using detail::LayerEmitter;
using detail::OpContext;
using detail::StageWriter;
using detail::embedding_forward;
using detail::embedding_weight;
using detail::heads_backward;
using detail::heads_forward;
using detail::last_stage_backward;
using detail::last_stage_forward;
using detail::mtp_stage_backward;
using detail::mtp_stage_forward;
using detail::mtp_weight;
using detail::output_weight;
using detail::tokens_of;
using detail::word_params;

namespace {

// Matching tag of a pipeline transfer: the pass, the micro-batch, the
// virtual stage that receives it and the DualPipe direction.
std::uint64_t p2p_tag(Pass pass, int mb, int to_stage, int direction) {
  return (static_cast<std::uint64_t>(pass) << 56) | (static_cast<std::uint64_t>(direction) << 48) |
         (static_cast<std::uint64_t>(mb) << 20) | static_cast<std::uint64_t>(to_stage);
}

struct ChunkParams {
  double dense = 0;    // parameters of the chunk, dense (incl. embedding/output it holds)
  double expert = 0;
};

// Whether a chunk with the MTP layers keeps a copy of the word embedding to
// look the tokens ahead up in: untied, or (tied) on a standalone MTP stage,
// whose loss stage's copy is elsewhere; never on a one-stage model.
bool mtp_embedding_copy(const Setup& s, const ChunkLayers& ch) {
  return ch.mtp > 0 && s.virtual_stages > 1 && (!s.model.tied_embeddings || !ch.loss);
}

ChunkParams chunk_params(const Setup& s, const ChunkLayers& ch) {
  const Sharding sh{s.plan.tp, s.etp, s.plan.ep};
  ParamSplit p;
  for (int l = ch.first; l < ch.first + ch.count; ++l) p += layer_params(s.model, l, sh);
  const double word = word_params(s);
  if (ch.embedding) p.dense += word;
  if (ch.loss && (!s.model.tied_embeddings || s.virtual_stages > 1)) p.dense += word;
  if (ch.mtp > 0) {
    for (int k = 0; k < ch.mtp; ++k) p += mtp_layer_params(s.model, sh);
    if (mtp_embedding_copy(s, ch)) p.dense += word;
  }
  return {p.dense, p.expert};
}

// Parameters of one piece of a chunk, in the order the backward finishes
// them: the output layer, the layers from last to first, the embedding.
struct Piece {
  enum class Kind : std::uint8_t { output, layer, mtp, embedding } kind = Kind::layer;
  int layer = 0;              // Kind::layer, and Kind::mtp's layer (num_layers + depth - 1)
  double dense = 0;           // parameters whose gradients the piece completes
  double expert = 0;
};

std::vector<Piece> backward_pieces(const Setup& s, const ChunkLayers& ch) {
  const Sharding sh{s.plan.tp, s.etp, s.plan.ep};
  const double word = word_params(s);
  std::vector<Piece> out;
  // The output layer's weight: its own (untied) or the last stage's copy of
  // the embedding; tied on a rank that also holds the embedding, the
  // embedding piece carries it.
  if (ch.loss) out.push_back({Piece::Kind::output, 0, (!s.model.tied_embeddings || s.virtual_stages > 1) ? word : 0.0, 0});
  if (ch.mtp > 0) {
    // MTP layers, deepest first; the first depth's piece also completes the
    // embedding copy they look the tokens up in (chunk_params).
    for (int k = s.model.mtp_num_layers - 1; k >= 0; --k) {
      const ParamSplit p = mtp_layer_params(s.model, sh);
      const double copy = k == 0 && mtp_embedding_copy(s, ch) ? word : 0.0;
      out.push_back({Piece::Kind::mtp, s.model.num_layers + k, p.dense + copy, p.expert});
    }
  }
  for (int l = ch.first + ch.count - 1; l >= ch.first; --l) {
    const ParamSplit p = layer_params(s.model, l, sh);
    out.push_back({Piece::Kind::layer, l, p.dense, p.expert});
  }
  if (ch.embedding) out.push_back({Piece::Kind::embedding, 0, word, 0});
  return out;
}

// Megatron-LM DDP's default bucket size: max(40M, 1M x dp) parameters.
double bucket_params(const Setup& s) { return std::max(40e6, 1e6 * s.dp * s.plan.cp); }

// Gradients reduced per bucket of this many parameters: sharded gradients
// (zero 2 and 3) unit by unit, each piece as its weight gradients complete.
// A plan's grad_bucket sets the size (DeepSpeed's reduce_bucket_size).
double grad_bucket(const Setup& s) {
  if (s.plan.grad_bucket) return *s.plan.grad_bucket;
  return zero_stage(s.plan) >= 2 ? 0.0 : bucket_params(s);
}

}  // namespace

Result<Program> build_program(const Setup& s) { return build_program(s, BuildOptions{}); }

Result<Program> build_program(const Setup& s, const BuildOptions& options) {
  Program prog;
  const int pp = s.plan.pp;
  const int m = s.num_microbatches;
  prog.grid = RankGrid{s.plan.tp, s.plan.cp, s.dp, pp, s.etp, s.plan.ep, s.edp};
  prog.grid.shard = s.dp_shard;
  prog.schedule = s.plan.schedule;
  prog.microbatches = m;
  if (options.loads && options.loads->size() != static_cast<std::size_t>(m))
    return tl::unexpected(Error{fmt::format("{} micro-batch loads for {} micro-batches", options.loads->size(), m),
                                "training.lengths", {}});
  std::vector<RankSchedule> schedule =
      options.order ? *options.order : make_schedule(s.plan.schedule, pp, s.vpp, m, s.microbatch_group);
  if (schedule.size() != static_cast<std::size_t>(pp))
    return tl::unexpected(
        Error{fmt::format("an order of {} pipeline ranks for pp {}", schedule.size(), pp), "plan.schedule", {}});
  // --overlap-moe-expert-parallel-comm: each backward that follows a forward
  // runs with it as one overlapped unit (below, the F&B units).
  if (s.plan.moe_ep_overlap)
    for (RankSchedule& steps : schedule)
      for (std::size_t i = 1; i < steps.size(); ++i)
        if (steps[i].pass == Pass::B && steps[i - 1].pass == Pass::F && !steps[i - 1].paired) steps[i].paired = true;
  const bool dualpipe = s.plan.schedule == Schedule::dualpipe;
  const int last_vs = s.virtual_stages - 1;

  // Which rank holds (direction, virtual stage): DualPipe's two directions use
  // chunk 0 and chunk 1; every other schedule has one holder per virtual stage.
  std::map<std::pair<int, int>, int> holder;
  for (int r = 0; r < pp; ++r)
    for (std::size_t c = 0; c < s.chunks[static_cast<std::size_t>(r)].size(); ++c)
      holder[{dualpipe ? static_cast<int>(c) : 0, s.chunks[static_cast<std::size_t>(r)][c].virtual_stage}] = r;

  const double h = static_cast<double>(s.model.hidden_size);
  const double tokens = tokens_of(s);
  // With sequence parallelism each TP rank sends its 1/tp slice of the
  // activation. Without it Megatron-Core sends the whole activation from every
  // TP rank; pre-Core Megatron-LM (pp_scatter_gather) sent the 1/tp slice and
  // all-gathered it over TP after the receive, before the compute that needs it.
  const bool scatter_gather = s.plan.pp_scatter_gather && s.plan.tp > 1 && !s.sequence_parallel;
  const double p2p_bytes = 2.0 * tokens * h / (s.sequence_parallel || scatter_gather ? s.plan.tp : 1);
  // Standalone MTP (its stage before the loss's): from that stage on, a
  // transfer carries the main and every depth's hidden states together.
  int mtp_vs = -1;
  for (std::size_t vs = 0; vs < s.layout.size(); ++vs)
    if (s.layout[vs].mtp > 0 && !s.layout[vs].loss) mtp_vs = static_cast<int>(vs);
  // The bytes crossing the boundary between virtual stages `lower` and lower
  // + 1 for micro-batch `mb` (variable-length training: its own tokens').
  const auto boundary_bytes = [&](int lower, int mb) {
    double b = mtp_vs >= 0 && lower >= mtp_vs ? p2p_bytes * (1 + s.model.mtp_num_layers) : p2p_bytes;
    if (options.loads && mb >= 0 && static_cast<std::size_t>(mb) < options.loads->size()) {
      const std::int64_t t = (*options.loads)[static_cast<std::size_t>(mb)].tokens;
      if (t > 0) b *= static_cast<double>(t) / static_cast<double>(s.seq_length);
    }
    return b;
  };
  const auto gathered = [&](StageWriter& w, std::uint32_t recv, const OpContext& ctx, double bytes) {
    if (!scatter_gather) return recv;
    const OpLabel label = w.program().ops[recv].label;
    return w.collective(OpKind::all_gather, Stream::tp, CommGroup::tp, label, ctx, bytes * s.plan.tp, {recv});
  };
  const double grad_bytes = bytes_of(s.training.grad_dtype);
  const bool distopt = s.plan.distributed_optimizer && s.dp * s.plan.cp > 1;
  // Sharded gradients (zero 2, 3) are reduce-scattered in every micro-batch;
  // sharded parameters (zero 3) all-gathered unit by unit in each pass.
  const bool sharded_grads = zero_stage(s.plan) >= 2;
  const bool fsdp = zero_stage(s.plan) >= 3;
  const double gather_b = param_gather_bytes(s.training, s.plan);
  const Sharding shard{s.plan.tp, s.etp, s.plan.ep};
  // Hybrid sharding: the sharded collectives inside a replica (dp_shard),
  // the gradients' shards all-reduced across the replicas once a step.
  const bool hsdp = s.plan.dp_replicas > 1;
  const CommGroup shard_group = hsdp ? CommGroup::dp_shard : CommGroup::dp_cp;
  const bool shard_collectives = s.dp_shard > 1;

  prog.stages.resize(static_cast<std::size_t>(pp));
  for (int r = 0; r < pp; ++r) {
    StageProgram& sp = prog.stages[static_cast<std::size_t>(r)];
    sp.stage = r;
    if (r > 0) {  // stages are alike: start at the previous one's size rather than grow by doubling
      const StageProgram& prev = prog.stages[static_cast<std::size_t>(r - 1)];
      sp.ops.reserve(prev.ops.size() + prev.ops.size() / 8);
      sp.deps.reserve(prev.deps.size() + prev.deps.size() / 8);
    }
    StageWriter w(sp);
    LayerEmitter layers{s, w, options.loads};
    const auto& chunks = s.chunks[static_cast<std::size_t>(r)];
    const RankSchedule& steps = schedule[static_cast<std::size_t>(r)];

    // The last W step of each chunk, where its gradient bucket is complete.
    std::vector<std::size_t> last_w(chunks.size(), 0);
    for (std::size_t i = 0; i < steps.size(); ++i)
      if (steps[i].pass == Pass::W) last_w[static_cast<std::size_t>(steps[i].chunk)] = i;

    std::vector<ChunkParams> params;
    for (const ChunkLayers& ch : chunks) params.push_back(chunk_params(s, ch));

    // Parameter all-gather of the distributed optimizer, overlapped with the
    // forward: issued bucket by bucket at the start of the iteration (forward
    // order); the first forward through a bucket's layers waits for it.
    std::vector<std::map<int, std::uint32_t>> layer_gate(chunks.size());   // first layer of a bucket -> its gather
    std::vector<std::optional<std::uint32_t>> embedding_gate(chunks.size());
    if (distopt && s.plan.overlap_param_gather) {
      for (std::size_t c = 0; c < chunks.size(); ++c) {
        std::vector<Piece> pieces = backward_pieces(s, chunks[c]);
        std::reverse(pieces.begin(), pieces.end());
        OpContext ctx{Phase::param_sync, std::nullopt, std::nullopt, static_cast<std::int32_t>(c)};
        double dense = 0, expert = 0;
        std::optional<int> first_layer;
        bool first_is_embedding = false;   // the bucket starts with the embedding
        auto flush = [&]() {
          if (dense + expert == 0) return;
          std::optional<std::uint32_t> ag;
          if (dense > 0 && shard_collectives)
            ag = w.collective(OpKind::all_gather, Stream::dp, shard_group, OpLabel::dp_param, ctx, dense * gather_b);
          if (expert > 0 && s.edp > 1)
            ag = w.collective(OpKind::all_gather, Stream::dp, CommGroup::edp, OpLabel::dp_param, ctx, expert * gather_b);
          if (ag) {
            if (first_layer) layer_gate[c][*first_layer] = *ag;
            else if (first_is_embedding) embedding_gate[c] = *ag;
          }
          dense = expert = 0;
          first_layer.reset();
          first_is_embedding = false;
        };
        for (std::size_t k = 0; k < pieces.size(); ++k) {
          if (dense + expert == 0) {
            if (pieces[k].kind == Piece::Kind::layer || pieces[k].kind == Piece::Kind::mtp) first_layer = pieces[k].layer;
            first_is_embedding = pieces[k].kind == Piece::Kind::embedding;
          }
          dense += pieces[k].dense;
          expert += pieces[k].expert;
          if (dense + expert >= bucket_params(s)) flush();
        }
        flush();
      }
    }
    std::vector<bool> chunk_started(chunks.size(), false);

    // zero 3: one unit's parameters gathered over DP x CP (dense) and
    // expert-DP (experts) on the dp_param stream, issued after `after`;
    // returns the last gather (the stream runs them in order).
    const auto gather_unit = [&](ParamSplit p, const OpContext& ctx, std::optional<std::uint32_t> after) {
      std::optional<std::uint32_t> ag;
      if (p.dense > 0 && shard_collectives)
        ag = w.collective(OpKind::all_gather, Stream::dp_param, shard_group, OpLabel::dp_param, ctx, p.dense * gather_b, after);
      if (p.expert > 0 && s.edp > 1)
        ag = w.collective(OpKind::all_gather, Stream::dp_param, CommGroup::edp, OpLabel::dp_param, ctx, p.expert * gather_b, after);
      return ag;
    };
    // A pass's layer gathers, in the pass's order: each issued fsdp_prefetch
    // units ahead of the layer that needs it.
    struct PassGathers {
      std::vector<std::optional<std::uint32_t>> op;
      int issued = 0;
    };
    const auto issue_gathers = [&](PassGathers& g, const ChunkLayers& ch, bool reverse, int upto, const OpContext& ctx,
                                   std::optional<std::uint32_t> after) {
      OpContext gctx{Phase::param_sync, std::nullopt, ctx.microbatch, ctx.chunk};
      for (; g.issued <= std::min(upto, ch.count - 1); ++g.issued) {
        const int l = reverse ? ch.first + ch.count - 1 - g.issued : ch.first + g.issued;
        gctx.layer = l;
        g.op[static_cast<std::size_t>(g.issued)] = gather_unit(layer_params(s.model, l, shard), gctx, after);
      }
    };
    // A compute op that waits for `dep` and the gather `g` (when there is one).
    const auto wait_gather = [&](std::optional<std::uint32_t> dep, std::optional<std::uint32_t> g, const OpContext& ctx) {
      if (!g) return dep;
      Deps join;
      if (dep) join.push(*dep);
      join.push(*g);
      return std::optional<std::uint32_t>(w.compute(OpLabel::attention, ctx, {}, join));
    };

    std::vector<std::uint32_t> grad_syncs;
    std::vector<std::size_t> pending_chunks;
    // What an unsplit B step leaves to its paired W step (step index `step`):
    // the weight gradients not yet reduced, the last weight-gradient op and
    // the input gradient's last op.
    struct CarriedW {
      bool active = false;
      std::size_t step = 0;
      double dense = 0, expert = 0;
      std::optional<std::uint32_t> input_grad, last_w;
    };
    CarriedW carried_w;
    // A micro-batch passing between two virtual stages held by this rank (the
    // V schedules' turn): the forward's output and the backward's input
    // gradient, by (direction, micro-batch, virtual stage).
    std::map<std::tuple<int, int, int>, std::uint32_t> f_out, b_out;
    // Sharded gradients: each micro-batch's reductions carry its number.
    // Hybrid sharding: the step's last reduction of a bucket (`last`) is
    // followed by the all-reduce of its shard across the replicas.
    auto reduce = [&](std::size_t c, double dense, double expert, Deps deps, std::optional<std::int32_t> mb = std::nullopt,
                      bool last = true) {
      OpContext ctx{Phase::gradient_sync, std::nullopt, sharded_grads ? mb : std::nullopt, static_cast<std::int32_t>(c)};
      const OpKind kind = distopt ? OpKind::reduce_scatter : OpKind::all_reduce;
      if (dense > 0 && hsdp) {
        std::optional<std::uint32_t> rs;
        if (shard_collectives)
          rs = w.collective(kind, Stream::dp, shard_group, OpLabel::dp_grad, ctx, dense * grad_bytes, deps);
        if (rs) grad_syncs.push_back(*rs);
        if (last)
          grad_syncs.push_back(w.collective(OpKind::all_reduce, Stream::dp, CommGroup::dp_replica, OpLabel::dp_grad, ctx,
                                            dense * grad_bytes / s.dp_shard, rs ? Deps{*rs} : deps));
      } else if (dense > 0 && s.dp * s.plan.cp > 1)
        grad_syncs.push_back(w.collective(kind, Stream::dp, CommGroup::dp_cp, OpLabel::dp_grad, ctx, dense * grad_bytes, deps));
      if (expert > 0 && s.edp > 1)
        grad_syncs.push_back(w.collective(kind, Stream::dp, CommGroup::edp, OpLabel::dp_grad, ctx, expert * grad_bytes, deps));
    };

    // Pipeline transfers. Overlapped (overlap_p2p_comm): each send is posted
    // when its data is ready and each receive gates only what consumes it.
    // Synchronous (Megatron-LM's 1f1b and gpipe, and its interleaved schedule
    // without --overlap-p2p-communication): the rank's steps form groups
    // separated by communication points. At each point the group's sends and
    // the next group's receives are posted together, and the next group's
    // compute waits for all of them. A group is one step (with an unsplit B's
    // W); the interleaved schedule's steady state pairs a forward with the
    // backward after it and sends the forward's output only after that
    // backward (send_forward_backward_recv_forward_backward).
    //
    // The interleaved schedule with overlap_p2p_comm but without
    // overlap_p2p_warmup_flush (Megatron-Core's default) is synchronous in
    // its warm-up (each forward's output sent and the next input received,
    // both waited for) and its flush (likewise each backward's gradient),
    // and overlapped in the steady state between them.
    const bool all_sync = !s.overlap_p2p_comm && pp > 1;
    const bool ends_sync = !all_sync && pp > 1 && s.plan.schedule == Schedule::interleaved && !s.plan.overlap_p2p_warmup_flush;
    const bool sync_p2p = all_sync || ends_sync;
    const bool pair_fb = all_sync && s.plan.schedule == Schedule::interleaved;
    std::vector<int> group_of(steps.size(), 0);
    const int warmup = s.plan.schedule == Schedule::interleaved && sync_p2p
                           ? interleaved_warmup(pp, s.vpp, m, r, s.microbatch_group)
                           : 0;
    // Which steps communicate synchronously: every step, or the warm-up's
    // forwards and the backwards after the last forward.
    std::vector<char> sync_step(steps.size(), all_sync ? 1 : 0);
    if (ends_sync) {
      std::size_t last_f = 0;
      for (std::size_t i = 0; i < steps.size(); ++i)
        if (steps[i].pass == Pass::F) last_f = i;
      for (std::size_t i = 0, forwards = 0; i < steps.size(); ++i) {
        if (steps[i].pass == Pass::F) ++forwards;
        sync_step[i] = (steps[i].pass == Pass::F && static_cast<int>(forwards) <= warmup) || i > last_f;
      }
    }
    for (std::size_t i = 1, forwards = !steps.empty() && steps[0].pass == Pass::F ? 1 : 0; i < steps.size(); ++i) {
      const ScheduleStep& a = steps[i - 1];
      const ScheduleStep& b = steps[i];
      const bool own_w = b.pass == Pass::W && b.paired && a.pass == Pass::B && a.microbatch == b.microbatch &&
                         a.chunk == b.chunk;
      // A steady-state forward (one after the warm-up) and the backward after it.
      const bool fb = pair_fb && a.pass == Pass::F && b.pass == Pass::B && static_cast<int>(forwards) > warmup;
      group_of[i] = group_of[i - 1] + (own_w || fb ? 0 : 1);
      if (b.pass == Pass::F) ++forwards;
    }
    const auto peer_of = [&](const ScheduleStep& st, int stage) { return holder.at({dualpipe ? st.chunk : 0, stage}); };
    // The receive step j needs from another rank, if any, posted after `deps`.
    const auto receive = [&](std::size_t j, Deps deps) -> std::optional<std::uint32_t> {
      const ScheduleStep& st = steps[j];
      const int vs = chunks[static_cast<std::size_t>(st.chunk)].virtual_stage;
      const int dir = dualpipe ? st.chunk : 0;
      OpContext ctx{Phase::forward, std::nullopt, st.microbatch, st.chunk};
      if (st.pass == Pass::F && vs > 0 && peer_of(st, vs - 1) != r)
        return gathered(w, w.p2p(OpKind::recv, OpLabel::pp_activation, ctx, peer_of(st, vs - 1),
                                 p2p_tag(Pass::F, st.microbatch, vs, dir), boundary_bytes(vs - 1, st.microbatch), deps),
                        ctx, boundary_bytes(vs - 1, st.microbatch));
      ctx.phase = Phase::backward_input;
      if (st.pass == Pass::B && vs < last_vs && peer_of(st, vs + 1) != r)
        return gathered(w, w.p2p(OpKind::recv, OpLabel::pp_gradient, ctx, peer_of(st, vs + 1),
                                 p2p_tag(Pass::B, st.microbatch, vs, dir), boundary_bytes(vs, st.microbatch), deps),
                        ctx, boundary_bytes(vs, st.microbatch));
      return std::nullopt;
    };
    std::vector<std::optional<std::uint32_t>> posted(steps.size());   // synchronous: receives posted ahead
    struct HeldSend {
      OpLabel label;
      OpContext ctx;
      int peer;
      std::uint64_t tag;
      double bytes;
      Deps deps;
    };
    std::vector<HeldSend> held;                 // synchronous: this group's sends, posted at its end
    std::vector<std::uint32_t> sent;            // synchronous: the last group's sends
    std::size_t cur = 0;   // the step being written
    const auto send = [&](OpLabel label, const OpContext& ctx, int to, std::uint64_t tag, double bytes, Deps deps) {
      if (sync_step[cur]) held.push_back({label, ctx, to, tag, bytes, deps});
      else w.p2p(OpKind::send, label, ctx, to, tag, bytes, deps);
    };

    std::vector<std::uint32_t> step_begin(steps.size() + 1, 0);   // each step's first op
    for (std::size_t i = 0; i < steps.size(); ++i) {
      cur = i;
      step_begin[i] = w.size();
      const std::optional<std::uint32_t> step_start = w.last_compute();   // where the host issues the step's gathers
      const ScheduleStep& st = steps[i];
      const ChunkLayers& ch = chunks[static_cast<std::size_t>(st.chunk)];
      const int vs = ch.virtual_stage;
      const int dir = dualpipe ? st.chunk : 0;
      OpContext ctx{Phase::forward, std::nullopt, st.microbatch, st.chunk};
      const auto peer = [&](int stage) { return peer_of(st, stage); };
      // The first overlapped step after a synchronous one still waits at the
      // point that ends it (Megatron-Core's last warm-up exchange receives
      // the next forward's input too).
      if ((sync_step[i] && (i == 0 || group_of[i] != group_of[i - 1])) || (i > 0 && !sync_step[i] && sync_step[i - 1])) {
        // A communication point: the group's receives are posted with the
        // last group's sends, and its first compute waits for all of them.
        Deps gate;
        for (std::uint32_t x : sent) gate.push(x);
        sent.clear();
        const std::optional<std::uint32_t> prev_end = w.last_compute();
        for (std::size_t j = i; j < steps.size() && group_of[j] == group_of[i]; ++j)
          if ((posted[j] = receive(j, prev_end))) gate.push(*posted[j]);
        if (gate.count > 0) w.compute(OpLabel::attention, ctx, {}, gate);
      }

      if (st.pass == Pass::F) {
        Deps first_deps;
        if (vs > 0 && peer(vs - 1) != r) {
          // Synchronous: the communication point's gate has waited for it.
          if (!posted[i]) first_deps.push(*receive(i, {}));
        } else if (vs > 0) {
          if (auto it = f_out.find({dir, st.microbatch, vs - 1}); it != f_out.end()) first_deps.push(it->second);
        }
        const bool first_pass = !chunk_started[static_cast<std::size_t>(st.chunk)];
        chunk_started[static_cast<std::size_t>(st.chunk)] = true;
        if (first_pass && embedding_gate[static_cast<std::size_t>(st.chunk)])
          first_deps.push(*embedding_gate[static_cast<std::size_t>(st.chunk)]);
        // zero 3: the root unit (embedding, output layer, MTP depths: what
        // the chunk holds beyond its layers) gathered for the micro-batch's
        // forward and kept to its backward, then the first layers'.
        PassGathers fg{std::vector<std::optional<std::uint32_t>>(static_cast<std::size_t>(ch.count)), 0};
        if (fsdp) {
          ParamSplit root{params[static_cast<std::size_t>(st.chunk)].dense, params[static_cast<std::size_t>(st.chunk)].expert};
          for (int l = ch.first; l < ch.first + ch.count; ++l) {
            const ParamSplit p = layer_params(s.model, l, shard);
            root.dense -= p.dense;
            root.expert -= p.expert;
          }
          OpContext gctx{Phase::param_sync, std::nullopt, st.microbatch, st.chunk};
          if (auto g = gather_unit(ParamSplit{std::max(0.0, root.dense), std::max(0.0, root.expert)}, gctx, step_start);
              g && ch.embedding)
            first_deps.push(*g);
          issue_gathers(fg, ch, false, s.plan.fsdp_prefetch, ctx, step_start);
        }
        std::optional<std::uint32_t> dep;
        if (ch.embedding) {
          dep = embedding_forward(w, layers.setup_for(ctx), ctx, first_deps);
        } else if (first_deps.count > 0) {
          // A receive (or the parameter gather) gates the first layer.
          dep = w.compute(OpLabel::attention, ctx, {}, first_deps);
        }
        for (int l = ch.first; l < ch.first + ch.count; ++l) {
          const auto& gates = layer_gate[static_cast<std::size_t>(st.chunk)];
          if (auto g = gates.find(l); first_pass && g != gates.end()) {
            Deps join;
            if (dep) join.push(*dep);
            join.push(g->second);
            dep = w.compute(OpLabel::attention, ctx, {}, join);   // wait for this bucket's parameters
          }
          if (fsdp) {
            const int pos = l - ch.first;
            if (pos > 0) issue_gathers(fg, ch, false, pos + s.plan.fsdp_prefetch, ctx, dep);
            dep = wait_gather(dep, fg.op[static_cast<std::size_t>(pos)], ctx);
          }
          dep = layers.forward(l, ctx, dep);
        }
        const std::map<int, std::uint32_t>* gates = first_pass ? &layer_gate[static_cast<std::size_t>(st.chunk)] : nullptr;
        // Standalone MTP: the depths on their own stage, the heads on the loss's.
        if (ch.mtp > 0 && !ch.loss) dep = mtp_stage_forward(w, layers, layers.setup_for(ctx), ctx, dep, gates);
        if (ch.loss && ch.mtp == 0 && s.model.mtp_num_layers > 0) {
          dep = heads_forward(w, layers.setup_for(ctx), ctx, dep);
        } else if (ch.loss) {
          dep = last_stage_forward(w, layers, layers.setup_for(ctx), ctx, dep, gates);
        } else if (peer(vs + 1) != r) {
          send(OpLabel::pp_activation, ctx, peer(vs + 1), p2p_tag(Pass::F, st.microbatch, vs + 1, dir),
               boundary_bytes(vs, st.microbatch), dep);
        } else if (dep) {
          f_out[{dir, st.microbatch, vs}] = *dep;
        }
      } else if (st.pass == Pass::B) {
        ctx.phase = Phase::backward_input;
        // An unsplit backward (the next step is this B's paired W) runs as
        // Megatron-LM's autograd does: each layer's weight gradients right
        // after its input gradients (and the output layer's after its own),
        // so a gradient bucket is complete, and its reduction can start, as
        // soon as the backward has passed its layers. The W step then only
        // sends the input gradient and reduces the rest.
        const bool w_follows = i + 1 < steps.size() && steps[i + 1].pass == Pass::W && steps[i + 1].paired &&
                               steps[i + 1].microbatch == st.microbatch && steps[i + 1].chunk == st.chunk;
        OpContext wctx = ctx;
        wctx.phase = Phase::backward_weight;
        const bool w_overlap = w_follows && (sharded_grads || i + 1 == last_w[static_cast<std::size_t>(st.chunk)]) &&
                               s.plan.overlap_grad_reduce;
        MEGASCOPE_CHECK(w_follows || !sharded_grads, "sharded gradients need each backward's weight gradients with it");
        std::vector<Piece> pieces;
        if (w_follows) pieces = backward_pieces(s, ch);
        std::size_t next_piece = 0;
        double dense = 0, expert = 0;
        std::optional<std::uint32_t> wdep;
        // Without the asynchronous TP all-reduce (tp_grad_overlap off) a
        // layer's weight gradients wait for its input gradient's collective,
        // and the next layer's backward for them: one op at a time, as
        // synchronous collectives ran. With it they follow on the compute
        // stream while the collective runs.
        // With CP the QKV weight gradient needs the KV gradients reduced over
        // the CP ring, which the layer's backward ends with: it waits too.
        const bool w_after_collective = !s.plan.tp_grad_overlap || s.plan.cp > 1;
        const auto w_waits = [&](std::optional<std::uint32_t> input_grad) {
          return w_after_collective ? input_grad : std::nullopt;
        };
        // What the next layer's backward waits for: the input gradient's
        // collective and these weight gradients (its first collective is
        // issued after them). Without tp_grad_overlap the weight gradients
        // already waited for the collective; with it, a join.
        const auto after_weights = [&](std::optional<std::uint32_t> input_grad) -> std::optional<std::uint32_t> {
          if (!w_follows || !wdep || !input_grad) return input_grad;
          if (w_after_collective) return wdep;
          if (s.plan.tp == 1) return input_grad;
          return w.compute(OpLabel::attention, ctx, {}, Deps{*input_grad, *wdep});
        };
        const auto weight_of = [&](Piece::Kind kind, auto&& emit) {
          if (!w_follows) return;
          MEGASCOPE_CHECK(next_piece < pieces.size() && pieces[next_piece].kind == kind, "backward pieces out of order");
          const Piece& piece = pieces[next_piece++];
          wdep = emit(piece);
          dense += piece.dense;
          expert += piece.expert;
          if (w_overlap && dense + expert >= grad_bucket(s)) {
            reduce(static_cast<std::size_t>(st.chunk), dense, expert, wdep, st.microbatch,
                   i + 1 == last_w[static_cast<std::size_t>(st.chunk)]);
            dense = expert = 0;
          }
        };
        std::optional<std::uint32_t> dep;
        if (vs < last_vs && peer(vs + 1) != r)
          dep = posted[i] ? posted[i] : receive(i, {});
        else if (vs < last_vs)
          if (auto it = b_out.find({dir, st.microbatch, vs + 1}); it != b_out.end()) dep = it->second;
        const auto edge_weights = [&](int k, std::uint32_t input_grad) {
          if (k < 0)
            weight_of(Piece::Kind::output,
                      [&](const Piece&) { return output_weight(w, layers.setup_for(wctx), wctx, w_waits(input_grad)); });
          else
            weight_of(Piece::Kind::mtp, [&](const Piece&) {
              return mtp_weight(w, layers, layers.setup_for(wctx), wctx, k, w_waits(input_grad));
            });
          return *after_weights(input_grad);
        };
        if (ch.loss && (ch.mtp > 0 || s.model.mtp_num_layers == 0))
          dep = last_stage_backward(w, layers, layers.setup_for(ctx), ctx, dep, edge_weights);
        else if (ch.loss)   // standalone MTP: the heads here, the depths on their own stage
          dep = heads_backward(w, layers.setup_for(ctx), ctx, dep, edge_weights);
        if (ch.mtp > 0 && !ch.loss) dep = mtp_stage_backward(w, layers, layers.setup_for(ctx), ctx, dep, edge_weights);
        const Recompute& rc = s.plan.recompute;
        const bool selective = rc.granularity == RecomputeGranularity::selective;
        const bool full = rc.granularity == RecomputeGranularity::full;
        const int recomputed = !full ? 0 : (*rc.method == RecomputeMethod::uniform ? ch.count : std::min(ch.count, *rc.num_layers));
        const int group = full ? (*rc.method == RecomputeMethod::uniform ? *rc.num_layers : 1) : 1;
        // zero 3, resharded after the forward: the layers gathered again, in
        // backward order, fsdp_prefetch ahead.
        const bool regather = fsdp && s.plan.reshard_after_forward;
        PassGathers bg{std::vector<std::optional<std::uint32_t>>(static_cast<std::size_t>(ch.count)), 0};
        if (regather) issue_gathers(bg, ch, true, s.plan.fsdp_prefetch, ctx, step_start);
        for (int i_l = ch.count - 1; i_l >= 0; --i_l) {
          const int l = ch.first + i_l;
          const bool recompute_here = i_l < recomputed && (i_l + 1 == recomputed || (i_l + 1) % group == 0);
          if (regather) {
            // A recomputed group needs all its layers: up to its first.
            const int pos = ch.count - 1 - i_l;
            const int need = recompute_here ? pos + i_l % group : pos;
            if (pos > 0 || need > s.plan.fsdp_prefetch) issue_gathers(bg, ch, true, std::max(need, pos + s.plan.fsdp_prefetch), ctx, dep);
            dep = wait_gather(dep, bg.op[static_cast<std::size_t>(need)], ctx);
          }
          if (recompute_here) {
            // Recompute the forward of this layer's group before its backward.
            const int start = i_l - (i_l % group);
            OpContext rctx = ctx;
            rctx.phase = Phase::recompute;
            for (int j = start; j <= i_l; ++j) dep = layers.forward(ch.first + j, rctx, dep);
          }
          dep = layers.backward_input(l, ctx, dep, selective);
          weight_of(Piece::Kind::layer,
                    [&](const Piece& piece) { return layers.backward_weight(piece.layer, wctx, w_waits(dep)); });
          if (i_l > 0) dep = after_weights(dep);
        }
        if (w_follows && next_piece < pieces.size())
          weight_of(Piece::Kind::embedding,   // its gradient is the first layer's input gradient
                    [&](const Piece&) { return embedding_weight(w, layers.setup_for(wctx), wctx, dep); });
        if (w_follows) carried_w = CarriedW{true, i + 1, dense, expert, dep, wdep};
        if (vs > 0 && peer(vs - 1) == r && dep) b_out[{dir, st.microbatch, vs}] = *dep;
        if (vs > 0 && peer(vs - 1) != r && !w_follows)
          send(OpLabel::pp_gradient, ctx, peer(vs - 1), p2p_tag(Pass::B, st.microbatch, vs - 1, dir),
               boundary_bytes(vs - 1, st.microbatch), dep);
      } else {
        ctx.phase = Phase::backward_weight;
        // Weight gradients in backward order; with overlap_grad_reduce the last
        // micro-batch of the chunk launches each bucket as soon as it is complete.
        const bool last_of_chunk = i == last_w[static_cast<std::size_t>(st.chunk)];
        const bool overlap = (last_of_chunk || sharded_grads) && s.plan.overlap_grad_reduce;
        double dense = 0, expert = 0;
        std::optional<std::uint32_t> dep;
        Deps send_deps;
        std::vector<Piece> pieces;
        if (carried_w.active && carried_w.step == i) {   // emitted layer by layer with its B
          dense = carried_w.dense;
          expert = carried_w.expert;
          dep = carried_w.last_w;
          if (carried_w.input_grad) send_deps.push(*carried_w.input_grad);
          carried_w.active = false;
        } else {
          pieces = backward_pieces(s, ch);
        }
        for (const Piece& piece : pieces) {
          switch (piece.kind) {
            case Piece::Kind::output:
              dep = output_weight(w, layers.setup_for(ctx), ctx);
              break;
            case Piece::Kind::layer:
              dep = layers.backward_weight(piece.layer, ctx, std::nullopt);
              break;
            case Piece::Kind::mtp:
              dep = mtp_weight(w, layers, layers.setup_for(ctx), ctx, piece.layer - s.model.num_layers, std::nullopt);
              break;
            case Piece::Kind::embedding:
              dep = embedding_weight(w, layers.setup_for(ctx), ctx);
              break;
          }
          dense += piece.dense;
          expert += piece.expert;
          if (overlap && dense + expert >= grad_bucket(s)) {
            reduce(static_cast<std::size_t>(st.chunk), dense, expert, dep, st.microbatch, last_of_chunk);
            dense = expert = 0;
          }
        }
        const bool after_own_b = st.paired && i > 0 && steps[i - 1].pass == Pass::B &&
                                 steps[i - 1].microbatch == st.microbatch && steps[i - 1].chunk == st.chunk;
        if (after_own_b && vs > 0 && peer(vs - 1) != r) {
          OpContext bctx = ctx;
          bctx.phase = Phase::backward_input;
          if (dep) send_deps.push(*dep);
          send(OpLabel::pp_gradient, bctx, peer(vs - 1), p2p_tag(Pass::B, st.microbatch, vs - 1, dir),
               boundary_bytes(vs - 1, st.microbatch), send_deps);
        }
        // Sharded gradients without overlap: the whole chunk's after each backward.
        if (overlap || sharded_grads)
          reduce(static_cast<std::size_t>(st.chunk), dense, expert, dep, st.microbatch, last_of_chunk);
        else if (last_of_chunk) pending_chunks.push_back(static_cast<std::size_t>(st.chunk));
      }
      if (sync_step[i] && (i + 1 == steps.size() || group_of[i + 1] != group_of[i])) {
        // The group's sends go when its last compute has ended.
        const std::optional<std::uint32_t> end = w.last_compute();
        for (HeldSend& hs : held) {
          if (end) hs.deps.push(*end);
          sent.push_back(w.p2p(OpKind::send, hs.label, hs.ctx, hs.peer, hs.tag, hs.bytes, hs.deps));
        }
        held.clear();
      }
    }

    step_begin[steps.size()] = w.size();
    // DualPipe(V)'s F&B units: a forward and the paired backward after it (with
    // that backward's own W), their ops interleaved (detail::interleave_fb).
    std::vector<detail::FbUnit> units;
    for (std::size_t i = 1; i < steps.size(); ++i) {
      if (!(steps[i].pass == Pass::B && steps[i].paired && steps[i - 1].pass == Pass::F)) continue;
      const std::size_t last = i + 1 < steps.size() && steps[i + 1].pass == Pass::W && steps[i + 1].paired &&
                                       steps[i + 1].microbatch == steps[i].microbatch && steps[i + 1].chunk == steps[i].chunk
                                   ? i + 1
                                   : i;
      units.push_back({step_begin[i - 1], step_begin[i], step_begin[last + 1]});
    }
    // Synchronous: the schedule returns when its last sends have ended.
    if (!sent.empty()) {
      Deps tail;
      for (std::uint32_t x : sent) tail.push(x);
      w.compute(OpLabel::attention, OpContext{Phase::backward_input, std::nullopt, std::nullopt, std::nullopt}, {}, tail);
    }
    // Gradient synchronisation not overlapped with the backward.
    const std::optional<std::uint32_t> last = w.last_compute();
    for (std::size_t c : pending_chunks) reduce(c, params[c].dense, params[c].expert, last);
    // Tied embeddings across stages: the first and last stage add their gradients.
    if (pp > 1 && s.model.tied_embeddings && (s.holds_embedding(r) != s.holds_output(r))) {
      OpContext ctx{Phase::gradient_sync, std::nullopt, std::nullopt, std::nullopt};
      grad_syncs.push_back(w.collective(OpKind::all_reduce, Stream::dp, CommGroup::embedding, OpLabel::embedding_grad,
                                        ctx, static_cast<double>(s.padded_vocab) * h / s.plan.tp * grad_bytes, last));
    }
    // Optimizer step: Adam reads the gradient, master weight and both moments and
    // writes them back with the 16-bit weight: about 30 bytes per parameter it owns.
    double dense = 0, expert = 0;
    for (const ChunkParams& p : params) {
      dense += p.dense;
      expert += p.expert;
    }
    const double owned = distopt ? dense / s.dp_shard + expert / s.edp : dense + expert;
    OpContext octx{Phase::optimizer, std::nullopt, std::nullopt, std::nullopt};
    Deps opt_deps;
    if (last) opt_deps.push(*last);
    const std::uint32_t opt =
        w.compute(OpLabel::optimizer, octx, {detail::memory(MemoryOp::optimizer, optimizer_step_bytes_per_param(s.training) * owned)},
                  opt_deps);
    for (std::uint32_t g : grad_syncs) w.add_dep(opt, g);
    if (distopt && !s.plan.overlap_param_gather && !fsdp) {
      OpContext ctx{Phase::param_sync, std::nullopt, std::nullopt, std::nullopt};
      if (shard_collectives) w.collective(OpKind::all_gather, Stream::dp, shard_group, OpLabel::dp_param, ctx, dense * gather_b, {opt});
      if (expert > 0 && s.edp > 1)
        w.collective(OpKind::all_gather, Stream::dp, CommGroup::edp, OpLabel::dp_param, ctx, expert * gather_b, {opt});
    }
    if (options.fb_overlap && !units.empty()) detail::interleave_fb(sp, units);
  }
  if (auto ok = validate_program(prog); !ok) return tl::unexpected(ok.error());
  return prog;
}

LayerProbe probe_edge(const Setup& s, EdgePass pass) {
  LayerProbe probe;
  StageWriter w(probe.ops);
  LayerEmitter layers{s, w};
  OpContext ctx{Phase::forward, std::nullopt, 0, 0};
  switch (pass) {
    case EdgePass::embedding_forward: probe.last = embedding_forward(w, layers.setup_for(ctx), ctx, {}); break;
    case EdgePass::embedding_weight:
      ctx.phase = Phase::backward_weight;
      probe.last = embedding_weight(w, layers.setup_for(ctx), ctx);
      break;
    // The output edge carries the MTP depths too (last_stage_forward).
    case EdgePass::output_forward: probe.last = last_stage_forward(w, layers, layers.setup_for(ctx), ctx, std::nullopt); break;
    case EdgePass::output_backward_input:
      ctx.phase = Phase::backward_input;
      probe.last = last_stage_backward(w, layers, layers.setup_for(ctx), ctx, std::nullopt, [](int, std::uint32_t x) { return x; });
      break;
    case EdgePass::output_weight:
      ctx.phase = Phase::backward_weight;
      probe.last = output_weight(w, layers.setup_for(ctx), ctx);
      for (int k = s.model.mtp_num_layers - 1; k >= 0; --k) probe.last = mtp_weight(w, layers, layers.setup_for(ctx), ctx, k, probe.last);
      break;
  }
  return probe;
}

LayerProbe probe_fb_pair(const Setup& s, int layer, bool interleave) {
  LayerProbe probe;
  StageWriter w(probe.ops);
  LayerEmitter layers{s, w};
  const bool selective = s.plan.recompute.granularity == RecomputeGranularity::selective;
  layers.forward(layer, OpContext{Phase::forward, std::nullopt, 0, 0}, std::nullopt);
  const std::uint32_t mid = w.size();
  const std::uint32_t b = layers.backward_input(layer, OpContext{Phase::backward_input, std::nullopt, 1, 0}, std::nullopt, selective);
  const std::uint32_t wg = layers.backward_weight(layer, OpContext{Phase::backward_weight, std::nullopt, 1, 0},
                                                  s.plan.tp_grad_overlap && s.plan.cp == 1 ? std::nullopt
                                                                                             : std::optional{b});
  const detail::FbUnit unit{0, mid, w.size()};
  probe.last = interleave ? detail::interleave_fb(probe.ops, std::span(&unit, 1))[wg] : wg;
  return probe;
}

LayerProbe probe_layer(const Setup& s, int layer, LayerPass pass) {
  LayerProbe probe;
  StageWriter w(probe.ops);
  LayerEmitter layers{s, w};
  OpContext ctx{Phase::forward, std::nullopt, 0, 0};
  switch (pass) {
    case LayerPass::forward:
      probe.last = layers.forward(layer, ctx, std::nullopt);
      break;
    case LayerPass::backward_input:
      ctx.phase = Phase::backward_input;
      probe.last = layers.backward_input(layer, ctx, std::nullopt,
                                         s.plan.recompute.granularity == RecomputeGranularity::selective);
      break;
    case LayerPass::backward_weight:
      ctx.phase = Phase::backward_weight;
      probe.last = layers.backward_weight(layer, ctx, std::nullopt);
      break;
  }
  return probe;
}

}  // namespace megascope
