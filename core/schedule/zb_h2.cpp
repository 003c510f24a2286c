// ZB-H2 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", Sec. 3.1 and
// Fig. 4): ZB-H1 with more forwards in the warm-up and the weight-gradient
// passes moved to the tail, so that with equal pass times every rank works
// without a gap from its first forward to its last W (a parallelogram; the
// iteration needs the optimizer's post-validation instead of a synchronous
// step to keep it, PlanSpec::post_validation). Peak memory of rank r:
// 2(p - r) - 1 micro-batches' activations (the paper's (2p - 2i + 1) M_B for
// worker i = r + 1) and up to 2r + 1 awaiting their W.
//
// The order is the list schedule of equal unit-time passes: tick by tick,
// each free rank runs its next B if it is ready and fewer than 2r + 1 W are
// pending (else the oldest W first), otherwise its next F if it is ready and
// fewer than 2(p - r) - 1 micro-batches are in flight, otherwise the oldest
// pending W. Decisions of one tick see only passes that ended before it.
#include <algorithm>
#include <deque>
#include <fmt/format.h>

#include "core/result.hpp"
#include "core/schedule/builders.hpp"

namespace megascope::schedule_detail {

std::vector<RankSchedule> zb_h2_order(int pp, int m) {
  std::vector<RankSchedule> out(static_cast<std::size_t>(pp));
  std::vector<RankWriter> writers;
  writers.reserve(static_cast<std::size_t>(pp));
  for (RankSchedule& o : out) writers.emplace_back(o);
  const auto idx = [&](int mb, int r) { return static_cast<std::size_t>(mb) * static_cast<std::size_t>(pp) + static_cast<std::size_t>(r); };
  constexpr long kNever = -1;
  std::vector<long> f_tick(static_cast<std::size_t>(pp) * static_cast<std::size_t>(m), kNever);
  std::vector<long> b_tick(f_tick.size(), kNever);
  std::vector<int> f(static_cast<std::size_t>(pp), 0), b(static_cast<std::size_t>(pp), 0);
  std::vector<std::deque<int>> pending(static_cast<std::size_t>(pp));
  struct Act {
    int rank;
    Pass pass;
    int mb;
  };
  std::vector<Act> acts;
  long left = 3L * m * pp;
  const long limit = 6L * m * pp + 4L * pp;   // far above any finished order: a guard, not a bound in use
  const auto ran_before = [](long tick, long now) { return tick != kNever && tick < now; };
  for (long t = 0; left > 0; ++t) {
    if (t > limit) throw InternalError(fmt::format("zb_h2_order: no progress after {} ticks (pp {}, m {})", t, pp, m));
    acts.clear();
    for (int r = 0; r < pp; ++r) {
      const auto ur = static_cast<std::size_t>(r);
      const int in_flight_cap = std::min(2 * (pp - r) - 1, m);
      const auto w_cap = static_cast<std::size_t>(2 * r + 1);
      const int kb = b[ur];
      const bool b_ready = kb < f[ur] && ran_before(f_tick[idx(kb, r)], t) &&
                           (r == pp - 1 || ran_before(b_tick[idx(kb, r + 1)], t)) && pending[ur].size() < w_cap;
      const int kf = f[ur];
      const bool f_ready = kf < m && kf - kb < in_flight_cap && (r == 0 || ran_before(f_tick[idx(kf, r - 1)], t));
      if (b_ready) acts.push_back({r, Pass::B, kb});
      else if (f_ready) acts.push_back({r, Pass::F, kf});
      else if (!pending[ur].empty()) acts.push_back({r, Pass::W, pending[ur].front()});
    }
    for (const Act& a : acts) {
      const auto ur = static_cast<std::size_t>(a.rank);
      RankWriter& w = writers[ur];
      --left;
      switch (a.pass) {
        case Pass::F:
          w.f(a.mb, 0);
          f_tick[idx(a.mb, a.rank)] = t;
          ++f[ur];
          break;
        case Pass::B:
          w.b(a.mb, 0);
          b_tick[idx(a.mb, a.rank)] = t;
          ++b[ur];
          pending[ur].push_back(a.mb);
          break;
        case Pass::W:
          w.w(a.mb, 0);
          pending[ur].pop_front();
          break;
      }
    }
  }
  return out;
}

}  // namespace megascope::schedule_detail
