// The GUI's plain data: span kinds and colours, timeline lanes from a
// simulation and from a trace file, memory over time, the predicted vs
// measured comparison, report rows and the candidate table model.
#include <QSortFilterProxyModel>
#include <QTemporaryDir>
#include <QtTest>

#include <set>

#include "config/plan_settings.hpp"
#include "config/trace_file.hpp"
#include "gui/candidatemodel.hpp"
#include "gui/inputs.hpp"
#include "gui/memorytimeline.hpp"
#include "gui/reportrows.hpp"
#include "gui/spankind.hpp"
#include "gui/timelinedata.hpp"
#include "gui/tracecompare.hpp"
#include "gui_support.hpp"

using namespace megascope;
using namespace megascope::gui;
using megascope::gui::test::simulateSmall;
using megascope::gui::test::simulateFixtureRun;

class SpanKindTest : public QObject {
  Q_OBJECT
 private slots:
  void kindsFollowPhaseForComputeAndLabelForCommunication() {
    QCOMPARE(spanKindOf(OpKind::compute, Phase::forward, OpLabel::mlp), SpanKind::forward);
    QCOMPARE(spanKindOf(OpKind::compute, Phase::backward_input, OpLabel::attention), SpanKind::backwardInput);
    QCOMPARE(spanKindOf(OpKind::compute, Phase::backward_weight, OpLabel::mlp), SpanKind::backwardWeight);
    QCOMPARE(spanKindOf(OpKind::compute, Phase::recompute, OpLabel::mlp), SpanKind::recompute);
    QCOMPARE(spanKindOf(OpKind::compute, Phase::optimizer, OpLabel::optimizer), SpanKind::optimizer);
    QCOMPARE(spanKindOf(OpKind::all_reduce, Phase::forward, OpLabel::tp_comm), SpanKind::tpComm);
    QCOMPARE(spanKindOf(OpKind::reduce_scatter, Phase::gradient_sync, OpLabel::dp_grad), SpanKind::dpComm);
    QCOMPARE(spanKindOf(OpKind::all_reduce, Phase::gradient_sync, OpLabel::embedding_grad), SpanKind::dpComm);
    QCOMPARE(spanKindOf(OpKind::send, Phase::forward, OpLabel::pp_activation), SpanKind::ppComm);
    QCOMPARE(spanKindOf(OpKind::all_to_all, Phase::forward, OpLabel::ep_comm), SpanKind::epComm);
    QCOMPARE(spanKindOf(OpKind::send, Phase::forward, OpLabel::cp_comm), SpanKind::cpComm);
  }
  void everyKindHasItsOwnColourAndName() {
    std::set<QRgb> colours;
    std::set<QString> names;
    for (SpanKind k : allSpanKinds()) {
      colours.insert(spanKindColor(k).rgb());
      names.insert(spanKindName(k));
    }
    QCOMPARE(static_cast<int>(colours.size()), kSpanKindCount);
    QCOMPARE(static_cast<int>(names.size()), kSpanKindCount);
  }
  void opNamesFollowMegascopeCompare() {
    QCOMPARE(opName(OpKind::compute, Phase::forward, OpLabel::mlp), std::string("forward mlp"));
    QCOMPARE(opName(OpKind::compute, Phase::backward_weight, OpLabel::attention),
             std::string("backward_weight attention"));
    QCOMPARE(opName(OpKind::compute, Phase::optimizer, OpLabel::optimizer), std::string("optimizer"));
    QCOMPARE(opName(OpKind::recv, Phase::backward_input, OpLabel::pp_gradient),
             std::string(to_string(OpLabel::pp_gradient)) + " recv");
  }
  void traceSpellingsParseBack() {
    for (int i = 0; i < kOpLabelCount; ++i)
      QCOMPARE(parseOpLabel(to_string(static_cast<OpLabel>(i))), std::optional(static_cast<OpLabel>(i)));
    QCOMPARE(parsePhase(to_string(Phase::backward_weight)), std::optional(Phase::backward_weight));
    QVERIFY(!parseOpLabel("nonsense"));
  }
};

