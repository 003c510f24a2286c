// Predicted vs measured: a measured trace (from `megascope run`, the same
// file format as `megascope simulate --trace`) matched op by op against the
// simulated iteration of the same plan. A measured span of rank r and op i is
// matched with the predicted span of op i on the traced rank of r's pipeline
// stage (all ranks of a stage run the same ops). Per span kind the summed
// durations give the error (predicted - measured) / measured.
// Plain data: no widgets.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "config/trace_file.hpp"
#include "core/program/program.hpp"
#include "core/trace.hpp"
#include "gui/spankind.hpp"

namespace megascope::gui {

struct KindError {
  SpanKind kind = SpanKind::other;
  double predictedS = 0;     // summed over matched spans
  double measuredS = 0;
  std::size_t matched = 0;
  [[nodiscard]] std::optional<double> error() const;   // (predicted - measured) / measured
};

// The same per op name (opName(): "forward mlp", "tp all-gather"), as
// `megascope compare` groups them.
struct OpError {
  std::string name;
  SpanKind kind = SpanKind::other;
  double predictedS = 0;
  double measuredS = 0;
  std::size_t matched = 0;
  [[nodiscard]] std::optional<double> error() const;
};

struct TraceComparison {
  std::vector<KindError> kinds;           // kinds with matched spans, in SpanKind order
  std::vector<OpError> ops;               // op names with matched spans, most measured time first
  double predictedStepS = 0;
  double measuredStepS = 0;
  std::size_t matched = 0;
  std::size_t unmatched = 0;              // measured spans with no predicted op (other plan, untraced stage)
  std::size_t misplaced = 0;              // of those, spans whose op differs from the program's at that index
                                          // (phase, micro-batch, chunk or layer): a trace of another program
  bool planMatches = true;                // the trace's plan/world agree with the program's
  [[nodiscard]] std::optional<double> stepError() const;
};

TraceComparison compareTraces(const Program& program, const std::vector<Span>& predicted, double predictedStepS,
                              const TraceFile& measured);

// A measured trace made from a simulated one for tests and demos: every
// span's start and length scaled by `computeScale` (compute) or `commScale`
// (communication), written with source "measured".
Result<void> writeScaledTrace(const std::string& path, const Program& program, const std::vector<int>& ranks,
                              const std::vector<Span>& spans, double stepS, double computeScale, double commScale,
                              const std::string& plan, const std::string& model);

}  // namespace megascope::gui
