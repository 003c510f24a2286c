// The background services: a newer simulation request supersedes an older
// one, and a planner search reports progress, can be cancelled, and fills the
// candidate table; neither blocks the GUI thread.
#include <QSignalSpy>
#include <map>
#include <numeric>
#include <QTimer>
#include <QtTest>

#include "gui/candidatemodel.hpp"
#include "gui/searchservice.hpp"
#include "gui/searchview.hpp"
#include "gui/simulationservice.hpp"
#include "core/varlen.hpp"
#include "gui_support.hpp"

using namespace megascope;
using namespace megascope::gui;
using megascope::gui::test::smallInputs;

namespace {
planner::SearchInputs smallSearch() {
  const Inputs in = smallInputs();
  planner::SearchInputs s;
  s.model = in.model;
  s.cluster = *with_device_count(in.cluster, in.gpus);
  s.training = in.training;
  s.gpu_counts = {in.gpus};
  return s;
}
}  // namespace

class SimulationServiceTest : public QObject {
  Q_OBJECT
 private slots:
  void onlyTheNewestRequestDelivers() {
    // Three requests in a row: the first two are superseded, exactly one outcome arrives,
    // carrying the third generation and the third setup (pp = 2).
    SimulationService service;
    QSignalSpy finished(&service, &SimulationService::finished);
    Inputs in = smallInputs();
    auto s1 = makeSetup(in);
    in.plan.pp = 8;
    in.plan.tp = 1;
    auto s2 = makeSetup(in);
    in.plan.pp = 2;
    in.plan.tp = 2;
    auto s3 = makeSetup(in);
    QVERIFY(s1 && s2 && s3);
    service.request(*s1);
    service.request(*s2);
    const quint64 last = service.request(*s3);
    // request() returned without simulating on this thread: nothing has been delivered yet.
    QCOMPARE(finished.count(), 0);
    QVERIFY(finished.wait(30000));
    service.waitForIdle();
    QTest::qWait(50);   // any late queued delivery would land now
    QCOMPARE(finished.count(), 1);
    auto outcome = finished.at(0).at(0).value<OutcomePtr>();
    QCOMPARE(outcome->generation, last);
    QCOMPARE(outcome->setup.plan.pp, 2);
    QVERIFY(outcome->timeline->spanCount > 0);
  }
  void aVariableLengthStepDrawsItsMicroBatchesAtTheirOwnLengths() {
    // The shipped variable-length example: the timeline is the first sampled
    // step's slowest replica, whose packed micro-batches differ in length, and
    // the report counts that step's real tokens.
    StartOptions o;
    o.example = std::string(MEGASCOPE_TEST_FIXTURES) + "/../../topologies/examples/llama3-8b-varlen-cp.toml";
    auto in = loadInputs(o);
    QVERIFY2(in.has_value(), in ? "" : in.error().str().c_str());
    auto setup = makeSetup(*in);
    QVERIFY(setup.has_value());
    auto out = simulateSetup(*setup);
    QVERIFY2(out.has_value(), out ? "" : out.error().str().c_str());
    const SimulationOutcome& r = **out;
    QVERIFY(r.timeline->spanCount > 0);
    // Forward time of each micro-batch on the traced rank of stage 0.
    std::map<int, double> forward;
    const StageProgram& sp = r.program.stages.at(0);
    for (const Span& span : r.result.spans)
      if (span.rank == 0 && sp.ops[span.op].phase == Phase::forward && sp.ops[span.op].kind == OpKind::compute &&
          sp.ops[span.op].microbatch)
        forward[*sp.ops[span.op].microbatch] += span.end - span.start;
    QVERIFY(forward.size() >= 2);
    double lo = 1e30, hi = 0;
    for (const auto& [mb, t] : forward) {
      lo = std::min(lo, t);
      hi = std::max(hi, t);
    }
    QVERIFY2(hi > 1.2 * lo, qPrintable(QStringLiteral("forward %1 to %2 s").arg(lo).arg(hi)));
    // tokens/s x step = the sampled step's real tokens.
    const auto lengths = sample_lengths(setup->training.varlen->lengths, setup->training.varlen->seed, 0,
                                        static_cast<std::size_t>(setup->training.global_batch_size));
    const double tokens = std::accumulate(lengths.begin(), lengths.end(), 0.0,
                                          [](double a, std::int64_t d) { return a + static_cast<double>(d); });
    QVERIFY(std::abs(r.report.tokens_per_s * r.report.step_time_s - tokens) < 1e-6 * tokens);
  }
  void theEventLoopRunsWhileGpt3Simulates() {
    // While GPT-3 175B on 1024 GPUs simulates (tens of milliseconds at least), a 2 ms timer on the
    // GUI thread keeps firing: request() returned at once and nothing waits on the worker.
    auto in = loadInputs({});
    QVERIFY(in.has_value());
    auto setup = makeSetup(*in);
    QVERIFY(setup.has_value());
    SimulationService service;
    QSignalSpy finished(&service, &SimulationService::finished);
    int ticks = 0, ticksAtDelivery = -1;
    QTimer timer;
    timer.setInterval(2);
    connect(&timer, &QTimer::timeout, [&] { ++ticks; });
    connect(&service, &SimulationService::finished, [&] { ticksAtDelivery = ticks; });
    timer.start();
    service.request(*setup);
    QCOMPARE(finished.count(), 0);
    QVERIFY(finished.wait(60000));
    QVERIFY2(ticksAtDelivery >= 3, qPrintable(QStringLiteral("%1 ticks").arg(ticksAtDelivery)));
    QCOMPARE(finished.at(0).at(0).value<OutcomePtr>()->setup.world, 1024);
  }
};

