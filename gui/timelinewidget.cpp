#include "gui/timelinewidget.hpp"

#include <QHelpEvent>
#include <QKeyEvent>
#include <QMouseEvent>
#include <QPainter>
#include <QScrollBar>
#include <QToolTip>
#include <QWheelEvent>

#include <cmath>

namespace megascope::gui {

namespace {
constexpr int kScrollBarWidth = 14;
const QColor kBackground(0xfb, 0xfb, 0xfb);
const QColor kHeaderBackground(0xe4, 0xe8, 0xee);
const QColor kLaneBackground(0xf1, 0xf3, 0xf6);
const QColor kGrid(0xd0, 0xd4, 0xda);
const QColor kText(0x20, 0x24, 0x2a);

QColor textColorOn(const QColor& c) { return c.lightness() > 150 ? QColor(0x20, 0x20, 0x20) : Qt::white; }
}  // namespace

TimelineWidget::TimelineWidget(QWidget* parent) : QWidget(parent) {
  setMouseTracking(true);
  setFocusPolicy(Qt::StrongFocus);
  setAttribute(Qt::WA_OpaquePaintEvent);
  m_vbar = new QScrollBar(Qt::Vertical, this);
  connect(m_vbar, &QScrollBar::valueChanged, this, [this] { update(); });
  setMinimumSize(400, 200);
}

void TimelineWidget::setTitle(const QString& title) {
  m_title = title;
  updateGeometry();
  update();
}

double TimelineWidget::plotWidth(int widgetWidth) const {
  return std::max(10.0, static_cast<double>(widgetWidth - kLabelWidth - kScrollBarWidth));
}

void TimelineWidget::setData(std::shared_ptr<const TimelineData> data) {
  const bool keep = m_data && data && !m_scale.showsAll() && m_scale.visible().end <= data->duration;
  const TimeRange old = m_scale.visible();
  m_data = std::move(data);
  m_scale.setDuration(m_data ? std::max(m_data->duration, 1e-9) : 1.0);
  if (keep) m_scale.setVisible(old);
  else {
    m_scale.showAll();
    m_zoom.clear();
  }
  if (m_data) m_layout.build(*m_data, m_collapsed);
  updateGeometry();
  update();
}

void TimelineWidget::setCollapsedStages(const QSet<int>& stages) {
  m_collapsed = stages;
  if (m_data) m_layout.build(*m_data, m_collapsed);
  updateGeometry();
  update();
}

void TimelineWidget::toggleStage(int stage) {
  if (m_collapsed.contains(stage)) m_collapsed.remove(stage);
  else m_collapsed.insert(stage);
  setCollapsedStages(m_collapsed);
}

void TimelineWidget::setVisibleRange(TimeRange r) {
  m_scale.setVisible(r);
  changed();
}

void TimelineWidget::zoomOut() {
  TimeRange r;
  if (m_zoom.pop(r)) m_scale.setVisible(r);
  else m_scale.showAll();
  changed();
}

void TimelineWidget::showAll() {
  m_zoom.clear();
  m_scale.showAll();
  changed();
}

void TimelineWidget::changed() {
  emit rangeChanged(m_scale.visible());
  update();
}

void TimelineWidget::updateGeometry() {
  m_scale.setWidth(plotWidth(width()));
  m_vbar->setGeometry(width() - kScrollBarWidth, static_cast<int>(lanesTop()), kScrollBarWidth,
                      std::max(0, height() - static_cast<int>(lanesTop())));
  const int visibleLanes = height() - static_cast<int>(lanesTop());
  const int range = std::max(0, static_cast<int>(std::ceil(m_layout.totalHeight())) - visibleLanes);
  m_vbar->setRange(0, range);
  m_vbar->setPageStep(std::max(1, visibleLanes));
  m_vbar->setSingleStep(20);
  m_vbar->setVisible(range > 0);
}

void TimelineWidget::resizeEvent(QResizeEvent*) { updateGeometry(); }

int TimelineWidget::fullHeight() const { return static_cast<int>(lanesTop() + m_layout.totalHeight()) + 4; }

void TimelineWidget::paintEvent(QPaintEvent*) {
  QPainter p(this);
  paintContents(p, width(), height(), m_vbar->isVisible() ? m_vbar->value() : 0);
  if (m_drag == Drag::band && m_moved) {
    const int x0 = std::max(kLabelWidth, std::min(m_pressPos.x(), m_lastPos.x()));
    const int x1 = std::max(m_pressPos.x(), m_lastPos.x());
    p.fillRect(QRect(x0, static_cast<int>(lanesTop()), x1 - x0, height()), QColor(60, 120, 220, 50));
    p.setPen(QColor(60, 120, 220));
    p.drawRect(QRect(x0, static_cast<int>(lanesTop()), x1 - x0, height() - static_cast<int>(lanesTop()) - 1));
  }
  if (m_data) emit rendered();
}

int TimelineWidget::renderAll(QPainter& painter, int w) {
  const TimeScale saved = m_scale;
  m_scale.setWidth(plotWidth(w));
  const int h = fullHeight();
  paintContents(painter, w, h, 0);
  m_scale = saved;
  return h;
}

void TimelineWidget::paintContents(QPainter& p, int w, int h, double scrollY) {
  m_scale.setWidth(plotWidth(w));
  p.fillRect(QRect(0, 0, w, h), kBackground);
  QFont small = font();
  small.setPointSizeF(std::max(6.0, small.pointSizeF() * 0.85));
  p.setFont(small);
  const QFontMetrics fm(small);
  const double plotLeft = kLabelWidth;
  const double plotRight = plotLeft + m_scale.width();
  double top = 0;
  if (!m_title.isEmpty()) {
    QFont bold = small;
    bold.setBold(true);
    p.setFont(bold);
    p.setPen(kText);
    p.drawText(QRectF(6, 0, w - 12, 20), Qt::AlignVCenter | Qt::AlignLeft, m_title);
    p.setFont(small);
    top = 20;
  }
  if (!m_data) {
    p.setPen(kText);
    p.drawText(QRect(0, 0, w, h), Qt::AlignCenter, QStringLiteral("No timeline yet: simulating..."));
    return;
  }

  // Legend.
  double lx = 6;
  for (SpanKind k : allSpanKinds()) {
    if (k == SpanKind::other) continue;
    const QString name = spanKindName(k);
    p.fillRect(QRectF(lx, top + 5, 12, 10), spanKindColor(k));
    p.setPen(kText);
    p.drawText(QPointF(lx + 16, top + 14), name);
    lx += 16 + fm.horizontalAdvance(name) + 14;
  }
  top += kLegendHeight;

  // Axis.
  const double axisTop = top;
  const double lanes0 = lanesTop();
  const std::vector<AxisTick> ticks = axisTicks(m_scale, std::max(90.0, fm.horizontalAdvance(QStringLiteral("00.000 ms")) * 1.4));
  p.setPen(kText);
  p.drawText(QRectF(6, axisTop, plotLeft - 12, kAxisHeight), Qt::AlignVCenter | Qt::AlignLeft,
             QStringLiteral("%1 spans, %2").arg(m_data->spanCount).arg(formatDuration(m_data->duration)));
  for (const AxisTick& t : ticks) {
    const double x = plotLeft + t.x;
    if (x < plotLeft - 0.5 || x > plotRight + 0.5) continue;
    p.setPen(kGrid);
    p.drawLine(QPointF(x, axisTop + kAxisHeight - 6), QPointF(x, h));
    p.setPen(kText);
    p.drawText(QPointF(x + 3, axisTop + kAxisHeight - 9), t.label);
  }
  p.setPen(kGrid);
  p.drawLine(QPointF(plotLeft, lanes0 - 1), QPointF(plotRight, lanes0 - 1));

  // Lanes.
  p.save();
  p.setClipRect(QRectF(0, lanes0, w, h - lanes0));
  const auto [first, last] = m_layout.rowsIn(scrollY, scrollY + (h - lanes0));
  for (int i = first; i < last; ++i) {
    const LaneRow& row = m_layout.rows()[static_cast<std::size_t>(i)];
    const double y = lanes0 + row.y - scrollY;
    if (row.header) {
      p.fillRect(QRectF(0, y, plotRight, row.height), kHeaderBackground);
      QFont bold = small;
      bold.setBold(true);
      p.setFont(bold);
      p.setPen(kText);
      p.drawText(QRectF(4, y, plotLeft - 8, row.height), Qt::AlignVCenter | Qt::AlignLeft, row.label);
      p.setFont(small);
    } else {
      p.fillRect(QRectF(plotLeft, y, plotRight - plotLeft, row.height), kLaneBackground);
      p.setPen(kText);
      p.drawText(QRectF(14, y, plotLeft - 18, row.height), Qt::AlignVCenter | Qt::AlignLeft, row.label);
    }
    if (row.lane < 0) continue;
    const TimelineLane& lane = m_data->lanes[static_cast<std::size_t>(row.lane)];
    levelOfDetail(lane, m_scale, m_items);
    const double sy = y + (row.header ? 4 : 1);
    const double sh = row.height - (row.header ? 8 : 2);
    p.save();
    p.setClipRect(QRectF(plotLeft, y, plotRight - plotLeft, row.height));
    for (const DrawItem& it : m_items) {
      const QRectF r(plotLeft + it.x0, sy, it.x1 - it.x0, sh);
      const QColor c = spanKindColor(it.kind);
      p.fillRect(r, c);
      if (it.span < 0 && it.secondShare > 0) {
        const double h2 = std::round(r.height() * it.secondShare);
        if (h2 >= 1) p.fillRect(QRectF(r.left(), r.bottom() - h2, r.width(), h2), spanKindColor(it.second));
      }
      if (it.span < 0 || row.header) continue;
      if (r.width() > 6) {
        p.setPen(c.darker(140));
        p.drawLine(r.topLeft(), r.bottomLeft());
      }
    }
    if (!row.header) {
      labelRuns(m_items, m_runs);
      for (const LabelRun& run : m_runs) {
        if (run.x1 - run.x0 < 12) continue;
        const QString text = QString::number(run.microbatch);
        if (fm.horizontalAdvance(text) + 4 >= run.x1 - run.x0) continue;
        p.setPen(textColorOn(spanKindColor(run.kind)));
        p.drawText(QRectF(plotLeft + run.x0, sy, run.x1 - run.x0, sh), Qt::AlignCenter, text);
      }
    }
    p.restore();
  }
  p.restore();
  // Label column separator.
  p.setPen(kGrid);
  p.drawLine(QPointF(plotLeft - 0.5, axisTop), QPointF(plotLeft - 0.5, h));
}

void TimelineWidget::wheelEvent(QWheelEvent* e) {
  const QPointF pos = e->position();
  const QPoint d = e->angleDelta();
  if (e->modifiers() & Qt::ShiftModifier) {
    m_vbar->setValue(m_vbar->value() - d.y() / 2);
  } else if (d.x() != 0 && d.y() == 0) {
    m_scale.panPixels(-d.x());
    changed();
  } else if (d.y() != 0) {
    m_scale.zoomAt(pos.x() - kLabelWidth, std::pow(1.0015, d.y()));
    changed();
  }
  e->accept();
}

void TimelineWidget::mousePressEvent(QMouseEvent* e) {
  m_pressPos = m_lastPos = e->pos();
  m_moved = false;
  const bool band = e->button() == Qt::RightButton ||
                    (e->button() == Qt::LeftButton && (e->modifiers() & Qt::ShiftModifier));
  m_drag = band ? Drag::band : (e->button() == Qt::LeftButton ? Drag::pan : Drag::none);
}

void TimelineWidget::mouseMoveEvent(QMouseEvent* e) {
  if (m_drag == Drag::none) return;
  const QPoint d = e->pos() - m_lastPos;
  m_lastPos = e->pos();
  if ((e->pos() - m_pressPos).manhattanLength() > 3) m_moved = true;
  if (m_drag == Drag::pan && m_moved) {
    m_scale.panPixels(-d.x());
    m_vbar->setValue(m_vbar->value() - d.y());
    changed();
  } else if (m_drag == Drag::band) {
    update();
  }
}

void TimelineWidget::mouseReleaseEvent(QMouseEvent* e) {
  const Drag drag = m_drag;
  m_drag = Drag::none;
  if (drag == Drag::band && m_moved) {
    const double x0 = std::min(m_pressPos.x(), e->pos().x()) - kLabelWidth;
    const double x1 = std::max(m_pressPos.x(), e->pos().x()) - kLabelWidth;
    if (x1 - x0 >= 3) {
      m_zoom.push(m_scale.visible());
      m_scale.setVisible({m_scale.xToTime(std::max(0.0, x0)), m_scale.xToTime(x1)});
    }
    changed();
    return;
  }
  if (drag == Drag::band && !m_moved && e->button() == Qt::RightButton) {
    zoomOut();
    return;
  }
  if (drag == Drag::pan && !m_moved && m_data) {
    const double scrollY = m_vbar->isVisible() ? m_vbar->value() : 0;
    const int row = m_layout.rowAt(e->pos().y() - lanesTop() + scrollY);
    if (row >= 0 && m_layout.rows()[static_cast<std::size_t>(row)].header)
      toggleStage(m_layout.rows()[static_cast<std::size_t>(row)].stage);
  }
  update();
}

void TimelineWidget::mouseDoubleClickEvent(QMouseEvent* e) {
  if (e->pos().x() > kLabelWidth) showAll();
}

void TimelineWidget::keyPressEvent(QKeyEvent* e) {
  switch (e->key()) {
    case Qt::Key_Backspace:
    case Qt::Key_Escape: zoomOut(); break;
    case Qt::Key_Home: showAll(); break;
    case Qt::Key_Plus:
    case Qt::Key_Equal: m_scale.zoomAt(m_scale.width() / 2, 1.5); changed(); break;
    case Qt::Key_Minus: m_scale.zoomAt(m_scale.width() / 2, 1 / 1.5); changed(); break;
    case Qt::Key_Left: m_scale.panPixels(-m_scale.width() / 8); changed(); break;
    case Qt::Key_Right: m_scale.panPixels(m_scale.width() / 8); changed(); break;
    default: QWidget::keyPressEvent(e);
  }
}

bool TimelineWidget::event(QEvent* e) {
  if (e->type() == QEvent::ToolTip && m_data) {
    auto* he = static_cast<QHelpEvent*>(e);
    const double scrollY = m_vbar->isVisible() ? m_vbar->value() : 0;
    const int row = m_layout.rowAt(he->pos().y() - lanesTop() + scrollY);
    const double x = he->pos().x() - kLabelWidth;
    if (row >= 0 && x >= 0) {
      const LaneRow& r = m_layout.rows()[static_cast<std::size_t>(row)];
      if (r.lane >= 0) {
        const double t = m_scale.xToTime(x);
        const int span = m_data->spanAt(r.lane, t, 3 / m_scale.pixelsPerSecond());
        if (span >= 0) {
          QToolTip::showText(he->globalPos(), m_data->describe(r.lane, span), this);
          return true;
        }
      }
    }
    QToolTip::hideText();
    e->ignore();
    return true;
  }
  return QWidget::event(e);
}

}  // namespace megascope::gui
