#include "gui/reportrows.hpp"

#include <QMap>

#include <cmath>

#include "config/plan_settings.hpp"

namespace megascope::gui {

namespace {
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

QMap<QString, QString> planMap(const Setup& s) {
  QMap<QString, QString> m;
  for (const QString& item : effectivePlanText(s).split(QLatin1Char(','), Qt::SkipEmptyParts)) {
    const qsizetype eq = item.indexOf(QLatin1Char('='));
    if (eq > 0) m.insert(item.left(eq), item.mid(eq + 1));
  }
  return m;
}
}  // namespace

QString ReportRow::change() const {
  if (!baseline) return {};
  if (*baseline == 0) return value == 0 ? QStringLiteral("=") : QStringLiteral("new");
  const double rel = (value - *baseline) / std::fabs(*baseline);
  if (std::fabs(rel) < 5e-4) return QStringLiteral("=");
  return QStringLiteral("%1%2%").arg(rel > 0 ? QStringLiteral("+") : QString()).arg(100 * rel, 0, 'f', 1);
}

std::optional<bool> ReportRow::better() const {
  if (!baseline) return std::nullopt;
  const double d = value - *baseline;
  if (std::fabs(d) <= 5e-4 * std::max(std::fabs(value), std::fabs(*baseline))) return std::nullopt;
  return higherIsBetter ? d > 0 : d < 0;
}

std::vector<ReportRow> reportRows(const Setup& s, const sim::SimReport& r, const MemoryReport& m) {
  std::vector<ReportRow> rows;
  auto add = [&](QString name, QString unit, double v, bool higher) {
    rows.push_back({std::move(name), std::move(unit), v, std::nullopt, higher});
  };
  add(QStringLiteral("step time"), QStringLiteral("s"), r.step_time_s, false);
  add(QStringLiteral("throughput"), QStringLiteral("tokens/s"), r.tokens_per_s, true);
  add(QStringLiteral("throughput per GPU"), QStringLiteral("tokens/s"), r.tokens_per_s / std::max(1, s.world), true);
  add(QStringLiteral("model TFLOP/s per GPU"), QStringLiteral("TFLOP/s"), r.tflops_per_gpu, true);
  add(QStringLiteral("MFU"), QStringLiteral("%"), 100 * r.mfu, true);
  add(QStringLiteral("MFU without causal halving"), QStringLiteral("%"), 100 * r.mfu_no_causal, true);
  add(QStringLiteral("pipeline bubble"), QStringLiteral("% of step"), 100 * r.bubble_fraction, false);
  for (int k = 0; k < sim::kCommKinds; ++k)
    add(QStringLiteral("exposed %1 communication").arg(QString::fromLatin1(sim::to_string(static_cast<sim::CommKind>(k)))
                                                          .toUpper()),
        QStringLiteral("ms"), 1e3 * r.exposed_comm_s[static_cast<std::size_t>(k)], false);
  add(QStringLiteral("peak memory"), QStringLiteral("GiB"), m.peak_bytes / kGiB, false);
  add(QStringLiteral("memory headroom"), QStringLiteral("GiB"), (m.capacity_bytes - m.peak_bytes) / kGiB, true);
  add(QStringLiteral("GPUs"), QString(), s.world, false);
  add(QStringLiteral("micro-batches per pipeline"), QString(), s.num_microbatches, false);
  return rows;
}

std::vector<ReportRow> compareRows(const std::vector<ReportRow>& current, const std::vector<ReportRow>& baseline) {
  std::vector<ReportRow> out = current;
  for (ReportRow& row : out)
    for (const ReportRow& b : baseline)
      if (b.name == row.name) row.baseline = b.value;
  return out;
}

QString effectivePlanText(const Setup& s) {
  PlanSpec p = s.plan;
  p.dp = s.dp;
  p.vpp = s.vpp;
  return QString::fromStdString(format_inline_plan(p));
}

QStringList setupDifferences(const Setup& baseline, const Setup& current) {
  QStringList out;
  if (baseline.model.name != current.model.name)
    out << QStringLiteral("model: %1 -> %2").arg(QString::fromStdString(baseline.model.name),
                                                 QString::fromStdString(current.model.name));
  if (baseline.cluster.name != current.cluster.name)
    out << QStringLiteral("cluster: %1 -> %2").arg(QString::fromStdString(baseline.cluster.name),
                                                   QString::fromStdString(current.cluster.name));
  if (baseline.world != current.world) out << QStringLiteral("GPUs: %1 -> %2").arg(baseline.world).arg(current.world);
  if (baseline.training.global_batch_size != current.training.global_batch_size)
    out << QStringLiteral("global batch: %1 -> %2")
               .arg(baseline.training.global_batch_size)
               .arg(current.training.global_batch_size);
  if (baseline.seq_length != current.seq_length)
    out << QStringLiteral("sequence length: %1 -> %2").arg(baseline.seq_length).arg(current.seq_length);
  const QMap<QString, QString> a = planMap(baseline), b = planMap(current);
  for (const std::string& key : plan_keys()) {
    const QString k = QString::fromStdString(key);
    const QString va = a.value(k, QStringLiteral("(default)")), vb = b.value(k, QStringLiteral("(default)"));
    if (va != vb) out << QStringLiteral("%1: %2 -> %3").arg(k, va, vb);
  }
  return out;
}

}  // namespace megascope::gui
