// Level of detail: what to draw for one lane at the current zoom. Spans at
// least `minWidthPx` wide are drawn one by one; runs of narrower spans that
// touch within a pixel merge into blocks of about three pixels, each coloured
// by the kind that takes most of its time (and, in its lower part, the
// runner-up in proportion to its time). The output is bounded by the lane's width in pixels times
// a small factor, whatever the number of spans, which keeps a million-span
// timeline smooth. Plain geometry: no widgets.
#pragma once

#include <cstdint>
#include <vector>

#include "gui/timelinedata.hpp"
#include "gui/timescale.hpp"

namespace megascope::gui {

struct DrawItem {
  double x0 = 0, x1 = 0;     // pixels; x1 - x0 >= 1 for merged blocks
  SpanKind kind = SpanKind::other;
  int span = -1;             // the span, for single spans; -1 for merged blocks
  std::uint32_t merged = 1;  // spans this item stands for
  std::int32_t microbatch = -1;   // the span's, or the one all merged spans share; -1: none or mixed
  // Merged blocks: the kind with the second largest time and its share of the
  // block's busy time (0 when one kind fills it), drawn as the lower part.
  SpanKind second = SpanKind::other;
  double secondShare = 0;
};

// Items for `lane` inside the scale's visible range, left to right.
void levelOfDetail(const TimelineLane& lane, const TimeScale& scale, std::vector<DrawItem>& out,
                   double minWidthPx = 2.0);

// Where to write micro-batch numbers: runs of consecutive items (single spans
// or merged blocks of one micro-batch) of one micro-batch and one pass (forward, recompute, or backward: input and
// weight gradients alike) less than 6 pixels apart become one label run, so
// that the several ops of one micro-batch's pass carry one label. Spans
// without a micro-batch start no run.
struct LabelRun {
  double x0 = 0, x1 = 0;
  std::int32_t microbatch = -1;
  SpanKind kind = SpanKind::other;
};
void labelRuns(const std::vector<DrawItem>& items, std::vector<LabelRun>& out);

}  // namespace megascope::gui
