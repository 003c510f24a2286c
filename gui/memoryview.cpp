#include "gui/memoryview.hpp"

#include <QBarCategoryAxis>
#include <QBarSet>
#include <QChart>
#include <QChartView>
#include <QComboBox>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineSeries>
#include <QStackedBarSeries>
#include <QValueAxis>
#include <QVBoxLayout>

#include "gui/timescale.hpp"

namespace megascope::gui {

namespace {
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

QChartView* makeView() {
  auto* chart = new QChart;
  chart->setAnimationOptions(QChart::NoAnimation);
  chart->legend()->setAlignment(Qt::AlignBottom);
  auto* v = new QChartView(chart);
  v->setRenderHint(QPainter::Antialiasing);
  return v;
}

void clearChart(QChart* c) {
  c->removeAllSeries();
  for (QAbstractAxis* a : c->axes()) {
    c->removeAxis(a);
    delete a;
  }
}
}  // namespace

MemoryView::MemoryView(QWidget* parent) : QWidget(parent) {
  auto* l = new QVBoxLayout(this);
  m_summary = new QLabel;
  m_summary->setWordWrap(true);
  l->addWidget(m_summary);
  auto* charts = new QHBoxLayout;
  m_bars = makeView();
  m_overTime = makeView();
  auto* right = new QVBoxLayout;
  auto* rankRow = new QHBoxLayout;
  rankRow->addWidget(new QLabel(tr("Rank")));
  m_rank = new QComboBox;
  m_rank->setSizeAdjustPolicy(QComboBox::AdjustToContents);
  rankRow->addWidget(m_rank);
  rankRow->addStretch(1);
  right->addLayout(rankRow);
  right->addWidget(m_overTime, 1);
  charts->addWidget(m_bars, 1);
  charts->addLayout(right, 1);
  l->addLayout(charts, 1);
  connect(m_rank, &QComboBox::activated, this, [this](int i) { showRank(m_rank->itemData(i).toInt()); });
}

QChart* MemoryView::barsChart() const { return m_bars->chart(); }
QChart* MemoryView::timeChart() const { return m_overTime->chart(); }

void MemoryView::setOutcome(OutcomePtr outcome) {
  m_outcome = std::move(outcome);
  if (!m_outcome) return;
  const int previous = m_rank->currentData().isValid() ? m_rank->currentData().toInt() : -1;
  m_rank->clear();
  int keep = 0;
  for (int r : m_outcome->result.traced_ranks) {
    m_rank->addItem(tr("%1 (stage %2)").arg(r).arg(m_outcome->program.grid.coord(r).pp), r);
    if (r == previous) keep = m_rank->count() - 1;
  }
  m_rank->setCurrentIndex(keep);
  fillBars();
  showRank(m_rank->currentData().toInt());
}

void MemoryView::showRank(int rank) {
  if (!m_outcome) return;
  m_timeline = memoryOverTime(m_outcome->setup, m_outcome->program, m_outcome->result.spans, rank);
  fillOverTime();
}

void MemoryView::fillBars() {
  QChart* c = m_bars->chart();
  clearChart(c);
  const MemoryReport& m = m_outcome->memory;
  c->setTitle(tr("Per GPU by stage: peak %1 of %2 GiB (stage %3), %4")
                  .arg(m.peak_bytes / kGiB, 0, 'f', 1)
                  .arg(m.capacity_bytes / kGiB, 0, 'f', 1)
                  .arg(m.peak_stage)
                  .arg(m.fits ? tr("fits") : tr("DOES NOT FIT")));
  const char* names[] = {"weights", "gradients", "optimizer", "activations", "other"};
  const QColor colors[] = {QColor(0x3b, 0x82, 0xd6), QColor(0xf2, 0x8e, 0x2b), QColor(0x9b, 0x6f, 0xd6),
                           QColor(0x2c, 0xa0, 0x2c), QColor(0x8c, 0x8c, 0x8c)};
  auto* series = new QStackedBarSeries;
  QBarSet* sets[5];
  for (int i = 0; i < 5; ++i) {
    sets[i] = new QBarSet(tr(names[i]));
    sets[i]->setColor(colors[i]);
    sets[i]->setBorderColor(colors[i].darker(130));
  }
  QStringList categories;
  double top = m.capacity_bytes;
  for (const StageMemory& s : m.stages) {
    *sets[0] << s.weights_bytes / kGiB;
    *sets[1] << s.grads_bytes / kGiB;
    *sets[2] << s.optimizer_bytes / kGiB;
    *sets[3] << s.activations_bytes / kGiB;
    *sets[4] << s.other_bytes / kGiB;
    categories << QString::number(s.stage);
    top = std::max(top, s.total_bytes);
  }
  for (QBarSet* s : sets) series->append(s);
  c->addSeries(series);   // applies the theme's colours: set ours afterwards
  for (int i = 0; i < 5; ++i) {
    sets[i]->setColor(colors[i]);
    sets[i]->setBorderColor(colors[i].darker(130));
  }
  auto* capacity = new QLineSeries;
  capacity->setName(tr("capacity"));
  capacity->setPen(QPen(QColor(0xb0, 0x00, 0x20), 2, Qt::DashLine));
  capacity->append(-0.5, m.capacity_bytes / kGiB);
  capacity->append(static_cast<double>(m.stages.size()) - 0.5, m.capacity_bytes / kGiB);
  c->addSeries(capacity);
  auto* x = new QBarCategoryAxis;
  x->append(categories);
  x->setTitleText(tr("pipeline stage"));
  auto* y = new QValueAxis;
  y->setRange(0, top / kGiB * 1.05);
  y->applyNiceNumbers();
  y->setTitleText(tr("GiB"));
  y->setLabelFormat(QStringLiteral("%.0f"));
  c->addAxis(x, Qt::AlignBottom);
  c->addAxis(y, Qt::AlignLeft);
  series->attachAxis(x);
  series->attachAxis(y);
  capacity->attachAxis(x);
  capacity->attachAxis(y);
}

void MemoryView::fillOverTime() {
  QChart* c = m_overTime->chart();
  clearChart(c);
  const MemoryTimeline& t = m_timeline;
  const double step = m_outcome->result.step_time_s;
  c->setTitle(tr("Rank %1 (stage %2) over the iteration: peak %3 GiB at %4")
                  .arg(t.rank)
                  .arg(t.stage)
                  .arg(t.peakTotalBytes() / kGiB, 0, 'f', 1)
                  .arg(formatDuration(t.peakTime)));
  auto* total = new QLineSeries;
  total->setName(tr("total"));
  total->setPen(QPen(QColor(0x2c, 0xa0, 0x2c), 1.5));
  // A step function: each level holds until the next point. Thin it to about
  // two points per pixel column of a wide chart.
  const std::size_t n = t.activations.size();
  const std::size_t stride = std::max<std::size_t>(1, n / 4000);
  double prev = t.staticBytes / kGiB;
  total->append(0, prev);
  for (std::size_t i = 0; i < n; i += stride) {
    double level = t.activations[i].bytes;
    for (std::size_t k = i + 1; k < std::min(n, i + stride); ++k) level = std::max(level, t.activations[k].bytes);
    const double y = (t.staticBytes + level) / kGiB;
    total->append(t.activations[i].time, prev);
    total->append(t.activations[i].time, y);
    prev = y;
  }
  total->append(step, prev);
  auto* base = new QLineSeries;
  base->setName(tr("resident: weights, gradients, optimizer, other"));
  base->setPen(QPen(QColor(0x3b, 0x82, 0xd6), 1.5));
  base->append(0, t.staticBytes / kGiB);
  base->append(step, t.staticBytes / kGiB);
  auto* capacity = new QLineSeries;
  capacity->setName(tr("capacity"));
  capacity->setPen(QPen(QColor(0xb0, 0x00, 0x20), 2, Qt::DashLine));
  capacity->append(0, t.capacityBytes / kGiB);
  capacity->append(step, t.capacityBytes / kGiB);
  for (QLineSeries* s : {total, base, capacity}) c->addSeries(s);
  auto* x = new QValueAxis;
  x->setRange(0, step);
  x->applyNiceNumbers();
  x->setTitleText(tr("time (s)"));
  auto* y = new QValueAxis;
  y->setRange(0, std::max(t.capacityBytes, t.peakTotalBytes()) / kGiB * 1.05);
  y->applyNiceNumbers();
  y->setTitleText(tr("GiB"));
  y->setLabelFormat(QStringLiteral("%.0f"));
  c->addAxis(x, Qt::AlignBottom);
  c->addAxis(y, Qt::AlignLeft);
  for (QLineSeries* s : {total, base, capacity}) {
    s->attachAxis(x);
    s->attachAxis(y);
  }
  m_summary->setText(tr("Bars: memory_report() per stage at its peak (in-flight micro-batches by schedule). "
                        "Curve: the chosen rank's activations alive between each micro-batch's forward and "
                        "backward in the simulated timeline, on top of the resident state."));
}

}  // namespace megascope::gui
