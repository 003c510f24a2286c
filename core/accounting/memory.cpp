#include "core/accounting/memory.hpp"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>

#include "core/accounting/inflight.hpp"
#include "core/accounting/params.hpp"

namespace megascope {

namespace {

// Precision-aware: master weight bytes per parameter (none for fp32 weights).
double master_bytes(const TrainingSpec& t) {
  if (t.params_dtype == Dtype::fp32) return 0.0;
  return master_as_remainders(t) ? 2.0 : bytes_of(t.optimizer_precision.main_params);
}

}  // namespace

BytesPerParam bytes_per_param(const Setup& s) {
  BytesPerParam b;
  const TrainingSpec& t = s.training;
  // FP8 training keeps an FP8 copy of each weight beside the 16-bit one; with
  // fp8_param_gather the FP8 copy is the only compute weight.
  b.weights = s.plan.fp8_param_gather ? 1.0 : bytes_of(t.params_dtype) + (t.precision == Precision::fp8 ? 1.0 : 0.0);
  b.grads = bytes_of(t.grad_dtype);
  const OptimizerPrecision& op = t.optimizer_precision;
  if (!op.enabled) {
    b.optimizer = 8.0;                                             // Adam m and v, fp32
    if (t.params_dtype != Dtype::fp32) b.optimizer += 4.0;         // fp32 master weights
    if (t.grad_dtype != Dtype::fp32) b.optimizer += 4.0;           // fp32 gradient copy
    return b;
  }
  // Precision-aware: the moments and master weights in their dtypes, the
  // main gradients read where they are (no fp32 copy).
  b.optimizer = bytes_of(op.exp_avg) + bytes_of(op.exp_avg_sq) + master_bytes(t);
  return b;
}

double param_gather_bytes(const TrainingSpec& t, const PlanSpec& p) {
  return p.fp8_param_gather && t.precision == Precision::fp8 ? 1.0 : bytes_of(t.params_dtype);
}

FsdpWorkingSet fsdp_working_set(const Setup& s, int pp_rank) {
  FsdpWorkingSet ws;
  const int zero = zero_stage(s.plan);
  if (zero < 2) return ws;
  const Sharding sh{s.plan.tp, s.etp, s.plan.ep};
  double largest = 0, layers = 0;
  for (const ChunkLayers& ch : s.chunks[static_cast<std::size_t>(pp_rank)])
    for (int l = ch.first; l < ch.first + ch.count; ++l) {
      const double n = layer_params(s.model, l, sh).total();
      largest = std::max(largest, n);
      layers += n;
    }
  // The embedding, output layer and MTP depths: the rest of the stage's parameters.
  const double root = std::max(0.0, rank_params(s, pp_rank).total() - layers);
  // Gradients: the unit whose weight gradients are being computed and the
  // one being reduce-scattered.
  ws.grads = 2 * std::max(largest, root);
  if (zero < 3) return ws;
  // Parameters: the unit computing and the prefetched ones, and the root
  // unit, gathered for the micro-batch's forward and kept to its backward;
  // without resharding after the forward, every unit stays gathered.
  ws.params = s.plan.reshard_after_forward ? (1 + s.plan.fsdp_prefetch) * largest + root : layers + root;
  return ws;
}

double optimizer_step_bytes_per_param(const TrainingSpec& t) {
  const OptimizerPrecision& op = t.optimizer_precision;
  if (!op.enabled) return 30.0;
  const double master = master_bytes(t);
  // The weight is written; read too where it is the master (fp32 weights)
  // or holds half of it (remainders).
  const bool read_weight = t.params_dtype == Dtype::fp32 || master_as_remainders(t);
  const double weight = (read_weight ? 2.0 : 1.0) * bytes_of(t.params_dtype);
  return bytes_of(t.grad_dtype) + 2.0 * master + 2.0 * bytes_of(op.exp_avg) + 2.0 * bytes_of(op.exp_avg_sq) + weight;
}

namespace {

// Number of communicators of size > 1 a rank belongs to.
int communicator_count(const Setup& s) {
  const PlanSpec& p = s.plan;
  int n = 0;
  n += p.tp > 1;
  n += p.cp > 1;
  n += s.dp * p.cp > 1;            // gradient reduction over DP x CP
  if (p.dp_replicas > 1) n += 2;   // HSDP: the shard group and the replica group
  n += p.pp > 1;                   // pipeline point-to-point
  if (s.model.moe) {
    n += p.ep > 1;
    n += s.etp > 1 && s.etp != p.tp;
    n += s.edp > 1 && s.edp != s.dp * p.cp;
  }
  if (p.pp > 1 && s.model.tied_embeddings) n += 1;   // embedding group of the first and last stage
  return n;
}

void add_term(std::map<std::string, double>& acc, std::vector<std::string>& order, const std::string& name,
              double bytes) {
  if (!acc.count(name)) order.push_back(name);
  acc[name] += bytes;
}

}  // namespace

MemoryReport memory_report(const Setup& s) {
  MemoryReport rep;
  rep.capacity_bytes = s.cluster.device.memory_bytes;
  const BytesPerParam bpp = bytes_per_param(s);
  const int zero = zero_stage(s.plan);
  const double dense_shard = zero >= 1 ? s.dp_shard : 1.0;
  const double expert_shard = zero >= 1 ? s.edp : 1.0;
  const double gather_bytes = param_gather_bytes(s.training, s.plan);
  const auto inflight = inflight_microbatches(s);
  const EdgeActivations edges = edge_activations(s);
  const Recompute& rc = s.plan.recompute;
  const bool full = rc.granularity == RecomputeGranularity::full;

  // Activations depend on the layer only through its kind (dense or MoE).
  std::optional<LayerActivations> dense_layer, moe_layer;
  auto activations_of = [&](int layer) -> const LayerActivations& {
    std::optional<LayerActivations>& slot = s.model.is_moe_layer(layer) ? moe_layer : dense_layer;
    if (!slot) slot = layer_activations(s, layer);
    return *slot;
  };

  for (int r = 0; r < s.plan.pp; ++r) {
    StageMemory st;
    st.stage = r;
    const ParamSplit params = rank_params(s, r);
    st.params = params.total();
    const auto sharded = [&](double per_param) {
      return params.dense * per_param / dense_shard + params.expert * per_param / expert_shard;
    };
    st.weights_bytes = zero >= 3 ? sharded(bpp.weights) : params.total() * bpp.weights;
    st.grads_bytes = zero >= 2 ? sharded(bpp.grads) : params.total() * bpp.grads;
    st.optimizer_bytes = sharded(bpp.optimizer);

    std::map<std::string, double> acc;
    std::vector<std::string> order;
    double working_set = 0;   // full recompute: activations of the group being recomputed
    const auto& chunks = s.chunks[static_cast<std::size_t>(r)];
    // One chunk's activations with `in` micro-batches in flight, added to (acc, order).
    const auto add_chunk = [&](const ChunkLayers& ch, const ChunkInflight in, std::map<std::string, double>& into,
                               std::vector<std::string>& keys) {
      const int recomputed = !full ? 0 : (*rc.method == RecomputeMethod::uniform ? ch.count
                                                                                  : std::min(ch.count, *rc.num_layers));
      double group = 0;
      // Stored (not recomputed) layers, counted by kind; each term is added once per kind.
      int stored_dense = 0, stored_moe = 0;
      double checkpoints = 0, weight_grad = 0;
      for (int i = 0; i < ch.count; ++i) {
        const int layer = ch.first + i;
        const LayerActivations& la = activations_of(layer);
        if (i < recomputed) {
          // uniform: one checkpoint (the group's input) per group of recompute_layers;
          // block: every recomputed layer is checkpointed on its own.
          const bool group_starts = *rc.method == RecomputeMethod::block || i % *rc.num_layers == 0;
          if (group_starts) checkpoints += la.checkpoint;
          group += la.stored;
          const bool group_ends = *rc.method == RecomputeMethod::block || (i + 1) % *rc.num_layers == 0 ||
                                  i + 1 == recomputed;
          if (group_ends) {
            working_set = std::max(working_set, group);
            group = 0;
          }
        } else {
          (s.model.is_moe_layer(layer) ? stored_moe : stored_dense) += 1;
        }
        weight_grad += la.weight_grad_state;
      }
      for (auto [count, moe] : {std::pair<int, bool>{stored_dense, false}, {stored_moe, true}}) {
        if (count == 0) continue;
        const LayerActivations& la = moe ? *moe_layer : *dense_layer;
        for (const ActivationTerm& t : la.terms) add_term(into, keys, t.name, in.full * count * t.bytes);
      }
      if (checkpoints > 0) add_term(into, keys, "recompute_checkpoints", in.full * checkpoints);
      if (in.weight_grad_only > 0) add_term(into, keys, "weight_grad_state", in.weight_grad_only * weight_grad);
      if (ch.embedding)
        for (const ActivationTerm& t : edges.embedding) add_term(into, keys, t.name, in.full * t.bytes);
      if (ch.loss)
        for (const ActivationTerm& t : edges.output) add_term(into, keys, t.name, in.full * t.bytes);
      // MTP depths: their layers where they run, their heads with the loss
      // (one stage, or a standalone MTP stage before the loss's).
      if (const int k = s.model.mtp_num_layers; k > 0 && (ch.mtp > 0 || ch.loss)) {
        const LayerActivations& last = activations_of(s.model.num_layers - 1);
        const double per = (ch.mtp > 0 ? last.stored : 0.0) + (ch.loss ? edges.output_bytes() : 0.0);
        add_term(into, keys, ch.mtp > 0 ? "mtp_layers" : "mtp_heads", in.full * k * per);
      }
    };
    std::vector<ChunkInflight> counts = inflight[static_cast<std::size_t>(r)];
    if (chunks.size() > 1) {
      // Chunks that keep different bytes per micro-batch: the heaviest step
      // of the order (inflight_candidates), not the closed form's.
      std::vector<double> per_mb(chunks.size(), 0.0);
      for (std::size_t c = 0; c < chunks.size(); ++c) {
        std::map<std::string, double> one;
        std::vector<std::string> names;
        add_chunk(chunks[c], ChunkInflight{1, 0}, one, names);
        for (const auto& [name, bytes] : one) per_mb[c] += bytes;
      }
      if (std::adjacent_find(per_mb.begin(), per_mb.end(), std::not_equal_to<>()) != per_mb.end()) {
        const std::vector<std::vector<int>> walked =
            inflight_candidates(s.plan.schedule, s.plan.pp, s.vpp, s.num_microbatches, r, s.microbatch_group);
        if (const std::vector<int>* heaviest = heaviest_inflight(walked, per_mb.data()))
          for (std::size_t c = 0; c < chunks.size() && c < heaviest->size(); ++c) counts[c].full = (*heaviest)[c];
      }
    }
    working_set = 0;
    for (std::size_t c = 0; c < chunks.size(); ++c) {
      st.inflight_microbatches += counts[c].full;
      add_chunk(chunks[c], counts[c], acc, order);
    }
    if (working_set > 0) add_term(acc, order, "recompute_working_set", working_set);
    for (const std::string& name : order) {
      st.activation_terms.push_back({name, acc[name]});
      st.activations_bytes += acc[name];
    }

    const RuntimeOverheads& o = s.training.overheads;
    st.other_terms.push_back({"cuda_context", o.cuda_context_bytes});
    st.other_terms.push_back({"nccl_buffers", o.nccl_bytes_per_group * communicator_count(s)});
    st.other_terms.push_back({"fragmentation", o.fragmentation_fraction * (st.activations_bytes + st.grads_bytes)});
    if (zero >= 2) {
      const FsdpWorkingSet ws = fsdp_working_set(s, r);
      if (ws.params > 0) st.other_terms.push_back({"fsdp_gathered_params", ws.params * gather_bytes});
      st.other_terms.push_back({"fsdp_unsharded_grads", ws.grads * bpp.grads});
    }
    for (const ActivationTerm& t : st.other_terms) st.other_bytes += t.bytes;

    st.total_bytes = st.weights_bytes + st.grads_bytes + st.optimizer_bytes + st.activations_bytes + st.other_bytes;
    if (st.total_bytes > rep.peak_bytes) {
      rep.peak_bytes = st.total_bytes;
      rep.peak_stage = r;
    }
    rep.stages.push_back(std::move(st));
  }
  rep.fits = rep.peak_bytes <= rep.capacity_bytes;
  return rep;
}

}  // namespace megascope
