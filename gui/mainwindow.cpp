#include "gui/mainwindow.hpp"

#include <QApplication>
#include <QClipboard>
#include <QDockWidget>
#include <QFileDialog>
#include <QFileInfo>
#include <QImage>
#include <QLabel>
#include <QMenuBar>
#include <QMessageBox>
#include <QPainter>
#include <QScrollArea>
#include <QStatusBar>
#include <QSvgGenerator>
#include <QTabWidget>

#include "config/megatron_args.hpp"
#include "config/plan_settings.hpp"
#include "config/validation_regimes.hpp"
#include "gui/compareview.hpp"
#include "gui/memoryview.hpp"
#include "gui/planpanel.hpp"
#include "gui/reportrows.hpp"
#include "gui/reportview.hpp"
#include "gui/searchview.hpp"
#include "gui/timelinewidget.hpp"
#include "gui/timescale.hpp"
#include "sim/report.hpp"

namespace megascope::gui {

MainWindow::MainWindow(QWidget* parent) : QMainWindow(parent) {
  setWindowTitle(tr("Megascope"));
  m_sim = new SimulationService(this);
  m_panel = new PlanPanel;
  auto* scroll = new QScrollArea;
  scroll->setWidget(m_panel);
  scroll->setWidgetResizable(true);
  scroll->setMinimumWidth(340);
  auto* dock = new QDockWidget(tr("Setup and plan"), this);
  dock->setObjectName(QStringLiteral("planDock"));
  dock->setWidget(scroll);
  dock->setFeatures(QDockWidget::DockWidgetMovable | QDockWidget::DockWidgetFloatable);
  addDockWidget(Qt::LeftDockWidgetArea, dock);

  m_tabs = new QTabWidget;
  m_timeline = new TimelineWidget;
  m_memory = new MemoryView;
  m_report = new ReportView;
  m_compare = new CompareView;
  m_search = new SearchView;
  m_tabs->addTab(m_timeline, tr("Timeline"));
  m_tabs->addTab(m_memory, tr("Memory"));
  m_tabs->addTab(m_report, tr("Report"));
  m_tabs->addTab(m_compare, tr("Measured vs predicted"));
  m_tabs->addTab(m_search, tr("Search"));
  setCentralWidget(m_tabs);
  m_statusLabel = new QLabel;
  statusBar()->addWidget(m_statusLabel, 1);

  connect(m_panel, &PlanPanel::inputsChanged, this, &MainWindow::onInputsChanged);
  connect(m_tabs, &QTabWidget::currentChanged, this, [this] { refreshCurrentView(); });
  connect(m_sim, &SimulationService::finished, this, &MainWindow::onFinished);
  connect(m_sim, &SimulationService::started, this, [this](quint64) {
    m_statusLabel->setText(tr("Simulating ..."));
  });
  connect(m_sim, &SimulationService::failed, this, [this](quint64, const QString& message) {
    m_statusLabel->setText(tr("Simulation failed: %1").arg(message));
  });
  connect(m_search, &SearchView::planChosen, this, [this](const PlanSpec& plan) { m_panel->setPlan(plan); });
  buildMenus();
  resize(1600, 1000);
}

MainWindow::~MainWindow() = default;

void MainWindow::buildMenus() {
  QMenu* file = menuBar()->addMenu(tr("&File"));
  file->addAction(tr("Open measured trace..."), this, [this] {
    const QString f = QFileDialog::getOpenFileName(this, tr("Open a measured trace"), QString(),
                                                   tr("Traces (*.json);;All files (*)"));
    if (f.isEmpty()) return;
    m_compare->loadMeasured(f);
    showView(View::compare);
  });
  file->addSeparator();
  file->addAction(tr("Export timeline as PNG or SVG..."), this, [this] {
    const QString f = QFileDialog::getSaveFileName(this, tr("Export the timeline"), QStringLiteral("timeline.png"),
                                                   tr("Images (*.png *.svg)"));
    if (f.isEmpty()) return;
    if (QString e = exportTimelineImage(f); !e.isEmpty()) QMessageBox::warning(this, tr("Export"), e);
  });
  file->addAction(tr("Export trace as Perfetto JSON..."), this, [this] {
    const QString f = QFileDialog::getSaveFileName(this, tr("Export the trace"), QStringLiteral("trace.json"),
                                                   tr("Perfetto / Chrome trace (*.json)"));
    if (f.isEmpty()) return;
    if (QString e = exportPerfetto(f); !e.isEmpty()) QMessageBox::warning(this, tr("Export"), e);
  });
  file->addAction(tr("Copy Megatron-LM arguments"), QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_C), this, [this] {
    if (QString e = copyMegatronArgs(); !e.isEmpty()) QMessageBox::warning(this, tr("Megatron-LM arguments"), e);
  });
  file->addSeparator();
  file->addAction(tr("Quit"), QKeySequence::Quit, this, &QWidget::close);
  QMenu* view = menuBar()->addMenu(tr("&View"));
  view->addAction(tr("Show the whole iteration"), QKeySequence(Qt::Key_Home), m_timeline, &TimelineWidget::showAll);
  view->addAction(tr("Zoom back"), m_timeline, &TimelineWidget::zoomOut);
  QAction* full = view->addAction(tr("Simulate every rank (full mode)"));
  full->setCheckable(true);
  full->setToolTip(tr("Reduced mode simulates one rank per pipeline stage; full mode every rank "
                      "(the timeline then shows up to 64 ranks)"));
  connect(full, &QAction::toggled, this, [this](bool on) { setFullMode(on); });
  m_fullModeAction = full;
  view->addAction(tr("Pin the plan as the report's baseline"), this, [this] {
    m_report->setBaseline(m_outcome);
    showView(View::report);
  });
}

