// CandidateModel: the planner's simulated plans as a table. Qt::DisplayRole
// gives formatted text; Qt::UserRole the raw number (or text) a
// QSortFilterProxyModel sorts by, so every column sorts numerically.
#pragma once

#include <QAbstractTableModel>

#include <vector>

#include "planner/planner.hpp"

namespace megascope::gui {

class CandidateModel : public QAbstractTableModel {
  Q_OBJECT
 public:
  enum Column { Rank, Plan, TokensPerS, Mfu, StepTime, PeakMemory, Bubble, ExposedComm, Stage1Rank, ColumnCount };

  explicit CandidateModel(QObject* parent = nullptr);
  void setPlans(std::vector<planner::SimulatedPlan> plans);
  [[nodiscard]] const planner::SimulatedPlan& plan(int row) const { return m_plans.at(static_cast<std::size_t>(row)); }

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role) const override;
  QVariant headerData(int section, Qt::Orientation o, int role) const override;

 private:
  std::vector<planner::SimulatedPlan> m_plans;
};

}  // namespace megascope::gui
