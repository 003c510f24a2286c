// `megascope compare SIMULATED.json MEASURED.json`: how far a simulated
// iteration is from a measured one (or any trace from another), op by op.
//
// Both files are traces of core/trace.hpp. Spans of the same Program match by
// (rank, op index) on the ranks traced in both. Reported: the step time of
// each and its error, and per op kind ("forward attention", "tp
// reduce-scatter", "pp-activation send", ...) the summed time of the matched
// spans in each, the error and the count; the time-weighted mean absolute
// error; and the spans found in one file only.
//
// Errors are relative to the second file: (first - second) / second, the
// convention of docs/validation.md (positive: the simulator predicts more time).
#pragma once

#include <CLI/CLI.hpp>
#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "config/trace_file.hpp"
#include "core/result.hpp"

namespace megascope::cli {

struct CompareOptions {
  std::string simulated, measured;  // trace files
  bool json = false;
  bool force = false;  // compare traces of different plans or models anyway
};

struct KindError {
  std::string kind;                        // "forward attention", "dp-grad reduce-scatter", ...
  std::size_t count = 0;                   // matched spans
  double simulated_s = 0, measured_s = 0;  // summed over the matched spans
  std::optional<double> error;             // (simulated - measured) / measured; none when measured is 0
};

struct Comparison {
  TraceInfo simulated, measured;
  std::optional<double> step_error;  // none when the measured step time is 0
  std::vector<int> matched_ranks;    // ranks with spans in both, ascending
  std::size_t matched_spans = 0;
  std::size_t only_simulated = 0, only_measured = 0;  // spans without a partner
  std::size_t differing = 0;                          // pairs whose op kinds differ (with --force; counted in only_*)
  std::vector<KindError> kinds;                       // largest measured time first
  double simulated_s = 0, measured_s = 0;             // summed over every matched span
  double mae_by_kind = 0;          // sum_k |sim_k - meas_k| / sum_k meas_k (each kind weighted by its measured time)
  double mae_by_op = 0;            // sum_i |sim_i - meas_i| / sum_i meas_i over the matched spans
  std::vector<std::string> notes;  // why spans did not match, swapped sources, ...
};

// The op kind of a span: its name without the micro-batch suffix, the
// compute phase spelled out: "forward attention", "backward_weight mlp",
// "tp reduce-scatter", "pp-activation send", "optimizer".
std::string op_kind(const TraceRecord& r);

// Compares two read traces; `a_name` and `b_name` (the files) go into errors
// and notes. Refuses traces of different models, plans or world sizes, or
// whose matched ops differ, unless `force`.
Result<Comparison> compare_traces(const TraceFile& simulated, const TraceFile& measured, const std::string& a_name,
                                  const std::string& b_name, bool force);

nlohmann::json compare_json(const Comparison& c, const CompareOptions& o);
std::string compare_text(const Comparison& c, const CompareOptions& o);

void add_compare_options(CLI::App& cmd, CompareOptions& o);
int run_compare(const CompareOptions& o, std::ostream& out, std::ostream& err);

}  // namespace megascope::cli
