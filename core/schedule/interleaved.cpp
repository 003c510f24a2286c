// Megatron-LM's interleaved 1F1B (forward_backward_pipelining_with_
// interleaving, Narayanan et al. 2021 Sec. 2.2), with the default
// microbatch_group_size_per_vp_stage = pp, hence m % pp == 0.
//
// A rank runs m * vpp "virtual micro-batches". The k-th forward runs chunk
// (k / pp) % vpp on micro-batch (k / (pp vpp)) pp + k % pp: pp micro-batches
// on chunk 0, the same pp on chunk 1, ..., then the next group of pp. The k-th
// backward walks the same sequence with the chunks reversed (vpp - 1 - c).
// Rank r first runs min(2 (pp - r - 1) + (vpp - 1) pp, m vpp) warm-up
// forwards, then steady pairs (forward warmup + i, backward i), then the
// cool-down backwards. Backwards are unsplit: each W paired with its B.
#include <algorithm>

#include "core/schedule/builders.hpp"

namespace megascope {

int interleaved_warmup(int pp, int vpp, int microbatches, int r) {
  return std::min((pp - r - 1) * 2 + (vpp - 1) * pp, microbatches * vpp);
}

}  // namespace megascope

namespace megascope::schedule_detail {

std::vector<RankSchedule> interleaved_order(int pp, int vpp, int m) {
  const int total = m * vpp;
  const int group = pp * vpp;
  auto chunk_of = [&](int k, bool forward) {
    const int c = (k % group) / pp;
    return forward ? c : vpp - 1 - c;
  };
  auto microbatch_of = [&](int k) { return (k / group) * pp + k % pp; };

  std::vector<RankSchedule> out(static_cast<std::size_t>(pp));
  for (int r = 0; r < pp; ++r) {
    RankWriter w(out[static_cast<std::size_t>(r)]);
    const int warmup = interleaved_warmup(pp, vpp, m, r);
    const int steady = total - warmup;
    for (int k = 0; k < warmup; ++k) w.f(microbatch_of(k), chunk_of(k, true));
    for (int i = 0; i < steady; ++i) {
      const int k = warmup + i;
      w.f(microbatch_of(k), chunk_of(k, true));
      w.b_w(microbatch_of(i), chunk_of(i, false));
    }
    for (int i = steady; i < total; ++i) w.b_w(microbatch_of(i), chunk_of(i, false));
  }
  return out;
}

}  // namespace megascope::schedule_detail
