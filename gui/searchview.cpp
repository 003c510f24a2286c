#include "gui/searchview.hpp"

#include <QCheckBox>
#include <QDoubleSpinBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QItemSelectionModel>
#include <QLabel>
#include <QProgressBar>
#include <QPushButton>
#include <QSortFilterProxyModel>
#include <QSpinBox>
#include <QTableView>
#include <QVBoxLayout>

#include "gui/candidatemodel.hpp"

namespace megascope::gui {

SearchView::SearchView(QWidget* parent) : QWidget(parent) {
  m_service = new SearchService(this);
  m_model = new CandidateModel(this);
  m_proxy = new QSortFilterProxyModel(this);
  m_proxy->setSourceModel(m_model);
  m_proxy->setSortRole(Qt::UserRole);

  auto* l = new QVBoxLayout(this);
  auto* controls = new QHBoxLayout;
  controls->addWidget(new QLabel(tr("Simulate the best")));
  m_topK = new QSpinBox;
  m_topK->setRange(1, 256);
  m_topK->setValue(16);
  controls->addWidget(m_topK);
  controls->addWidget(new QLabel(tr("plans; keep free")));
  m_headroom = new QDoubleSpinBox;
  m_headroom->setRange(0, 64);
  m_headroom->setValue(2);
  m_headroom->setSuffix(tr(" GiB"));
  controls->addWidget(m_headroom);
  m_allSchedules = new QCheckBox(tr("all schedules (zero-bubble, DualPipe)"));
  controls->addWidget(m_allSchedules);
  controls->addStretch(1);
  m_run = new QPushButton(tr("Search"));
  m_cancel = new QPushButton(tr("Cancel"));
  m_cancel->setEnabled(false);
  controls->addWidget(m_run);
  controls->addWidget(m_cancel);
  l->addLayout(controls);
  auto* prog = new QHBoxLayout;
  m_progress = new QProgressBar;
  m_progress->setRange(0, 1000);
  m_progress->setValue(0);
  m_status = new QLabel(tr("Searches every legal plan for the current model, cluster, GPU count and batch."));
  prog->addWidget(m_progress, 1);
  prog->addWidget(m_status, 2);
  l->addLayout(prog);
  m_table = new QTableView;
  m_table->setModel(m_proxy);
  m_table->setSortingEnabled(true);
  m_table->setSelectionBehavior(QAbstractItemView::SelectRows);
  m_table->setSelectionMode(QAbstractItemView::SingleSelection);
  m_table->verticalHeader()->hide();
  m_table->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  m_table->horizontalHeader()->setSectionResizeMode(CandidateModel::Plan, QHeaderView::Stretch);
  m_table->sortByColumn(CandidateModel::Rank, Qt::AscendingOrder);
  l->addWidget(m_table, 1);

  connect(m_run, &QPushButton::clicked, this, &SearchView::startSearch);
  connect(m_cancel, &QPushButton::clicked, this, &SearchView::cancelSearch);
  connect(m_service, &SearchService::progress, this, [this](quint64, const QString& stage, double f) {
    m_progress->setValue(static_cast<int>(1000 * f));
    m_status->setText(tr("%1: %2%").arg(stage).arg(100 * f, 0, 'f', 0));
  });
  connect(m_service, &SearchService::finished, this, &SearchView::onFinished);
  connect(m_service, &SearchService::failed, this, [this](quint64, const QString& message) {
    setRunning(false);
    m_status->setText(QStringLiteral("<span style='color:#b00020'>%1</span>").arg(message.toHtmlEscaped()));
  });
  connect(m_service, &SearchService::cancelled, this, [this](quint64) {
    setRunning(false);
    m_status->setText(tr("Cancelled."));
  });
  connect(m_table->selectionModel(), &QItemSelectionModel::currentRowChanged, this,
          [this](const QModelIndex& current) {
            if (!current.isValid()) return;
            const QModelIndex src = m_proxy->mapToSource(current);
            emit planChosen(m_model->plan(src.row()).plan);
          });
}

void SearchView::setTopK(int k) { m_topK->setValue(k); }

void SearchView::setRunning(bool running) {
  m_run->setEnabled(!running);
  m_cancel->setEnabled(running);
  if (!running && m_progress->value() < 1000) m_progress->setValue(0);
}

void SearchView::startSearch() {
  planner::SearchInputs in;
  in.model = m_inputs.model;
  auto c = with_device_count(m_inputs.cluster, m_inputs.gpus);
  if (!c) {
    m_status->setText(QString::fromStdString(c.error().str()));
    return;
  }
  in.cluster = *c;
  in.training = m_inputs.training;
  in.gpu_counts = {m_inputs.gpus};
  in.constraints.headroom_bytes = m_headroom->value() * 1024.0 * 1024 * 1024;
  if (m_allSchedules->isChecked())
    in.constraints.schedules = all_schedules();
  m_service->cancel();   // a search still running (reports "Cancelled." before the new one starts)
  m_progress->setValue(0);
  m_status->setText(tr("Searching %1 on %2 GPUs ...").arg(QString::fromStdString(in.model.name)).arg(m_inputs.gpus));
  setRunning(true);
  m_service->start(in, m_topK->value());
}

void SearchView::cancelSearch() { m_service->cancel(); }

void SearchView::onFinished(quint64, SearchResultPtr result) {
  setRunning(false);
  m_progress->setValue(1000);
  m_model->setPlans(result->ranked);
  m_table->sortByColumn(CandidateModel::Rank, Qt::AscendingOrder);
  m_status->setText(tr("%1 plans evaluated, %2 fit, %3 simulated (%4 s + %5 s). Select a row to show it.")
                        .arg(result->evaluated)
                        .arg(result->fitting)
                        .arg(result->ranked.size())
                        .arg(result->stage1_s, 0, 'f', 1)
                        .arg(result->stage2_s, 0, 'f', 1));
  emit searchFinished();
}

void SearchView::selectRow(int row) {
  if (row < 0 || row >= m_proxy->rowCount()) return;
  m_table->selectionModel()->setCurrentIndex(m_proxy->index(row, 0),
                                             QItemSelectionModel::ClearAndSelect | QItemSelectionModel::Rows);
}

}  // namespace megascope::gui
