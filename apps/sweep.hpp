// `megascope sweep`: a full planner search at every point of a cross product
// of GPU counts, models, clusters and cluster variants (device, GPUs per
// node, scale-up domain, NIC bandwidth), reported as a table, CSV, JSON and
// an SVG plot of throughput and MFU against the swept variable.
//
// Under `mpirun -np K` rank r searches points r, r + K, r + 2K, ...; the
// results travel to rank 0 as JSON and rank 0 alone prints and writes files.
// A single process takes the same JSON round trip, so the output is the same
// byte for byte whatever the number of ranks and threads.
//
// Not here: the search itself (planner/), cluster validation (core/cluster).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "apps/plan.hpp"
#include "core/cluster.hpp"
#include "core/result.hpp"

namespace megascope::cli {

// The swept variables, in the nesting order of the cross product (model
// outermost, GPU count innermost).
enum class SweepVar : std::uint8_t { model, cluster, device, gpus_per_node, scale_up_domain, nic_gbps, gpus };
inline constexpr int kSweepVars = 7;
const char* to_string(SweepVar v);                                 // CSV column: "model", ..., "nic_gbps", "gpus"
const char* option_of(SweepVar v);                                 // "--model", ..., "--gpus"
std::optional<SweepVar> parse_sweep_var(const std::string& text);  // column or option name
bool numeric(SweepVar v);                                          // ordered by value (all but model, cluster, device)

struct SweepOptions {
  PlanCommandOptions search;  // --model/--cluster/--gpus hold lists here; batch, constraints, --top
  std::optional<std::string> device, gpus_per_node, scale_up_domain, nic_gbps;
  std::optional<std::string> x;          // the plot's x variable (default: the first swept of gpus, nic_gbps, ...)
  std::optional<std::string> csv, plot;  // files
  bool json = false;
};

// Numbers of a swept option: "A,B,C", "A-BxK" (A, A K, A K^2, ... up to B)
// or "A-B+K" (A, A + K, ... up to B), mixed freely: "8,16,64-512x2".
// Duplicates are dropped, the order kept; `integer` refuses fractions. The
// error names `option`.
Result<std::vector<double>> parse_sweep_values(const std::string& text, const std::string& option, bool integer);

// A cluster variant: fields of a validated ClusterSpec replaced before the
// GPU count is fitted. Absent fields keep the cluster's values.
struct ClusterVariant {
  std::optional<DeviceSpec> device;    // GPU type (from a shipped cluster or a cluster file)
  std::optional<int> gpus_per_node;    // NICs per GPU kept (rounded up); a node-sized NVLink domain follows
  std::optional<int> scale_up_domain;  // devices per NVLink domain
  std::optional<double> nic_gbps;      // per NIC per direction, Gb/s
};
// The cluster with the variant applied and validated; an error names the
// cluster field and the option that set it.
Result<ClusterSpec> apply_variant(const ClusterSpec& c, const ClusterVariant& v);

// A device by name: a shipped cluster's name or a cluster file (its device),
// or a device name or unique prefix among the shipped clusters' devices
// ("h200", "B200-SXM-180GB"), case-insensitive.
Result<DeviceSpec> resolve_device(const std::string& name);

// The best plan of one point, as rank 0 receives it.
struct SweepResult {
  std::size_t point = 0;
  enum class Status : std::uint8_t { ok, no_fit, no_legal_plan } status = Status::ok;
  std::string plan;  // the best plan (inline form); no_fit: the fastest that does not fit
  double tokens_per_s = 0, tflops_per_gpu = 0, mfu = 0, step_time_s = 0;
  double peak_memory_bytes = 0, capacity_bytes = 0, bubble_fraction = 0, exposed_comm_fraction = 0;
  std::uint64_t evaluated = 0, fitting = 0;
  std::string error;  // non-empty: the search failed (the sweep exits 1)
  double wall_s = 0;  // not printed: timing is not part of the output
};

// One point's values of every variable (text, as in the CSV) and the SVG.
struct SweepRow {
  std::array<std::string, kSweepVars> values;
  SweepResult result;
};
struct SweepPlotData {
  std::string title;
  SweepVar x = SweepVar::gpus;
  std::vector<SweepVar> series_vars;  // swept variables besides x (one line per combination)
  std::vector<SweepRow> rows;
};
// An SVG of two panels sharing the x axis: tokens/s (top) and MFU (bottom)
// (apps/sweep_plot.cpp).
std::string sweep_svg(const SweepPlotData& d);

// The items of a comma list, empty ones included (apps/sweep.cpp).
std::vector<std::string> split_commas(const std::string& text);

void add_sweep_options(CLI::App& cmd, SweepOptions& o);
int run_sweep(const SweepOptions& o, std::ostream& out, std::ostream& err);

}  // namespace megascope::cli
