// Trace: what happened to each op of a Program on the ranks that were
// traced, as spans in seconds from the start of the iteration. The simulator
// (sim/) predicts one and the executor (exec/) measures one; both write it
// in the same Chrome/Perfetto JSON format, so that `megascope compare` and the
// GUI can put a predicted and a measured iteration side by side, op by op
// (spans of the same Program are matched by rank and op index).
//
// The JSON: one process per traced rank, one thread per stream, one complete
// ("X") event per op with its op index, phase, label, micro-batch, chunk,
// layer, bytes and FLOPs in `args`; top-level `megascope` object with the
// source ("simulated" or "measured"), the step time and the plan.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/program/program.hpp"
#include "core/result.hpp"

namespace megascope {

struct Span {
  std::int32_t rank = 0;
  std::uint32_t op = 0;       // index in the rank's StageProgram
  double start = 0, end = 0;  // seconds from the start of the iteration
};

enum class TraceSource : std::uint8_t { simulated, measured };
const char* to_string(TraceSource s);

// What a trace file says besides its spans.
struct TraceInfo {
  TraceSource source = TraceSource::simulated;
  double step_time_s = 0;
  std::string plan;           // the plan in inline form, for display and matching
  std::string model;
  int world = 0;              // ranks of the run (not all of them need be traced)
};

// Writes the trace of `ranks` (spans of other ranks are skipped). The error
// names the file.
Result<void> write_trace(const std::string& path, const Program& p, const TraceInfo& info,
                         const std::vector<int>& ranks, const std::vector<Span>& spans);

}  // namespace megascope
