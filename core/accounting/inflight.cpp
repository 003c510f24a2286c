#include "core/accounting/inflight.hpp"

#include <algorithm>

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
