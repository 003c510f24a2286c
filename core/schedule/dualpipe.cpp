// DualPipe and DualPipeV (DeepSeek-AI, deepseek-ai/DualPipe dualpipe.py and
// dualpipev.py; DeepSeek-V3 report Sec. 3.2.1). Both run the same eight-part
// program per rank; they differ in what a "phase" is:
//
//   DualPipeV  pp ranks hold a 2pp-stage model in a V: phase 0 is chunk 0
//              (stage r), phase 1 chunk 1 (stage 2pp - 1 - r); all m
//              micro-batches go down and back up. Program size N = pp, rank
//              index i = r, micro-batches per phase M = m.
//   DualPipe   two copies of a pp-stage model run in opposite directions:
//              chunk 0 of rank r is stage r of direction 0 (micro-batches
//              [0, m/2), entering at rank 0), chunk 1 stage pp - 1 - r of
//              direction 1 (micro-batches [m/2, m), entering at rank pp - 1).
//              Ranks of the first half see phase 0 = direction 0, those of the
//              second half phase 0 = direction 1. N = pp/2, i = min(r, pp-1-r),
//              M = m/2.
//
// The program (F/B of phase 0 or 1; "F0&B1" an overlapped pair: the F step,
// then the B step marked paired). A backward is unsplit (its W paired with it,
// computed in the same pass) unless marked "zb": then its W goes to the FIFO
// weight store and a later "W" step runs the oldest one.
//   1  2(N - i - 1) x F0
//   2  (i + 1) x (F0, F1)
//   3  (N - i - 1) x (B1 zb, W, F1)
//   4  (M - 2N + i + 1) x (F0&B1, F1&B0); on the innermost rank (i = N - 1)
//      the first F0, B1 run one after the other, not overlapped
//   5  (N - i - 1) x (B1, F1&B0)
//   6  (i + 1) x (B1, B0), W deferred from the middle iteration on
//      (before B1 for odd i, before B0 for even i)
//   7  (N - i - 1) x (W, B0 zb)
//   8  (i + 1) x W
#include <algorithm>

#include "core/schedule/builders.hpp"

namespace megascope::schedule_detail {

namespace {

struct PhaseMap {
  int chunk[2];           // model chunk of phase 0 and 1 on this rank
  int first_mb[2];        // first micro-batch of that phase's chunk
};

void dualpipe_program(RankWriter& w, int n, int i, int per_phase, const PhaseMap& map) {
  int next_f[2] = {0, 0};
  int next_b[2] = {0, 0};
  auto f = [&](int ph, bool paired = false) { w.f(map.first_mb[ph] + next_f[ph]++, map.chunk[ph], paired); };
  auto b = [&](int ph, bool zb, bool paired = false) {
    const int mb = map.first_mb[ph] + next_b[ph]++;
    if (zb)
      w.b_defer(mb, map.chunk[ph], paired);
    else
      w.b_w(mb, map.chunk[ph], paired);
  };

  for (int k = 0; k < 2 * (n - i - 1); ++k) f(0);                 // 1
  for (int k = 0; k < i + 1; ++k) {                               // 2
    f(0);
    f(1);
  }
  for (int k = 0; k < n - i - 1; ++k) {                           // 3
    b(1, true);
    w.pop_w();
    f(1);
  }
  const int main_steps = per_phase - 2 * n + i + 1;               // 4
  for (int k = 0; k < main_steps; ++k) {
    f(0);
    b(1, false, !(k == 0 && i == n - 1));
    f(1);
    b(0, false, true);
  }
  for (int k = 0; k < n - i - 1; ++k) {                           // 5
    b(1, false);
    f(1);
    b(0, false, true);
  }
  bool zb = false;                                                // 6
  const int cool = i + 1;
  for (int k = 0; k < cool; ++k) {
    if (k == cool / 2 && i % 2 == 1) zb = true;
    b(1, zb);
    if (k == cool / 2 && i % 2 == 0) zb = true;
    b(0, zb);
  }
  for (int k = 0; k < n - i - 1; ++k) {                           // 7
    w.pop_w();
    b(0, true);
  }
  w.flush_w();                                                    // 8 (i + 1 W)
}

}  // namespace

std::vector<RankSchedule> dualpipev_order(int pp, int m) {
  std::vector<RankSchedule> out(static_cast<std::size_t>(pp));
  for (int r = 0; r < pp; ++r) {
    RankWriter w(out[static_cast<std::size_t>(r)]);
    dualpipe_program(w, pp, r, m, PhaseMap{{0, 1}, {0, 0}});
  }
  return out;
}

std::vector<RankSchedule> dualpipe_order(int pp, int m) {
  const int half = m / 2;
  std::vector<RankSchedule> out(static_cast<std::size_t>(pp));
  for (int r = 0; r < pp; ++r) {
    RankWriter w(out[static_cast<std::size_t>(r)]);
    const bool second_half = r >= pp / 2;
    // Direction d runs on chunk d, micro-batches [d m/2, (d + 1) m/2).
    const int d0 = second_half ? 1 : 0;
    const int d1 = 1 - d0;
    dualpipe_program(w, pp / 2, std::min(r, pp - 1 - r), half, PhaseMap{{d0, d1}, {d0 * half, d1 * half}});
  }
  return out;
}

}  // namespace megascope::schedule_detail
