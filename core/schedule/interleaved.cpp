// Megatron-LM's interleaved 1F1B (forward_backward_pipelining_with_
// interleaving, Narayanan et al. 2021 Sec. 2.2), with Megatron-Core's
// microbatch_group_size_per_vp_stage g (default pp).
//
// A rank runs m * vpp "virtual micro-batches" in the order of Megatron-Core's
// get_schedule_table: micro-batches in groups of g (the last group takes
// whatever is left), each group run on chunk 0, then the same group on
// chunk 1, and so on. The k-th forward is the table's k-th entry; the k-th
// backward the same entry with the chunks reversed (vpp - 1 - c). With g = pp
// the k-th forward runs chunk (k / pp) % vpp on micro-batch
// (k / (pp vpp)) pp + k % pp. Rank r first runs
// min(2 (pp - r - 1) + (vpp - 1) g, m vpp) warm-up forwards, then steady
// pairs (forward warmup + i, backward i), then the cool-down backwards.
// Backwards are unsplit: each W paired with its B.
#include <algorithm>
#include <utility>

#include "core/schedule/builders.hpp"

namespace megascope {

int interleaved_warmup(int pp, int vpp, int microbatches, int r, int group) {
  if (group <= 0) group = pp;
  return std::min((pp - r - 1) * 2 + (vpp - 1) * group, microbatches * vpp);
}

}  // namespace megascope

namespace megascope::schedule_detail {

std::vector<std::pair<int, int>> interleaved_table(int vpp, int m, int group) {
  std::vector<std::pair<int, int>> table;   // (micro-batch, chunk)
  table.reserve(static_cast<std::size_t>(m) * static_cast<std::size_t>(vpp));
  for (int lo = 0; lo < m; lo += group) {
    const int hi = lo + group >= m ? m : lo + group;
    for (int c = 0; c < vpp; ++c)
      for (int mb = lo; mb < hi; ++mb) table.emplace_back(mb, c);
    if (hi == m) break;
  }
  return table;
}

std::vector<RankSchedule> interleaved_order(int pp, int vpp, int m, int group) {
  const std::vector<std::pair<int, int>> table = interleaved_table(vpp, m, group);
  const int total = m * vpp;
  std::vector<RankSchedule> out(static_cast<std::size_t>(pp));
  for (int r = 0; r < pp; ++r) {
    RankWriter w(out[static_cast<std::size_t>(r)]);
    const auto fwd = [&](int k) { w.f(table[static_cast<std::size_t>(k)].first, table[static_cast<std::size_t>(k)].second); };
    const auto bwd = [&](int k) {
      w.b_w(table[static_cast<std::size_t>(k)].first, vpp - 1 - table[static_cast<std::size_t>(k)].second);
    };
    const int warmup = interleaved_warmup(pp, vpp, m, r, group);
    const int steady = total - warmup;
    for (int k = 0; k < warmup; ++k) fwd(k);
    for (int i = 0; i < steady; ++i) {
      fwd(warmup + i);
      bwd(i);
    }
    for (int i = steady; i < total; ++i) bwd(i);
  }
  return out;
}

}  // namespace megascope::schedule_detail
