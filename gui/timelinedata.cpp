#include "gui/timelinedata.hpp"

#include <algorithm>
#include <map>
#include <random>
#include <tuple>

#include "gui/timescale.hpp"

namespace megascope::gui {

namespace {

OpInfo infoOf(const Op& op) {
  OpInfo i;
  i.kind = op.kind;
  i.phase = op.phase;
  i.label = op.label;
  i.microbatch = op.microbatch.value_or(-1);
  i.layer = op.layer.value_or(-1);
  i.chunk = op.chunk.value_or(-1);
  i.bytes = op.bytes;
  i.flops = op.flops;
  return i;
}

void finishLane(TimelineLane& lane) {
  const auto byStart = [](const TimelineSpan& a, const TimelineSpan& b) { return a.start < b.start; };
  // Ordered streams complete in start order already: sort only what is not.
  if (!std::is_sorted(lane.spans.begin(), lane.spans.end(), byStart))
    std::stable_sort(lane.spans.begin(), lane.spans.end(), byStart);
  lane.maxSpanLength = 0;
  for (const TimelineSpan& s : lane.spans) lane.maxSpanLength = std::max(lane.maxSpanLength, s.end - s.start);
}

void finish(TimelineData& d) {
  std::stable_sort(d.lanes.begin(), d.lanes.end(), [](const TimelineLane& a, const TimelineLane& b) {
    return std::tuple(a.stage, a.rank, a.stream, a.origin) < std::tuple(b.stage, b.rank, b.stream, b.origin);
  });
  d.spanCount = 0;
  int maxStage = -1;
  for (TimelineLane& l : d.lanes) {
    finishLane(l);
    d.spanCount += l.spans.size();
    if (!l.spans.empty()) d.duration = std::max(d.duration, l.spans.back().end);
    for (const TimelineSpan& s : l.spans) d.duration = std::max(d.duration, s.end);
    maxStage = std::max(maxStage, l.stage);
  }
  d.stages = maxStage + 1;
}

QString streamName(Stream s) { return QString::fromLatin1(to_string(s)); }

}  // namespace

QString TimelineLane::title() const {
  QString t = QStringLiteral("rank %1 %2").arg(rank).arg(streamName(stream));
  if (origin == TraceOrigin::measured) t += QStringLiteral(" (measured)");
  return t;
}

int TimelineData::spanAt(int lane, double t, double slack) const {
  if (lane < 0 || lane >= static_cast<int>(lanes.size())) return -1;
  const TimelineLane& l = lanes[static_cast<std::size_t>(lane)];
  const auto& s = l.spans;
  // First span that could reach t - slack: start >= t - slack - maxSpanLength.
  auto it = std::lower_bound(s.begin(), s.end(), t - slack - l.maxSpanLength,
                             [](const TimelineSpan& a, double v) { return a.start < v; });
  int best = -1;
  double bestDist = slack;
  for (; it != s.end() && it->start <= t + slack; ++it) {
    const double d = t < it->start ? it->start - t : (t > it->end ? t - it->end : 0);
    if (d <= bestDist) {
      // Prefer a span that contains t, then the nearest, then the shortest.
      if (best < 0 || d < bestDist ||
          (it->end - it->start) < (s[static_cast<std::size_t>(best)].end - s[static_cast<std::size_t>(best)].start)) {
        best = static_cast<int>(it - s.begin());
        bestDist = d;
      }
    }
  }
  return best;
}

QString TimelineData::describe(int lane, int span) const {
  if (lane < 0 || lane >= static_cast<int>(lanes.size())) return {};
  const TimelineLane& l = lanes[static_cast<std::size_t>(lane)];
  if (span < 0 || span >= static_cast<int>(l.spans.size())) return {};
  const TimelineSpan& s = l.spans[static_cast<std::size_t>(span)];
  QString t = QStringLiteral("<b>%1</b><br>").arg(spanKindName(s.kind));
  if (l.ops && s.op < l.ops->size()) {
    const OpInfo& o = (*l.ops)[s.op];
    t += QStringLiteral("%1 (%2)<br>")
             .arg(QString::fromStdString(opName(o.kind, o.phase, o.label)),
                  QString::fromLatin1(o.kind == OpKind::compute ? phaseName(o.phase) : to_string(o.phase)));
    if (o.microbatch >= 0) t += QStringLiteral("micro-batch %1<br>").arg(o.microbatch);
    if (o.layer >= 0) t += QStringLiteral("layer %1<br>").arg(o.layer);
    if (o.chunk >= 0) t += QStringLiteral("chunk %1<br>").arg(o.chunk);
    if (o.flops > 0) t += QStringLiteral("%1 GFLOP<br>").arg(o.flops / 1e9, 0, 'f', 2);
    if (o.bytes > 0) t += QStringLiteral("%1 MB<br>").arg(o.bytes / 1e6, 0, 'f', 2);
  }
  t += QStringLiteral("%1 op %2, stage %3<br>").arg(l.title()).arg(s.op).arg(l.stage);
  t += QStringLiteral("start %1, duration %2").arg(formatDuration(s.start, 6), formatDuration(s.end - s.start, 4));
  return t;
}

std::shared_ptr<TimelineData> timelineFromSimulation(const Program& program, const std::vector<Span>& spans,
                                                     double stepTime) {
  auto d = std::make_shared<TimelineData>();
  std::vector<std::shared_ptr<const std::vector<OpInfo>>> stageOps(program.stages.size());
  for (std::size_t s = 0; s < program.stages.size(); ++s) {
    auto v = std::make_shared<std::vector<OpInfo>>();
    v->reserve(program.stages[s].ops.size());
    for (const Op& op : program.stages[s].ops) v->push_back(infoOf(op));
    stageOps[s] = std::move(v);
  }
  // (rank, stream) -> lane, through a slot per traced rank (no per-span map lookups).
  const int world = program.grid.world();
  std::vector<int> slotOfRank(static_cast<std::size_t>(world), -1);
  std::vector<int> stageOfSlot;
  std::vector<int> laneOf;   // slot * kStreamCount + stream -> lane, -1: none yet
  for (const Span& sp : spans) {
    if (sp.rank < 0 || sp.rank >= world) continue;
    int& slot = slotOfRank[static_cast<std::size_t>(sp.rank)];
    if (slot < 0) {
      slot = static_cast<int>(stageOfSlot.size());
      stageOfSlot.push_back(program.grid.coord(sp.rank).pp);
      laneOf.resize(laneOf.size() + kStreamCount, -1);
    }
    const int stage = stageOfSlot[static_cast<std::size_t>(slot)];
    const Op& op = program.stages[static_cast<std::size_t>(stage)].ops.at(sp.op);
    int& lane = laneOf[static_cast<std::size_t>(slot * kStreamCount + static_cast<int>(op.stream))];
    if (lane < 0) {
      lane = static_cast<int>(d->lanes.size());
      TimelineLane l;
      l.rank = sp.rank;
      l.stage = stage;
      l.stream = op.stream;
      l.ops = stageOps[static_cast<std::size_t>(stage)];
      d->lanes.push_back(std::move(l));
    }
    d->lanes[static_cast<std::size_t>(lane)].spans.push_back(
        {sp.start, sp.end, sp.op, op.microbatch.value_or(-1), spanKindOf(op)});
  }
  d->duration = stepTime;
  finish(*d);
  d->stages = std::max(d->stages, static_cast<int>(program.stages.size()));
  return d;
}

std::shared_ptr<TimelineData> timelineFromTrace(const TraceFile& trace, TraceOrigin origin, const Program* program) {
  auto d = std::make_shared<TimelineData>();
  const bool programMatches = program && program->grid.world() == trace.info.world;
  std::map<int, int> stageOfRank;
  for (std::size_t i = 0; i < trace.ranks.size(); ++i)
    stageOfRank[trace.ranks[i]] = programMatches ? program->grid.coord(trace.ranks[i]).pp : static_cast<int>(i);
  // Op details per rank, from the records themselves.
  std::map<int, std::shared_ptr<std::vector<OpInfo>>> opsOfRank;
  std::map<std::pair<int, int>, std::size_t> laneOf;
  for (const TraceRecord& r : trace.spans) {
    if (!stageOfRank.count(r.rank)) stageOfRank[r.rank] = programMatches ? program->grid.coord(r.rank).pp : 0;
    auto& ops = opsOfRank[r.rank];
    if (!ops) ops = std::make_shared<std::vector<OpInfo>>();
    if (ops->size() <= r.op) ops->resize(r.op + 1);
    OpInfo& info = (*ops)[r.op];
    info.phase = parsePhase(r.phase).value_or(Phase::forward);
    info.label = parseOpLabel(r.label).value_or(OpLabel::attention);
    const Stream stream = static_cast<Stream>(std::clamp(r.stream, 0, kStreamCount - 1));
    info.kind = stream == Stream::compute ? OpKind::compute
                : stream == Stream::pp_send ? OpKind::send
                : stream == Stream::pp_recv ? OpKind::recv
                                            : OpKind::all_reduce;
    if (programMatches) {
      const StageProgram& sp = program->of_rank(r.rank);
      if (r.op < sp.ops.size()) info.kind = sp.ops[r.op].kind;
    }
    info.microbatch = r.microbatch.value_or(-1);
    info.layer = r.layer.value_or(-1);
    info.chunk = r.chunk.value_or(-1);
    info.bytes = r.bytes;
    info.flops = r.flops;
    const auto key = std::pair(r.rank, static_cast<int>(stream));
    auto [it, inserted] = laneOf.try_emplace(key, d->lanes.size());
    if (inserted) {
      TimelineLane lane;
      lane.rank = r.rank;
      lane.stage = stageOfRank[r.rank];
      lane.stream = stream;
      lane.origin = origin;
      d->lanes.push_back(std::move(lane));
    }
    d->lanes[it->second].spans.push_back(
        {r.start_s, r.end_s, r.op, info.microbatch, spanKindOf(info.kind, info.phase, info.label)});
  }
  for (TimelineLane& l : d->lanes) l.ops = opsOfRank[l.rank];
  d->duration = trace.info.step_time_s;
  finish(*d);
  return d;
}

std::shared_ptr<TimelineData> mergeTimelines(const TimelineData& predicted, const TimelineData& measured) {
  auto d = std::make_shared<TimelineData>();
  d->lanes = predicted.lanes;
  d->lanes.insert(d->lanes.end(), measured.lanes.begin(), measured.lanes.end());
  d->duration = std::max(predicted.duration, measured.duration);
  finish(*d);
  return d;
}

std::shared_ptr<TimelineData> syntheticTimeline(int lanes, int spansPerLane, unsigned seed) {
  auto d = std::make_shared<TimelineData>();
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> len(0.5e-6, 20e-6);
  std::uniform_int_distribution<int> kind(0, kSpanKindCount - 1);
  for (int i = 0; i < lanes; ++i) {
    TimelineLane lane;
    lane.rank = i / 2;
    lane.stage = i / 4;
    lane.stream = i % 2 ? Stream::tp : Stream::compute;
    lane.spans.reserve(static_cast<std::size_t>(spansPerLane));
    double t = 0;
    for (int k = 0; k < spansPerLane; ++k) {
      const double l = len(rng);
      lane.spans.push_back({t, t + l, static_cast<std::uint32_t>(k), k % 96, static_cast<SpanKind>(kind(rng))});
      t += l * 1.05;
    }
    d->lanes.push_back(std::move(lane));
  }
  finish(*d);
  return d;
}

}  // namespace megascope::gui
