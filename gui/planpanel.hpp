// PlanPanel: the controls for the model, cluster, training setup and plan.
// It holds no simulation logic: every edit emits inputsChanged() with the
// new Inputs, and the main window validates and re-simulates. Validation
// messages (validate_setup's error, naming the field and the rule) are shown
// under the controls through showValidation().
#pragma once

#include <QWidget>

#include "gui/inputs.hpp"

class QCheckBox;
class QComboBox;
class QLabel;
class QLineEdit;
class QSpinBox;

namespace megascope::gui {

class PlanPanel : public QWidget {
  Q_OBJECT
 public:
  explicit PlanPanel(QWidget* parent = nullptr);

  // Fills every control from `in` without emitting inputsChanged().
  void setInputs(const Inputs& in);
  [[nodiscard]] const Inputs& inputs() const { return m_inputs; }
  // Replaces only the plan (a search result chosen in the table); emits.
  void setPlan(const PlanSpec& plan);
  // Empty: valid. Otherwise the error, in red.
  void showValidation(const QString& error, const QStringList& warnings = {});

 signals:
  void inputsChanged(const megascope::gui::Inputs& inputs);
  void status(const QString& message);

 private:
  void readControls();            // controls -> m_inputs (plan, training, gpus)
  void writeControls();           // m_inputs -> controls
  void chooseModel(const QString& nameOrPath);
  void chooseCluster(const QString& nameOrPath);
  void openModelFile();
  void openClusterFile();
  void planTextEdited();

  Inputs m_inputs;
  bool m_updating = false;
  QComboBox* m_model = nullptr;
  QComboBox* m_cluster = nullptr;
  QSpinBox* m_nodes = nullptr;
  QSpinBox* m_gpus = nullptr;
  QSpinBox* m_globalBatch = nullptr;
  QSpinBox* m_seqLen = nullptr;
  QSpinBox* m_tp = nullptr;
  QSpinBox* m_pp = nullptr;
  QSpinBox* m_vpp = nullptr;
  QSpinBox* m_dp = nullptr;
  QSpinBox* m_cp = nullptr;
  QSpinBox* m_ep = nullptr;
  QSpinBox* m_mbs = nullptr;
  QCheckBox* m_sp = nullptr;
  QComboBox* m_recompute = nullptr;
  QSpinBox* m_recomputeLayers = nullptr;
  QComboBox* m_sharding = nullptr;   // ZeRO stage 0-3 (1: the distributed optimizer)
  QCheckBox* m_overlapGrad = nullptr;
  QCheckBox* m_overlapParam = nullptr;
  QCheckBox* m_tpOverlap = nullptr;
  QComboBox* m_schedule = nullptr;
  QLineEdit* m_planText = nullptr;
  QLabel* m_modelInfo = nullptr;
  QLabel* m_clusterInfo = nullptr;
  QLabel* m_validation = nullptr;
};

}  // namespace megascope::gui
