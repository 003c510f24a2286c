// MainWindow: the plan panel on the left, the views in tabs (Timeline,
// Memory, Report, Measured vs predicted, Search), exports in the File menu.
// Every input change is validated at once on the GUI thread (cheap) and, when
// valid, simulated in the background; the newest outcome updates every view.
#pragma once

#include <QMainWindow>
#include <QSet>

#include "gui/inputs.hpp"
#include "gui/simulationservice.hpp"

class QAction;
class QLabel;
class QTabWidget;

namespace megascope::gui {

class CompareView;
class MemoryView;
class PlanPanel;
class ReportView;
class SearchView;
class TimelineWidget;

class MainWindow : public QMainWindow {
  Q_OBJECT
 public:
  enum class View { timeline, memory, report, compare, search };

  explicit MainWindow(QWidget* parent = nullptr);
  ~MainWindow() override;

  // Loads inputs (and simulates them in the background).
  void setInputs(const Inputs& in);
  void showView(View v);
  // Full mode simulates (and traces, up to 64) every rank; reduced one per stage.
  void setFullMode(bool on);

  [[nodiscard]] OutcomePtr outcome() const { return m_outcome; }
  [[nodiscard]] SimulationService* simulation() const { return m_sim; }
  [[nodiscard]] TimelineWidget* timeline() const { return m_timeline; }
  [[nodiscard]] MemoryView* memoryView() const { return m_memory; }
  [[nodiscard]] ReportView* reportView() const { return m_report; }
  [[nodiscard]] CompareView* compareView() const { return m_compare; }
  [[nodiscard]] SearchView* searchView() const { return m_search; }
  [[nodiscard]] PlanPanel* planPanel() const { return m_panel; }
  // The last validation error ("" when the inputs are valid).
  [[nodiscard]] QString validationError() const { return m_validationError; }

  // Exports; each returns an error message or "".
  QString exportTimelineImage(const QString& path);   // .png or .svg
  QString exportPerfetto(const QString& path);
  QString copyMegatronArgs();

 signals:
  void outcomeChanged(megascope::gui::OutcomePtr outcome);

 private:
  void onInputsChanged(const Inputs& in);
  void onFinished(OutcomePtr outcome);
  void buildMenus();
  void refreshCurrentView();

  SimulationService* m_sim = nullptr;
  PlanPanel* m_panel = nullptr;
  QTabWidget* m_tabs = nullptr;
  TimelineWidget* m_timeline = nullptr;
  MemoryView* m_memory = nullptr;
  ReportView* m_report = nullptr;
  CompareView* m_compare = nullptr;
  SearchView* m_search = nullptr;
  QLabel* m_statusLabel = nullptr;
  QAction* m_fullModeAction = nullptr;
  bool m_inputsSet = false;
  OutcomePtr m_outcome;
  QSet<int> m_staleViews;              // views (View as int) not yet showing m_outcome
  QString m_validationError;
};

}  // namespace megascope::gui