void MainWindow::setFullMode(bool on) {
  const sim::Mode mode = on ? sim::Mode::full : sim::Mode::reduced;
  if (m_sim->mode() == mode) return;
  m_sim->setMode(mode);
  m_fullModeAction->setChecked(on);   // re-enters here and returns above
  if (m_inputsSet) onInputsChanged(m_panel->inputs());
}

void MainWindow::showView(View v) {
  m_tabs->setCurrentIndex(static_cast<int>(v));
  refreshCurrentView();
}

void MainWindow::refreshCurrentView() {
  const View v = static_cast<View>(m_tabs->currentIndex());
  if (!m_outcome || !m_staleViews.contains(static_cast<int>(v))) return;
  m_staleViews.remove(static_cast<int>(v));
  switch (v) {
    case View::memory: m_memory->setOutcome(m_outcome); break;
    case View::report: m_report->setCurrent(m_outcome); break;
    case View::compare: m_compare->setPredicted(m_outcome); break;
    default: break;
  }
}

void MainWindow::setInputs(const Inputs& in) {
  m_inputsSet = true;
  m_panel->setInputs(in);
  onInputsChanged(in);
}

void MainWindow::onInputsChanged(const Inputs& in) {
  m_search->setInputs(in);
  auto setup = makeSetup(in);
  if (!setup) {
    m_validationError = QString::fromStdString(setup.error().str());
    m_panel->showValidation(m_validationError);
    m_statusLabel->setText(tr("Invalid plan: the views show the last valid one"));
    return;
  }
  m_validationError.clear();
  QStringList warnings;
  for (const std::string& w : setup->warnings) warnings << QString::fromStdString(w);
  m_panel->showValidation(QString(), warnings);
  m_sim->request(*setup);
}

void MainWindow::onFinished(OutcomePtr outcome) {
  m_outcome = outcome;
  m_timeline->setData(outcome->timeline);
  const Setup& s = outcome->setup;
  m_timeline->setTitle(tr("%1 on %2 x %3, %4: step %5, %6 tokens/s, MFU %7%, bubble %8%; %9")
                           .arg(QString::fromStdString(s.model.name))
                           .arg(s.world)
                           .arg(QString::fromStdString(s.cluster.device.name))
                           .arg(effectivePlanText(s))
                           .arg(formatDuration(outcome->report.step_time_s))
                           .arg(outcome->report.tokens_per_s, 0, 'f', 0)
                           .arg(100 * outcome->report.mfu, 0, 'f', 1)
                           .arg(100 * outcome->report.bubble_fraction, 0, 'f', 1)
                           .arg(QString::fromStdString(
                               expected_error_brief(expected_error(s, outcome->report.mfu, shipped_regimes())))));
  // The other views catch up when they are shown, so that a plan change
  // redraws the visible view first.
  m_staleViews = {static_cast<int>(View::memory), static_cast<int>(View::report), static_cast<int>(View::compare)};
  refreshCurrentView();
  m_statusLabel->setText(tr("Simulated in %1 (%2 spans on %3 traced ranks, %4 mode; cost profile %5)")
                             .arg(formatDuration(outcome->wallSeconds))
                             .arg(outcome->timeline->spanCount)
                             .arg(outcome->result.traced_ranks.size())
                             .arg(outcome->result.simulated_ranks.size() == static_cast<std::size_t>(s.world)
                                      ? tr("full")
                                      : tr("reduced"))
                             .arg(QString::fromStdString(outcome->profileSource)));
  emit outcomeChanged(outcome);
}

QString MainWindow::exportTimelineImage(const QString& path) {
  if (!m_timeline->data()) return tr("No timeline to export yet");
  const int w = std::max(1200, m_timeline->width());
  const int h = m_timeline->fullHeight();
  if (path.endsWith(QStringLiteral(".svg"), Qt::CaseInsensitive)) {
    QSvgGenerator gen;
    gen.setFileName(path);
    gen.setSize(QSize(w, h));
    gen.setViewBox(QRect(0, 0, w, h));
    gen.setTitle(tr("Megascope timeline"));
    QPainter p;
    if (!p.begin(&gen)) return tr("Cannot write %1").arg(path);
    m_timeline->renderAll(p, w);
    p.end();
    return QFileInfo::exists(path) ? QString() : tr("Cannot write %1").arg(path);
  }
  QImage img(w, h, QImage::Format_ARGB32_Premultiplied);
  img.fill(Qt::white);
  {
    QPainter p(&img);
    m_timeline->renderAll(p, w);
  }
  return img.save(path) ? QString() : tr("Cannot write %1").arg(path);
}

QString MainWindow::exportPerfetto(const QString& path) {
  if (!m_outcome) return tr("No simulation to export yet");
  const Setup& s = m_outcome->setup;
  TraceInfo info{TraceSource::simulated, m_outcome->result.step_time_s, effectivePlanText(s).toStdString(),
                 s.model.name, s.world};
  auto ok = sim::write_trace(path.toStdString(), m_outcome->program, m_outcome->result, info);
  return ok ? QString() : QString::fromStdString(ok.error().str());
}

QString MainWindow::copyMegatronArgs() {
  if (!m_outcome) return tr("No valid plan yet");
  auto args = export_megatron_args(m_outcome->setup);
  if (!args) return QString::fromStdString(args.error().str());
  QApplication::clipboard()->setText(QString::fromStdString(*args));
  m_statusLabel->setText(tr("Megatron-LM arguments copied to the clipboard"));
  return {};
}

}  // namespace megascope::gui
