// LaneLayout: where each lane of a TimelineData goes vertically. Lanes are
// grouped by pipeline stage under a header row; a collapsed group shows only
// its header, which then summarises the group with the compute lane of its
// first rank. Plain geometry: no widgets.
#pragma once

#include <QSet>
#include <QString>

#include <vector>

#include "gui/timelinedata.hpp"

namespace megascope::gui {

struct LaneRow {
  bool header = false;
  int stage = 0;
  int lane = -1;          // lane drawn in this row (a header's summary lane when collapsed), or -1
  double y = 0;           // top, pixels from the top of the lane area
  double height = 0;
  QString label;
};

class LaneLayout {
 public:
  double laneHeight = 18;
  double headerHeight = 20;
  double gap = 2;

  void build(const TimelineData& data, const QSet<int>& collapsedStages);
  [[nodiscard]] const std::vector<LaneRow>& rows() const { return m_rows; }
  [[nodiscard]] double totalHeight() const { return m_total; }
  // Row under y (pixels from the top of the lane area), or -1.
  [[nodiscard]] int rowAt(double y) const;
  // Rows intersecting [top, bottom): first and one past the last.
  [[nodiscard]] std::pair<int, int> rowsIn(double top, double bottom) const;
  [[nodiscard]] int laneRowCount() const;   // rows that are lanes (not headers)

 private:
  std::vector<LaneRow> m_rows;
  double m_total = 0;
};

}  // namespace megascope::gui
