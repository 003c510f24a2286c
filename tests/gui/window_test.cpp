// The main window as a user drives it: instant validation naming the broken
// rule, exports (PNG, SVG, Perfetto JSON, Megatron-LM arguments), a search
// row shown everywhere, and the timeline's zoom, rubber band, collapse and
// tooltip.
#include <QApplication>
#include <QClipboard>
#include <QComboBox>
#include <QLabel>
#include <QLineEdit>
#include <QFile>
#include <QHelpEvent>
#include <QMouseEvent>
#include <QSignalSpy>
#include <QTemporaryDir>
#include <QToolTip>
#include <QWheelEvent>
#include <QtTest>

#include <set>

#include "config/trace_file.hpp"
#include "gui/candidatemodel.hpp"
#include "gui/mainwindow.hpp"
#include "gui/planpanel.hpp"
#include "gui/searchview.hpp"
#include "gui/timelinewidget.hpp"
#include "gui_support.hpp"

using namespace megascope;
using namespace megascope::gui;
using megascope::gui::test::smallInputs;

namespace {

// A window showing the small example, its first outcome arrived.
std::unique_ptr<MainWindow> loadedWindow() {
  auto w = std::make_unique<MainWindow>();
  w->resize(1400, 900);
  w->show();
  QSignalSpy outcome(w.get(), &MainWindow::outcomeChanged);
  w->setInputs(smallInputs());
  if (!outcome.wait(30000)) qFatal("no outcome");
  return w;
}

void sendMouse(QWidget* w, QEvent::Type type, QPoint pos, Qt::MouseButton button, Qt::MouseButtons buttons,
               Qt::KeyboardModifiers mods = Qt::NoModifier) {
  QMouseEvent e(type, QPointF(pos), w->mapToGlobal(QPointF(pos)), button, buttons, mods);
  QApplication::sendEvent(w, &e);
}

}  // namespace

