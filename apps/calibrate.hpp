// `megascope calibrate --backend cpu`: measures on this machine what the
// simulator's cost model and network need for the CPU executor and writes
//   - a calibration profile (docs/cost-model.md section 2): the exact GEMM
//     shapes of the shipped tiny models' Programs, a GEMM size curve fitted
//     to a sweep, a bandwidth per kind of memory-bound kernel, attention
//     efficiencies, the launch overhead per kernel and the executor's
//     overhead per op; for `simulate --calibration FILE`;
//   - a calibrated cluster (the CPU host with the scale-up bandwidth and
//     latency fitted to the measured MPI collectives); for `--cluster FILE`.
// Under mpirun -np N every rank measures at once (as in a run) and the
// collectives are timed over groups of 2..N ranks; without mpirun the
// collectives are skipped and the cluster keeps the base cluster's network.
// docs/cost-model.md section 6 describes every measurement and fit.
#pragma once

#include <CLI/CLI.hpp>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "core/cluster.hpp"
#include "core/result.hpp"
#include "exec/calibrate.hpp"
#include "sim/cost_model.hpp"

namespace megascope::cli {

struct CalibrateOptions {
  std::string backend = "cpu";
  std::string output = "calibration.toml";         // the profile
  std::optional<std::string> cluster_output;       // default: <output without .toml>-cluster.toml
  std::string cluster = "cpu-host";                // the base cluster (device peaks, topology)
  std::vector<std::string> models = {"tiny-gpt", "tiny-llama"};   // whose Programs give the exact shapes
  std::vector<int> micro_batches = {1, 2, 4, 8};
  std::vector<int> tp = {1, 2};
  bool quick = false;                              // tiny sweeps and few repeats (tests)
  bool reference_run = true;                       // measure the per-op overhead with a short executor run
  bool json = false;
};

// Everything measured, in case order.
struct CalibrationData {
  std::vector<exec::GemmCase> gemms;
  std::vector<double> gemm_uses;                   // occurrences in the Programs (0: sweep only)
  std::vector<exec::Timing> gemm_t;
  std::vector<exec::MemoryCase> memory;
  std::vector<exec::Timing> memory_t;
  std::vector<exec::AttentionCase> attention;
  std::vector<exec::Timing> attention_t;
  std::vector<exec::CommCase> comms;
  std::vector<exec::Timing> comm_t;
  int world = 1;
};

// How well each fitted part reproduces its own measurements.
struct FitQuality {
  double gemm_curve_rms = 0;                       // RMS of log(predicted / measured) over every GEMM case
  std::map<std::string, double> memory_rms;        // by the profile's key prefix: the kind, or <kind>_bwd
  std::map<std::string, double> memory_GBps;       // the fitted bandwidth of each
  double attention_fwd_rms = 0, attention_bwd_rms = 0;
  double comm_rms = 0;
  int comm_cases = 0;
};

struct CalibrationFit {
  sim::CostProfile profile;
  ClusterSpec cluster;
  bool network_fitted = false;
  FitQuality quality;
};

// Fits the profile (over `base`, whose device gives the peaks) and the
// network (over `cluster`) to the measurements. Pure: no I/O.
CalibrationFit fit_calibration(const CalibrationData& d, const ClusterSpec& cluster, const sim::CostProfile& base);

// The TOML texts of the profile (docs/cost-model.md section 2) and of the
// calibrated cluster (docs/spec-format.md).
std::string profile_toml(const CalibrationFit& f);
std::string cluster_toml(const CalibrationFit& f, const std::string& base_name);

void add_calibrate_options(CLI::App& cmd, CalibrateOptions& o);
int run_calibrate(const CalibrateOptions& o, std::ostream& out, std::ostream& err);

// Small helpers both backends' reports use: the date (YYYY-MM-DD), the
// host's name, and the median of a sample (0 when empty).
std::string today();
std::string host_name();
double median(std::vector<double> v);

}  // namespace megascope::cli
