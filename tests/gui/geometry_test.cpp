// TimeScale, ZoomStack, axis ticks, LaneLayout and level of detail: the
// timeline's geometry, without widgets.
#include <QtTest>

#include "gui/lanelayout.hpp"
#include "gui/lod.hpp"
#include "gui/timescale.hpp"
#include "gui_support.hpp"

using namespace megascope;
using namespace megascope::gui;

class TimeScaleTest : public QObject {
  Q_OBJECT
 private slots:
  void mapsTimeToPixelsAndBack() {
    // x = (t - start) * width / length, and xToTime inverts it.
    TimeScale s;
    s.setDuration(10);
    s.setWidth(1000);
    s.showAll();
    QCOMPARE(s.timeToX(5), 500.0);
    s.setVisible({2, 4});
    QCOMPARE(s.timeToX(3), 500.0);
    QCOMPARE(s.xToTime(250), 2.5);
  }
  void zoomKeepsTheTimeUnderTheCursor() {
    // Zooming in at pixel 300 leaves the time under pixel 300 where it was and shrinks the range.
    TimeScale s;
    s.setDuration(10);
    s.setWidth(1000);
    s.showAll();
    const double t = s.xToTime(300);
    s.zoomAt(300, 4);
    QVERIFY(qAbs(s.xToTime(300) - t) < 1e-12);
    QVERIFY(qAbs(s.visible().length() - 2.5) < 1e-12);
    s.zoomAt(300, 1e-6);   // zooming far out stops at the whole iteration
    QVERIFY(s.showsAll());
  }
  void panAndRangesStayInsideTheIteration() {
    // Panning past either end stops at it; a reversed or oversized range is clamped.
    TimeScale s;
    s.setDuration(10);
    s.setWidth(1000);
    s.setVisible({1, 3});
    s.panPixels(-1e6);
    QCOMPARE(s.visible().start, 0.0);
    QCOMPARE(s.visible().length(), 2.0);
    s.panPixels(1e6);
    QCOMPARE(s.visible().end, 10.0);
    s.setVisible({7, -5});
    QVERIFY(s.showsAll());
    s.setVisible({5, 5});
    QVERIFY(s.visible().length() >= s.minimumSpan() * (1 - 1e-6));   // up to rounding
  }
  void zoomStackStepsBackInOrder() {
    // Ranges come back last in, first out; an empty stack reports nothing.
    ZoomStack z;
    z.push({0, 10});
    z.push({2, 4});
    TimeRange r;
    QVERIFY(z.pop(r));
    QCOMPARE(r, (TimeRange{2, 4}));
    QVERIFY(z.pop(r));
    QCOMPARE(r, (TimeRange{0, 10}));
    QVERIFY(!z.pop(r));
  }
  void ticksAreNiceAndLabelledWithUnits() {
    // Over 18.4 s on 1000 px with >= 80 px spacing, ticks fall every 2 s and read "2 s", "4 s"...
    QCOMPARE(niceStep(1.3), 2.0);
    QCOMPARE(niceStep(0.0031), 0.005);
    QCOMPARE(niceStep(7), 10.0);
    TimeScale s;
    s.setDuration(18.4);
    s.setWidth(1000);
    s.showAll();
    const auto ticks = axisTicks(s, 80);
    QVERIFY(ticks.size() >= 9);
    QCOMPARE(ticks[1].label, QStringLiteral("2 s"));
    for (std::size_t i = 1; i < ticks.size(); ++i) QVERIFY(ticks[i].x - ticks[i - 1].x >= 80 - 1e-9);
    s.setVisible({1.0, 1.0 + 5e-4});
    const auto fine = axisTicks(s, 80);
    QVERIFY(fine.size() >= 2);
    QVERIFY(fine[1].label.endsWith(QStringLiteral(" s")));   // 1.0001 s, with enough digits to differ
    QVERIFY(fine[0].label != fine[1].label);
  }
  void durationsUseTheFittingUnit() {
    QCOMPARE(formatDuration(18.43), QStringLiteral("18.43 s"));
    QCOMPARE(formatDuration(0.25), QStringLiteral("250 ms"));
    QCOMPARE(formatDuration(12.5e-6), QStringLiteral("12.5 us"));
    QCOMPARE(formatDuration(8e-7), QStringLiteral("800 ns"));
    QCOMPARE(formatDuration(0), QStringLiteral("0 s"));
  }
};

