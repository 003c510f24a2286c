// The ideal-cluster evaluator behind run_ideal() and run_stage_times(): fixed
// per-rank orders, every step as early as possible; no communication cost, or
// (run_stage_times) a fixed transfer time between ranks.
//
// Steps are identified by (pass, micro-batch, virtual stage); a step's
// dependencies (schedule.hpp) are looked up by that key, so DualPipe's two
// directions need no special case: chunk 1 of rank r is stage pp - 1 - r, and
// the direction-1 micro-batches that run on it flow from rank pp - 1 (stage 0)
// to rank 0 (stage pp - 1).
//
// A paired group (a step and the steps after it marked `paired`) starts when
// the rank is free and every member's dependencies outside the group have
// finished (a W paired with its B is computed in the same pass), and all its
// members end together. It takes the sum of its members' times, except that
// when it holds one F and one B and IdealTimes::fb_overlapped is set, those
// two take fb_overlapped together (a paired W still adds its own time).
//
// Evaluation sweeps the ranks, advancing each as far as its next group is
// ready. A sweep that advances nothing while steps remain is a deadlock: the
// next group of every unfinished rank waits for a step that cannot run first.
#include <algorithm>
#include <fmt/format.h>
#include <string>
#include <utility>

#include "core/result.hpp"
#include "core/schedule/timeline.hpp"

