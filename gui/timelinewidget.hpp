// TimelineWidget: draws a TimelineData. A lane per rank and stream, grouped
// by pipeline stage (click a stage header to collapse it), spans coloured by
// kind and labelled with their micro-batch, a time axis with units and a
// legend. Wheel zooms at the cursor, a rubber band (right button, or Shift +
// left button) zooms to a range, left drag pans, Backspace steps back out,
// Home shows everything; hovering a span shows its op's details.
//
// The geometry lives in TimeScale, ZoomStack, LaneLayout and levelOfDetail();
// paint only draws what they return.
#pragma once

#include <QElapsedTimer>
#include <QSet>
#include <QWidget>

#include <memory>
#include <optional>
#include <vector>

#include "gui/lanelayout.hpp"
#include "gui/lod.hpp"
#include "gui/timelinedata.hpp"
#include "gui/timescale.hpp"

class QScrollBar;

namespace megascope::gui {

class TimelineWidget : public QWidget {
  Q_OBJECT
 public:
  static constexpr int kLabelWidth = 190;
  static constexpr int kAxisHeight = 26;
  static constexpr int kLegendHeight = 20;

  explicit TimelineWidget(QWidget* parent = nullptr);

  // Keeps the visible range when the new data covers it, else shows all.
  void setData(std::shared_ptr<const TimelineData> data);
  [[nodiscard]] const TimelineData* data() const { return m_data.get(); }
  [[nodiscard]] const TimeScale& scale() const { return m_scale; }
  [[nodiscard]] const LaneLayout& layout() const { return m_layout; }
  void setVisibleRange(TimeRange r);
  void zoomOut();          // back to the previous range
  void showAll();
  void toggleStage(int stage);
  void setCollapsedStages(const QSet<int>& stages);
  void setTitle(const QString& title);
  [[nodiscard]] const QString& title() const { return m_title; }

  // Draws the whole timeline (every lane, no scrolling) into `painter`,
  // `size` wide, for PNG and SVG export; returns the height used.
  int renderAll(QPainter& painter, int width);
  [[nodiscard]] int fullHeight() const;

  [[nodiscard]] QSize sizeHint() const override { return {1200, 700}; }

 signals:
  void rendered();        // after each paint that drew data
  void rangeChanged(megascope::gui::TimeRange range);

 protected:
  void paintEvent(QPaintEvent* e) override;
  void resizeEvent(QResizeEvent* e) override;
  void wheelEvent(QWheelEvent* e) override;
  void mousePressEvent(QMouseEvent* e) override;
  void mouseMoveEvent(QMouseEvent* e) override;
  void mouseReleaseEvent(QMouseEvent* e) override;
  void mouseDoubleClickEvent(QMouseEvent* e) override;
  void keyPressEvent(QKeyEvent* e) override;
  bool event(QEvent* e) override;

 private:
  void paintContents(QPainter& p, int width, int height, double scrollY);
  void updateGeometry();
  [[nodiscard]] double lanesTop() const { return kAxisHeight + kLegendHeight + (m_title.isEmpty() ? 0 : 20); }
  [[nodiscard]] double plotWidth(int widgetWidth) const;
  void changed();

  std::shared_ptr<const TimelineData> m_data;
  TimeScale m_scale;
  ZoomStack m_zoom;
  LaneLayout m_layout;
  QSet<int> m_collapsed;
  QScrollBar* m_vbar = nullptr;
  QString m_title;
  std::vector<DrawItem> m_items;   // scratch for levelOfDetail
  std::vector<LabelRun> m_runs;    // scratch for labelRuns

  enum class Drag { none, pan, band };
  Drag m_drag = Drag::none;
  QPoint m_pressPos, m_lastPos;
  bool m_moved = false;
};

}  // namespace megascope::gui
