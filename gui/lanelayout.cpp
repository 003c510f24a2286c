#include "gui/lanelayout.hpp"

#include <algorithm>
#include <set>

namespace megascope::gui {

void LaneLayout::build(const TimelineData& data, const QSet<int>& collapsedStages) {
  m_rows.clear();
  double y = 0;
  std::size_t i = 0;
  while (i < data.lanes.size()) {
    const int stage = data.lanes[i].stage;
    std::size_t j = i;
    std::set<int> ranks;
    while (j < data.lanes.size() && data.lanes[j].stage == stage) ranks.insert(data.lanes[j++].rank);
    const bool collapsed = collapsedStages.contains(stage);
    LaneRow h;
    h.header = true;
    h.stage = stage;
    h.y = y;
    h.height = headerHeight;
    QString rankList;
    int shown = 0;
    for (int r : ranks) {
      if (shown++ == 4) {
        rankList += QStringLiteral(", ...");
        break;
      }
      rankList += (rankList.isEmpty() ? QString() : QStringLiteral(", ")) + QString::number(r);
    }
    h.label = QStringLiteral("%1 stage %2  (rank%3 %4)")
                  .arg(collapsed ? QStringLiteral("\u25b8") : QStringLiteral("\u25be"))
                  .arg(stage)
                  .arg(ranks.size() > 1 ? QStringLiteral("s") : QString())
                  .arg(rankList);
    if (collapsed) {
      for (std::size_t k = i; k < j; ++k)
        if (data.lanes[k].stream == Stream::compute) {
          h.lane = static_cast<int>(k);
          break;
        }
    }
    m_rows.push_back(h);
    y += headerHeight + gap;
    if (!collapsed) {
      for (std::size_t k = i; k < j; ++k) {
        LaneRow r;
        r.stage = stage;
        r.lane = static_cast<int>(k);
        r.y = y;
        r.height = laneHeight;
        r.label = data.lanes[k].title();
        m_rows.push_back(r);
        y += laneHeight + gap;
      }
    }
    i = j;
  }
  m_total = y;
}

int LaneLayout::rowAt(double y) const {
  auto it = std::upper_bound(m_rows.begin(), m_rows.end(), y, [](double v, const LaneRow& r) { return v < r.y; });
  if (it == m_rows.begin()) return -1;
  --it;
  if (y >= it->y + it->height) return -1;   // in the gap
  return static_cast<int>(it - m_rows.begin());
}

std::pair<int, int> LaneLayout::rowsIn(double top, double bottom) const {
  auto first = std::lower_bound(m_rows.begin(), m_rows.end(), top,
                                [](const LaneRow& r, double v) { return r.y + r.height <= v; });
  auto last = std::lower_bound(first, m_rows.end(), bottom, [](const LaneRow& r, double v) { return r.y < v; });
  return {static_cast<int>(first - m_rows.begin()), static_cast<int>(last - m_rows.begin())};
}

int LaneLayout::laneRowCount() const {
  return static_cast<int>(std::count_if(m_rows.begin(), m_rows.end(), [](const LaneRow& r) { return !r.header; }));
}

}  // namespace megascope::gui