class TimelineDataTest : public QObject {
  Q_OBJECT
 private slots:
  void simulationGivesALanePerTracedRankAndStream() {
    // pp=4 reduced: four traced ranks, one per stage, each with a compute and a tp lane;
    // every span lands in exactly one lane, sorted by start, within the step.
    auto o = simulateSmall();
    const TimelineData& d = *o->timeline;
    QCOMPARE(d.stages, 4);
    QCOMPARE(d.spanCount, o->result.spans.size());
    std::set<int> ranks;
    std::set<std::pair<int, int>> laneKeys;
    for (const TimelineLane& l : d.lanes) {
      ranks.insert(l.rank);
      QVERIFY(laneKeys.insert({l.rank, static_cast<int>(l.stream)}).second);
      QCOMPARE(l.stage, o->program.grid.coord(l.rank).pp);
      for (std::size_t i = 1; i < l.spans.size(); ++i) QVERIFY(l.spans[i - 1].start <= l.spans[i].start);
      for (const TimelineSpan& s : l.spans) QVERIFY(s.end <= d.duration + 1e-12);
    }
    QCOMPARE(static_cast<int>(ranks.size()), 4);
    for (int r : ranks) {
      QVERIFY(laneKeys.count({r, static_cast<int>(Stream::compute)}));
      QVERIFY(laneKeys.count({r, static_cast<int>(Stream::tp)}));
    }
    // Lanes come grouped by stage.
    for (std::size_t i = 1; i < d.lanes.size(); ++i) QVERIFY(d.lanes[i - 1].stage <= d.lanes[i].stage);
  }
  void hoverFindsTheSpanAndDescribesItsOp() {
    // The time in the middle of a compute span finds that span; its tooltip names the phase,
    // the label and the micro-batch of the op in the Program.
    auto o = simulateSmall();
    const TimelineData& d = *o->timeline;
    const TimelineLane& lane = d.lanes[0];
    QCOMPARE(lane.stream, Stream::compute);
    const std::size_t k = lane.spans.size() / 2;
    const TimelineSpan& s = lane.spans[k];
    QCOMPARE(d.spanAt(0, 0.5 * (s.start + s.end), 0), static_cast<int>(k));
    const Op& op = o->program.of_rank(lane.rank).ops[s.op];
    const QString text = d.describe(0, static_cast<int>(k));
    QVERIFY(text.contains(QString::fromLatin1(to_string(op.label))));
    QVERIFY(text.contains(QString::fromLatin1(phaseName(op.phase))));
    if (op.microbatch) QVERIFY(text.contains(QStringLiteral("micro-batch %1").arg(*op.microbatch)));
    QCOMPARE(d.spanAt(0, d.duration * 10, 0), -1);
  }
  void aTraceFileReadsBackIntoTheSameLanes() {
    // write_trace then read_trace then timelineFromTrace gives the simulation's lanes and spans.
    auto o = simulateSmall();
    QTemporaryDir dir;
    const std::string path = dir.filePath(QStringLiteral("t.json")).toStdString();
    TraceInfo info{TraceSource::simulated, o->result.step_time_s, "tp=2,pp=4", "gpt-1.7b", o->setup.world};
    QVERIFY(write_trace(path, o->program, info, o->result.traced_ranks, o->result.spans).has_value());
    auto t = read_trace(path);
    QVERIFY(t.has_value());
    auto d = timelineFromTrace(*t, TraceOrigin::measured, &o->program);
    QCOMPARE(d->lanes.size(), o->timeline->lanes.size());
    QCOMPARE(d->spanCount, o->timeline->spanCount);
    for (std::size_t i = 0; i < d->lanes.size(); ++i) {
      QCOMPARE(d->lanes[i].rank, o->timeline->lanes[i].rank);
      QCOMPARE(d->lanes[i].stream, o->timeline->lanes[i].stream);
      QCOMPARE(d->lanes[i].origin, TraceOrigin::measured);
      QCOMPARE(d->lanes[i].spans.front().kind, o->timeline->lanes[i].spans.front().kind);
    }
    auto merged = mergeTimelines(*o->timeline, *d);
    QCOMPARE(merged->lanes.size(), 2 * d->lanes.size());
    // The measured lane sits right after the predicted lane of the same rank and stream.
    QCOMPARE(merged->lanes[1].origin, TraceOrigin::measured);
    QCOMPARE(merged->lanes[1].rank, merged->lanes[0].rank);
    QCOMPARE(merged->lanes[1].stream, merged->lanes[0].stream);
  }
};

class MemoryTimelineTest : public QObject {
  Q_OBJECT
 private slots:
  void oneFOneBPeakMatchesTheAccountedActivations() {
    // With 1F1B, stage 0 holds p = 4 micro-batches at its peak: the curve's peak equals
    // memory_report's activations for stage 0 (within 2%), and everything is freed by the end.
    auto o = simulateSmall();
    const int rank = o->result.traced_ranks.front();
    const MemoryTimeline m = memoryOverTime(o->setup, o->program, o->result.spans, rank);
    QCOMPARE(m.stage, 0);
    const double accounted = o->memory.stages[0].activations_bytes;
    QVERIFY2(qAbs(m.peakActivationBytes - accounted) / accounted < 0.02,
             qPrintable(QStringLiteral("peak %1 vs accounted %2").arg(m.peakActivationBytes).arg(accounted)));
    QVERIFY(qAbs(m.activations.back().bytes) < 1);
    for (std::size_t i = 1; i < m.activations.size(); ++i) QVERIFY(m.activations[i - 1].time < m.activations[i].time);
    const StageMemory& st = o->memory.stages[0];
    QCOMPARE(m.staticBytes, st.weights_bytes + st.grads_bytes + st.optimizer_bytes + st.other_bytes);
  }
  void fullRecomputationKeepsLessBetweenForwardAndBackward() {
    // Full recomputation of every layer lowers the peak below the stored-activation peak.
    auto stored = simulateSmall();
    auto full = simulateSmall("tp=2,pp=4,mbs=1,schedule=1f1b,recompute=full,recompute_method=uniform,recompute_layers=1");
    const auto a = memoryOverTime(stored->setup, stored->program, stored->result.spans, 0);
    const auto b = memoryOverTime(full->setup, full->program, full->result.spans, 0);
    QVERIFY(b.peakActivationBytes < 0.6 * a.peakActivationBytes);
    QVERIFY(b.peakActivationBytes > 0);
  }
};

