#include "gui/tracecompare.hpp"

#include <array>
#include <cmath>
#include <algorithm>
#include <map>
#include <string>

namespace megascope::gui {

std::optional<double> KindError::error() const {
  if (measuredS <= 0) return std::nullopt;
  return (predictedS - measuredS) / measuredS;
}

std::optional<double> OpError::error() const {
  if (measuredS <= 0) return std::nullopt;
  return (predictedS - measuredS) / measuredS;
}

std::optional<double> TraceComparison::stepError() const {
  if (measuredStepS <= 0) return std::nullopt;
  return (predictedStepS - measuredStepS) / measuredStepS;
}

TraceComparison compareTraces(const Program& program, const std::vector<Span>& predicted, double predictedStepS,
                              const TraceFile& measured) {
  TraceComparison c;
  c.predictedStepS = predictedStepS;
  c.measuredStepS = measured.info.step_time_s;
  c.planMatches = measured.info.world == 0 || measured.info.world == program.grid.world();
  // Predicted duration of (stage, op), from the first traced rank of each stage.
  std::map<int, int> traceRankOfStage;
  for (const Span& s : predicted) traceRankOfStage.try_emplace(program.grid.coord(s.rank).pp, s.rank);
  std::vector<std::vector<double>> duration(program.stages.size());
  for (std::size_t st = 0; st < program.stages.size(); ++st)
    duration[st].assign(program.stages[st].ops.size(), -1.0);
  for (const Span& s : predicted) {
    const int stage = program.grid.coord(s.rank).pp;
    if (traceRankOfStage[stage] != s.rank) continue;
    duration[static_cast<std::size_t>(stage)][s.op] = s.end - s.start;
  }
  std::array<KindError, kSpanKindCount> acc{};
  std::map<std::string, OpError> byName;
  for (const TraceRecord& r : measured.spans) {
    if (!c.planMatches || r.rank < 0 || r.rank >= program.grid.world()) {
      ++c.unmatched;
      continue;
    }
    const int stage = program.grid.coord(r.rank).pp;
    const auto& d = duration[static_cast<std::size_t>(stage)];
    if (r.op >= d.size() || d[r.op] < 0) {
      ++c.unmatched;
      continue;
    }
    const Op& op = program.stages[static_cast<std::size_t>(stage)].ops[r.op];
    // The trace names its op: a span of another program (an older builder,
    // another schedule) must not be compared with whatever op has its index.
    const auto same = [](std::optional<int> a, std::optional<std::int32_t> b) {
      return a.has_value() == b.has_value() && (!a || *a == *b);
    };
    if ((!r.phase.empty() && r.phase != to_string(op.phase)) || !same(r.microbatch, op.microbatch) ||
        !same(r.chunk, op.chunk) || !same(r.layer, op.layer)) {
      ++c.unmatched;
      ++c.misplaced;
      continue;
    }
    KindError& k = acc[static_cast<std::size_t>(spanKindOf(op))];
    k.predictedS += d[r.op];
    k.measuredS += r.end_s - r.start_s;
    ++k.matched;
    ++c.matched;
    const std::string name = opName(op.kind, op.phase, op.label);
    OpError& e = byName[name];
    e.name = name;
    e.kind = spanKindOf(op);
    e.predictedS += d[r.op];
    e.measuredS += r.end_s - r.start_s;
    ++e.matched;
  }
  for (auto& [name, e] : byName) c.ops.push_back(std::move(e));
  std::stable_sort(c.ops.begin(), c.ops.end(),
                   [](const OpError& a, const OpError& b) { return a.measuredS > b.measuredS; });
  for (int i = 0; i < kSpanKindCount; ++i) {
    if (acc[static_cast<std::size_t>(i)].matched == 0) continue;
    acc[static_cast<std::size_t>(i)].kind = static_cast<SpanKind>(i);
    c.kinds.push_back(acc[static_cast<std::size_t>(i)]);
  }
  return c;
}

Result<void> writeScaledTrace(const std::string& path, const Program& program, const std::vector<int>& ranks,
                              const std::vector<Span>& spans, double stepS, double computeScale, double commScale,
                              const std::string& plan, const std::string& model) {
  std::vector<Span> scaled = spans;
  double end = 0;
  for (Span& s : scaled) {
    const Op& op = program.of_rank(s.rank).ops.at(s.op);
    const double f = op.kind == OpKind::compute ? computeScale : commScale;
    const double len = (s.end - s.start) * f;
    s.start *= computeScale;
    s.end = s.start + len;
    end = std::max(end, s.end);
  }
  TraceInfo info{TraceSource::measured, std::max(end, stepS * computeScale), plan, model, program.grid.world()};
  return write_trace(path, program, info, ranks, scaled);
}

}  // namespace megascope::gui
