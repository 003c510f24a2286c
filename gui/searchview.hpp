// SearchView: runs the planner for the current model, cluster, GPU count and
// batch, with progress and cancel, and lists the best plans in a sortable
// table. Choosing a row emits planChosen(), and the main window shows that
// plan in every view.
#pragma once

#include <QWidget>

#include "gui/inputs.hpp"
#include "gui/searchservice.hpp"

class QCheckBox;
class QDoubleSpinBox;
class QLabel;
class QProgressBar;
class QPushButton;
class QSortFilterProxyModel;
class QSpinBox;
class QTableView;

namespace megascope::gui {

class CandidateModel;

class SearchView : public QWidget {
  Q_OBJECT
 public:
  explicit SearchView(QWidget* parent = nullptr);
  void setInputs(const Inputs& in) { m_inputs = in; }
  void startSearch();
  void cancelSearch();
  void selectRow(int row);        // in the sorted view
  [[nodiscard]] SearchService* service() const { return m_service; }
  [[nodiscard]] CandidateModel* model() const { return m_model; }
  [[nodiscard]] QTableView* table() const { return m_table; }
  void setTopK(int k);

 signals:
  void planChosen(const megascope::PlanSpec& plan);
  void searchFinished();

 private:
  void onFinished(quint64 gen, SearchResultPtr result);
  void setRunning(bool running);

  Inputs m_inputs;
  SearchService* m_service = nullptr;
  CandidateModel* m_model = nullptr;
  QSortFilterProxyModel* m_proxy = nullptr;
  QTableView* m_table = nullptr;
  QSpinBox* m_topK = nullptr;
  QDoubleSpinBox* m_headroom = nullptr;
  QCheckBox* m_allSchedules = nullptr;
  QPushButton* m_run = nullptr;
  QPushButton* m_cancel = nullptr;
  QProgressBar* m_progress = nullptr;
  QLabel* m_status = nullptr;
};

}  // namespace megascope::gui

Q_DECLARE_METATYPE(megascope::PlanSpec)
