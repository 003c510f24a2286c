// ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", Sec. 3.1, and
// the ZeroBubbleH1Pipeline of the authors' Megatron-DeepSpeed port, exact
// B/W-split semantics). Rank r runs 1F1B's warm-up (pp - r - 1 forwards);
// its first r steady-state backwards leave their W pending; from then on every
// F-B pair is followed by the oldest pending W, the cool-down runs B then the
// oldest W, and the r still pending W close the iteration. Rank r therefore
// holds pp - r micro-batches' full activations plus up to r awaiting W, and
// the backward chain is no longer slowed by W: the bubble shrinks from
// (pp-1)(T_F + T_B + T_W) to (pp-1)(T_F + T_B - T_W) (Table 2).
#include <algorithm>

#include "core/schedule/builders.hpp"

namespace megascope::schedule_detail {

std::vector<RankSchedule> zb_h1_order(int pp, int m) {
  std::vector<RankSchedule> out(static_cast<std::size_t>(pp));
  for (int r = 0; r < pp; ++r) {
    RankWriter w(out[static_cast<std::size_t>(r)]);
    int f = 0, b = 0;
    const int warmup = std::min(pp - r - 1, m);
    for (; f < warmup; ++f) w.f(f, 0);
    for (int i = 0; i < r && f < m; ++i, ++f, ++b) {   // F-B, W deferred
      w.f(f, 0);
      w.b_defer(b, 0);
    }
    for (; f < m; ++f, ++b) {                          // F-B-W
      w.f(f, 0);
      w.b_defer(b, 0);
      w.pop_w();
    }
    for (; b < m; ++b) {                               // cool-down: B-W
      w.b_defer(b, 0);
      w.pop_w();
    }
    w.flush_w();
  }
  return out;
}

}  // namespace megascope::schedule_detail
