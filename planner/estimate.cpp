#include "planner/estimate.hpp"

#include "planner/estimate_impl.hpp"

namespace megascope::planner {

Result<Estimate> Estimator::Impl::memory(const Candidate& c) {
  auto lay = layout(c);
  if (!lay) return tl::unexpected(lay.error());
  auto acts_of = activations(c);
  if (!acts_of) return tl::unexpected(acts_of.error());
  const Layout& L = **lay;
  const ActEntry& A = **acts_of;
  const RuntimeOverheads& o = in.training.overheads;
  const int edp = c.gpus / (c.etp * c.ep * c.pp);
  const double dense_shard = c.distopt ? shard_size(c) : 1.0;
  const double expert_shard = c.distopt ? edp : 1.0;
  const bool full = c.recompute == RecomputeGranularity::full;
  const bool uniform = c.recompute_method == RecomputeMethod::uniform;
  const int m = static_cast<int>(in.training.global_batch_size / (static_cast<std::int64_t>(c.mbs) * c.dp));
  const double fixed_other = o.cuda_context_bytes + o.nccl_bytes_per_group * communicators(c);
  const int mtp = in.model.mtp_num_layers;
  const LayerAct& last = L.last_layer_moe ? A.moe : A.dense;

  Estimate e;
  for (int r = 0; r < c.pp; ++r) {
    const RankLayout& rl = L.ranks[static_cast<std::size_t>(r)];
    // Sharded over DP x CP (dense) and expert-DP (experts): the optimizer
    // state from stage 1, the gradients from 2, the weights at 3 (memory_report).
    const double shard = rl.params.dense / dense_shard + rl.params.expert / expert_shard;
    const double grads = (c.zero >= 2 ? shard : rl.params.total()) * bpp.grads;
    double total = (c.zero >= 3 ? shard : rl.params.total()) * weight_bytes(c) + grads + shard * bpp.optimizer;
    if (c.zero >= 2) {
      // fsdp_working_set: the unsharded gradients of two units, and at stage
      // 3 the unit computing, the one prefetched and the root unit.
      const Units u = units_of(L, rl);
      // The largest layer the rank holds (fsdp_working_set's).
      const double layer = std::max(rl.dense_layers > 0 ? u.dense : 0.0, rl.moe_layers > 0 ? u.moe : 0.0);
      total += 2 * std::max(layer, u.root) * bpp.grads;
      if (c.zero >= 3) total += (2 * layer + u.root) * gather_bytes(c);
    }
    const int nch = static_cast<int>(rl.chunks.size());
    if (inflight.size() < rl.chunks.size()) inflight.resize(rl.chunks.size());   // vpp is not bounded
    rank_inflight(c.schedule, c.pp, c.vpp, m, r, inflight.data(), nch);
    // One micro-batch's full activations of chunk ci (memory_report's terms).
    const auto per_microbatch = [&](const ChunkInfo& ch) {
      const int rec = !full ? 0 : (uniform ? ch.count : std::min<int>(ch.count, c.recompute_layers));
      const int rec_moe = ch.moe_prefix[static_cast<std::size_t>(rec)];
      const int rec_dense = rec - rec_moe;
      const int st_moe = ch.moe_prefix.back() - rec_moe, st_dense = ch.count - rec - st_moe;
      double b = st_dense * A.dense.stored + st_moe * A.moe.stored + rec_dense * A.dense.checkpoint +
                 rec_moe * A.moe.checkpoint;
      if (ch.embedding) b += A.embedding;
      if (ch.loss) b += A.output + (mtp > 0 ? mtp * (last.stored + A.output) : 0.0);
      return b;
    };
    chunk_bytes.assign(static_cast<std::size_t>(nch), 0.0);
    for (int ci = 0; ci < nch; ++ci)
      chunk_bytes[static_cast<std::size_t>(ci)] = per_microbatch(rl.chunks[static_cast<std::size_t>(ci)]);
    // Chunks that keep different bytes: the heaviest step of the order (memory_report does the same).
    if (nch > 1 &&
        std::adjacent_find(chunk_bytes.begin(), chunk_bytes.end(), std::not_equal_to<>()) != chunk_bytes.end()) {
      const std::array<int, 5> key{static_cast<int>(c.schedule), c.pp, c.vpp, m, r};
      if (!last_peaks || last_peaks_key != key) {
        auto it = peaks.find(key);
        if (it == peaks.end()) {
          Peaks pk;
          pk.counts = inflight_candidates(c.schedule, c.pp, c.vpp, m, r);
          for (const std::vector<int>& v : pk.counts) pk.totals.push_back(std::accumulate(v.begin(), v.end(), 0));
          it = peaks.emplace(key, std::move(pk)).first;
        }
        last_peaks = &it->second;
        last_peaks_key = key;
      }
      // heaviest_inflight, with most chunks at one common value a: the sum
      // is a x total plus the other chunks' excess (a rank's embedding or
      // loss chunk), a few terms instead of one per chunk.
      const double a = chunk_bytes[static_cast<std::size_t>(nch / 2)];
      odd_chunks.clear();
      for (int ci = 0; ci < nch; ++ci)
        if (chunk_bytes[static_cast<std::size_t>(ci)] != a) odd_chunks.push_back(ci);
      const std::vector<int>* heaviest = nullptr;
      double most = -1;
      for (std::size_t k = 0; k < last_peaks->counts.size(); ++k) {
        const std::vector<int>& v = last_peaks->counts[k];
        double sum = a * last_peaks->totals[k];
        for (const int ci : odd_chunks)
          sum += (chunk_bytes[static_cast<std::size_t>(ci)] - a) * v[static_cast<std::size_t>(ci)];
        if (sum > most) {
          most = sum;
          heaviest = &v;
        }
      }
      if (heaviest)
        for (int ci = 0; ci < nch && ci < static_cast<int>(heaviest->size()); ++ci)
          inflight[static_cast<std::size_t>(ci)].full = (*heaviest)[static_cast<std::size_t>(ci)];
    }
    double act = 0, working = 0;
    for (int ci = 0; ci < nch; ++ci) {
      const ChunkInfo& ch = rl.chunks[static_cast<std::size_t>(ci)];
      const ChunkInflight in_c = inflight[static_cast<std::size_t>(ci)];
      const int rec = !full ? 0 : (uniform ? ch.count : std::min<int>(ch.count, c.recompute_layers));
      const int rec_moe = ch.moe_prefix[static_cast<std::size_t>(rec)];
      const int rec_dense = rec - rec_moe;
      const int moe_all = ch.moe_prefix.back();
      act += in_c.full * chunk_bytes[static_cast<std::size_t>(ci)];
      if (in_c.weight_grad_only > 0)
        act += in_c.weight_grad_only * ((ch.count - moe_all) * A.dense.wgs + moe_all * A.moe.wgs);
      if (rec_dense > 0) working = std::max(working, A.dense.stored);
      if (rec_moe > 0) working = std::max(working, A.moe.stored);
    }
    act += working;
    total += act + fixed_other + o.fragmentation_fraction * (act + grads);
    if (total > e.peak_bytes) {
      e.peak_bytes = total;
      e.peak_stage = r;
    }
  }
  e.fits = e.peak_bytes + in.constraints.headroom_bytes <= in.cluster.device.memory_bytes;
  return e;
}

Estimator::Estimator(const SearchInputs& in, const sim::CostModel& cost) : impl_(std::make_unique<Impl>(in, cost)) {}
Estimator::~Estimator() = default;
Estimator::Estimator(Estimator&&) noexcept = default;
Estimator& Estimator::operator=(Estimator&&) noexcept = default;

Result<Estimate> Estimator::memory(const Candidate& c) { return impl_->memory(c); }

Result<Estimate> Estimator::evaluate(const Candidate& c, double fit_bound, double reject_bound) {
  return impl_->evaluate(c, fit_bound, reject_bound);
}

}  // namespace megascope::planner
