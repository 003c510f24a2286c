#include "gui/timescale.hpp"

#include <algorithm>
#include <cmath>

namespace megascope::gui {

void TimeScale::setDuration(double seconds) {
  m_duration = seconds > 0 ? seconds : 1e-9;
  setVisible(m_visible);
}

void TimeScale::setWidth(double pixels) { m_width = std::max(1.0, pixels); }

double TimeScale::minimumSpan() const { return std::max(1e-9, m_duration * 1e-9); }

void TimeScale::setVisible(TimeRange r) {
  const double minSpan = minimumSpan();
  if (r.end < r.start) std::swap(r.start, r.end);
  double len = std::clamp(r.length(), minSpan, m_duration);
  double mid = 0.5 * (r.start + r.end);
  double start = mid - 0.5 * len;
  start = std::clamp(start, 0.0, m_duration - len);
  m_visible = {start, start + len};
}

bool TimeScale::showsAll() const {
  return m_visible.start <= 0 && m_visible.end >= m_duration * (1 - 1e-12);
}

void TimeScale::zoomAt(double x, double factor) {
  if (factor <= 0) return;
  const double t = xToTime(x);
  const double len = std::clamp(m_visible.length() / factor, minimumSpan(), m_duration);
  const double frac = std::clamp(x / m_width, 0.0, 1.0);
  double start = t - frac * len;
  start = std::clamp(start, 0.0, m_duration - len);
  m_visible = {start, start + len};
}

void TimeScale::panPixels(double dx) {
  const double len = m_visible.length();
  double start = m_visible.start + dx / pixelsPerSecond();
  start = std::clamp(start, 0.0, m_duration - len);
  m_visible = {start, start + len};
}

bool ZoomStack::pop(TimeRange& out) {
  if (m_stack.empty()) return false;
  out = m_stack.back();
  m_stack.pop_back();
  return true;
}

double niceStep(double rawStep) {
  if (!(rawStep > 0)) return 1;
  const double p = std::pow(10.0, std::floor(std::log10(rawStep)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= rawStep * (1 - 1e-9)) return m * p;
  return 10 * p;
}

QString formatDuration(double seconds, int significant) {
  const double a = std::fabs(seconds);
  struct Unit { double scale; const char* name; };
  static const Unit units[] = {{1, "s"}, {1e-3, "ms"}, {1e-6, "us"}, {1e-9, "ns"}};
  if (a == 0) return QStringLiteral("0 s");
  for (const Unit& u : units)
    if (a >= u.scale * (1 - 1e-9) || u.scale == 1e-9)
      return QString::number(seconds / u.scale, 'g', significant) + QLatin1Char(' ') + QLatin1String(u.name);
  return QString::number(seconds, 'g', significant) + QStringLiteral(" s");
}

std::vector<AxisTick> axisTicks(const TimeScale& scale, double minSpacingPx) {
  std::vector<AxisTick> ticks;
  const TimeRange v = scale.visible();
  const double step = niceStep(minSpacingPx / scale.pixelsPerSecond());
  const double first = std::ceil(v.start / step - 1e-9) * step;
  for (double t = first; t <= v.end + step * 1e-9; t += step) {
    const double snapped = std::round(t / step) * step;
    // Enough digits that adjacent labels differ: the step's magnitude relative to t.
    const int digits = std::clamp(static_cast<int>(std::ceil(std::log10(std::max(std::fabs(snapped), step) / step))) + 2,
                                  3, 12);
    ticks.push_back({snapped, scale.timeToX(snapped), formatDuration(snapped, digits)});
    if (ticks.size() > 10000) break;
  }
  return ticks;
}

}  // namespace megascope::gui