class SearchServiceTest : public QObject {
  Q_OBJECT
 private slots:
  void searchReportsProgressAndFinishes() {
    // A search of gpt-1.7b on 8 GPUs reports progress in [0, 1] and returns the plans simulated,
    // fastest first.
    SearchService service;
    QSignalSpy progress(&service, &SearchService::progress);
    QSignalSpy finished(&service, &SearchService::finished);
    service.start(smallSearch(), 4, 2);
    QVERIFY(service.running());
    QVERIFY(finished.wait(60000));
    QVERIFY(!service.running());
    auto r = finished.at(0).at(1).value<SearchResultPtr>();
    QVERIFY(!r->ranked.empty());
    QVERIFY(r->ranked.size() <= 4);
    for (std::size_t i = 1; i < r->ranked.size(); ++i)
      QVERIFY(r->ranked[i - 1].report.step_time_s <= r->ranked[i].report.step_time_s);
    for (const QList<QVariant>& p : progress) {
      const double f = p.at(2).toDouble();
      QVERIFY(f >= 0 && f <= 1);
    }
  }
  void cancelStopsDeliveryAtOnce() {
    // Cancelled right after starting: "cancelled" arrives synchronously and no result follows,
    // even after the planner thread is done.
    SearchService service;
    QSignalSpy finished(&service, &SearchService::finished);
    QSignalSpy cancelled(&service, &SearchService::cancelled);
    const quint64 gen = service.start(smallSearch(), 4, 2);
    service.cancel();
    QCOMPARE(cancelled.count(), 1);
    QCOMPARE(cancelled.at(0).at(0).toULongLong(), gen);
    QVERIFY(!service.running());
    service.waitForIdle();
    QTest::qWait(50);
    QCOMPARE(finished.count(), 0);
  }
  void aNewSearchSupersedesTheRunningOne() {
    // Two starts in a row: the first is cancelled at once, only the second delivers a result.
    SearchService service;
    QSignalSpy finished(&service, &SearchService::finished);
    QSignalSpy cancelled(&service, &SearchService::cancelled);
    const quint64 first = service.start(smallSearch(), 4, 2);
    const quint64 second = service.start(smallSearch(), 2, 2);
    QCOMPARE(cancelled.count(), 1);
    QCOMPARE(cancelled.at(0).at(0).toULongLong(), first);
    QVERIFY(finished.wait(60000));
    service.waitForIdle();
    QTest::qWait(50);
    QCOMPARE(finished.count(), 1);
    QCOMPARE(finished.at(0).at(0).toULongLong(), second);
    QVERIFY(finished.at(0).at(1).value<SearchResultPtr>()->ranked.size() <= 2);
  }
  void searchViewFillsTheTableAndAChosenRowEmitsItsPlan() {
    // The view's table gets a row per simulated plan; selecting the first emits that plan.
    SearchView view;
    view.setInputs(smallInputs());
    view.setTopK(3);
    QSignalSpy done(&view, &SearchView::searchFinished);
    QSignalSpy chosen(&view, &SearchView::planChosen);
    view.startSearch();
    QVERIFY(done.wait(60000));
    QVERIFY(view.model()->rowCount() >= 1);
    view.selectRow(0);
    QCOMPARE(chosen.count(), 1);
    const auto plan = chosen.at(0).at(0).value<PlanSpec>();
    QCOMPARE(plan.tp, view.model()->plan(0).plan.tp);
    QCOMPARE(plan.pp, view.model()->plan(0).plan.pp);
  }
};

MEGASCOPE_GUI_TEST("services", SimulationServiceTest)
MEGASCOPE_GUI_TEST("services", SearchServiceTest)

#include "services_test.moc"
