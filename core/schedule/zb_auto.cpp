// The automatic zero-bubble schedules ZB-1p and ZB-2p (Qi et al. 2024, "Zero
// Bubble Pipeline Parallelism", Sec. 3): orders placed from the stages' own
// pass times and the pipeline transfer time, under a per-rank memory limit
// (pp or 2 pp micro-batches' activations), instead of a fixed pattern.
//
// The heuristic of the paper's Sec. 3.1, as a list scheduler in time order:
//   - a rank runs its next B as soon as it is ready (the backward chain is the
//     critical path), else its next F if the memory limit allows one more
//     micro-batch; in the warm-up (no B run yet) an F that would delay the
//     first B is not run (the paper makes this a binary choice; `extra_warmup`
//     is kept in the code, but running that F never gave a shorter order on
//     the paper's profiled setups, so the search leaves it off);
//   - a rank with fewer than one F more than the next rank runs F first
//     (`feed_next`: the paper keeps stage i at least one F ahead of i + 1);
//   - a pending W fills a gap until the next F or B is ready when the gap is
//     at least `w_gap` W times (1, 1/2 or 1/4: a W that delays the next pass a
//     little can still shorten the iteration), when the memory limit blocks
//     the next F and no B can free memory, or (`fill_small_gaps`) when the gap
//     would make this rank's accumulated idle time the largest of all ranks;
//     while a rank has F left it keeps `reserve` x r W pending (0, 1 or 2:
//     ZB-H1 keeps r, ZB-H2 2r + 1) to fill the wait for its last B's, unless
//     memory forces one;
//   - when its F and B have run out, a rank runs its remaining W.
// These choices are searched (36 runs), and the handcrafted ZB-H1 and ZB-H2
// orders join the candidates where they fit the limit. Each candidate is
// timed by run_ideal() with the same pass and transfer times; the fastest is
// kept. The paper refines its heuristic's order with an ILP; taking the best
// of the heuristic and the handcrafted orders stands in for that step.
#include <algorithm>
#include <cmath>
#include <deque>
#include <fmt/format.h>
#include <limits>
#include <optional>

#include "core/result.hpp"
#include "core/schedule/builders.hpp"
#include "core/schedule/schedule.hpp"

namespace megascope {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

template <class Vec>
auto& at(Vec& v, int i) {
  return v[static_cast<std::size_t>(i)];
}

struct Choices {
  bool extra_warmup = false;
  bool feed_next = false;
  bool fill_small_gaps = false;
  double w_gap = 1;   // a W fills a gap of at least this many W times
  int reserve = 0;    // rank r keeps reserve x r W pending for its drain while it has F left
};

struct Times {
  const AutoScheduleInputs& in;
  int pp;
  [[nodiscard]] double of(Pass p, int r) const {
    const StageTimes& t = in.times;
    return at(p == Pass::F ? t.f : p == Pass::B ? t.b : t.w, r);
  }
  [[nodiscard]] double rho(int r) const { return in.w_memory.empty() ? 1.0 : at(in.w_memory, r); }
};

// One run of the heuristic; nullopt when it cannot finish (a rank whose next
// F the limit blocks with nothing to free: a limit below one micro-batch).
std::optional<std::vector<RankSchedule>> heuristic_order(int pp, int m, const AutoScheduleInputs& in, Choices h) {
  const Times T{in, pp};
  const double comm = in.times.comm;
  const double limit = in.memory_limit + 1e-9;
  const auto n = static_cast<std::size_t>(pp);
  std::vector<std::vector<double>> end_f(n, std::vector<double>(static_cast<std::size_t>(m), kInf));
  std::vector<std::vector<double>> end_b = end_f;
  std::vector<int> nf(n, 0), nb(n, 0), nw(n, 0);
  std::vector<double> free_at(n, 0.0), idle(n, 0.0), last_end(n, 0.0);
  std::vector<std::deque<int>> pending(n);
  std::vector<RankSchedule> out(n);
  long left = 3L * m * pp;
  double now = 0;
  while (left > 0) {
    bool acted = false;
    double wake = kInf;   // the next time anything a waiting rank depends on can change
    for (int r = 0; r < pp; ++r) {
      if (at(free_at, r) > now) {
        wake = std::min(wake, at(free_at, r));
        continue;
      }
      if (at(nw, r) == m) continue;
      const int f = at(nf, r), b = at(nb, r);
      const double mem = (f - b) + T.rho(r) * (b - at(nw, r));
      const bool f_fits = f < m && mem + 1 <= limit;
      // Ready times (kInf: waits for a pass not yet placed) and lower bounds.
      const double ready_f = f >= m ? kInf : r == 0 ? 0.0 : at(at(end_f, r - 1), f) + comm;
      const double ready_b = b >= f ? kInf
                             : r == pp - 1 ? at(at(end_f, r), b)
                                           : std::max(at(at(end_f, r), b), at(at(end_b, r + 1), b) + comm);
      const double soon_f = f >= m ? kInf : ready_f < kInf ? ready_f : now + T.of(Pass::F, r - 1) + comm;
      const double soon_b = b >= f ? kInf : ready_b < kInf ? ready_b : now + T.of(Pass::B, r + 1) + comm;
      std::optional<Pass> run;
      const bool f_ready = f_fits && ready_f <= now, b_ready = ready_b <= now;
      if (h.feed_next && f_ready && r < pp - 1 && f <= at(nf, r + 1)) run = Pass::F;
      else if (b_ready) run = Pass::B;
      else if (f_ready && !(b == 0 && !h.extra_warmup && ready_b < now + T.of(Pass::F, r))) run = Pass::F;
      if (!run && !at(pending, r).empty()) {
        const double gap = std::min(f_fits ? soon_f : kInf, soon_b) - now;
        const bool stuck = !f_fits && b >= f;   // nothing but a W can run or free memory
        double most_idle = 0;
        for (const double x : idle) most_idle = std::max(most_idle, x);
        const bool spare = f >= m || static_cast<int>(at(pending, r).size()) > h.reserve * r;
        if (stuck || (spare && (gap >= h.w_gap * T.of(Pass::W, r) ||
                                (h.fill_small_gaps && gap > 0 && at(idle, r) + gap > most_idle))))
          run = Pass::W;
      }
      if (!run) {
        for (const double x : {ready_f, ready_b})
          if (x > now && x < kInf) wake = std::min(wake, x);
        continue;
      }
      const double d = T.of(*run, r);
      at(idle, r) += now - at(last_end, r);
      at(last_end, r) = now + d;
      at(free_at, r) = now + d;
      wake = std::min(wake, now + d);
      RankSchedule& o = at(out, r);
      switch (*run) {
        case Pass::F:
          o.push_back({Pass::F, f, 0, false});
          at(at(end_f, r), f) = now + d;
          ++at(nf, r);
          break;
        case Pass::B:
          o.push_back({Pass::B, b, 0, false});
          at(at(end_b, r), b) = now + d;
          ++at(nb, r);
          at(pending, r).push_back(b);
          break;
        case Pass::W:
          o.push_back({Pass::W, at(pending, r).front(), 0, false});
          at(pending, r).pop_front();
          ++at(nw, r);
          break;
      }
      --left;
      acted = true;
    }
    if (acted) continue;   // ranks free at `now` decide again after the others
    if (!(wake < kInf)) return std::nullopt;
    now = wake;
  }
  return out;
}

}  // namespace

