// ScreenshotDriver: loads inputs into a MainWindow, waits (without blocking
// the event loop) for the simulation and for what the chosen view needs (a
// pinned baseline, a measured trace, a search), then renders the window to
// an image. Used by `megascope-gui --screenshot` and by the GUI tests.
#pragma once

#include <QImage>
#include <QObject>
#include <QSize>
#include <QString>
#include <QTimer>

#include <optional>

#include "gui/inputs.hpp"
#include "gui/mainwindow.hpp"
#include "gui/timescale.hpp"

namespace megascope::gui {

struct ScreenshotRequest {
  MainWindow::View view = MainWindow::View::timeline;
  std::optional<PlanSpec> baselinePlan;    // report: simulated first and pinned as the baseline
  QString measuredTrace;                   // compare: a trace file
  bool demoMeasured = false;               // compare: a synthetic measured trace (see synthesizeMeasured)
  int searchTopK = 8;                      // search: plans simulated
  std::optional<TimeRange> zoom;           // timeline and compare: the visible range (seconds)
  QSize size{1600, 1000};
  int timeoutMs = 300000;
};

class ScreenshotDriver : public QObject {
  Q_OBJECT
 public:
  ScreenshotDriver(MainWindow* window, ScreenshotRequest request, QObject* parent = nullptr);
  void start(const Inputs& inputs);
  [[nodiscard]] const QImage& image() const { return m_image; }

  // The current simulation written as a "measured" trace with compute x1.08
  // and communication x1.3: a stand-in for `megascope run` in demos and tests.
  static QString synthesizeMeasured(const SimulationOutcome& outcome, const QString& path);

 signals:
  void done(const QString& error);   // "" when image() holds the screenshot

 private:
  enum class Step { baseline, current, compare, search, searchPick, done };
  void onOutcome();
  void finish();
  void fail(const QString& message);

  MainWindow* m_window;
  ScreenshotRequest m_req;
  Inputs m_inputs;
  Step m_step = Step::current;
  QImage m_image;
  QTimer m_timeout;
  QString m_tempTrace;
};

}  // namespace megascope::gui
