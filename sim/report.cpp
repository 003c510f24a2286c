#include "sim/report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "core/accounting/flops.hpp"

namespace megascope::sim {

const char* to_string(CommKind k) {
  switch (k) {
    case CommKind::tp: return "tp";
    case CommKind::cp: return "cp";
    case CommKind::ep: return "ep";
    case CommKind::dp: return "dp";
    case CommKind::pp: return "pp";
  }
  return "?";
}

namespace {

// Sorts intervals that are nearly in order: spans arrive in completion
// order, and an op finishes out of start order only by a few places (the
// engine ends a region's inner ops before an exit it started earlier). An
// insertion sort costs one step per displacement; past a budget of a few
// per element the list is not nearly sorted after all and std::sort takes
// over. Both give the one sorted order (pairs compare by value).
void sort_nearly_sorted(Intervals& v) {
  std::size_t budget = 8 * v.size() + 64;
  for (std::size_t i = 1; i < v.size(); ++i) {
    if (!(v[i] < v[i - 1])) continue;
    const auto x = v[i];
    std::size_t j = i;
    while (j > 0 && x < v[j - 1]) {
      v[j] = v[j - 1];
      --j;
      if (--budget == 0) {
        v[j] = x;
        std::sort(v.begin(), v.end());
        return;
      }
    }
    v[j] = x;
  }
}

// Sorted, overlapping and touching intervals joined. Spans of one stream
// arrive in start order, so the sort is usually one pass that moves nothing.
Intervals merged(Intervals v) {
  sort_nearly_sorted(v);
  std::size_t n = 0;   // in place: v[0..n) is the merged prefix
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (n > 0 && v[i].first <= v[n - 1].second) v[n - 1].second = std::max(v[n - 1].second, v[i].second);
    else v[n++] = v[i];
  }
  v.resize(n);
  return v;
}

// The union of two merged lists, merged.
Intervals united(const Intervals& a, const Intervals& b) {
  Intervals v(a.size() + b.size());
  std::merge(a.begin(), a.end(), b.begin(), b.end(), v.begin());
  return merged(std::move(v));
}

double length(const Intervals& v) {
  double t = 0;
  for (const auto& [a, b] : v) t += b - a;
  return t;
}

// Length of `a` not covered by `b` (both merged).
double minus(const Intervals& a, const Intervals& b) {
  double t = 0;
  std::size_t j = 0;
  for (const auto& [s, e] : a) {
    double cur = s;
    while (j < b.size() && b[j].second <= cur) ++j;
    std::size_t k = j;
    while (cur < e) {
      if (k >= b.size() || b[k].first >= e) {
        t += e - cur;
        break;
      }
      if (b[k].first > cur) t += b[k].first - cur;
      cur = std::max(cur, b[k].second);
      ++k;
    }
  }
  return t;
}

// The report of per-rank activity, whichever way it was gathered.
SimReport report_of(const Setup& s, const Program& p, double step_time_s, std::vector<RankActivity> per_rank) {
  SimReport rep;
  rep.makespan_s = step_time_s;
  // Each rank's span: its first op's start to its last op's end.
  std::vector<double> spans(per_rank.size(), 0.0);
  double longest = 0;
  for (std::size_t i = 0; i < per_rank.size(); ++i) {
    RankActivity& entry = per_rank[i];
    if (!entry.any) continue;
    double first = std::numeric_limits<double>::infinity(), last = 0;
    for (std::size_t k = 0; k < kActivityLists; ++k)
      for (const auto& [a, b] : entry.list(k)) {
        first = std::min(first, a);
        last = std::max(last, b);
      }
    if (last > first) spans[i] = last - first;
    longest = std::max(longest, spans[i]);
  }
  // With post-validation no synchronisation ends the iteration: each rank
  // starts the next one when it has finished this one (after its optimizer
  // step and parameter gather), so the iteration repeats every longest span.
  if (s.plan.post_validation && longest > 0) step_time_s = longest;
  rep.step_time_s = step_time_s;
  const double tokens = static_cast<double>(s.tokens_per_iteration());
  const IterationFlops fl = iteration_flops(s);
  rep.model_flops = fl.model;
  if (step_time_s > 0) {
    rep.tokens_per_s = tokens / step_time_s;
    rep.tflops_per_gpu = fl.model / step_time_s / s.world / 1e12;
    rep.tflops_per_gpu_no_causal = fl.model_no_causal / step_time_s / s.world / 1e12;
    rep.hardware_tflops_per_gpu_no_causal = fl.hardware_no_causal / step_time_s / s.world / 1e12;
    const double peak = s.cluster.device.peak_bf16_flops / 1e12;
    rep.mfu = rep.tflops_per_gpu / peak;
    rep.mfu_no_causal = rep.tflops_per_gpu_no_causal / peak;
  }
  for (RankActivity& entry : per_rank) {
    if (!entry.any) continue;
    const int rank = entry.rank;
    StageReport st;
    st.rank = rank;
    st.stage = p.grid.coord(rank).pp;
    st.span_s = spans[static_cast<std::size_t>(&entry - per_rank.data())];
    const Intervals compute = merged(std::move(entry.compute));
    st.compute_busy_s = length(compute);
    Intervals busy = compute;
    for (int k = 0; k < kCommKinds; ++k) {
      const Intervals c = merged(std::move(entry.comm[static_cast<std::size_t>(k)]));
      st.exposed_comm_s[static_cast<std::size_t>(k)] = minus(c, compute);
      if (!c.empty()) busy = united(busy, c);
    }
    st.bubble_s = std::max(0.0, step_time_s - length(busy));
    for (int l = 0; l < kOpLabelCount; ++l)
      if (entry.has_label[static_cast<std::size_t>(l)])
        st.compute_by_label_s[to_string(static_cast<OpLabel>(l))] = entry.by_label[static_cast<std::size_t>(l)];
    rep.stages.push_back(st);
  }
  std::sort(rep.stages.begin(), rep.stages.end(), [](const auto& a, const auto& b) {
    return a.stage != b.stage ? a.stage < b.stage : a.rank < b.rank;
  });
  if (!rep.stages.empty() && step_time_s > 0) {
    for (const StageReport& st : rep.stages) {
      rep.bubble_fraction += st.bubble_s / step_time_s;
      for (int k = 0; k < kCommKinds; ++k) rep.exposed_comm_s[static_cast<std::size_t>(k)] += st.exposed_comm_s[static_cast<std::size_t>(k)];
    }
    rep.bubble_fraction /= static_cast<double>(rep.stages.size());
    // The stage that waits least sets the pace: its idle time is the bubble
    // the schedule cannot avoid (its communication in flight counts as work).
    double least = rep.stages.front().bubble_s;
    for (const StageReport& st : rep.stages) least = std::min(least, st.bubble_s);
    rep.busiest_bubble_fraction = least / step_time_s;
    for (double& e : rep.exposed_comm_s) e /= static_cast<double>(rep.stages.size());
  }
  return rep;
}

// Per traced rank, its spans' activity, ranks in the order of their first
// span. Ranks are looked up by index, op codes by stage: no per-span maps.
std::vector<RankActivity> activity_of_spans(const Program& p, const std::vector<Span>& spans) {
  std::vector<RankActivity> per_rank;
  std::vector<const std::vector<std::uint8_t>*> codes_of_slot;
  std::vector<std::int32_t> slot_of_rank(static_cast<std::size_t>(std::max(0, p.grid.world())), -1);
  std::vector<std::vector<std::uint8_t>> codes(p.stages.size());   // per stage, made when first needed
  for (const Span& sp : spans) {
    auto& slot = slot_of_rank.at(static_cast<std::size_t>(sp.rank));
    if (slot < 0) {
      slot = static_cast<std::int32_t>(per_rank.size());
      const StageProgram& stage = p.of_rank(sp.rank);
      auto& c = codes[static_cast<std::size_t>(&stage - p.stages.data())];
      if (c.empty()) c = activity_codes(stage);
      per_rank.push_back(RankActivity{});
      per_rank.back().rank = sp.rank;
      codes_of_slot.push_back(&c);
    }
    const auto k = static_cast<std::size_t>(slot);
    per_rank[k].add((*codes_of_slot[k])[sp.op], sp.start, sp.end);
  }
  for (RankActivity& a : per_rank) a.flush();
  return per_rank;
}

}  // namespace

std::vector<std::uint8_t> activity_codes(const StageProgram& stage) {
  std::vector<std::uint8_t> c(stage.ops.size());
  for (std::size_t i = 0; i < stage.ops.size(); ++i) c[i] = activity_code(stage.ops[i]);
  return c;
}

SimReport make_report(const Setup& s, const Program& p, const SimResult& r) {
  return report_of(s, p, r.step_time_s, r.activity.empty() ? activity_of_spans(p, r.spans) : r.activity);
}

SimReport make_report(const Setup& s, const Program& p, SimResult&& r) {
  return report_of(s, p, r.step_time_s, r.activity.empty() ? activity_of_spans(p, r.spans) : std::move(r.activity));
}

Result<void> write_trace(const std::string& path, const Program& p, const SimResult& r, TraceInfo info) {
  info.source = TraceSource::simulated;
  info.step_time_s = r.step_time_s;
  if (info.world == 0) info.world = p.grid.world();
  return megascope::write_trace(path, p, info, r.traced_ranks, r.spans);
}

}  // namespace megascope::sim
