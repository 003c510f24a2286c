#include "gui/planpanel.hpp"

#include <QCheckBox>
#include <QComboBox>
#include <QFileDialog>
#include <QFormLayout>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QPushButton>
#include <QSpinBox>
#include <QVBoxLayout>

#include "config/library.hpp"
#include "config/plan_settings.hpp"

namespace megascope::gui {

namespace {

QSpinBox* spin(int lo, int hi, const QString& special = {}) {
  auto* s = new QSpinBox;
  s->setRange(lo, hi);
  if (!special.isEmpty()) s->setSpecialValueText(special);
  s->setKeyboardTracking(false);   // typed values apply on Enter or focus out, not per digit
  return s;
}

const Schedule kSchedules[] = {Schedule::gpipe, Schedule::one_f_one_b, Schedule::interleaved, Schedule::zb_h1,
                               Schedule::zb_h2, Schedule::zb_1p,       Schedule::zb_2p,       Schedule::zb_v,
                               Schedule::dualpipe, Schedule::dualpipev};

}  // namespace

PlanPanel::PlanPanel(QWidget* parent) : QWidget(parent) {
  auto* outer = new QVBoxLayout(this);

  auto* setupBox = new QGroupBox(tr("Model and cluster"));
  auto* sf = new QFormLayout(setupBox);
  m_model = new QComboBox;
  m_model->setObjectName(QStringLiteral("model"));
  m_model->setEditable(true);
  for (const std::string& m : shipped_models()) m_model->addItem(QString::fromStdString(m));
  auto* modelOpen = new QPushButton(tr("Open..."));
  auto* modelRow = new QHBoxLayout;
  modelRow->addWidget(m_model, 1);
  modelRow->addWidget(modelOpen);
  sf->addRow(tr("Model"), modelRow);
  m_modelInfo = new QLabel;
  m_modelInfo->setWordWrap(true);
  sf->addRow(QString(), m_modelInfo);
  m_cluster = new QComboBox;
  m_cluster->setObjectName(QStringLiteral("cluster"));
  m_cluster->setEditable(true);
  for (const std::string& c : shipped_clusters()) m_cluster->addItem(QString::fromStdString(c));
  auto* clusterOpen = new QPushButton(tr("Open..."));
  auto* clusterRow = new QHBoxLayout;
  clusterRow->addWidget(m_cluster, 1);
  clusterRow->addWidget(clusterOpen);
  sf->addRow(tr("Cluster"), clusterRow);
  m_clusterInfo = new QLabel;
  m_clusterInfo->setWordWrap(true);
  sf->addRow(QString(), m_clusterInfo);
  m_nodes = spin(1, 1 << 20);
  m_gpus = spin(1, 1 << 24);
  auto* sizeRow = new QHBoxLayout;
  sizeRow->addWidget(m_nodes);
  sizeRow->addWidget(new QLabel(tr("GPUs")));
  sizeRow->addWidget(m_gpus);
  sf->addRow(tr("Nodes"), sizeRow);
  m_globalBatch = spin(1, 1 << 24);
  m_seqLen = spin(0, 1 << 24, tr("model's"));
  sf->addRow(tr("Global batch"), m_globalBatch);
  sf->addRow(tr("Sequence length"), m_seqLen);
  outer->addWidget(setupBox);

  auto* planBox = new QGroupBox(tr("Plan"));
  auto* pf = new QFormLayout(planBox);
  m_tp = spin(1, 1024);
  m_pp = spin(1, 1024);
  m_vpp = spin(0, 256, tr("auto"));
  m_dp = spin(0, 1 << 20, tr("auto"));
  m_cp = spin(1, 1024);
  m_ep = spin(1, 1024);
  m_mbs = spin(1, 4096);
  auto* row1 = new QHBoxLayout;
  row1->addWidget(new QLabel(tr("TP")));
  row1->addWidget(m_tp);
  row1->addWidget(new QLabel(tr("PP")));
  row1->addWidget(m_pp);
  row1->addWidget(new QLabel(tr("VPP")));
  row1->addWidget(m_vpp);
  pf->addRow(row1);
  auto* row2 = new QHBoxLayout;
  row2->addWidget(new QLabel(tr("DP")));
  row2->addWidget(m_dp);
  row2->addWidget(new QLabel(tr("CP")));
  row2->addWidget(m_cp);
  row2->addWidget(new QLabel(tr("EP")));
  row2->addWidget(m_ep);
  pf->addRow(row2);
  pf->addRow(tr("Micro-batch"), m_mbs);
  m_schedule = new QComboBox;
  for (Schedule s : kSchedules) m_schedule->addItem(QString::fromLatin1(to_string(s)));
  pf->addRow(tr("Schedule"), m_schedule);
  m_recompute = new QComboBox;
  m_recompute->addItems({QStringLiteral("none"), QStringLiteral("selective"), QStringLiteral("full")});
  m_recomputeLayers = spin(1, 1024);
  auto* rcRow = new QHBoxLayout;
  rcRow->addWidget(m_recompute, 1);
  rcRow->addWidget(new QLabel(tr("layers")));
  rcRow->addWidget(m_recomputeLayers);
  pf->addRow(tr("Recompute"), rcRow);
  m_sp = new QCheckBox(tr("sequence parallel"));
  m_sharding = new QComboBox;
  m_sharding->addItems({tr("none"), tr("ZeRO-1: optimizer state (distributed optimizer)"), tr("ZeRO-2: + gradients"),
                        tr("ZeRO-3 / FSDP: + parameters")});
  m_sharding->setToolTip(tr("What data parallelism shards over its ranks"));
  m_overlapGrad = new QCheckBox(tr("overlap grad reduce"));
  m_overlapParam = new QCheckBox(tr("overlap param gather"));
  m_tpOverlap = new QCheckBox(tr("overlap TP comm"));
  pf->addRow(m_sp);
  pf->addRow(tr("DP sharding"), m_sharding);
  pf->addRow(m_overlapGrad);
  pf->addRow(m_overlapParam);
  pf->addRow(m_tpOverlap);
  m_planText = new QLineEdit;
  m_planText->setToolTip(tr("The plan inline, as megascope --plan takes it; edit and press Enter"));
  pf->addRow(tr("Inline"), m_planText);
  outer->addWidget(planBox);

  m_validation = new QLabel;
  m_validation->setObjectName(QStringLiteral("validation"));
  m_validation->setWordWrap(true);
  m_validation->setTextInteractionFlags(Qt::TextSelectableByMouse);
  outer->addWidget(m_validation);
  outer->addStretch(1);

  for (QSpinBox* s : {m_gpus, m_globalBatch, m_seqLen, m_tp, m_pp, m_vpp, m_dp, m_cp, m_ep, m_mbs, m_recomputeLayers})
    connect(s, &QSpinBox::valueChanged, this, [this] { readControls(); });
  connect(m_nodes, &QSpinBox::valueChanged, this, [this](int n) {
    if (m_updating) return;
    m_gpus->setValue(n * std::max(1, m_inputs.cluster.node.devices_per_node));
  });
  for (QCheckBox* c : {m_sp, m_overlapGrad, m_overlapParam, m_tpOverlap})
    connect(c, &QCheckBox::toggled, this, [this] { readControls(); });
  for (QComboBox* c : {m_schedule, m_recompute, m_sharding})
    connect(c, &QComboBox::currentIndexChanged, this, [this] { readControls(); });
  connect(m_model, &QComboBox::activated, this, [this] { chooseModel(m_model->currentText()); });
  connect(m_model->lineEdit(), &QLineEdit::returnPressed, this, [this] { chooseModel(m_model->currentText()); });
  connect(m_cluster, &QComboBox::activated, this, [this] { chooseCluster(m_cluster->currentText()); });
  connect(m_cluster->lineEdit(), &QLineEdit::returnPressed, this, [this] { chooseCluster(m_cluster->currentText()); });
  connect(modelOpen, &QPushButton::clicked, this, &PlanPanel::openModelFile);
  connect(clusterOpen, &QPushButton::clicked, this, &PlanPanel::openClusterFile);
  connect(m_planText, &QLineEdit::returnPressed, this, &PlanPanel::planTextEdited);
}

void PlanPanel::setInputs(const Inputs& in) {
  m_inputs = in;
  writeControls();
}

void PlanPanel::setPlan(const PlanSpec& plan) {
  m_inputs.plan = plan;
  writeControls();
  emit inputsChanged(m_inputs);
}

void PlanPanel::writeControls() {
  m_updating = true;
  const Inputs& in = m_inputs;
  m_model->setCurrentText(QString::fromStdString(in.modelName));
  m_cluster->setCurrentText(QString::fromStdString(in.clusterName));
  const int perNode = std::max(1, in.cluster.node.devices_per_node);
  m_nodes->setValue((in.gpus + perNode - 1) / perNode);
  m_gpus->setValue(in.gpus);
  m_globalBatch->setValue(static_cast<int>(in.training.global_batch_size));
  m_seqLen->setValue(static_cast<int>(in.training.seq_length.value_or(0)));
  const PlanSpec& p = in.plan;
  m_tp->setValue(p.tp);
  m_pp->setValue(p.pp);
  m_vpp->setValue(p.vpp.value_or(0));
  m_dp->setValue(p.dp.value_or(0));
  m_cp->setValue(p.cp);
  m_ep->setValue(p.ep);
  m_mbs->setValue(p.micro_batch_size);
  m_sp->setChecked(p.sequence_parallel);
  m_recompute->setCurrentIndex(static_cast<int>(p.recompute.granularity));
  m_recomputeLayers->setValue(p.recompute.num_layers.value_or(1));
  m_recomputeLayers->setEnabled(p.recompute.granularity == RecomputeGranularity::full);
  m_sharding->setCurrentIndex(zero_stage(p));
  m_overlapGrad->setChecked(p.overlap_grad_reduce);
  m_overlapParam->setChecked(p.overlap_param_gather);
  m_tpOverlap->setChecked(p.tp_comm_overlap);
  for (int i = 0; i < m_schedule->count(); ++i)
    if (kSchedules[i] == p.schedule) m_schedule->setCurrentIndex(i);
  m_planText->setText(QString::fromStdString(format_inline_plan(p)));
  const ModelSpec& m = in.model;
  m_modelInfo->setText(tr("%1: %2 layers, hidden %3, %4 heads%5")
                           .arg(QString::fromStdString(m.name))
                           .arg(m.num_layers)
                           .arg(m.hidden_size)
                           .arg(m.num_attention_heads)
                           .arg(m.moe ? tr(", %1 experts").arg(m.moe->num_experts) : QString()));
  const ClusterSpec& c = in.cluster;
  m_clusterInfo->setText(tr("%1 x %2 per node, %3 GiB each")
                             .arg(QString::fromStdString(c.device.name))
                             .arg(c.node.devices_per_node)
                             .arg(c.device.memory_bytes / (1024.0 * 1024 * 1024), 0, 'f', 0));
  m_updating = false;
}

void PlanPanel::readControls() {
  if (m_updating) return;
  Inputs& in = m_inputs;
  in.gpus = m_gpus->value();
  in.training.global_batch_size = m_globalBatch->value();
  in.training.seq_length = m_seqLen->value() > 0 ? std::optional<std::int64_t>(m_seqLen->value()) : std::nullopt;
  PlanSpec& p = in.plan;
  p.tp = m_tp->value();
  p.pp = m_pp->value();
  p.vpp = m_vpp->value() > 0 ? std::optional<int>(m_vpp->value()) : std::nullopt;
  p.dp = m_dp->value() > 0 ? std::optional<int>(m_dp->value()) : std::nullopt;
  p.cp = m_cp->value();
  p.ep = m_ep->value();
  p.micro_batch_size = m_mbs->value();
  p.sequence_parallel = m_sp->isChecked();
  p.recompute.granularity = static_cast<RecomputeGranularity>(m_recompute->currentIndex());
  if (p.recompute.granularity == RecomputeGranularity::full) {
    if (!p.recompute.method) p.recompute.method = RecomputeMethod::uniform;
    p.recompute.num_layers = m_recomputeLayers->value();
  } else {
    p.recompute.method.reset();
    p.recompute.num_layers.reset();
  }
  // A searched plan's module set holds while recompute stays selective.
  if (p.recompute.granularity != RecomputeGranularity::selective) p.recompute.modules.reset();
  const int zero = m_sharding->currentIndex();
  p.distributed_optimizer = zero >= 1;
  p.zero = zero >= 2 ? zero : 0;
  p.overlap_grad_reduce = m_overlapGrad->isChecked();
  p.overlap_param_gather = m_overlapParam->isChecked();
  p.tp_comm_overlap = m_tpOverlap->isChecked();
  p.schedule = kSchedules[std::clamp(m_schedule->currentIndex(), 0, static_cast<int>(std::size(kSchedules)) - 1)];
  m_updating = true;
  m_recomputeLayers->setEnabled(p.recompute.granularity == RecomputeGranularity::full);
  const int perNode = std::max(1, in.cluster.node.devices_per_node);
  m_nodes->setValue((in.gpus + perNode - 1) / perNode);
  m_planText->setText(QString::fromStdString(format_inline_plan(p)));
  m_updating = false;
  emit inputsChanged(m_inputs);
}

void PlanPanel::planTextEdited() {
  auto p = parse_inline_plan(m_planText->text().toStdString());
  if (!p) {
    showValidation(QString::fromStdString(p.error().str()));
    return;
  }
  setPlan(*p);
}

void PlanPanel::chooseModel(const QString& nameOrPath) {
  auto m = resolve_model(nameOrPath.toStdString());
  if (!m) {
    showValidation(QString::fromStdString(m.error().str()));
    return;
  }
  m_inputs.model = *m;
  m_inputs.modelName = nameOrPath.toStdString();
  writeControls();
  emit inputsChanged(m_inputs);
}

void PlanPanel::chooseCluster(const QString& nameOrPath) {
  auto c = resolve_cluster(nameOrPath.toStdString());
  if (!c) {
    showValidation(QString::fromStdString(c.error().str()));
    return;
  }
  // Keep the node count; the GPU count follows the new node size.
  const int oldPerNode = std::max(1, m_inputs.cluster.node.devices_per_node);
  const int nodes = (m_inputs.gpus + oldPerNode - 1) / oldPerNode;
  m_inputs.cluster = *c;
  m_inputs.clusterName = nameOrPath.toStdString();
  m_inputs.gpus = nodes * c->node.devices_per_node;
  writeControls();
  emit inputsChanged(m_inputs);
}

void PlanPanel::openModelFile() {
  const QString f = QFileDialog::getOpenFileName(this, tr("Open a model"), QString(),
                                                 tr("Models (*.toml *.json);;All files (*)"));
  if (!f.isEmpty()) chooseModel(f);
}

void PlanPanel::openClusterFile() {
  const QString f =
      QFileDialog::getOpenFileName(this, tr("Open a cluster"), QString(), tr("Clusters (*.toml);;All files (*)"));
  if (!f.isEmpty()) chooseCluster(f);
}

void PlanPanel::showValidation(const QString& error, const QStringList& warnings) {
  QString html;
  if (!error.isEmpty())
    html = QStringLiteral("<span style='color:#b00020'><b>Invalid:</b> %1</span>").arg(error.toHtmlEscaped());
  else
    html = QStringLiteral("<span style='color:#1b7f3b'>Plan is valid.</span>");
  for (const QString& w : warnings) html += QStringLiteral("<br><span style='color:#8a6d00'>%1</span>").arg(w.toHtmlEscaped());
  m_validation->setText(html);
}

}  // namespace megascope::gui