namespace megascope::schedule_detail {

namespace {

template <class Vec>
auto& at(Vec& v, int i) {
  return v[static_cast<std::size_t>(i)];
}

const char* pass_name(Pass p) {
  switch (p) {
    case Pass::F: return "F";
    case Pass::B: return "B";
    case Pass::W: return "W";
  }
  return "?";
}

struct Loc {
  int rank = -1;
  int index = -1;
};

}  // namespace

IdealTimeline ideal_timeline(const std::vector<RankSchedule>& schedule, Schedule s, int pp, int vpp, int microbatches,
                             IdealTimes t, const StageTimes* per_rank) {
  const int m = microbatches;
  if (static_cast<int>(schedule.size()) != pp || m < 1)
    throw InternalError(fmt::format("run_ideal: a schedule of {} ranks for pp {} and {} micro-batches",
                                    schedule.size(), pp, m));
  const int chunks = schedule_chunks(s, vpp);
  const int stages = s == Schedule::dualpipe ? pp : pp * chunks;
  auto step = [&](int r, int k) -> const ScheduleStep& { return at(at(schedule, r), k); };
  auto length_of = [&](int r) { return static_cast<int>(at(schedule, r).size()); };
  auto describe = [&](int r, int k) {
    const ScheduleStep& st = step(r, k);
    return fmt::format("rank {} step {} ({} mb {} chunk {})", r, k, pass_name(st.pass), st.microbatch, st.chunk);
  };

  // Where each (pass, micro-batch, virtual stage) runs.
  std::vector<Loc> where(3 * static_cast<std::size_t>(m) * static_cast<std::size_t>(stages));
  auto slot = [&](Pass p, int mb, int vs) -> Loc& {
    return at(where, (static_cast<int>(p) * m + mb) * stages + vs);
  };
  for (int r = 0; r < pp; ++r) {
    for (int k = 0; k < length_of(r); ++k) {
      const ScheduleStep& st = step(r, k);
      if (st.microbatch < 0 || st.microbatch >= m || st.chunk < 0 || st.chunk >= chunks)
        throw InternalError(fmt::format("run_ideal: {} is outside {} micro-batches x {} chunks", describe(r, k), m,
                                        chunks));
      if (st.paired && k == 0)
        throw InternalError(fmt::format("run_ideal: {} is paired but no step comes before it", describe(r, k)));
      Loc& l = slot(st.pass, st.microbatch, virtual_stage(s, pp, r, st.chunk));
      if (l.rank >= 0)
        throw InternalError(fmt::format("run_ideal: {} repeats {}", describe(r, k), describe(l.rank, l.index)));
      l = {r, k};
    }
  }

  // Data dependencies of step k of rank r.
  std::vector<Loc> deps;
  auto deps_of = [&](int r, int k) {
    deps.clear();
    const ScheduleStep& st = step(r, k);
    const int vs = virtual_stage(s, pp, r, st.chunk);
    auto need = [&](Pass p, int stage) {
      const Loc l = slot(p, st.microbatch, stage);
      if (l.rank < 0)
        throw InternalError(fmt::format("run_ideal: {} needs {} of micro-batch {} on virtual stage {}, which no "
                                        "rank runs", describe(r, k), pass_name(p), st.microbatch, stage));
      deps.push_back(l);
    };
    switch (st.pass) {
      case Pass::F:
        if (vs > 0) need(Pass::F, vs - 1);
        break;
      case Pass::B:
        if (vs < stages - 1) need(Pass::B, vs + 1);
        need(Pass::F, vs);
        break;
      case Pass::W: need(Pass::B, vs); break;
    }
  };
  if (per_rank)
    for (const auto* v : {&per_rank->f, &per_rank->b, &per_rank->w})
      if (static_cast<int>(v->size()) != pp)
        throw InternalError(fmt::format("run_stage_times: times for {} ranks, pp {}", v->size(), pp));
  const double comm = per_rank ? per_rank->comm : 0.0;
  auto duration = [&](Pass p, int r) {
    if (per_rank) return at(p == Pass::F ? per_rank->f : p == Pass::B ? per_rank->b : per_rank->w, r);
    return p == Pass::F ? t.f : p == Pass::B ? t.b : t.w;
  };

  IdealTimeline out;
  out.steps.resize(static_cast<std::size_t>(pp));
  std::vector<std::vector<char>> done(static_cast<std::size_t>(pp));
  for (int r = 0; r < pp; ++r) {
    at(out.steps, r).resize(at(schedule, r).size());
    at(done, r).assign(at(schedule, r).size(), 0);
  }
  std::vector<int> next(static_cast<std::size_t>(pp), 0);
  std::vector<double> free_at(static_cast<std::size_t>(pp), 0.0);
  IdealResult& res = out.result;
  res.busy.assign(static_cast<std::size_t>(pp), 0.0);
  std::vector<std::pair<Loc, Loc>> waits;   // (waiting step, what it waits for), for the deadlock message

  // Runs the group starting at next[r] if it is ready; returns whether it ran.
  auto try_group = [&](int r) {
    const int begin = at(next, r);
    int end = begin + 1;
    while (end < length_of(r) && step(r, end).paired) ++end;
    double ready = at(free_at, r);
    for (int k = begin; k < end; ++k) {
      deps_of(r, k);
      for (const Loc& d : deps) {
        // Inside the group (a W paired with its B): one pass computes both.
        if (d.rank == r && d.index >= begin && d.index < end) continue;
        if (!at(at(done, d.rank), d.index)) {
          waits.push_back({Loc{r, k}, d});
          return false;
        }
        ready = std::max(ready, at(at(out.steps, d.rank), d.index).end + (d.rank != r ? comm : 0.0));
      }
    }
    double length = 0;
    int forwards = 0, backwards = 0;
    for (int k = begin; k < end; ++k) {
      length += duration(step(r, k).pass, r);
      forwards += step(r, k).pass == Pass::F;
      backwards += step(r, k).pass == Pass::B;
    }
    if (forwards == 1 && backwards == 1 && t.fb_overlapped >= 0)
      length += t.fb_overlapped - duration(Pass::F, r) - duration(Pass::B, r);
    for (int k = begin; k < end; ++k) {
      at(at(out.steps, r), k) = {ready, ready + length};
      at(at(done, r), k) = 1;
    }
    at(free_at, r) = ready + length;
    at(res.busy, r) += length;
    at(next, r) = end;
    return true;
  };

  for (;;) {
    bool progress = false, finished = true;
    waits.clear();
    for (int r = 0; r < pp; ++r) {
      while (at(next, r) < length_of(r) && try_group(r)) progress = true;
      if (at(next, r) < length_of(r)) finished = false;
    }
    if (finished) break;
    if (!progress) {
      std::string why;
      for (const auto& [waiting, on] : waits)
        why += fmt::format("; {} waits for {}", describe(waiting.rank, waiting.index), describe(on.rank, on.index));
      throw InternalError(fmt::format("run_ideal: the {} schedule deadlocks (pp {}, {} micro-batches), no rank can "
                                      "advance{}", to_string(s), pp, m, why));
    }
  }

  res.makespan = *std::max_element(free_at.begin(), free_at.end());
  res.span.assign(static_cast<std::size_t>(pp), 0.0);
  for (int r = 0; r < pp; ++r)
    if (length_of(r) > 0) at(res.span, r) = at(free_at, r) - at(at(out.steps, r), 0).start;
  res.longest_span = *std::max_element(res.span.begin(), res.span.end());
  const double work = *std::max_element(res.busy.begin(), res.busy.end());
  res.bubble_fraction = work > 0 ? (res.makespan - work) / work : 0.0;

  // In flight: walking the rank's order, +1 at each F and -1 at each B, so
  // after each step the count is the micro-batch-chunks whose F has run and
  // whose B has not. The peak is the largest count after an F. A paired F&B
  // (F listed first) counts the new F before its partner B frees a slot, as
  // both micro-batches' activations are alive while the pair runs.
  res.peak_inflight.assign(static_cast<std::size_t>(pp), 0);
  for (int r = 0; r < pp; ++r) {
    int now = 0, peak = 0;
    for (const ScheduleStep& st : at(schedule, r)) {
      if (st.pass == Pass::F) peak = std::max(peak, ++now);
      if (st.pass == Pass::B) --now;
    }
    at(res.peak_inflight, r) = peak;
  }
  return out;
}

}  // namespace megascope::schedule_detail

namespace megascope {

IdealResult run_ideal(const std::vector<RankSchedule>& schedule, Schedule s, int pp, int vpp, int microbatches,
                      IdealTimes t) {
  return schedule_detail::ideal_timeline(schedule, s, pp, vpp, microbatches, t).result;
}

IdealResult run_stage_times(const std::vector<RankSchedule>& schedule, Schedule s, int pp, int vpp, int microbatches,
                            const StageTimes& t) {
  return schedule_detail::ideal_timeline(schedule, s, pp, vpp, microbatches, {}, &t).result;
}

}  // namespace megascope
