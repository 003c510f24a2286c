// ReportView: the current plan's step time, tokens/s, MFU, bubble, exposed
// communication by kind and memory, per stage below; with a pinned baseline
// plan, both side by side with the change of every metric and the settings
// that differ.
#pragma once

#include <QWidget>

#include "gui/simulationservice.hpp"

class QLabel;
class QTableWidget;

namespace megascope::gui {

class ReportView : public QWidget {
  Q_OBJECT
 public:
  explicit ReportView(QWidget* parent = nullptr);
  void setCurrent(OutcomePtr outcome);
  void setBaseline(OutcomePtr outcome);    // null: none
  [[nodiscard]] OutcomePtr baseline() const { return m_baseline; }
  [[nodiscard]] const QTableWidget* metricsTable() const { return m_metrics; }

 private:
  void refresh();
  OutcomePtr m_current, m_baseline;
  QLabel* m_title = nullptr;
  QLabel* m_differences = nullptr;
  QTableWidget* m_metrics = nullptr;
  QTableWidget* m_stages = nullptr;
};

}  // namespace megascope::gui
