// MemoryView: per-stage stacked bars (weights, gradients, optimizer state,
// activations, other) against the GPU's capacity, and the memory of one
// traced rank over the iteration (memorytimeline.hpp says how it is derived).
#pragma once

#include <QWidget>

#include "gui/memorytimeline.hpp"
#include "gui/simulationservice.hpp"

class QChart;
class QChartView;
class QComboBox;
class QLabel;

namespace megascope::gui {

class MemoryView : public QWidget {
  Q_OBJECT
 public:
  explicit MemoryView(QWidget* parent = nullptr);
  void setOutcome(OutcomePtr outcome);
  void showRank(int rank);
  [[nodiscard]] const MemoryTimeline& timeline() const { return m_timeline; }
  [[nodiscard]] QChart* barsChart() const;
  [[nodiscard]] QChart* timeChart() const;

 private:
  void fillBars();
  void fillOverTime();
  OutcomePtr m_outcome;
  MemoryTimeline m_timeline;
  QChartView* m_bars = nullptr;
  QChartView* m_overTime = nullptr;
  QComboBox* m_rank = nullptr;
  QLabel* m_summary = nullptr;
};

}  // namespace megascope::gui