class TraceCompareTest : public QObject {
  Q_OBJECT
 private slots:
  void scaledComputeShowsAsAPerKindError() {
    // A "measured" trace with compute x1.25 and communication x1: the forward and gradient kinds
    // show (1 - 1.25) / 1.25 = -20% error, communication kinds 0%, and every span matches.
    auto o = simulateSmall();
    QTemporaryDir dir;
    const std::string path = dir.filePath(QStringLiteral("m.json")).toStdString();
    QVERIFY(writeScaledTrace(path, o->program, o->result.traced_ranks, o->result.spans, o->result.step_time_s, 1.25,
                             1.0, "tp=2,pp=4", "gpt-1.7b")
                .has_value());
    auto t = read_trace(path);
    QVERIFY(t.has_value());
    QCOMPARE(t->info.source, TraceSource::measured);
    const TraceComparison c = compareTraces(o->program, o->result.spans, o->result.step_time_s, *t);
    QCOMPARE(c.matched, o->result.spans.size());
    QCOMPARE(c.unmatched, std::size_t{0});
    bool sawForward = false, sawTp = false;
    for (const KindError& k : c.kinds) {
      QVERIFY(k.error().has_value());
      if (k.kind == SpanKind::forward || k.kind == SpanKind::backwardInput) {
        QVERIFY(qAbs(*k.error() - (-0.2)) < 1e-3);
        sawForward = sawForward || k.kind == SpanKind::forward;
      }
      if (k.kind == SpanKind::tpComm) {
        QVERIFY(qAbs(*k.error()) < 1e-3);
        sawTp = true;
      }
    }
    QVERIFY(sawForward && sawTp);
    QVERIFY(c.stepError().has_value());
  }
  void aRealMeasuredTraceMatchesItsPlanOpByOp() {
    // A trace measured by the CPU executor (mpirun -np 2 megascope run --backend cpu --model
    // tiny-gpt --plan pp=2 --global-batch 8 --steps 3 --trace ...) matches the simulation of the
    // same plan span for span (254 spans, each naming the op the Program has at its index, none
    // left over), with forward and PP kinds present.
    // When the Program builder or tiny-gpt changes, regenerate the fixture with that command.
    auto t = read_trace(MEGASCOPE_GUI_FIXTURES "/tiny-gpt-pp2-measured.json");
    QVERIFY2(t.has_value(), t ? "" : t.error().str().c_str());
    QCOMPARE(t->info.source, TraceSource::measured);
    const auto sim = simulateFixtureRun("pp=2");
    const SimulationOutcome& p = *sim;
    const TraceComparison c = compareTraces(p.program, p.result.spans, p.result.step_time_s, *t);
    QVERIFY(c.planMatches);
    QCOMPARE(c.matched, t->spans.size());
    QCOMPARE(c.unmatched, std::size_t{0});
    QCOMPARE(c.misplaced, std::size_t{0});
    std::set<SpanKind> kinds;
    for (const KindError& k : c.kinds) kinds.insert(k.kind);
    QVERIFY(kinds.count(SpanKind::forward) && kinds.count(SpanKind::backwardInput) && kinds.count(SpanKind::ppComm));
    // Per op name, as `megascope compare` groups them: the names cover every matched span and
    // are sorted by measured time.
    std::size_t byName = 0;
    bool forwardMlp = false;
    for (std::size_t i = 0; i < c.ops.size(); ++i) {
      byName += c.ops[i].matched;
      if (i) QVERIFY(c.ops[i - 1].measuredS >= c.ops[i].measuredS);
      forwardMlp = forwardMlp || c.ops[i].name == "forward mlp";
    }
    QCOMPARE(byName, c.matched);
    QVERIFY(forwardMlp);
    auto lanes = timelineFromTrace(*t, TraceOrigin::measured, &p.program);
    QCOMPARE(lanes->spanCount, t->spans.size());
    QCOMPARE(lanes->stages, 2);
  }
  void aTraceOfAnotherProgramIsNotMatchedByIndex() {
    // The same world and model, but the overlapped pipeline communication's
    // Program (no gates): its ops sit at other indices, so the measured spans
    // name ops the Program does not have there.
    auto t = read_trace(MEGASCOPE_GUI_FIXTURES "/tiny-gpt-pp2-measured.json");
    QVERIFY(t.has_value());
    const auto sim = simulateFixtureRun("pp=2,overlap_p2p_comm=on");
    const SimulationOutcome& p = *sim;
    const TraceComparison c = compareTraces(p.program, p.result.spans, p.result.step_time_s, *t);
    QVERIFY(c.misplaced > 0);
    QCOMPARE(c.matched + c.unmatched, t->spans.size());
  }
  void aTraceOfAnotherWorldSizeMatchesNothing() {
    auto o = simulateSmall();
    TraceFile t;
    t.info.world = 64;
    t.spans.push_back({});
    const TraceComparison c = compareTraces(o->program, o->result.spans, o->result.step_time_s, t);
    QVERIFY(!c.planMatches);
    QCOMPARE(c.matched, std::size_t{0});
    QCOMPARE(c.unmatched, std::size_t{1});
  }
};