namespace {
// Two stages, two ranks each with compute and tp lanes.
TimelineData fourRanks() {
  TimelineData d;
  for (int rank = 0; rank < 4; ++rank)
    for (Stream st : {Stream::compute, Stream::tp}) {
      TimelineLane l;
      l.rank = rank;
      l.stage = rank / 2;
      l.stream = st;
      l.spans.push_back({0.0, 1.0, 0, 0, SpanKind::forward});
      d.lanes.push_back(l);
    }
  d.duration = 1;
  d.stages = 2;
  return d;
}
}  // namespace

class LaneLayoutTest : public QObject {
  Q_OBJECT
 private slots:
  void groupsLanesUnderStageHeaders() {
    // A header per stage, then its lanes, each laneHeight tall with gaps, labelled by rank and stream.
    LaneLayout l;
    l.build(fourRanks(), {});
    QCOMPARE(static_cast<int>(l.rows().size()), 2 + 8);
    QVERIFY(l.rows()[0].header);
    QCOMPARE(l.rows()[1].label, QStringLiteral("rank 0 compute"));
    QCOMPARE(l.rows()[2].label, QStringLiteral("rank 0 tp"));
    QVERIFY(l.rows()[5].header);
    QCOMPARE(l.rows()[5].stage, 1);
    QCOMPARE(l.laneRowCount(), 8);
    QCOMPARE(l.totalHeight(), 2 * (l.headerHeight + l.gap) + 8 * (l.laneHeight + l.gap));
  }
  void collapsedStageShowsOnlyItsHeaderWithTheComputeLane() {
    // Collapsing stage 0 hides its four lanes; its header summarises rank 0's compute lane (lane 0).
    LaneLayout l;
    l.build(fourRanks(), {0});
    QCOMPARE(static_cast<int>(l.rows().size()), 2 + 4);
    QVERIFY(l.rows()[0].header);
    QCOMPARE(l.rows()[0].lane, 0);
    QVERIFY(l.rows()[1].header);
    QVERIFY(l.rows()[0].label.contains(QStringLiteral("stage 0")));
  }
  void hitTestingFindsRowsAndGaps() {
    // rowAt finds the row under y, -1 in the gaps and outside; rowsIn returns the rows a band touches.
    LaneLayout l;
    l.build(fourRanks(), {});
    const LaneRow& r3 = l.rows()[3];
    QCOMPARE(l.rowAt(r3.y + 1), 3);
    QCOMPARE(l.rowAt(r3.y + r3.height + l.gap / 2), -1);
    QCOMPARE(l.rowAt(-5), -1);
    QCOMPARE(l.rowAt(l.totalHeight() + 10), -1);
    const auto [a, b] = l.rowsIn(r3.y + 1, l.rows()[5].y + 1);
    QCOMPARE(a, 3);
    QCOMPARE(b, 6);
  }
};