class WindowTest : public QObject {
  Q_OBJECT
 private slots:
  void anInvalidPlanNamesTheRuleAndKeepsTheLastTimeline() {
    // tp = 3 with pp = 4 does not divide the 8 GPUs: the message names plan.tp and the rule, nothing is simulated,
    // and the views keep the last valid outcome.
    auto w = loadedWindow();
    const OutcomePtr before = w->outcome();
    const quint64 gen = w->simulation()->latestGeneration();
    PlanSpec bad = smallInputs().plan;
    bad.tp = 3;
    w->planPanel()->setPlan(bad);
    QVERIFY(w->validationError().contains(QStringLiteral("plan.tp")));
    QVERIFY(w->validationError().contains(QStringLiteral("must be divisible by tp x pp x cp")));
    QCOMPARE(w->simulation()->latestGeneration(), gen);
    QCOMPARE(w->outcome(), before);
    // Back to a valid plan: it simulates again and the message clears.
    QSignalSpy outcome(w.get(), &MainWindow::outcomeChanged);
    w->planPanel()->setPlan(smallInputs().plan);
    QVERIFY(w->validationError().isEmpty());
    QVERIFY(outcome.wait(30000));
  }
  void modelsAndClustersOpenByNameOrFile() {
    // Typing a Hugging Face config.json path in the model box loads it (Llama 3 8B, 32 layers) and
    // re-simulates; a cluster TOML loads the same way; an unknown name is an error naming the model.
    auto w = loadedWindow();
    auto* model = w->planPanel()->findChild<QComboBox*>(QStringLiteral("model"));
    auto* cluster = w->planPanel()->findChild<QComboBox*>(QStringLiteral("cluster"));
    QVERIFY(model && cluster);
    QSignalSpy outcome(w.get(), &MainWindow::outcomeChanged);
    model->setEditText(QStringLiteral(MEGASCOPE_TEST_FIXTURES "/hf/llama3-8b.json"));
    QTest::keyClick(model->lineEdit(), Qt::Key_Return);
    QVERIFY(outcome.wait(30000));
    QCOMPARE(w->outcome()->setup.model.num_layers, 32);
    cluster->setEditText(QStringLiteral("dgx-h100"));
    QTest::keyClick(cluster->lineEdit(), Qt::Key_Return);
    QVERIFY(outcome.wait(30000));
    QCOMPARE(QString::fromStdString(w->outcome()->setup.cluster.device.name).left(4), QStringLiteral("H100"));
    QCOMPARE(w->outcome()->setup.world, 8);   // one node of 8 kept
    model->setEditText(QStringLiteral("no-such-model"));
    QTest::keyClick(model->lineEdit(), Qt::Key_Return);
    QCOMPARE(w->planPanel()->inputs().model.num_layers, 32);   // unchanged
    auto* message = w->planPanel()->findChild<QLabel*>(QStringLiteral("validation"));
    QVERIFY(message);
    QVERIFY(message->text().contains(QStringLiteral("no-such-model")));
  }
  void theTimelineTitleStatesTheExpectedErrorOfTheClass() {
    // The small example (A100, 16-bit, dense, no CP) is of a validated class:
    // the title states its mean error over the class's published runs.
    auto w = loadedWindow();
    const QString title = w->timeline()->title();
    QVERIFY2(title.contains(QStringLiteral("; expected within ")), qPrintable(title));
    QVERIFY2(title.contains(QStringLiteral("published runs)")), qPrintable(title));
  }
  void exportsWriteWhatTheyClaim() {
    // PNG and SVG of the timeline, the Perfetto trace (read back with the simulation's span count)
    // and the Megatron-LM arguments on the clipboard.
    auto w = loadedWindow();
    QTemporaryDir dir;
    const QString png = dir.filePath(QStringLiteral("t.png")), svg = dir.filePath(QStringLiteral("t.svg")),
                  json = dir.filePath(QStringLiteral("t.json"));
    QCOMPARE(w->exportTimelineImage(png), QString());
    QImage img(png);
    QVERIFY(img.width() >= 1200);
    QCOMPARE(img.height(), w->timeline()->fullHeight());
    QVERIFY(test::countColor(img, spanKindColor(SpanKind::forward)) > 1000);
    QCOMPARE(w->exportTimelineImage(svg), QString());
    QFile f(svg);
    QVERIFY(f.open(QIODevice::ReadOnly));
    const QByteArray text = f.readAll();
    QVERIFY(text.contains("<svg"));
    QVERIFY(text.contains("rank 0 compute"));
    QCOMPARE(w->exportPerfetto(json), QString());
    auto trace = read_trace(json.toStdString());
    QVERIFY(trace.has_value());
    QCOMPARE(trace->spans.size(), w->outcome()->result.spans.size());
    QCOMPARE(trace->info.source, TraceSource::simulated);
    QCOMPARE(w->copyMegatronArgs(), QString());
    const QString args = QApplication::clipboard()->text();
    QVERIFY(args.contains(QStringLiteral("--tensor-model-parallel-size 2")));
    QVERIFY(args.contains(QStringLiteral("--pipeline-model-parallel-size 4")));
  }
  void aChosenSearchRowIsShownEverywhere() {
    // After a search, selecting the second row puts its plan in the panel and simulates it.
    auto w = loadedWindow();
    SearchView* s = w->searchView();
    s->setTopK(3);
    QSignalSpy done(s, &SearchView::searchFinished);
    s->startSearch();
    QVERIFY(done.wait(60000));
    QVERIFY(s->model()->rowCount() >= 2);
    QSignalSpy outcome(w.get(), &MainWindow::outcomeChanged);
    s->selectRow(1);
    QVERIFY(outcome.wait(30000));
    const PlanSpec& chosen = s->model()->plan(1).plan;
    QCOMPARE(w->outcome()->setup.plan.tp, chosen.tp);
    QCOMPARE(w->outcome()->setup.plan.pp, chosen.pp);
    QCOMPARE(w->outcome()->setup.plan.micro_batch_size, chosen.micro_batch_size);
    QCOMPARE(w->planPanel()->inputs().plan.pp, chosen.pp);
  }
  void fullModeShowsEveryRank() {
    // Reduced mode traces one rank per stage (4); full mode all 8 ranks, two per stage group.
    auto w = loadedWindow();
    QCOMPARE(static_cast<int>(w->outcome()->result.traced_ranks.size()), 4);
    QSignalSpy outcome(w.get(), &MainWindow::outcomeChanged);
    w->setFullMode(true);
    QVERIFY(outcome.wait(30000));
    QCOMPARE(static_cast<int>(w->outcome()->result.traced_ranks.size()), 8);
    std::set<int> ranks;
    for (const TimelineLane& l : w->timeline()->data()->lanes) ranks.insert(l.rank);
    QCOMPARE(static_cast<int>(ranks.size()), 8);
    QVERIFY(w->timeline()->layout().rows().front().label.contains(QStringLiteral("ranks 0, 1")));
  }
  void timelineZoomsPansCollapsesAndExplains() {
    auto w = loadedWindow();
    TimelineWidget* t = w->timeline();
    QVERIFY(t->scale().showsAll());
    const int x = TimelineWidget::kLabelWidth + 300;
    const int y = 200;
    // Wheel up zooms in around the cursor.
    const double under = t->scale().xToTime(300);
    QWheelEvent wheel(QPointF(x, y), t->mapToGlobal(QPointF(x, y)), QPoint(), QPoint(0, 480), Qt::NoButton,
                      Qt::NoModifier, Qt::NoScrollPhase, false);
    QApplication::sendEvent(t, &wheel);
    QVERIFY(!t->scale().showsAll());
    QVERIFY(qAbs(t->scale().xToTime(300) - under) < 1e-9 * t->scale().duration());
    // Home shows everything again; a right-button rubber band zooms to its pixels, Backspace steps back.
    QTest::keyClick(t, Qt::Key_Home);
    QVERIFY(t->scale().showsAll());
    const double t0 = t->scale().xToTime(100), t1 = t->scale().xToTime(400);
    const int bx0 = TimelineWidget::kLabelWidth + 100, bx1 = TimelineWidget::kLabelWidth + 400;
    sendMouse(t, QEvent::MouseButtonPress, {bx0, y}, Qt::RightButton, Qt::RightButton);
    sendMouse(t, QEvent::MouseMove, {bx0 + 150, y}, Qt::NoButton, Qt::RightButton);
    sendMouse(t, QEvent::MouseMove, {bx1, y}, Qt::NoButton, Qt::RightButton);
    sendMouse(t, QEvent::MouseButtonRelease, {bx1, y}, Qt::RightButton, Qt::NoButton);
    QVERIFY(qAbs(t->scale().visible().start - t0) < 1e-9);
    QVERIFY(qAbs(t->scale().visible().end - t1) < 1e-9);
    QTest::keyClick(t, Qt::Key_Backspace);
    QVERIFY(t->scale().showsAll());
    // Clicking the first stage header collapses it: its lanes leave the layout.
    const int rowsBefore = static_cast<int>(t->layout().rows().size());
    const LaneRow header = t->layout().rows().front();
    QVERIFY(header.header);
    const double lanesTop = t->fullHeight() - t->layout().totalHeight() - 4;
    const int hy = static_cast<int>(lanesTop + header.y + header.height / 2);
    sendMouse(t, QEvent::MouseButtonPress, {40, hy}, Qt::LeftButton, Qt::LeftButton);
    sendMouse(t, QEvent::MouseButtonRelease, {40, hy}, Qt::LeftButton, Qt::NoButton);
    QVERIFY(static_cast<int>(t->layout().rows().size()) < rowsBefore);
    QVERIFY(t->layout().rows().front().lane >= 0);   // the collapsed header summarises a compute lane
    t->setCollapsedStages({});
    // Hovering a compute span shows its op: phase, label, micro-batch.
    const LaneRow* compute = nullptr;
    for (const LaneRow& r : t->layout().rows())
      if (!r.header && t->data()->lanes[static_cast<std::size_t>(r.lane)].stream == Stream::compute) {
        compute = &r;
        break;
      }
    QVERIFY(compute);
    const TimelineLane& lane = t->data()->lanes[static_cast<std::size_t>(compute->lane)];
    const TimelineSpan* mid = nullptr;
    for (const TimelineSpan& sp : lane.spans)
      if (sp.microbatch >= 0 && sp.end > sp.start) {
        mid = &sp;
        break;
      }
    QVERIFY(mid);
    const double len = mid->end - mid->start;
    t->setVisibleRange({mid->start - len, mid->end + len});   // the span a third of the width
    const QPoint at(TimelineWidget::kLabelWidth + static_cast<int>(t->scale().timeToX(0.5 * (mid->start + mid->end))),
                    static_cast<int>(lanesTop + compute->y + compute->height / 2));
    QHelpEvent help(QEvent::ToolTip, at, t->mapToGlobal(at));
    QApplication::sendEvent(t, &help);
    QVERIFY(QToolTip::isVisible());
    QVERIFY(QToolTip::text().contains(QStringLiteral("micro-batch %1").arg(mid->microbatch)));
  }
};

MEGASCOPE_GUI_TEST("window", WindowTest)

#include "window_test.moc"
