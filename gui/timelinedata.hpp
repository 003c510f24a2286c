// TimelineData: the spans of an iteration arranged for drawing, one lane per
// (traced rank, stream, source), each lane's spans sorted by start time, with
// the op details a tooltip shows. Built off the GUI thread from a simulated
// Program + SimResult or from a trace file (simulated or measured); two of
// them merge into one for the predicted-vs-measured view.
// Plain data: no widgets.
#pragma once

#include <QString>

#include <cstdint>
#include <memory>
#include <vector>

#include "config/trace_file.hpp"
#include "core/program/program.hpp"
#include "core/trace.hpp"
#include "gui/spankind.hpp"

namespace megascope::gui {

// What a tooltip says about an op (indexed by the op's index in its stage).
struct OpInfo {
  OpKind kind = OpKind::compute;
  Phase phase = Phase::forward;
  OpLabel label = OpLabel::attention;
  std::int32_t microbatch = -1;   // -1: none
  std::int32_t layer = -1;
  std::int32_t chunk = -1;
  double bytes = 0;
  double flops = 0;
};

struct TimelineSpan {
  double start = 0, end = 0;      // seconds
  std::uint32_t op = 0;           // index into the lane's ops
  std::int32_t microbatch = -1;
  SpanKind kind = SpanKind::other;
};

enum class TraceOrigin : std::uint8_t { simulated, measured };

struct TimelineLane {
  int rank = 0;
  int stage = 0;                  // pipeline rank
  Stream stream = Stream::compute;
  TraceOrigin origin = TraceOrigin::simulated;
  std::vector<TimelineSpan> spans;        // sorted by start
  double maxSpanLength = 0;               // longest span: bounds the search for visible spans
  std::shared_ptr<const std::vector<OpInfo>> ops;
  [[nodiscard]] QString title() const;    // "rank 8 compute", "rank 8 tp (measured)"
};

struct TimelineData {
  std::vector<TimelineLane> lanes;        // by stage, rank, stream, origin
  double duration = 0;                    // seconds: the step time or the last span's end
  int stages = 0;
  std::size_t spanCount = 0;

  // Index of the lane's span under time t (spans nearest to t within `slack`
  // seconds count), or -1.
  [[nodiscard]] int spanAt(int lane, double t, double slack) const;
  [[nodiscard]] QString describe(int lane, int span) const;   // tooltip text (rich text)
};

// From a simulation: one lane per traced rank and stream that has spans.
std::shared_ptr<TimelineData> timelineFromSimulation(const Program& program, const std::vector<Span>& spans,
                                                     double stepTime);
// From a trace file; `program` (may be null) gives the ranks' stages when it
// matches the trace, otherwise the stage is read from nothing and set to 0.
std::shared_ptr<TimelineData> timelineFromTrace(const TraceFile& trace, TraceOrigin origin,
                                                const Program* program = nullptr);
// Lanes of both, the lanes of one rank and stream next to each other.
std::shared_ptr<TimelineData> mergeTimelines(const TimelineData& predicted, const TimelineData& measured);

// Synthetic data for tests and the benchmark: `lanes` lanes of back-to-back
// spans of random kinds and lengths, `spansPerLane` each.
std::shared_ptr<TimelineData> syntheticTimeline(int lanes, int spansPerLane, unsigned seed = 1);

}  // namespace megascope::gui
