// CompareView: a measured trace (megascope run) beside the simulated
// iteration of the current plan: one timeline with each measured lane right
// under the predicted lane of the same rank and stream, on one time axis, and
// a table of the error per op kind. The trace is read and matched off the
// GUI thread; a newer load or a newer simulation supersedes an older one.
#pragma once

#include <QWidget>

#include <atomic>
#include <memory>

#include "config/trace_file.hpp"
#include "gui/simulationservice.hpp"
#include "gui/tracecompare.hpp"

class QComboBox;
class QLabel;
class QTableWidget;

namespace megascope::gui {

class TimelineWidget;

class CompareView : public QWidget {
  Q_OBJECT
 public:
  explicit CompareView(QWidget* parent = nullptr);
  ~CompareView() override;
  void setPredicted(OutcomePtr outcome);
  // Reads the file in the background; emits compared() or failed(). `title`
  // names it in the view (default: the path).
  void loadMeasured(const QString& path, const QString& title = {});
  [[nodiscard]] const TraceComparison& comparison() const { return m_comparison; }
  [[nodiscard]] TimelineWidget* timeline() const { return m_timeline; }
  [[nodiscard]] const QTableWidget* errorTable() const { return m_table; }
  void setGroupByOp(bool byOp);   // the table: per op name instead of per span kind

 signals:
  void compared();
  void failed(const QString& message);

 private:
  void recompute();
  void show(const TraceComparison& c, std::shared_ptr<const TimelineData> merged);
  void fillTable();

  OutcomePtr m_predicted;
  std::shared_ptr<const TraceFile> m_measured;
  QString m_path;
  std::atomic<quint64> m_generation{0};
  TraceComparison m_comparison;
  QLabel* m_summary = nullptr;
  TimelineWidget* m_timeline = nullptr;
  QTableWidget* m_table = nullptr;
  QComboBox* m_grouping = nullptr;   // by span kind, or by op name as `megascope compare`
};

}  // namespace megascope::gui
