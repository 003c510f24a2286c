#include "gui/reportview.hpp"

#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QPushButton>
#include <QTableWidget>
#include <QVBoxLayout>

#include <cmath>

#include "gui/reportrows.hpp"

namespace megascope::gui {

namespace {

QString number(double v) {
  const double a = std::fabs(v);
  if (v == std::round(v) && a < 1e15) return QString::number(static_cast<long long>(v));
  if (a >= 1e5) return QString::number(v, 'f', 0);
  if (a >= 100) return QString::number(v, 'f', 1);
  if (a >= 1) return QString::number(v, 'f', 3);
  return QString::number(v, 'g', 4);
}

QTableWidgetItem* cell(const QString& text, Qt::Alignment align = Qt::AlignRight | Qt::AlignVCenter) {
  auto* it = new QTableWidgetItem(text);
  it->setTextAlignment(align);
  it->setFlags(Qt::ItemIsEnabled | Qt::ItemIsSelectable);
  return it;
}

}  // namespace

ReportView::ReportView(QWidget* parent) : QWidget(parent) {
  auto* l = new QVBoxLayout(this);
  auto* top = new QHBoxLayout;
  m_title = new QLabel;
  m_title->setWordWrap(true);
  m_title->setTextInteractionFlags(Qt::TextSelectableByMouse);
  top->addWidget(m_title, 1);
  auto* pin = new QPushButton(tr("Pin as baseline"));
  pin->setToolTip(tr("Keep this plan as the baseline; later plans are compared with it"));
  auto* clear = new QPushButton(tr("Clear baseline"));
  top->addWidget(pin);
  top->addWidget(clear);
  l->addLayout(top);
  m_metrics = new QTableWidget(0, 4);
  m_metrics->setHorizontalHeaderLabels({tr("metric"), tr("baseline"), tr("current"), tr("change")});
  m_metrics->verticalHeader()->hide();
  m_metrics->horizontalHeader()->setSectionResizeMode(0, QHeaderView::Stretch);
  l->addWidget(m_metrics, 3);
  m_differences = new QLabel;
  m_differences->setWordWrap(true);
  m_differences->setTextInteractionFlags(Qt::TextSelectableByMouse);
  l->addWidget(m_differences);
  m_stages = new QTableWidget(0, 9);
  m_stages->setHorizontalHeaderLabels({tr("stage"), tr("rank"), tr("compute s"), tr("bubble %"), tr("TP ms"),
                                       tr("CP ms"), tr("EP ms"), tr("DP ms"), tr("PP ms")});
  m_stages->verticalHeader()->hide();
  m_stages->horizontalHeader()->setSectionResizeMode(QHeaderView::Stretch);
  l->addWidget(m_stages, 2);
  connect(pin, &QPushButton::clicked, this, [this] { setBaseline(m_current); });
  connect(clear, &QPushButton::clicked, this, [this] { setBaseline(nullptr); });
}

void ReportView::setCurrent(OutcomePtr outcome) {
  m_current = std::move(outcome);
  refresh();
}

void ReportView::setBaseline(OutcomePtr outcome) {
  m_baseline = std::move(outcome);
  refresh();
}

void ReportView::refresh() {
  if (!m_current) return;
  const SimulationOutcome& c = *m_current;
  m_title->setText(tr("<b>%1</b> on %2 x %3<br>current: <tt>%4</tt>%5")
                       .arg(QString::fromStdString(c.setup.model.name))
                       .arg(c.setup.world)
                       .arg(QString::fromStdString(c.setup.cluster.device.name))
                       .arg(effectivePlanText(c.setup))
                       .arg(m_baseline ? tr("<br>baseline: <tt>%1</tt>").arg(effectivePlanText(m_baseline->setup))
                                       : tr("<br>no baseline: press <i>Pin as baseline</i>, then change the plan")));
  std::vector<ReportRow> rows = reportRows(c.setup, c.report, c.memory);
  if (m_baseline)
    rows = compareRows(rows, reportRows(m_baseline->setup, m_baseline->report, m_baseline->memory));
  m_metrics->setRowCount(static_cast<int>(rows.size()));
  for (int i = 0; i < static_cast<int>(rows.size()); ++i) {
    const ReportRow& r = rows[static_cast<std::size_t>(i)];
    const QString unit = r.unit.isEmpty() ? QString() : QStringLiteral(" ") + r.unit;
    m_metrics->setItem(i, 0, cell(r.name, Qt::AlignLeft | Qt::AlignVCenter));
    m_metrics->setItem(i, 1, cell(r.baseline ? number(*r.baseline) + unit : QStringLiteral("-")));
    m_metrics->setItem(i, 2, cell(number(r.value) + unit));
    auto* ch = cell(r.change());
    if (auto b = r.better()) ch->setForeground(*b ? QColor(0x1b, 0x7f, 0x3b) : QColor(0xb0, 0x00, 0x20));
    m_metrics->setItem(i, 3, ch);
  }
  m_metrics->setColumnHidden(1, !m_baseline);
  m_metrics->setColumnHidden(3, !m_baseline);
  m_metrics->resizeColumnsToContents();
  m_metrics->horizontalHeader()->setSectionResizeMode(0, QHeaderView::Stretch);

  if (m_baseline) {
    const QStringList d = setupDifferences(m_baseline->setup, c.setup);
    m_differences->setText(d.isEmpty() ? tr("Same setup as the baseline.")
                                       : tr("<b>Differences from the baseline:</b> %1").arg(d.join(QStringLiteral("; "))));
  } else {
    m_differences->clear();
  }

  const auto& st = c.report.stages;
  m_stages->setRowCount(static_cast<int>(st.size()));
  for (int i = 0; i < static_cast<int>(st.size()); ++i) {
    const sim::StageReport& s = st[static_cast<std::size_t>(i)];
    m_stages->setItem(i, 0, cell(QString::number(s.stage)));
    m_stages->setItem(i, 1, cell(QString::number(s.rank)));
    m_stages->setItem(i, 2, cell(QString::number(s.compute_busy_s, 'f', 4)));
    m_stages->setItem(i, 3, cell(QString::number(100 * s.bubble_s / std::max(1e-30, c.report.step_time_s), 'f', 1)));
    for (int k = 0; k < sim::kCommKinds; ++k)
      m_stages->setItem(i, 4 + k, cell(QString::number(1e3 * s.exposed_comm_s[static_cast<std::size_t>(k)], 'f', 1)));
  }
}

}  // namespace megascope::gui
