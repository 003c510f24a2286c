// Screenshots: the main window rendered offscreen for each view, checked for
// content (lanes laid out and labelled, span colours present, charts and
// tables filled), and `megascope-gui --screenshot` run as a process.
#include <QBarSet>
#include <QChart>
#include <QStackedBarSeries>
#include <QPainter>
#include <QProcess>
#include <QTableWidget>
#include <QTemporaryDir>
#include <QtTest>

#include "gui/compareview.hpp"
#include "gui/mainwindow.hpp"
#include "gui/memoryview.hpp"
#include "gui/reportview.hpp"
#include "gui/screenshot.hpp"
#include "gui/spankind.hpp"
#include "gui/timelinewidget.hpp"
#include "gui_support.hpp"

using namespace megascope;
using namespace megascope::gui;
using megascope::gui::test::countColor;
using megascope::gui::test::smallInputs;

namespace {

QImage shoot(MainWindow& w, ScreenshotRequest req, const Inputs& in) {
  req.timeoutMs = 60000;
  ScreenshotDriver d(&w, req);
  QSignalSpy done(&d, &ScreenshotDriver::done);
  d.start(in);
  if (!done.wait(90000)) qFatal("screenshot timed out");
  const QString error = done.at(0).at(0).toString();
  if (!error.isEmpty()) qFatal("screenshot failed: %s", qPrintable(error));
  return d.image();
}

}  // namespace