class LevelOfDetailTest : public QObject {
  Q_OBJECT
 private slots:
  void aMillionSpansBecomeAFewItemsPerPixel() {
    // One lane of a million back-to-back spans shown whole on 1000 px gives at most ~1000 items,
    // all inside the lane, left to right, standing for every span.
    auto d = syntheticTimeline(1, 1000000);
    TimeScale s;
    s.setDuration(d->duration);
    s.setWidth(1000);
    s.showAll();
    std::vector<DrawItem> items;
    levelOfDetail(d->lanes[0], s, items);
    QVERIFY(!items.empty());
    QVERIFY(items.size() <= 1100);
    std::uint64_t merged = 0;
    for (std::size_t i = 0; i < items.size(); ++i) {
      QVERIFY(items[i].x0 >= -1 && items[i].x1 <= 1001);
      QVERIFY(items[i].x1 - items[i].x0 >= 1);
      if (i) QVERIFY(items[i].x0 >= items[i - 1].x0);
      merged += items[i].merged;
    }
    QCOMPARE(merged, std::uint64_t{1000000});
  }
  void zoomedInSpansAreDrawnOneByOne() {
    // Zoomed to about 10 spans, every item is a single span with its index, as wide as the span.
    auto d = syntheticTimeline(1, 100000);
    const auto& spans = d->lanes[0].spans;
    TimeScale s;
    s.setDuration(d->duration);
    s.setWidth(1000);
    s.setVisible({spans[500].start, spans[510].end});
    std::vector<DrawItem> items;
    levelOfDetail(d->lanes[0], s, items);
    QVERIFY(items.size() >= 11 && items.size() <= 13);
    for (const DrawItem& it : items) {
      QVERIFY(it.span >= 499 && it.span <= 511);
      const auto& sp = spans[static_cast<std::size_t>(it.span)];
      QVERIFY(qAbs((it.x1 - it.x0) - (sp.end - sp.start) * s.pixelsPerSecond()) < 1e-6 || it.x0 <= -1 ||
              it.x1 >= 1001);
    }
  }
  void mergedBlocksTakeTheDominantKindAndTheRunnerUp() {
    // Three forward spans of 3 units and one backward of 1 inside one pixel: forward wins, backward has 1/10.
    TimelineLane lane;
    lane.spans = {{0, 3, 0, 0, SpanKind::forward}, {3, 6, 1, 0, SpanKind::forward},
                  {6, 9, 2, 0, SpanKind::forward}, {9, 10, 3, 0, SpanKind::backwardInput}};
    lane.maxSpanLength = 3;
    TimeScale s;
    s.setDuration(1000);
    s.setWidth(100);   // 10 time units per pixel
    s.showAll();
    std::vector<DrawItem> items;
    levelOfDetail(lane, s, items);
    QCOMPARE(static_cast<int>(items.size()), 1);
    QCOMPARE(items[0].kind, SpanKind::forward);
    QCOMPARE(items[0].second, SpanKind::backwardInput);
    QVERIFY(qAbs(items[0].secondShare - 0.1) < 1e-12);
    QCOMPARE(items[0].merged, 4u);
    QCOMPARE(items[0].microbatch, 0);   // all four belong to micro-batch 0
    lane.spans[3].microbatch = 1;
    levelOfDetail(lane, s, items);
    QCOMPARE(items[0].microbatch, -1);  // mixed
  }
  void labelRunsJoinTheOpsOfOneMicroBatch() {
    // Forward ops of micro-batch 3 with a 3-pixel wait between them, then its backward (input and
    // weight gradients), then micro-batch 4's forward after a 100-pixel gap: three runs, each
    // spanning its ops; a span without a micro-batch starts none.
    TimelineLane lane;
    lane.spans = {{0, 1, 0, 3, SpanKind::forward},         {1.03, 2, 1, 3, SpanKind::forward},
                  {2, 2.5, 2, 3, SpanKind::backwardInput}, {2.5, 3, 3, 3, SpanKind::backwardWeight},
                  {4, 5, 4, 4, SpanKind::forward},         {5, 6, 5, -1, SpanKind::optimizer}};
    lane.maxSpanLength = 1;
    TimeScale s;
    s.setDuration(6);
    s.setWidth(600);
    s.showAll();
    std::vector<DrawItem> items;
    levelOfDetail(lane, s, items);
    QCOMPARE(static_cast<int>(items.size()), 6);
    std::vector<LabelRun> runs;
    labelRuns(items, runs);
    QCOMPARE(static_cast<int>(runs.size()), 3);
    QCOMPARE(runs[0].microbatch, 3);
    QCOMPARE(runs[0].kind, SpanKind::forward);
    QCOMPARE(runs[0].x0, 0.0);
    QCOMPARE(runs[0].x1, 200.0);
    QCOMPARE(runs[1].kind, SpanKind::backwardInput);
    QCOMPARE(runs[1].x1, 300.0);
    QCOMPARE(runs[2].microbatch, 4);
    QCOMPARE(runs[2].x0, 400.0);
  }
};

MEGASCOPE_GUI_TEST("geometry", TimeScaleTest)
MEGASCOPE_GUI_TEST("geometry", LaneLayoutTest)
MEGASCOPE_GUI_TEST("geometry", LevelOfDetailTest)

#include "geometry_test.moc"
