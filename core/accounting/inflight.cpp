#include "core/accounting/inflight.hpp"

#include <algorithm>

namespace megascope {

std::vector<std::vector<ChunkInflight>> inflight_microbatches(const Setup& s) {
  const int p = s.plan.pp;
  const int m = s.num_microbatches;
  std::vector<std::vector<ChunkInflight>> out(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) {
    const std::size_t nchunks = s.chunks[static_cast<std::size_t>(r)].size();
    std::vector<ChunkInflight>& row = out[static_cast<std::size_t>(r)];
    row.assign(nchunks, {});
    switch (s.plan.schedule) {
      case Schedule::gpipe:
        row[0].full = m;
        break;
      case Schedule::one_f_one_b:
        row[0].full = std::min(p - r, m);
        break;
      case Schedule::interleaved: {
        const int v = s.vpp;
        const int total = std::min(2 * (p - r - 1) + (v - 1) * p + 1, m * v);
        // Forward k runs chunk (k / p) % v; count the first `total` forwards per chunk.
        for (int k = 0; k < total; ++k) row[static_cast<std::size_t>((k / p) % v)].full += 1;
        for (ChunkInflight& c : row) c.full = std::min(c.full, m);
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
  return out;
}

}  // namespace megascope
