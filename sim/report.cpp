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

Intervals merged(Intervals v) {
  std::sort(v.begin(), v.end());
  Intervals out;
  for (const auto& [a, b] : v) {
    if (!out.empty() && a <= out.back().second) out.back().second = std::max(out.back().second, b);
    else out.push_back({a, b});
  }
  return out;
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
    const StageProgram* program = nullptr;
    Intervals compute;
    std::array<Intervals, kCommKinds> comm;
    std::array<double, kOpLabelCount> by_label{};
    std::array<bool, kOpLabelCount> has_label{};
  };
  std::vector<RankSpans> per_rank;
  std::vector<std::int32_t> slot_of_rank(static_cast<std::size_t>(std::max(0, p.grid.world())), -1);
  for (const Span& sp : r.spans) {
    auto& slot = slot_of_rank.at(static_cast<std::size_t>(sp.rank));
    if (slot < 0) {
      slot = static_cast<std::int32_t>(per_rank.size());
      per_rank.push_back(RankSpans{sp.rank, &p.of_rank(sp.rank), {}, {}, {}, {}});
    }
    RankSpans& entry = per_rank[static_cast<std::size_t>(slot)];
    const Op& op = entry.program->ops[sp.op];
    if (op.kind == OpKind::compute) {
      entry.compute.push_back({sp.start, sp.end});
      const auto l = static_cast<std::size_t>(op.label);
      entry.by_label[l] += sp.end - sp.start;
      entry.has_label[l] = true;
    } else if (auto k = comm_kind(op.label)) {
      entry.comm[static_cast<std::size_t>(*k)].push_back({sp.start, sp.end});
    }
  }
  for (RankSpans& entry : per_rank) {
    const int rank = entry.rank;
    StageReport st;
    st.rank = rank;
    st.stage = p.grid.coord(rank).pp;
    const Intervals compute = merged(std::move(entry.compute));
    st.compute_busy_s = length(compute);
    Intervals all_comm;
    for (int k = 0; k < kCommKinds; ++k) {
      const Intervals c = merged(std::move(entry.comm[static_cast<std::size_t>(k)]));
      st.exposed_comm_s[static_cast<std::size_t>(k)] = minus(c, compute);
      all_comm.insert(all_comm.end(), c.begin(), c.end());
    }
    const Intervals busy = merged([&] {
      Intervals v = compute;
      v.insert(v.end(), all_comm.begin(), all_comm.end());
      return v;
    }());
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
