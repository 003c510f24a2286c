// TimeScale: the visible time range of a timeline and its mapping to pixels;
// ZoomStack: the ranges a user zoomed through, to step back out; axis ticks
// at "nice" steps (1, 2, 5 x 10^k seconds) with unit labels (s, ms, us, ns).
// Plain geometry: no widgets, tested on its own.
#pragma once

#include <QString>

#include <vector>

namespace megascope::gui {

struct TimeRange {
  double start = 0, end = 1;   // seconds
  [[nodiscard]] double length() const { return end - start; }
  bool operator==(const TimeRange&) const = default;
};

class TimeScale {
 public:
  // The whole iteration [0, duration] is the outermost view.
  void setDuration(double seconds);
  void setWidth(double pixels);      // drawing area width, x measured from its left edge
  [[nodiscard]] double duration() const { return m_duration; }
  [[nodiscard]] double width() const { return m_width; }

  [[nodiscard]] TimeRange visible() const { return m_visible; }
  void setVisible(TimeRange r);      // clamped to [0, duration], at least minimumSpan() long
  void showAll() { setVisible({0, m_duration}); }
  [[nodiscard]] bool showsAll() const;

  [[nodiscard]] double timeToX(double t) const { return (t - m_visible.start) * pixelsPerSecond(); }
  [[nodiscard]] double xToTime(double x) const { return m_visible.start + x / pixelsPerSecond(); }
  [[nodiscard]] double pixelsPerSecond() const { return m_width / m_visible.length(); }

  // Zooms by `factor` (> 1 zooms in) keeping the time under pixel x fixed.
  void zoomAt(double x, double factor);
  // Moves the view by `dx` pixels (positive: towards later times), clamped.
  void panPixels(double dx);
  // Shortest visible range: 1 ns or duration / 1e9, whichever is larger.
  [[nodiscard]] double minimumSpan() const;

 private:
  double m_duration = 1;
  double m_width = 1;
  TimeRange m_visible{0, 1};
};

class ZoomStack {
 public:
  void push(TimeRange r) { m_stack.push_back(r); }
  // The previous range, or nothing when the stack is empty.
  bool pop(TimeRange& out);
  void clear() { m_stack.clear(); }
  [[nodiscard]] int depth() const { return static_cast<int>(m_stack.size()); }

 private:
  std::vector<TimeRange> m_stack;
};

struct AxisTick {
  double time = 0;   // seconds
  double x = 0;      // pixels
  QString label;     // "250 ms"
};

// Ticks at a 1/2/5 step chosen so that ticks are at least `minSpacingPx` apart.
std::vector<AxisTick> axisTicks(const TimeScale& scale, double minSpacingPx = 80);
// The step axisTicks uses for a visible length and width.
double niceStep(double rawStep);
// "18.43 s", "250 ms", "12.5 us", "800 ns": a duration in the unit that fits.
QString formatDuration(double seconds, int significant = 4);

}  // namespace megascope::gui