class ScreenshotTest : public QObject {
  Q_OBJECT
 private slots:
  void timelineShowsLabelledLanesInKindColours() {
    // gpt-1.7b, pp=4: 4 stage headers and their lanes ("rank 0 compute", ...), forward (blue),
    // input-gradient (orange) and TP (green) spans in visible amounts, the label column drawn.
    MainWindow w;
    const QImage img = shoot(w, {}, smallInputs());
    QCOMPARE(img.size(), QSize(1600, 1000));
    const LaneLayout& l = w.timeline()->layout();
    int headers = 0;
    QStringList labels;
    for (const LaneRow& r : l.rows()) {
      headers += r.header;
      if (!r.header) labels << r.label;
    }
    QCOMPARE(headers, 4);
    QVERIFY(labels.contains(QStringLiteral("rank 0 compute")));
    QVERIFY(labels.contains(QStringLiteral("rank 0 tp")));
    QVERIFY(l.laneRowCount() >= 8);
    QVERIFY(countColor(img, spanKindColor(SpanKind::forward)) > 2000);
    QVERIFY(countColor(img, spanKindColor(SpanKind::backwardInput)) > 2000);
    QVERIFY(countColor(img, spanKindColor(SpanKind::tpComm)) > 500);
    // The timeline alone, rendered for export, has the lane labels' dark text in its label column
    // at the height of every lane row.
    QImage t(1200, w.timeline()->fullHeight(), QImage::Format_RGB32);
    QPainter p(&t);
    w.timeline()->renderAll(p, 1200);
    p.end();
    const int top = static_cast<int>(w.timeline()->fullHeight() - l.totalHeight()) - 4;
    for (const LaneRow& r : l.rows()) {
      const QImage band = t.copy(0, top + static_cast<int>(r.y), TimelineWidget::kLabelWidth, static_cast<int>(r.height));
      QVERIFY2(countColor(band, QColor(0x20, 0x24, 0x2a), 60) > 10, qPrintable(r.label));
    }
  }
  void memoryViewDrawsStageBarsAndTheRankCurve() {
    // Bars: one stacked series (five sets, one value per stage) plus the capacity line; the rank
    // curve has points; the bar colours appear in the image.
    MainWindow w;
    ScreenshotRequest req;
    req.view = MainWindow::View::memory;
    const QImage img = shoot(w, req, smallInputs());
    QChart* bars = w.memoryView()->barsChart();
    QCOMPARE(bars->series().size(), 2);
    QVERIFY(bars->title().contains(QStringLiteral("fits")));
    QCOMPARE(w.memoryView()->timeChart()->series().size(), 3);
    QVERIFY(w.memoryView()->timeline().activations.size() > 10);
    auto* stacked = qobject_cast<QStackedBarSeries*>(bars->series().at(0));
    QVERIFY(stacked);
    QCOMPARE(stacked->count(), 5);
    for (QBarSet* set : stacked->barSets()) QCOMPARE(set->count(), 4);   // one bar per stage
    QCOMPARE(stacked->barSets().at(0)->label(), QStringLiteral("weights"));
    QVERIFY(countColor(img, QColor(0xb0, 0x00, 0x20), 40) > 300);      // the capacity lines
    QVERIFY(countColor(img, QColor(0x2c, 0xa0, 0x2c), 40) > 300);      // the total-memory curve
  }
  void reportShowsBaselineAndDifferences() {
    // With a baseline plan pinned, every metric row has a baseline value and a change, and the
    // plan differences are listed.
    MainWindow w;
    ScreenshotRequest req;
    req.view = MainWindow::View::report;
    Inputs in = smallInputs();
    PlanSpec baseline = in.plan;
    baseline.pp = 2;
    req.baselinePlan = baseline;
    shoot(w, req, in);
    const QTableWidget* t = w.reportView()->metricsTable();
    QVERIFY(t->rowCount() >= 10);
    QCOMPARE(t->item(0, 0)->text(), QStringLiteral("step time"));
    QVERIFY(!t->isColumnHidden(1));
    QVERIFY(t->item(0, 1)->text().endsWith(QStringLiteral(" s")));
    QVERIFY(!t->item(0, 3)->text().isEmpty());
  }
  void compareViewAlignsMeasuredLanesAndListsErrors() {
    // A synthetic measured trace (compute x1.08, comm x1.3): measured lanes interleave with the
    // predicted ones and the error table lists forward at -7.4% (1/1.08 - 1).
    MainWindow w;
    ScreenshotRequest req;
    req.view = MainWindow::View::compare;
    req.demoMeasured = true;
    const QImage img = shoot(w, req, smallInputs());
    const TimelineData* d = w.compareView()->timeline()->data();
    QVERIFY(d);
    int measured = 0;
    for (const TimelineLane& l : d->lanes) measured += l.origin == TraceOrigin::measured;
    QCOMPARE(measured * 2, static_cast<int>(d->lanes.size()));
    const TraceComparison& c = w.compareView()->comparison();
    bool forward = false;
    for (const KindError& k : c.kinds)
      if (k.kind == SpanKind::forward) {
        forward = true;
        QVERIFY(qAbs(*k.error() - (1 / 1.08 - 1)) < 1e-3);
      }
    QVERIFY(forward);
    QVERIFY(w.compareView()->errorTable()->rowCount() >= 3);
    const int kinds = w.compareView()->errorTable()->rowCount();
    w.compareView()->setGroupByOp(true);   // per op name: more rows, "forward mlp" among them
    QVERIFY(w.compareView()->errorTable()->rowCount() > kinds);
    QVERIFY(!w.compareView()->errorTable()->findItems(QStringLiteral("forward mlp"), Qt::MatchExactly).isEmpty());
    QVERIFY(countColor(img, spanKindColor(SpanKind::forward)) > 1000);
  }
  void commandLineScreenshotWritesThePng() {
    // megascope-gui --screenshot FILE with a small example exits 0 and writes a 1300x800 PNG in
    // which forward spans are drawn.
    QTemporaryDir dir;
    const QString out = dir.filePath(QStringLiteral("t.png"));
    QProcess p;
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert(QStringLiteral("QT_QPA_PLATFORM"), QStringLiteral("offscreen"));
    p.setProcessEnvironment(env);
    p.start(QStringLiteral(MEGASCOPE_GUI_BINARY),
            {QStringLiteral("--screenshot"), out, QStringLiteral("--model"), QStringLiteral("gpt-1.7b"),
             QStringLiteral("--cluster"), QStringLiteral("dgx-a100"), QStringLiteral("--gpus"), QStringLiteral("8"),
             QStringLiteral("--plan"), QStringLiteral("tp=2,pp=4,mbs=1,schedule=1f1b"),
             QStringLiteral("--global-batch"), QStringLiteral("16"), QStringLiteral("--size"),
             QStringLiteral("1300x800")});
    QVERIFY(p.waitForFinished(60000));
    QCOMPARE(p.exitCode(), 0);
    QImage img(out);
    QCOMPARE(img.size(), QSize(1300, 800));
    QVERIFY(countColor(img, spanKindColor(SpanKind::forward)) > 500);
  }
  void commandLineRejectsAnInvalidPlan() {
    // A plan breaking a rule exits 1 with validate_setup's message naming the field.
    QProcess p;
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert(QStringLiteral("QT_QPA_PLATFORM"), QStringLiteral("offscreen"));
    p.setProcessEnvironment(env);
    p.start(QStringLiteral(MEGASCOPE_GUI_BINARY),
            {QStringLiteral("--screenshot"), QStringLiteral("/dev/null"), QStringLiteral("--model"),
             QStringLiteral("gpt-1.7b"), QStringLiteral("--cluster"), QStringLiteral("dgx-a100"),
             QStringLiteral("--gpus"), QStringLiteral("5"), QStringLiteral("--plan"), QStringLiteral("tp=5"),
             QStringLiteral("--global-batch"), QStringLiteral("8")});
    QVERIFY(p.waitForFinished(60000));
    QCOMPARE(p.exitCode(), 1);
    QVERIFY(QString::fromLocal8Bit(p.readAllStandardError()).contains(QStringLiteral("plan.tp")));
  }
  void withoutADisplayHelpPrintsAndAWindowIsOneClearError() {
    // No DISPLAY, WAYLAND_DISPLAY or QT_QPA_PLATFORM: --help needs none and
    // exits 0; opening a window says what is missing and exits 1, where Qt
    // alone would abort.
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    for (const char* v : {"DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"}) env.remove(QString::fromLatin1(v));
    QProcess help;
    help.setProcessEnvironment(env);
    help.start(QStringLiteral(MEGASCOPE_GUI_BINARY), {QStringLiteral("--help")});
    QVERIFY(help.waitForFinished(60000));
    QCOMPARE(help.exitStatus(), QProcess::NormalExit);
    QCOMPARE(help.exitCode(), 0);
    QVERIFY(QString::fromLocal8Bit(help.readAllStandardOutput()).contains(QStringLiteral("--screenshot")));
    QProcess window;
    window.setProcessEnvironment(env);
    window.start(QStringLiteral(MEGASCOPE_GUI_BINARY), {});
    QVERIFY(window.waitForFinished(60000));
    QCOMPARE(window.exitStatus(), QProcess::NormalExit);
    QCOMPARE(window.exitCode(), 1);
    QVERIFY(QString::fromLocal8Bit(window.readAllStandardError()).contains(QStringLiteral("no display")));
  }
};

MEGASCOPE_GUI_TEST("screenshot", ScreenshotTest)

#include "screenshot_test.moc"