int auto_memory_limit(Schedule s, int pp) { return s == Schedule::zb_2p ? 2 * pp : pp; }

double order_peak_memory(const RankSchedule& order, double w_memory) {
  int f = 0, b = 0, w = 0;
  double peak = 0;
  for (const ScheduleStep& st : order) {
    (st.pass == Pass::F ? f : st.pass == Pass::B ? b : w) += 1;
    peak = std::max(peak, (f - b) + w_memory * (b - w));
  }
  return peak;
}

AutoSchedule auto_zero_bubble(int pp, int microbatches, const AutoScheduleInputs& in) {
  const int m = microbatches;
  if (pp < 1 || m < 1)
    throw InternalError(fmt::format("auto_zero_bubble: pp {} and {} micro-batches", pp, m));
  if (!(in.memory_limit >= 1))
    throw InternalError(fmt::format("auto_zero_bubble: a memory limit of {} micro-batches holds none", in.memory_limit));
  for (const auto* v : {&in.times.f, &in.times.b, &in.times.w})
    if (static_cast<int>(v->size()) != pp)
      throw InternalError(fmt::format("auto_zero_bubble: pass times for {} ranks, pp {}", v->size(), pp));
  if (!in.w_memory.empty() && static_cast<int>(in.w_memory.size()) != pp)
    throw InternalError(fmt::format("auto_zero_bubble: w_memory for {} ranks, pp {}", in.w_memory.size(), pp));
  const Times T{in, pp};
  const auto fits = [&](const std::vector<RankSchedule>& order) {
    for (int r = 0; r < pp; ++r)
      if (order_peak_memory(at(order, r), T.rho(r)) > in.memory_limit + 1e-9) return false;
    return true;
  };
  AutoSchedule best;
  best.time = kInf;
  const auto consider = [&](std::vector<RankSchedule> order, std::string name) {
    const IdealResult r = run_stage_times(order, Schedule::zb_1p, pp, 1, m, in.times);
    const double t = in.objective_span ? r.longest_span : r.makespan;
    if (t < best.time * (1 - 1e-12)) best = {std::move(order), std::move(name), t};
  };
  for (const int reserve : {0, 1, 2})
    for (const double w_gap : {1.0, 0.5, 0.25})
      for (int bits = 0; bits < 4; ++bits) {
        const Choices h{false, (bits & 1) != 0, (bits & 2) != 0, w_gap, reserve};
        if (auto order = heuristic_order(pp, m, in, h))
          consider(std::move(*order),
                   fmt::format("heuristic (extra warm-up forward {}, F ahead of the next rank {}, W in gaps of {} W, "
                               "in smaller gaps {}, {} r W kept for the drain)", h.extra_warmup ? "on" : "off",
                               h.feed_next ? "on" : "off", w_gap, h.fill_small_gaps ? "on" : "off", reserve));
      }
  for (auto [name, order] : {std::pair{"zb-h1", schedule_detail::zb_h1_order(pp, m)},
                             std::pair{"zb-h2", schedule_detail::zb_h2_order(pp, m)}})
    if (fits(order)) consider(std::move(order), name);
  if (best.order.empty())
    throw InternalError(fmt::format("auto_zero_bubble: no order fits {} micro-batches of memory (pp {}, m {})",
                                    in.memory_limit, pp, m));
  return best;
}

}  // namespace megascope
