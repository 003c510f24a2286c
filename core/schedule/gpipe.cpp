// GPipe (Huang et al. 2019): every forward, then every backward, the
// backwards in reverse micro-batch order (the last forward's activations are
// the first freed). Backwards are unsplit: each W paired with its B.
#include "core/schedule/builders.hpp"

namespace megascope::schedule_detail {

std::vector<RankSchedule> gpipe_order(int pp, int m) {
  std::vector<RankSchedule> out(static_cast<std::size_t>(pp));
  for (RankSchedule& rank : out) {
    RankWriter w(rank);
    for (int mb = 0; mb < m; ++mb) w.f(mb, 0);
    for (int mb = m - 1; mb >= 0; --mb) w.b_w(mb, 0);
  }
  return out;
}

}  // namespace megascope::schedule_detail
