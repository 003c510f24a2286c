#include "core/accounting/inflight.hpp"

#include <algorithm>

#include "core/schedule/builders.hpp"
#include "core/schedule/schedule.hpp"

namespace megascope {

void rank_inflight(Schedule schedule, int p, int v, int m, int r, ChunkInflight* row, int chunks, int group) {
  for (int c = 0; c < chunks; ++c) row[c] = {};
  switch (schedule) {
    case Schedule::gpipe:
      row[0].full = m;
      break;
    case Schedule::one_f_one_b:
      row[0].full = std::min(p - r, m);
      break;
    case Schedule::interleaved: {
      // The warm-up's forwards and the first steady one, in the order of
      // Megatron-Core's schedule table: groups of g micro-batches (the last
      // takes the rest), each on chunk 0, then chunk 1, ...
      const int g = group > 0 ? group : p;
      int left = std::min(2 * (p - r - 1) + (v - 1) * g + 1, m * v);
      for (int lo = 0; lo < m && left > 0; lo += g) {
        const int n = lo + g >= m ? m - lo : g;
        const int take = std::min(left, n * std::min(v, chunks));
        for (int c = 0; c < take / n; ++c) row[c].full += n;
        if (take % n > 0) row[take / n].full += take % n;
        left -= take;
        if (lo + g >= m) break;
      }
      break;
    }
    case Schedule::zb_h1:
      row[0].full = std::min(p - r, m);
      row[0].weight_grad_only = std::min(r, std::max(0, m - row[0].full));
      break;
    case Schedule::zb_h2:
      // The warm-up's forwards and, at the same step, up to 2r + 1 micro-
      // batches past B awaiting W (core/schedule/zb_h2.cpp; the paper's
      // (2p - 2i + 1) M_B + (2i - 2) M_W for worker i, plus the W of the B
      // just run).
      row[0].full = std::min(2 * (p - r) - 1, m);
      row[0].weight_grad_only = std::min(2 * r + 1, m - row[0].full);
      break;
    case Schedule::zb_1p:
    case Schedule::zb_2p:
      // Placed from the stages' times under a limit of p (2p) micro-batches'
      // full activations, counting one awaiting its W at M_W <= M_B
      // (core/schedule/zb_auto.cpp): charged at the limit.
      row[0].full = std::min(auto_memory_limit(schedule, p), m);
      break;
    case Schedule::zb_v:
      row[0].full = std::min(2 * p - r - 1, m);
      row[1].full = std::min(r + 1, m);
      break;
    case Schedule::dualpipe:
      // Half of the micro-batches flow in each direction.
      row[0].full = std::min(p - r, (m + 1) / 2);
      row[1].full = std::min(r + 1, m / 2);
      break;
    case Schedule::dualpipev:
      row[0].full = std::min(2 * p - r, m);
      row[1].full = std::min(r + 1, m);
      break;
  }
}

std::vector<std::vector<int>> inflight_candidates(Schedule schedule, int p, int v, int m, int r, int group) {
  const auto chunks = static_cast<std::size_t>(schedule_chunks(schedule, v));
  std::vector<std::vector<int>> kept;
  std::vector<int> now(chunks, 0);
  // Called after the last of a run of forwards (forwards only add, so those
  // counts cover the run's others): keeps `now` unless a kept one covers it.
  const auto covers = [&](const std::vector<int>& a, const std::vector<int>& b) {   // a >= b in every chunk
    for (std::size_t c = 0; c < chunks; ++c)
      if (a[c] < b[c]) return false;
    return true;
  };
  const auto record = [&]() {
    if (std::any_of(kept.begin(), kept.end(), [&](const std::vector<int>& k) { return covers(k, now); })) return;
    std::erase_if(kept, [&](const std::vector<int>& k) { return covers(now, k); });
    kept.push_back(now);
  };
  if (schedule == Schedule::interleaved) {
    // schedule_detail::interleaved_order's steps of rank r: the warm-up's
    // forwards, then (forward warmup + i, backward i) pairs, then backwards.
    if (group <= 0) group = p;
    const std::vector<std::pair<int, int>> table = schedule_detail::interleaved_table(v, m, group);
    const int total = m * v;
    const int warmup = interleaved_warmup(p, v, m, r, group);
    for (int k = 0; k < warmup; ++k) ++now[static_cast<std::size_t>(table[static_cast<std::size_t>(k)].second)];
    if (warmup == total) record();
    // The table repeats every period = g v entries (a group on each chunk),
    // so while both the forward (warmup + i) and the backward (i) index are
    // in whole groups, the counts at i + period equal those at i: only the
    // first period and the steps from a period before the partial last
    // group onwards can add a new vector.
    const int steady = total - warmup;
    const int period = group * v;
    const int whole = (m - m % group) * v;   // entries in whole groups
    const int tail = std::max(period, whole - warmup - period);
    for (int i = 0; i < steady; ++i) {
      ++now[static_cast<std::size_t>(table[static_cast<std::size_t>(warmup + i)].second)];
      if (i < period || i >= tail) record();
      --now[static_cast<std::size_t>(v - 1 - table[static_cast<std::size_t>(i)].second)];
    }
    return kept;
  }
  const std::vector<RankSchedule> order = make_schedule(schedule, p, v, m, group);
  const RankSchedule& steps = order[static_cast<std::size_t>(r)];
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const ScheduleStep& st = steps[i];
    now[static_cast<std::size_t>(st.chunk)] += st.pass == Pass::F ? 1 : st.pass == Pass::B ? -1 : 0;
    if (st.pass == Pass::F && (i + 1 == steps.size() || steps[i + 1].pass != Pass::F)) record();
  }
  return kept;
}

const std::vector<int>* heaviest_inflight(const std::vector<std::vector<int>>& candidates, const double* bytes) {
  const std::vector<int>* best = nullptr;
  double most = -1;
  for (const std::vector<int>& v : candidates) {
    double sum = 0;
    for (std::size_t c = 0; c < v.size(); ++c) sum += v[c] * bytes[c];
    if (sum > most) {
      most = sum;
      best = &v;
    }
  }
  return best;
}

std::vector<std::vector<ChunkInflight>> inflight_microbatches(const Setup& s) {
  std::vector<std::vector<ChunkInflight>> out(static_cast<std::size_t>(s.plan.pp));
  for (int r = 0; r < s.plan.pp; ++r) {
    std::vector<ChunkInflight>& row = out[static_cast<std::size_t>(r)];
    row.assign(s.chunks[static_cast<std::size_t>(r)].size(), {});
    rank_inflight(s.plan.schedule, s.plan.pp, s.vpp, s.num_microbatches, r, row.data(), static_cast<int>(row.size()),
                  s.microbatch_group);
  }
  return out;
}

}  // namespace megascope
