#include "core/accounting/inflight.hpp"

#include <algorithm>

namespace megascope {

void rank_inflight(Schedule schedule, int p, int v, int m, int r, ChunkInflight* row, int chunks) {
  for (int c = 0; c < chunks; ++c) row[c] = {};
  switch (schedule) {
    case Schedule::gpipe:
      row[0].full = m;
      break;
    case Schedule::one_f_one_b:
      row[0].full = std::min(p - r, m);
      break;
    case Schedule::interleaved: {
      const int total = std::min(2 * (p - r - 1) + (v - 1) * p + 1, m * v);
      // Forward k runs chunk (k / p) % v: whole rounds of p per chunk, then the rest.
      const int rounds = total / p, rest = total % p;
      for (int c = 0; c < chunks; ++c) row[c].full = (rounds / v + (c < rounds % v ? 1 : 0)) * p;
      if (rest > 0) row[rounds % v].full += rest;
      for (int c = 0; c < chunks; ++c) row[c].full = std::min(row[c].full, m);
      break;
    }
    case Schedule::zb_h1:
      row[0].full = std::min(p - r, m);
      row[0].weight_grad_only = std::min(r, std::max(0, m - row[0].full));
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
    rank_inflight(s.plan.schedule, s.plan.pp, s.vpp, s.num_microbatches, r, row.data(), static_cast<int>(row.size()));
  }
  return out;
}

}  // namespace megascope
