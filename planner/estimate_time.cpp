// Stage 1's step time: the pipeline of the busiest rank's micro-batches,
// its bubble, the sharded data-parallel traffic beside the passes, and the
// data-parallel tail (docs/planner.md).
#include "planner/estimate.hpp"

#include "planner/estimate_impl.hpp"

namespace megascope::planner {

Result<Estimate> Estimator::Impl::evaluate(const Candidate& c, double fit_bound, double reject_bound) {
  auto mem = memory(c);
  if (!mem) return mem;
  Estimate e = *mem;
  const double bound = e.fits ? fit_bound : reject_bound;
  auto lt = layer_times(c);
  if (!lt) return tl::unexpected(lt.error());
  const TimeEntry& T = **lt;
  const Layout& lay = **layout(c);   // memory() found it: the memo answers
  const int p = c.pp;
  const int m = static_cast<int>(in.training.global_batch_size / (static_cast<std::int64_t>(c.mbs) * c.dp));
  const bool full = c.recompute == RecomputeGranularity::full;
  const bool uniform = c.recompute_method == RecomputeMethod::uniform;
  const bool dualpipe = c.schedule == Schedule::dualpipe;
  const double share = dualpipe ? 0.5 : 1.0;   // DualPipe: a micro-batch runs one of the rank's two chunks
  // DualPipe(V)'s F&B units: a forward and a backward interleaved, about half
  // the rank's layers each, one layer's pair hiding its communication.
  const std::vector<int>* fb_units_of =
      c.schedule == Schedule::dualpipe || c.schedule == Schedule::dualpipev ? &fb_units(c.schedule, p, m) : nullptr;

  double cmax = 0, csum = 0, fsum = 0, bsum = 0, wsum = 0;
  back.assign(static_cast<std::size_t>(p), 0.0);
  // zero 2 and 3: each micro-batch reduce-scatters the rank's gradients unit
  // by unit (and at 3 gathers each unit before its forward and backward, the
  // root unit once), on streams beside the compute: a pass takes the longer
  // of its compute and its communication. The last unit's reduction is
  // left after the last backward (last_unit_rs).
  const int edp_all = c.gpus / (c.etp * c.ep * c.pp);
  const bool sharded = c.zero >= 2 && (c.dp * c.cp > 1 || edp_all > 1);
  // HSDP: the last micro-batch also all-reduces each unit's shard across
  // the replicas after its reduce-scatter. replica_tail: what is left after
  // the last backward, with or without HSDP.
  std::vector<double> last_unit_rs, replica_tail;
  if (sharded) {
    last_unit_rs.assign(static_cast<std::size_t>(p), 0.0);
    replica_tail.assign(static_cast<std::size_t>(p), 0.0);
  }
  struct ZeroComm {
    double traffic = 0, first = 0, replica = 0, replica_last = 0;
    double scale_out = 0;   // of the traffic, what runs over scale-out links
  };
  const RankGrid zgrid = grid_of(c);
  // A layer unit's reduction and gather, the same on every rank: [dense, MoE].
  std::array<Link, 2> layer_rs{}, layer_ag{};
  bool have_layer_units = false;
  const auto zero_comm = [&](int r, const RankLayout& rl) {
    const Units u = units_of(lay, rl);
    const double grad_b = bytes_of(in.training.grad_dtype), gb = gather_bytes(c);
    const auto on = [&](sim::Collective kind, CommGroup g, double bytes) {
      const CommTable* t = table(c.gpus, zgrid, kind, g);
      const double s = time_on(t, bytes);
      return Link{s, t && t->scale_out ? s : 0.0};
    };
    const auto unit_time = [&](sim::Collective kind, double params, double bytes_per) {
      return params > 0 ? on(kind, shard_group(c), params * bytes_per) : Link{};
    };
    // A MoE unit: its dense part over DP x CP, its experts over expert-DP.
    const auto moe_split = [&](sim::Collective kind, double bytes_per) {
      if (u.moe <= 0) return Link{};
      const ParamSplit& ps = lay.moe_unit;
      Link t = on(kind, CommGroup::dp_cp, ps.dense * bytes_per);
      if (edp_all > 1) t = t + on(kind, CommGroup::edp, ps.expert * bytes_per);
      return t;
    };
    if (!have_layer_units) {
      layer_rs = {unit_time(sim::Collective::reduce_scatter, u.dense, grad_b), moe_split(sim::Collective::reduce_scatter, grad_b)};
      if (c.zero >= 3)
        layer_ag = {unit_time(sim::Collective::all_gather, u.dense, gb), moe_split(sim::Collective::all_gather, gb)};
      have_layer_units = true;
    }
    // One unit's reduction and gather of each kind the rank holds.
    const Link dense_rs = rl.dense_layers > 0 ? layer_rs[0] : Link{};
    const Link moe_rs = rl.moe_layers > 0 ? layer_rs[1] : Link{};
    const Link root_rs = unit_time(sim::Collective::reduce_scatter, u.root, grad_b);
    const Link rs = dense_rs * rl.dense_layers + moe_rs * rl.moe_layers + root_rs;
    // The last unit reduced: the root on the embedding's rank (or a rank
    // without layers), else a layer.
    const bool root_last = rl.embedding || rl.dense_layers + rl.moe_layers == 0;
    last_unit_rs[static_cast<std::size_t>(r)] = (root_last ? root_rs : rl.dense_layers > 0 ? dense_rs : moe_rs).all;
    Link ag;
    double largest_ag = 0;
    if (c.zero >= 3) {
      const Link dense_ag = rl.dense_layers > 0 ? layer_ag[0] : Link{};
      const Link moe_ag = rl.moe_layers > 0 ? layer_ag[1] : Link{};
      const Link root_ag = unit_time(sim::Collective::all_gather, u.root, gb);
      ag = (dense_ag * rl.dense_layers + moe_ag * rl.moe_layers) * 2 + root_ag;
      largest_ag = std::max({dense_ag.all, moe_ag.all, root_ag.all});
    }
    // Gathers and reductions run on streams of their own but share the
    // links: their times add. Each pass of a chunk (forward and backward,
    // once per schedule step) waits for its first unit's gather, which
    // nothing before it prefetched.
    ZeroComm z;
    z.first = 2.0 * static_cast<double>(rl.chunks.size()) * largest_ag;
    z.traffic = rs.all + ag.all;
    z.scale_out = rs.net + ag.net;
    if (c.dp_replicas > 1) {
      const double shard = shard_size(c);
      const auto replica_ar = [&](double params) {
        return params > 0 ? time_on(table(c.gpus, zgrid, sim::Collective::all_reduce, CommGroup::dp_replica),
                                    params / shard * grad_b)
                          : 0.0;
      };
      z.replica = rl.dense_layers * replica_ar(u.dense) + replica_ar(u.root);
      z.replica_last = replica_ar(root_last ? u.root : u.dense);
    }
    return z;
  };
  for (int r = 0; r < p; ++r) {
    const RankLayout& rl = lay.ranks[static_cast<std::size_t>(r)];
    double F = rl.dense_layers * T.dense.f + rl.moe_layers * T.moe.f;
    double B = rl.dense_layers * T.dense.b + rl.moe_layers * T.moe.b;
    double W = rl.dense_layers * T.dense.w + rl.moe_layers * T.moe.w;
    if (rl.embedding) {
      F += T.emb_f;
      W += T.emb_w;
    }
    if (rl.output) {
      F += T.out_f;
      B += T.out_b;
      W += T.out_w;
    }
    // The layers' own collectives over scale-out links (recomputed forwards too).
    double net = rl.dense_layers * (T.dense.net_f + T.dense.net_b + T.dense.net_w) +
                 rl.moe_layers * (T.moe.net_f + T.moe.net_b + T.moe.net_w);
    if (full) {
      for (const ChunkInfo& ch : rl.chunks) {
        const int rec = uniform ? ch.count : std::min<int>(ch.count, c.recompute_layers);
        const int rec_moe = ch.moe_prefix[static_cast<std::size_t>(rec)];
        B += (rec - rec_moe) * T.dense.f + rec_moe * T.moe.f;
        net += (rec - rec_moe) * T.dense.net_f + rec_moe * T.moe.net_f;
      }
    }
    F *= share;
    B *= share;
    W *= share;
    double cr = F + B + W;
    if (fb_units_of) {
      const double per_unit = 0.5 * (rl.dense_layers * T.dense.fb_saving + rl.moe_layers * T.moe.fb_saving);
      cr = std::max(0.0, cr - per_unit * (*fb_units_of)[static_cast<std::size_t>(r)] / m);
    }
    if (sharded) {
      // The traffic hides behind the compute up to its own length. Its
      // part over scale-out links shares the NICs with the layers' own
      // collectives there: those, on the critical path, slow by as much of
      // it as runs beside them (at most their own time), and the NICs
      // carry both. The first gathers of each pass wait in front of it.
      const ZeroComm z = zero_comm(r, rl);
      const double busy =
          std::max({cr + std::min(net, z.scale_out) * share, z.traffic * share, (z.scale_out + net) * share});
      // After the last backward: the last unit's reduction (and its
      // replicas' all-reduce), or whatever of the traffic the last
      // micro-batch could not fit, whichever ends later.
      const std::size_t ri = static_cast<std::size_t>(r);
      replica_tail[ri] = std::max(last_unit_rs[ri] + z.replica_last, (z.traffic + z.replica) * share - busy);
      cr = busy + z.first * share;
    }
    cmax = std::max(cmax, cr);
    csum += cr;
    fsum += F;
    bsum += B;
    wsum += W;
    back[static_cast<std::size_t>(r)] = B + W;
  }
  const double fm = fsum / p, bm = bsum / p, wm = wsum / p;
  double bubble = 0;
  switch (c.schedule) {
    case Schedule::gpipe:
    case Schedule::one_f_one_b: bubble = csum - cmax; break;
    case Schedule::interleaved: bubble = (csum - cmax) / c.vpp; break;
    // ZB-1p and ZB-2p keep the faster of their heuristic's order and ZB-H1's
    // (ZB-H2's), which fit their limits: the handcrafted forms bound them.
    case Schedule::zb_1p:
    case Schedule::zb_h1: bubble = (p - 1) * std::max(0.0, fm + bm - wm); break;
    // ZB-H2: rank 0's own gap is (p - 1)(F + B - 2W) (Qi et al. Table 2);
    // without post-validation the last rank also starts (p - 1) F late.
    // Fewer than 2p - 1 micro-batches cannot fill the warm-up: about one
    // pass time per missing micro-batch stays idle.
    case Schedule::zb_2p:
    case Schedule::zb_h2:
      bubble = (p - 1) * std::max(c.post_validation ? 0.0 : fm, fm + bm - 2 * wm) +
               std::max(0, 2 * p - 1 - m) * (fm + bm + wm) / 3;
      break;
    case Schedule::zb_v: bubble = (p - 1) * std::max(0.0, fm + bm - 2 * wm) / 2; break;
    case Schedule::dualpipe: bubble = (p / 2 - 1) * std::max(0.0, fm + 2 * bm - wm); break;
    case Schedule::dualpipev: bubble = (p - 1) * std::max(0.0, fm + 2 * bm - wm) / 2; break;
  }
  const int edp = c.gpus / (c.etp * c.ep * c.pp);
  const bool distopt = c.distopt && c.dp * c.cp > 1;
  const double optimizer_step_bytes = optimizer_step_bytes_per_param(in.training);
  // Parameters whose optimizer state a rank updates.
  const auto owned_of = [&](const RankLayout& rl) {
    return distopt ? rl.params.dense / shard_size(c) + rl.params.expert / edp : rl.params.total();
  };
  // A lower bound of the step that needs no collective: the pipeline below
  // is m (cmax + waits) + bubble + fill transfers, every term non-negative,
  // and the step is at least the pipeline plus rank 0's tail, whose terms
  // are non-negative and include its optimizer step. In floating point
  // too: adding a non-negative term, or multiplying by m, never rounds below
  // the exact smaller value.
  {
    const double lower = m * cmax + bubble;
    if (const double with_tail = lower + cost.memory_s(MemoryOp::optimizer, optimizer_step_bytes * owned_of(lay.ranks.front()));
        with_tail > bound) {
      e.step_s = with_tail;
      e.pipeline_s = lower;
      e.bubble_s = bubble;
      e.bounded = true;
      return e;
    }
  }
  const RankGrid grid = grid_of(c);
  const double h = static_cast<double>(in.model.hidden_size);
  const double seq = static_cast<double>(in.training.seq_length.value_or(in.model.seq_length));
  // As the Program sends (core/program/builder.cpp): the 1/tp slice with SP,
  // the whole activation from every TP rank without it (Megatron-Core).
  const double p2p_bytes = 2.0 * seq / c.cp * c.mbs * h / (c.sp && c.tp > 1 ? c.tp : 1);
  const double p2p = p > 1 ? comm_s(c.gpus, grid, sim::Collective::send_recv, CommGroup::pp, p2p_bytes) : 0.0;
  // Megatron-LM's gpipe and 1f1b wait for every transfer (the search's plans
  // take their schedule's overlap_p2p_comm): each micro-batch's forward and
  // backward end with one on the critical path.
  const bool sync_p2p = !default_overlap_p2p_comm(c.schedule);
  const double pipeline = m * (cmax + (sync_p2p ? 2.0 * p2p : 0.0)) + bubble + 2.0 * (p - 1) * p2p;

  // Gradient reduction, optimizer, parameter gather: per rank after its last backward.
  const double grad_b = bytes_of(in.training.grad_dtype), param_b = gather_bytes(c);
  const double bucket = std::max(40e6, 1e6 * c.dp * c.cp);
  const sim::Collective reduce = distopt ? sim::Collective::reduce_scatter : sim::Collective::all_reduce;
  const double v_eff = c.schedule == Schedule::interleaved ? c.vpp : 1.0;
  const bool has_dp = c.dp * c.cp > 1;
  const bool hsdp = c.dp_replicas > 1;
  const double shard = shard_size(c);
  CommTable* dense_reduce = has_dp && shard > 1 ? table(c.gpus, grid, reduce, shard_group(c)) : nullptr;
  // HSDP: each bucket's shard all-reduced across the replicas after its reduce-scatter.
  CommTable* replica_reduce = hsdp ? table(c.gpus, grid, sim::Collective::all_reduce, CommGroup::dp_replica) : nullptr;
  CommTable* expert_reduce = edp > 1 ? table(c.gpus, grid, reduce, CommGroup::edp) : nullptr;
  CommTable* dense_gather = distopt ? table(c.gpus, grid, sim::Collective::all_gather, shard_group(c)) : nullptr;
  CommTable* expert_gather = distopt && edp > 1 ? table(c.gpus, grid, sim::Collective::all_gather, CommGroup::edp)
                                                : nullptr;
  CommTable* embedding = p > 1 && in.model.tied_embeddings
                             ? table(c.gpus, grid, sim::Collective::all_reduce, CommGroup::embedding)
                             : nullptr;
  const double embedding_bytes = static_cast<double>(in.model.padded_vocab(c.tp)) * h / c.tp * grad_b;
  double step = pipeline, dp_worst = 0;
  for (int r = 0; r < p; ++r) {
    const RankLayout& rl = lay.ranks[static_cast<std::size_t>(r)];
    const double nch = static_cast<double>(rl.chunks.size());
    double grad = 0, last_bucket = 0;
    if (rl.params.dense > 0) {
      grad += nch * (time_on(dense_reduce, rl.params.dense / nch * grad_b) +
                     time_on(replica_reduce, rl.params.dense / nch / shard * grad_b));
      last_bucket += time_on(dense_reduce, std::min(bucket, rl.params.dense) * grad_b) +
                     time_on(replica_reduce, std::min(bucket, rl.params.dense) / shard * grad_b);
    }
    if (rl.params.expert > 0) {
      grad += nch * time_on(expert_reduce, rl.params.expert / nch * grad_b);
      last_bucket += time_on(expert_reduce, std::min(bucket, rl.params.expert) * grad_b);
    }
    double exposed = sharded ? replica_tail[static_cast<std::size_t>(r)]
                     : c.overlap_grad_reduce ? std::max(last_bucket, grad - back[static_cast<std::size_t>(r)]) : grad;
    if (rl.embedding != rl.output) exposed += time_on(embedding, embedding_bytes);
    exposed += cost.memory_s(MemoryOp::optimizer, optimizer_step_bytes * owned_of(rl));
    if (distopt && c.zero < 3) {
      const double dense_ag = time_on(
          dense_gather, (c.overlap_param_gather ? std::min(bucket, rl.params.dense) : rl.params.dense) * param_b);
      const double expert_ag =
          rl.params.expert > 0
              ? time_on(expert_gather,
                        (c.overlap_param_gather ? std::min(bucket, rl.params.expert) : rl.params.expert) * param_b)
              : 0.0;
      exposed += dense_ag + expert_ag;
    }
    const double offset = r * back[static_cast<std::size_t>(r)] / v_eff;
    step = std::max(step, pipeline - offset + exposed);
    dp_worst = std::max(dp_worst, exposed);
  }
  e.pipeline_s = pipeline;
  e.bubble_s = pipeline - m * cmax;
  e.dp_exposed_s = dp_worst;
  e.step_s = step;
  return e;
}

}  // namespace megascope::planner
