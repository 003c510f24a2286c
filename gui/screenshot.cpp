#include "gui/screenshot.hpp"

#include <QApplication>
#include <QDir>
#include <QPixmap>

#include "gui/compareview.hpp"
#include "gui/reportview.hpp"
#include "gui/searchview.hpp"
#include "gui/timelinewidget.hpp"
#include "gui/tracecompare.hpp"
#include "gui/reportrows.hpp"

namespace megascope::gui {

ScreenshotDriver::ScreenshotDriver(MainWindow* window, ScreenshotRequest request, QObject* parent)
    : QObject(parent), m_window(window), m_req(std::move(request)) {
  m_timeout.setSingleShot(true);
  connect(&m_timeout, &QTimer::timeout, this, [this] { fail(tr("timed out")); });
  connect(m_window, &MainWindow::outcomeChanged, this, &ScreenshotDriver::onOutcome);
  connect(m_window->simulation(), &SimulationService::failed, this,
          [this](quint64, const QString& message) { fail(message); });
  connect(m_window->compareView(), &CompareView::compared, this, [this] {
    if (m_step == Step::compare) finish();
  });
  connect(m_window->compareView(), &CompareView::failed, this, [this](const QString& m) {
    if (m_step == Step::compare) fail(m);
  });
  connect(m_window->searchView(), &SearchView::searchFinished, this, [this] {
    if (m_step != Step::search) return;
    m_step = Step::searchPick;
    m_window->searchView()->selectRow(0);   // re-simulates the best plan; onOutcome finishes
  });
  connect(m_window->searchView()->service(), &SearchService::failed, this,
          [this](quint64, const QString& m) { fail(m); });
}

QString ScreenshotDriver::synthesizeMeasured(const SimulationOutcome& o, const QString& path) {
  auto ok = writeScaledTrace(path.toStdString(), o.program, o.result.traced_ranks, o.result.spans,
                             o.result.step_time_s, 1.08, 1.3, effectivePlanText(o.setup).toStdString(),
                             o.setup.model.name);
  return ok ? QString() : QString::fromStdString(ok.error().str());
}

void ScreenshotDriver::start(const Inputs& inputs) {
  m_inputs = inputs;
  m_timeout.start(m_req.timeoutMs);
  m_window->resize(m_req.size);
  m_window->show();
  m_window->showView(m_req.view);
  if (m_req.baselinePlan) {
    m_step = Step::baseline;
    Inputs b = inputs;
    b.plan = *m_req.baselinePlan;
    m_window->setInputs(b);
  } else {
    m_step = Step::current;
    m_window->setInputs(inputs);
  }
  if (!m_window->validationError().isEmpty()) fail(m_window->validationError());
}

void ScreenshotDriver::onOutcome() {
  switch (m_step) {
    case Step::baseline:
      m_window->reportView()->setBaseline(m_window->outcome());
      m_step = Step::current;
      m_window->setInputs(m_inputs);
      if (!m_window->validationError().isEmpty()) fail(m_window->validationError());
      return;
    case Step::current:
      if (m_req.view == MainWindow::View::compare && (!m_req.measuredTrace.isEmpty() || m_req.demoMeasured)) {
        m_step = Step::compare;
        QString path = m_req.measuredTrace, title;
        if (path.isEmpty()) {
          title = tr("synthetic measured trace (the simulation, compute x1.08, communication x1.3)");
          path = QDir::temp().filePath(QStringLiteral("megascope-gui-demo-measured-%1.json").arg(QApplication::applicationPid()));
          m_tempTrace = path;
          if (QString e = synthesizeMeasured(*m_window->outcome(), path); !e.isEmpty()) return fail(e);
        }
        m_window->compareView()->loadMeasured(path, title);
        return;
      }
      if (m_req.view == MainWindow::View::search) {
        m_step = Step::search;
        m_window->searchView()->setTopK(m_req.searchTopK);
        m_window->searchView()->startSearch();
        return;
      }
      finish();
      return;
    case Step::searchPick: finish(); return;
    default: return;
  }
}

void ScreenshotDriver::finish() {
  if (m_step == Step::done) return;
  m_step = Step::done;
  m_timeout.stop();
  if (!m_tempTrace.isEmpty()) QFile::remove(m_tempTrace);
  m_window->showView(m_req.view);
  if (m_req.zoom) {
    m_window->timeline()->setVisibleRange(*m_req.zoom);
    m_window->compareView()->timeline()->setVisibleRange(*m_req.zoom);
  }
  QApplication::processEvents();
  m_image = m_window->grab().toImage();
  emit done(QString());
}

void ScreenshotDriver::fail(const QString& message) {
  if (m_step == Step::done) return;
  m_step = Step::done;
  m_timeout.stop();
  if (!m_tempTrace.isEmpty()) QFile::remove(m_tempTrace);
  emit done(message.isEmpty() ? tr("failed") : message);
}

}  // namespace megascope::gui
