#include "sim/report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

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

std::optional<CommKind> comm_kind(OpLabel l) {
  switch (l) {
    case OpLabel::tp_comm: return CommKind::tp;
    case OpLabel::cp_comm: return CommKind::cp;
    case OpLabel::ep_comm: return CommKind::ep;
    case OpLabel::dp_grad:
    case OpLabel::dp_param:
    case OpLabel::embedding_grad: return CommKind::dp;
    case OpLabel::pp_activation:
    case OpLabel::pp_gradient: return CommKind::pp;
    default: return std::nullopt;
  }
}

using Intervals = std::vector<std::pair<double, double>>;

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

}  // namespace

SimReport make_report(const Setup& s, const Program& p, const SimResult& r) {
  SimReport rep;
  rep.step_time_s = r.step_time_s;
  const double tokens = static_cast<double>(s.tokens_per_iteration());
  const IterationFlops fl = iteration_flops(s);
  rep.model_flops = fl.model;
  if (r.step_time_s > 0) {
    rep.tokens_per_s = tokens / r.step_time_s;
    rep.tflops_per_gpu = fl.model / r.step_time_s / s.world / 1e12;
    rep.tflops_per_gpu_no_causal = fl.model_no_causal / r.step_time_s / s.world / 1e12;
    rep.hardware_tflops_per_gpu_no_causal = fl.hardware_no_causal / r.step_time_s / s.world / 1e12;
    const double peak = s.cluster.device.peak_bf16_flops / 1e12;
    rep.mfu = rep.tflops_per_gpu / peak;
    rep.mfu_no_causal = rep.tflops_per_gpu_no_causal / peak;
  }
  // Intervals per traced rank, and compute time by label (summed in span
  // order). Ranks are looked up by index, labels by enum: no per-span maps.
  struct RankSpans {
    int rank = 0;
    const std::vector<std::uint8_t>* codes = nullptr;
    Intervals compute;
    std::array<Intervals, kCommKinds> comm;
    std::array<double, kOpLabelCount> by_label{};
    std::array<bool, kOpLabelCount> has_label{};
  };
  std::vector<RankSpans> per_rank;
  std::vector<std::int32_t> slot_of_rank(static_cast<std::size_t>(std::max(0, p.grid.world())), -1);
  // What a span needs of its op, one byte per op of each stage (read once, in
  // order; spans come in completion order, interleaved over ranks): compute
  // (kCompute | label), a kind of communication, or kIgnored.
  constexpr std::uint8_t kCompute = 0x80, kIgnored = 0x7f;
  static_assert(kOpLabelCount < kIgnored && kCommKinds < kIgnored);
  std::vector<std::vector<std::uint8_t>> codes(p.stages.size());
  const auto codes_of = [&](int rank) -> const std::vector<std::uint8_t>* {
    const StageProgram& sp = p.of_rank(rank);
    auto& c = codes[static_cast<std::size_t>(&sp - p.stages.data())];
    if (c.empty() && !sp.ops.empty()) {
      c.resize(sp.ops.size());
      for (std::size_t i = 0; i < sp.ops.size(); ++i) {
        const Op& op = sp.ops[i];
        const auto k = comm_kind(op.label);
        c[i] = op.kind == OpKind::compute ? static_cast<std::uint8_t>(kCompute | static_cast<std::uint8_t>(op.label))
               : k                        ? static_cast<std::uint8_t>(*k)
                                          : kIgnored;
      }
    }
    return &c;
  };
  for (const Span& sp : r.spans) {
    auto& slot = slot_of_rank.at(static_cast<std::size_t>(sp.rank));
    if (slot < 0) {
      slot = static_cast<std::int32_t>(per_rank.size());
      per_rank.push_back(RankSpans{sp.rank, codes_of(sp.rank), {}, {}, {}, {}});
      per_rank.back().compute.reserve(per_rank.back().codes->size());
    }
    RankSpans& entry = per_rank[static_cast<std::size_t>(slot)];
    const std::uint8_t code = (*entry.codes)[sp.op];
    if (code & kCompute) {
      entry.compute.push_back({sp.start, sp.end});
      const auto l = static_cast<std::size_t>(code & ~kCompute);
      entry.by_label[l] += sp.end - sp.start;
      entry.has_label[l] = true;
    } else if (code != kIgnored) {
      entry.comm[code].push_back({sp.start, sp.end});
    }
  }
  for (RankSpans& entry : per_rank) {
    const int rank = entry.rank;
    StageReport st;
    st.rank = rank;
    st.stage = p.grid.coord(rank).pp;
    const Intervals compute = merged(std::move(entry.compute));
    st.compute_busy_s = length(compute);
    Intervals busy = compute;
    for (int k = 0; k < kCommKinds; ++k) {
      const Intervals c = merged(std::move(entry.comm[static_cast<std::size_t>(k)]));
      st.exposed_comm_s[static_cast<std::size_t>(k)] = minus(c, compute);
      if (!c.empty()) busy = united(busy, c);
    }
    st.bubble_s = std::max(0.0, r.step_time_s - length(busy));
    for (int l = 0; l < kOpLabelCount; ++l)
      if (entry.has_label[static_cast<std::size_t>(l)])
        st.compute_by_label_s[to_string(static_cast<OpLabel>(l))] = entry.by_label[static_cast<std::size_t>(l)];
    rep.stages.push_back(st);
  }
  std::sort(rep.stages.begin(), rep.stages.end(), [](const auto& a, const auto& b) {
    return a.stage != b.stage ? a.stage < b.stage : a.rank < b.rank;
  });
  if (!rep.stages.empty() && r.step_time_s > 0) {
    for (const StageReport& st : rep.stages) {
      rep.bubble_fraction += st.bubble_s / r.step_time_s;
      for (int k = 0; k < kCommKinds; ++k) rep.exposed_comm_s[static_cast<std::size_t>(k)] += st.exposed_comm_s[static_cast<std::size_t>(k)];
    }
    rep.bubble_fraction /= static_cast<double>(rep.stages.size());
    for (double& e : rep.exposed_comm_s) e /= static_cast<double>(rep.stages.size());
  }
  return rep;
}

Result<void> write_trace(const std::string& path, const Program& p, const SimResult& r, TraceInfo info) {
  info.source = TraceSource::simulated;
  info.step_time_s = r.step_time_s;
  if (info.world == 0) info.world = p.grid.world();
  return megascope::write_trace(path, p, info, r.traced_ranks, r.spans);
}

}  // namespace megascope::sim
