// The SVG of `megascope sweep --plot`: two panels sharing the x axis,
// tokens/s above and MFU below, one line per series, written by hand (no
// plotting library). Geometry only; the data come from apps/sweep.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "apps/sweep.hpp"

namespace megascope::cli {

namespace {

std::string xml(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

// A "nice" step (1, 2 or 5 times a power of ten) giving about `n` ticks up to `hi`.
double nice_step(double hi, int n) {
  const double raw = hi / n;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * p >= raw) return m * p;
  return 10 * p;
}

std::string si_label(double v) {
  auto trim = [](std::string s) {
    if (s.find('.') != std::string::npos) {
      while (s.back() == '0') s.pop_back();
      if (s.back() == '.') s.pop_back();
    }
    return s;
  };
  if (v >= 1e9) return trim(fmt::format("{:.2f}", v / 1e9)) + "G";
  if (v >= 1e6) return trim(fmt::format("{:.2f}", v / 1e6)) + "M";
  if (v >= 1e3) return trim(fmt::format("{:.2f}", v / 1e3)) + "k";
  return trim(fmt::format("{:.2f}", v));
}

std::string x_label(SweepVar v) {
  switch (v) {
    case SweepVar::gpus:
      return "GPUs";
    case SweepVar::nic_gbps:
      return "NIC bandwidth (Gb/s per NIC, per direction)";
    case SweepVar::gpus_per_node:
      return "GPUs per node";
    case SweepVar::scale_up_domain:
      return "scale-up (NVLink) domain (GPUs)";
    case SweepVar::device:
      return "device";
    case SweepVar::cluster:
      return "cluster";
    case SweepVar::model:
      return "model";
  }
  return "";
}

std::string series_label(SweepVar v, const std::string& value) {
  switch (v) {
    case SweepVar::gpus:
      return value + " GPUs";
    case SweepVar::nic_gbps:
      return "NIC " + value + " Gb/s";
    case SweepVar::gpus_per_node:
      return value + " GPUs/node";
    case SweepVar::scale_up_domain:
      return "NVLink domain " + value;
    default:
      return value;
  }
}

}  // namespace

std::string sweep_svg(const SweepPlotData& d) {
  static constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                            "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  const std::size_t xi = static_cast<std::size_t>(d.x);

  // x positions: numeric variables by value (log2 when they span 4x or more), others by order of appearance.
  std::vector<std::string> categories;
  for (const SweepRow& r : d.rows)
    if (std::find(categories.begin(), categories.end(), r.values[xi]) == categories.end())
      categories.push_back(r.values[xi]);
  const bool is_numeric = numeric(d.x);
  double lo = 0, hi = 0;
  bool log2x = false;
  if (is_numeric) {
    lo = hi = std::stod(categories.front());
    for (const std::string& c : categories) {
      lo = std::min(lo, std::stod(c));
      hi = std::max(hi, std::stod(c));
    }
    log2x = lo > 0 && hi / lo >= 4;
  }
  auto xval = [&](const std::string& v) {
    if (!is_numeric)
      return static_cast<double>(std::find(categories.begin(), categories.end(), v) - categories.begin());
    return log2x ? std::log2(std::stod(v)) : std::stod(v);
  };
  double x0 = 0, x1 = 0;
  if (!is_numeric) {
    x0 = -0.5;
    x1 = static_cast<double>(categories.size()) - 0.5;
  } else {
    x0 = log2x ? std::log2(lo) : lo;
    x1 = log2x ? std::log2(hi) : hi;
    const double pad = x1 > x0 ? 0.06 * (x1 - x0) : (log2x ? 0.5 : std::max(1.0, 0.1 * x0));
    x0 -= pad;
    x1 += pad;
  }

  // Series: one per combination of the other swept variables, in order of appearance.
  std::vector<std::string> series;
  std::vector<std::size_t> series_of;
  for (const SweepRow& r : d.rows) {
    std::vector<std::string> parts;
    for (SweepVar v : d.series_vars) parts.push_back(series_label(v, r.values[static_cast<std::size_t>(v)]));
    const std::string name = parts.empty() ? "best plan" : fmt::format("{}", fmt::join(parts, ", "));
    auto it = std::find(series.begin(), series.end(), name);
    series_of.push_back(static_cast<std::size_t>(it - series.begin()));
    if (it == series.end()) series.push_back(name);
  }
  const bool legend = series.size() > 1 || std::any_of(d.rows.begin(), d.rows.end(), [](const SweepRow& r) {
                        return r.result.status != SweepResult::Status::ok;
                      });
  std::size_t legend_chars = 0;
  for (const std::string& s : series) legend_chars = std::max(legend_chars, s.size());
  legend_chars = std::max<std::size_t>(legend_chars, 12);

  const double left = 90, plot_w = 640, right = legend ? 60 + 7.5 * static_cast<double>(legend_chars) : 30;
  const double width = left + plot_w + right;
  // The subtitle, wrapped after commas to the width of the figure (about 6.5 px a character).
  const std::size_t chars = static_cast<std::size_t>((width - left - 10) / 6.5);
  std::vector<std::string> sub(1);
  for (std::string part : split_commas(d.title)) {
    if (!sub.back().empty() && sub.back().size() + part.size() + 1 > chars) {
      sub.back() += ",";
      sub.emplace_back();
      part.erase(0, std::min(part.size(), part.find_first_not_of(' ')));
    } else if (!sub.back().empty()) {
      part = "," + part;
    }
    sub.back() += part;
  }
  const double top = 56 + 16.0 * static_cast<double>(sub.size());
  std::size_t longest = 0;
  for (const std::string& c : categories) longest = std::max(longest, c.size());
  const double spacing = plot_w / static_cast<double>(std::max<std::size_t>(1, categories.size()));
  const bool rotate = 7.0 * static_cast<double>(longest) > spacing;
  const double xlabels_h = rotate ? 10 + 6.0 * static_cast<double>(std::min<std::size_t>(longest, 30)) : 24;
  const double panel_h = 250, gap = xlabels_h + 16;   // the top panel's x labels sit in the gap
  const double height = top + 2 * panel_h + gap + xlabels_h + 40;
  auto px = [&](double v) { return left + (v - x0) / (x1 - x0) * plot_w; };

  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" viewBox=\"0 0 {:.0f} {:.0f}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      width, height, width, height);
  s += fmt::format(
      "<text x=\"{:.1f}\" y=\"24\" font-size=\"15\" font-weight=\"bold\">megascope sweep: best plan at each "
      "point</text>\n",
      left);
  for (std::size_t i = 0; i < sub.size(); ++i)
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.0f}\" fill=\"#444\">{}</text>\n", left,
                     44 + 16.0 * static_cast<double>(i), xml(sub[i]));

  // x ticks: every value when there are at most 12, else powers of two (log) or nice steps.
  std::vector<std::pair<double, std::string>> xticks;
  if (!is_numeric || categories.size() <= 12) {
    for (const std::string& c : categories) xticks.push_back({xval(c), c});
  } else if (log2x) {
    for (double e = std::ceil(x0); e <= x1; e += 1) xticks.push_back({e, fmt::format("{:g}", std::exp2(e))});
  } else {
    const double step = nice_step(x1 - x0, 8);
    for (double v = std::ceil(x0 / step) * step; v <= x1; v += step) xticks.push_back({v, fmt::format("{:g}", v)});
  }

  // Throughput per GPU, not in total: linear scaling is a flat line, on a
  // log or a linear GPU axis alike.
  struct Panel {
    const char* label;
    double (*value)(const SweepRow&);
    bool percent;
  };
  const Panel panels[] = {{"throughput per GPU (tokens/s)",
                           [](const SweepRow& r) {
                             return r.result.tokens_per_s / std::stod(r.values[static_cast<std::size_t>(SweepVar::gpus)]);
                           },
                           false},
                          {"MFU (% of dense BF16 peak)", [](const SweepRow& r) { return 100 * r.result.mfu; }, true}};
  for (int k = 0; k < 2; ++k) {
    const Panel& p = panels[k];
    const double y0 = top + k * (panel_h + gap);  // panel top
    double ymax = 0;
    for (const SweepRow& r : d.rows)
      if (r.result.status == SweepResult::Status::ok) ymax = std::max(ymax, p.value(r));
    if (!(ymax > 0)) ymax = p.percent ? 100 : 1;
    const double step = nice_step(ymax * 1.05, 5);
    const double ytop = std::ceil(ymax * 1.05 / step) * step;
    auto py = [&](double v) { return y0 + panel_h - v / ytop * panel_h; };
    s += fmt::format("<g class=\"panel\" id=\"{}\">\n", k == 0 ? "throughput" : "mfu");
    for (double v = 0; v <= ytop + step * 1e-9; v += step) {
      s += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#e5e5e5\"/>\n", left,
                       py(v), left + plot_w, py(v));
      s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", left - 6, py(v) + 4,
                       p.percent ? fmt::format("{:g}", v) : si_label(v));
    }
    for (const auto& [v, label] : xticks) {
      s += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#e5e5e5\"/>\n", px(v),
                       y0, px(v), y0 + panel_h);
      s += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"black\"/>\n", px(v),
                       y0 + panel_h, px(v), y0 + panel_h + 5);
      {   // both panels carry the x labels
        const double ty = y0 + panel_h + 18;
        if (rotate)
          s += fmt::format(
              "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" transform=\"rotate(-35 {:.1f} {:.1f})\">{}</text>\n",
              px(v), ty, px(v), ty, xml(label));
        else
          s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", px(v), ty, xml(label));
      }
    }
    s += fmt::format(
        "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" stroke=\"black\"/>\n", left,
        y0, plot_w, panel_h);
    const double ly = y0 + panel_h / 2;
    s += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" transform=\"rotate(-90 {:.1f} {:.1f})\">{}</text>\n",
        left - 62, ly, left - 62, ly, p.label);
    // One polyline per run of consecutive fitting points of a series; a cross on the axis where no plan fits.
    for (std::size_t sidx = 0; sidx < series.size(); ++sidx) {
      const char* color = kColors[sidx % std::size(kColors)];
      std::vector<const SweepRow*> rows;
      for (std::size_t i = 0; i < d.rows.size(); ++i)
        if (series_of[i] == sidx) rows.push_back(&d.rows[i]);
      std::stable_sort(rows.begin(), rows.end(),
                       [&](const SweepRow* a, const SweepRow* b) { return xval(a->values[xi]) < xval(b->values[xi]); });
      std::vector<std::string> runs(1);
      for (const SweepRow* r : rows) {
        const double x = px(xval(r->values[xi]));
        if (r->result.status != SweepResult::Status::ok) {
          if (!runs.back().empty()) runs.emplace_back();
          const double y = y0 + panel_h;
          s += fmt::format(
              "<path d=\"M{:.1f} {:.1f}l8 -8m0 8l-8 -8\" transform=\"translate(-4 4)\" stroke=\"{}\" "
              "stroke-width=\"2\"><title>{}: no plan fits</title></path>\n",
              x, y, color, xml(r->values[xi]));
          continue;
        }
        const double y = py(p.value(*r));
        runs.back() += fmt::format("{}{:.1f},{:.1f}", runs.back().empty() ? "" : " ", x, y);
        s += fmt::format(
            "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"{}\"><title>{}: {}</title></circle>\n", x, y, color,
            xml(r->values[xi]),
            p.percent ? fmt::format("{:.1f}%", p.value(*r)) : si_label(p.value(*r)) + " tokens/s per GPU");
      }
      for (const std::string& pts : runs)  // categories (devices, models, clusters) are not joined
        if (is_numeric && pts.find(' ') != std::string::npos)
          s += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>\n", pts, color);
    }
    s += "</g>\n";
  }
  const double xl = top + 2 * panel_h + gap + xlabels_h + 22;
  s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}{}</text>\n", left + plot_w / 2, xl,
                   xml(x_label(d.x)), log2x ? " (log scale)" : "");
  if (legend) {
    const double lx = left + plot_w + 20;
    double ly = top + 10;
    for (std::size_t i = 0; i < series.size(); ++i, ly += 20) {
      const char* color = kColors[i % std::size(kColors)];
      s += fmt::format(
          "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" stroke-width=\"2\"/>"
          "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"{}\"/>\n",
          lx, ly, lx + 20, ly, color, lx + 10, ly, color);
      s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n", lx + 26, ly + 4, xml(series[i]));
    }
    if (std::any_of(d.rows.begin(), d.rows.end(),
                    [](const SweepRow& r) { return r.result.status != SweepResult::Status::ok; }))
      s += fmt::format(
          "<path d=\"M{:.1f} {:.1f}l8 -8m0 8l-8 -8\" stroke=\"#444\" stroke-width=\"2\"/>"
          "<text x=\"{:.1f}\" y=\"{:.1f}\">no plan fits</text>\n",
          lx + 6, ly + 4, lx + 26, ly + 4);
  }
  s += "</svg>\n";
  return s;
}

}  // namespace megascope::cli
