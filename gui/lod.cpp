#include "gui/lod.hpp"

#include <algorithm>
#include <array>

namespace megascope::gui {

void levelOfDetail(const TimelineLane& lane, const TimeScale& scale, std::vector<DrawItem>& out, double minWidthPx) {
  out.clear();
  const TimeRange v = scale.visible();
  const auto& spans = lane.spans;
  auto it = std::lower_bound(spans.begin(), spans.end(), v.start - lane.maxSpanLength,
                             [](const TimelineSpan& a, double t) { return a.start < t; });
  const double width = scale.width();

  bool pending = false;
  DrawItem block;
  std::array<double, kSpanKindCount> share{};
  auto flush = [&] {
    if (!pending) return;
    int best = 0, second = -1;
    double total = 0;
    for (int k = 0; k < kSpanKindCount; ++k) {
      const double x = share[static_cast<std::size_t>(k)];
      total += x;
      if (x > share[static_cast<std::size_t>(best)]) {
        second = best;
        best = k;
      } else if (k != best && x > 0 && (second < 0 || x > share[static_cast<std::size_t>(second)])) {
        second = k;
      }
    }
    if (second == best) second = -1;
    block.kind = static_cast<SpanKind>(best);
    if (second >= 0 && share[static_cast<std::size_t>(second)] > 0 && total > 0) {
      block.second = static_cast<SpanKind>(second);
      block.secondShare = share[static_cast<std::size_t>(second)] / total;
    }
    if (block.x1 - block.x0 < 1) block.x1 = block.x0 + 1;
    out.push_back(block);
    pending = false;
  };

  for (; it != spans.end() && it->start <= v.end; ++it) {
    if (it->end < v.start) continue;
    const double x0 = std::max(-1.0, scale.timeToX(it->start));
    const double x1 = std::min(width + 1, scale.timeToX(it->end));
    if (x1 - x0 >= minWidthPx) {
      flush();
      DrawItem single{x0, x1, it->kind, static_cast<int>(it - spans.begin()), 1};
      single.microbatch = it->microbatch;
      out.push_back(single);
      continue;
    }
    if (pending && x0 <= block.x1 + 1.0 && block.x1 - block.x0 < 3.0) {
      block.x1 = std::max(block.x1, x1);
      ++block.merged;
      if (block.microbatch != it->microbatch) block.microbatch = -1;
    } else {
      flush();
      pending = true;
      block = {x0, x1, it->kind, -1, 1};
      block.microbatch = it->microbatch;
      share.fill(0);
    }
    share[static_cast<std::size_t>(it->kind)] += it->end - it->start;
  }
  flush();
}

void labelRuns(const std::vector<DrawItem>& items, std::vector<LabelRun>& out) {
  out.clear();
  bool open = false;
  LabelRun run;
  for (const DrawItem& it : items) {
    const std::int32_t mb = it.microbatch;
    // One pass of one micro-batch: its ops, the short waits between them (TP communication on
    // another stream) and, for the backward, input and weight gradients alike.
    const auto family = [](SpanKind k) { return k == SpanKind::backwardWeight ? SpanKind::backwardInput : k; };
    if (open && mb >= 0 && mb == run.microbatch && family(it.kind) == family(run.kind) && it.x0 <= run.x1 + 6.0) {
      run.x1 = std::max(run.x1, it.x1);
      continue;
    }
    if (open) out.push_back(run);
    open = mb >= 0;
    if (open) run = {it.x0, it.x1, mb, it.kind};
  }
  if (open) out.push_back(run);
}

}  // namespace megascope::gui