class ReportRowsTest : public QObject {
  Q_OBJECT
 private slots:
  void sideBySideRowsShowChangeAndDirection() {
    // A plan with more pipeline stages next to the baseline: every metric gets a baseline value;
    // the step time change is (b - a) / a and is "better" exactly when it went down.
    auto a = simulateSmall();
    auto b = simulateSmall("tp=2,pp=2,mbs=1,schedule=1f1b");
    const auto rows = compareRows(reportRows(b->setup, b->report, b->memory), reportRows(a->setup, a->report, a->memory));
    QCOMPARE(rows.front().name, QStringLiteral("step time"));
    for (const ReportRow& r : rows) QVERIFY(r.baseline.has_value());
    const ReportRow& step = rows.front();
    const double rel = (b->report.step_time_s - a->report.step_time_s) / a->report.step_time_s;
    QCOMPARE(step.change(), QStringLiteral("%1%2%").arg(rel > 0 ? "+" : "").arg(100 * rel, 0, 'f', 1));
    QCOMPARE(*step.better(), rel < 0);
    const QStringList diff = setupDifferences(a->setup, b->setup);
    QVERIFY(diff.contains(QStringLiteral("pp: 4 -> 2")));
    QVERIFY(diff.contains(QStringLiteral("dp: 1 -> 2")));
    QVERIFY(setupDifferences(a->setup, a->setup).isEmpty());
  }
};

class CandidateModelTest : public QObject {
  Q_OBJECT
 private slots:
  void columnsSortNumerically() {
    // Throughputs 900, 10000 and 85 sort as numbers (85 < 900 < 10000), not as text.
    std::vector<planner::SimulatedPlan> plans(3);
    const double tps[] = {900, 10000, 85};
    for (int i = 0; i < 3; ++i) {
      plans[static_cast<std::size_t>(i)].report.tokens_per_s = tps[i];
      plans[static_cast<std::size_t>(i)].report.step_time_s = 1;
      plans[static_cast<std::size_t>(i)].plan.tp = 1 << i;
    }
    CandidateModel m;
    m.setPlans(plans);
    QCOMPARE(m.rowCount(), 3);
    QCOMPARE(m.data(m.index(1, CandidateModel::TokensPerS), Qt::DisplayRole).toString(), QStringLiteral("10000"));
    QCOMPARE(m.data(m.index(2, CandidateModel::Plan), Qt::DisplayRole).toString(), QStringLiteral("tp=4"));
    QSortFilterProxyModel proxy;
    proxy.setSourceModel(&m);
    proxy.setSortRole(Qt::UserRole);
    proxy.sort(CandidateModel::TokensPerS, Qt::AscendingOrder);
    QCOMPARE(proxy.data(proxy.index(0, CandidateModel::TokensPerS)).toString(), QStringLiteral("85"));
    QCOMPARE(proxy.data(proxy.index(1, CandidateModel::TokensPerS)).toString(), QStringLiteral("900"));
    QCOMPARE(proxy.data(proxy.index(2, CandidateModel::TokensPerS)).toString(), QStringLiteral("10000"));
  }
};

MEGASCOPE_GUI_TEST("data", SpanKindTest)
MEGASCOPE_GUI_TEST("data", TimelineDataTest)
MEGASCOPE_GUI_TEST("data", MemoryTimelineTest)
MEGASCOPE_GUI_TEST("data", TraceCompareTest)
MEGASCOPE_GUI_TEST("data", ReportRowsTest)
MEGASCOPE_GUI_TEST("data", CandidateModelTest)

#include "data_test.moc"
