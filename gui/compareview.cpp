#include "gui/compareview.hpp"

#include <QComboBox>
#include <QFileDialog>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QMetaObject>
#include <QPointer>
#include <QPushButton>
#include <QSplitter>
#include <QTableWidget>
#include <QThreadPool>
#include <QVBoxLayout>

#include "gui/timelinewidget.hpp"
#include "gui/timescale.hpp"

namespace megascope::gui {

namespace {
QTableWidgetItem* cell(const QString& text, Qt::Alignment a = Qt::AlignRight | Qt::AlignVCenter) {
  auto* it = new QTableWidgetItem(text);
  it->setTextAlignment(a);
  it->setFlags(Qt::ItemIsEnabled | Qt::ItemIsSelectable);
  return it;
}
}  // namespace

CompareView::CompareView(QWidget* parent) : QWidget(parent) {
  auto* l = new QVBoxLayout(this);
  auto* top = new QHBoxLayout;
  auto* open = new QPushButton(tr("Open measured trace..."));
  m_summary = new QLabel(tr("Open a trace written by <tt>megascope run</tt> (or <tt>megascope simulate --trace</tt>) "
                            "for the current plan to compare it with the prediction."));
  m_summary->setWordWrap(true);
  top->addWidget(open);
  top->addWidget(m_summary, 1);
  l->addLayout(top);
  auto* split = new QSplitter(Qt::Vertical);
  m_timeline = new TimelineWidget;
  auto* tableBox = new QWidget;
  auto* tl = new QVBoxLayout(tableBox);
  tl->setContentsMargins(0, 0, 0, 0);
  auto* groupRow = new QHBoxLayout;
  groupRow->addWidget(new QLabel(tr("Error per")));
  m_grouping = new QComboBox;
  m_grouping->addItems({tr("op kind"), tr("op (phase and label, as megascope compare)")});
  groupRow->addWidget(m_grouping);
  groupRow->addStretch(1);
  tl->addLayout(groupRow);
  m_table = new QTableWidget(0, 5);
  m_table->setHorizontalHeaderLabels({tr("op kind"), tr("predicted"), tr("measured"), tr("error"), tr("spans")});
  m_table->verticalHeader()->hide();
  m_table->horizontalHeader()->setSectionResizeMode(QHeaderView::Stretch);
  tl->addWidget(m_table, 1);
  split->addWidget(m_timeline);
  split->addWidget(tableBox);
  split->setStretchFactor(0, 3);
  split->setStretchFactor(1, 1);
  split->setSizes({700, 260});
  l->addWidget(split, 1);
  connect(m_grouping, &QComboBox::currentIndexChanged, this, [this] { fillTable(); });
  connect(open, &QPushButton::clicked, this, [this] {
    const QString f = QFileDialog::getOpenFileName(this, tr("Open a measured trace"), QString(),
                                                   tr("Traces (*.json);;All files (*)"));
    if (!f.isEmpty()) loadMeasured(f);
  });
}

CompareView::~CompareView() { m_generation = ~quint64{0}; }

void CompareView::setPredicted(OutcomePtr outcome) {
  m_predicted = std::move(outcome);
  if (m_measured) recompute();
}

void CompareView::loadMeasured(const QString& path, const QString& title) {
  const quint64 gen = ++m_generation;
  m_path = title.isEmpty() ? path : title;
  m_summary->setText(tr("Reading %1 ...").arg(path));
  QPointer<CompareView> self(this);
  OutcomePtr predicted = m_predicted;
  QThreadPool::globalInstance()->start([self, gen, path, predicted] {
    auto trace = read_trace(path.toStdString());
    if (!trace) {
      const QString message = QString::fromStdString(trace.error().str());
      QMetaObject::invokeMethod(self, [self, gen, message] {
        if (!self || gen != self->m_generation) return;
        self->m_summary->setText(QStringLiteral("<span style='color:#b00020'>%1</span>").arg(message.toHtmlEscaped()));
        emit self->failed(message);
      }, Qt::QueuedConnection);
      return;
    }
    auto file = std::make_shared<const TraceFile>(std::move(*trace));
    QMetaObject::invokeMethod(self, [self, gen, file] {
      if (!self || gen != self->m_generation) return;
      self->m_measured = file;
      self->recompute();
    }, Qt::QueuedConnection);
  });
}

void CompareView::recompute() {
  if (!m_measured || !m_predicted) return;
  const quint64 gen = ++m_generation;
  QPointer<CompareView> self(this);
  OutcomePtr predicted = m_predicted;
  std::shared_ptr<const TraceFile> measured = m_measured;
  QThreadPool::globalInstance()->start([self, gen, predicted, measured] {
    TraceComparison c = compareTraces(predicted->program, predicted->result.spans, predicted->result.step_time_s,
                                      *measured);
    auto measuredLanes = timelineFromTrace(*measured, TraceOrigin::measured, &predicted->program);
    std::shared_ptr<const TimelineData> merged = mergeTimelines(*predicted->timeline, *measuredLanes);
    QMetaObject::invokeMethod(self, [self, gen, c, merged] {
      if (!self || gen != self->m_generation) return;
      self->show(c, merged);
    }, Qt::QueuedConnection);
  });
}

void CompareView::show(const TraceComparison& c, std::shared_ptr<const TimelineData> merged) {
  m_comparison = c;
  m_timeline->setData(std::move(merged));
  m_timeline->setTitle(tr("Predicted and measured (lanes marked \"measured\"), aligned at the start of the iteration"));
  QString text = tr("<b>%1</b>: measured step %2, predicted %3")
                     .arg(m_path.toHtmlEscaped(), formatDuration(c.measuredStepS), formatDuration(c.predictedStepS));
  if (auto e = c.stepError()) text += tr(" (error %1%)").arg(100 * *e, 0, 'f', 1);
  text += tr("; %1 spans matched, %2 not").arg(c.matched).arg(c.unmatched);
  if (!c.planMatches)
    text += tr("<br><span style='color:#b00020'>The trace's world size differs from the current plan's: choose "
               "the plan the trace was measured with.</span>");
  m_summary->setText(text);
  fillTable();
  emit compared();
}

void CompareView::setGroupByOp(bool byOp) { m_grouping->setCurrentIndex(byOp ? 1 : 0); }

void CompareView::fillTable() {
  const bool byOp = m_grouping->currentIndex() == 1;
  struct Row {
    QString name;
    SpanKind kind;
    double predicted, measured;
    std::size_t matched;
    std::optional<double> error;
  };
  std::vector<Row> rows;
  if (byOp)
    for (const OpError& o : m_comparison.ops)
      rows.push_back({QString::fromStdString(o.name), o.kind, o.predictedS, o.measuredS, o.matched, o.error()});
  else
    for (const KindError& k : m_comparison.kinds)
      rows.push_back({spanKindName(k.kind), k.kind, k.predictedS, k.measuredS, k.matched, k.error()});
  m_table->setHorizontalHeaderItem(0, new QTableWidgetItem(byOp ? tr("op") : tr("op kind")));
  m_table->setRowCount(static_cast<int>(rows.size()));
  for (int i = 0; i < static_cast<int>(rows.size()); ++i) {
    const Row& r = rows[static_cast<std::size_t>(i)];
    auto* name = cell(r.name, Qt::AlignLeft | Qt::AlignVCenter);
    QPixmap px(12, 12);
    px.fill(spanKindColor(r.kind));
    name->setIcon(QIcon(px));
    m_table->setItem(i, 0, name);
    m_table->setItem(i, 1, cell(formatDuration(r.predicted)));
    m_table->setItem(i, 2, cell(formatDuration(r.measured)));
    m_table->setItem(i, 3, cell(r.error ? QStringLiteral("%1%2%").arg(*r.error > 0 ? "+" : "").arg(100 * *r.error, 0, 'f', 1)
                                        : QStringLiteral("-")));
    m_table->setItem(i, 4, cell(QString::number(r.matched)));
  }
}

}  // namespace megascope::gui
