// Megatron-LM's non-interleaved 1F1B (forward_backward_pipelining_without_
// interleaving; Narayanan et al. 2021, PipeDream-Flush): rank r runs
// min(pp - r - 1, m) warm-up forwards, then pairs of one forward and one
// backward, then the cool-down backwards. Backwards are unsplit (Megatron
// runs one backward pass): each W paired with its B.
#include <algorithm>

#include "core/schedule/builders.hpp"

namespace megascope::schedule_detail {

std::vector<RankSchedule> one_f_one_b_order(int pp, int m) {
  std::vector<RankSchedule> out(static_cast<std::size_t>(pp));
  for (int r = 0; r < pp; ++r) {
    RankWriter w(out[static_cast<std::size_t>(r)]);
    const int warmup = std::min(pp - r - 1, m);
    const int steady = m - warmup;
    for (int mb = 0; mb < warmup; ++mb) w.f(mb, 0);
    for (int i = 0; i < steady; ++i) {
      w.f(warmup + i, 0);
      w.b_w(i, 0);
    }
    for (int i = steady; i < m; ++i) w.b_w(i, 0);
  }
  return out;
}

}  // namespace megascope::schedule_detail
