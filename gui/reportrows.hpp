// The numbers of the Report view, as plain rows: one plan's metrics (step
// time, tokens/s, MFU, bubble, exposed communication by kind, memory) and, for
// two plans side by side, the difference of each metric and of each plan
// setting. Plain data: no widgets.
#pragma once

#include <QString>
#include <QStringList>

#include <optional>
#include <vector>

#include "core/accounting/memory.hpp"
#include "core/setup.hpp"
#include "sim/report.hpp"

namespace megascope::gui {

struct ReportRow {
  QString name;               // "step time"
  QString unit;               // "s"
  double value = 0;           // in `unit`
  std::optional<double> baseline;
  bool higherIsBetter = false;
  // "+3.2%" or "" when there is no baseline; `better` tells the colour.
  [[nodiscard]] QString change() const;
  [[nodiscard]] std::optional<bool> better() const;
};

std::vector<ReportRow> reportRows(const Setup& s, const sim::SimReport& r, const MemoryReport& m);
// Rows of `current` with `baseline`'s values beside them (same metrics, same order).
std::vector<ReportRow> compareRows(const std::vector<ReportRow>& current, const std::vector<ReportRow>& baseline);

// Settings that differ, "tp: 8 -> 4", over the plan keys, the GPU count, the
// model, the cluster and the batch.
QStringList setupDifferences(const Setup& baseline, const Setup& current);

// "tp=8,pp=8,vpp=3,dp=16,..." with the derived dp and vpp filled in.
QString effectivePlanText(const Setup& s);

}  // namespace megascope::gui
