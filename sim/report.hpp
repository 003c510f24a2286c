// What a simulated iteration means for the user: step time, throughput,
// MFU, pipeline bubble and exposed communication by kind, from the spans of
// the traced ranks (one per pipeline stage at least).
//
// Definitions (docs/simulator.md):
//   tokens/s       global batch x sequence length / step time
//   TFLOP/s/GPU    model FLOPs / step time / GPUs; model FLOPs as Megatron-LM
//                  counts them today (causal attention halved); the value
//                  without the halving, which the published tables use, too
//   MFU            TFLOP/s/GPU / the device's dense bf16 peak
//   exposed comm   per rank and kind: time some communication of that kind is
//                  in flight while the compute stream is idle
//   bubble         per rank: time the compute stream is idle and no
//                  communication of the rank is in flight (waiting on other
//                  stages); bubble_fraction is its mean over stages / step time
//   busiest-stage  1 - the busiest stage's compute time / step time: the
//   bubble         zero-bubble paper's bubble rate (Qi et al. 2024), which
//                  counts only the idle time of the stage that sets the pace
#pragma once

#include <array>
#include <map>
#include <string>
#include <vector>

#include "core/program/program.hpp"
#include "core/setup.hpp"
#include "sim/activity.hpp"
#include "sim/engine.hpp"

namespace megascope::sim {

struct StageReport {
  int stage = 0;
  int rank = 0;
  double compute_busy_s = 0;
  double bubble_s = 0;
  std::array<double, kCommKinds> exposed_comm_s{};
  std::map<std::string, double> compute_by_label_s;   // attention, mlp, ...
};

struct SimReport {
  double step_time_s = 0;
  double tokens_per_s = 0;
  double model_flops = 0;
  double tflops_per_gpu = 0;
  double mfu = 0;
  double tflops_per_gpu_no_causal = 0;
  double mfu_no_causal = 0;
  double hardware_tflops_per_gpu_no_causal = 0;   // with recomputation: the Narayanan Table 1 convention
  double bubble_fraction = 0;           // mean over stages of idle time / step (see above)
  double busiest_bubble_fraction = 0;   // 1 - busiest stage's compute / step
  std::array<double, kCommKinds> exposed_comm_s{};   // mean over stages
  std::vector<StageReport> stages;
};

// From r.activity when the engine gathered it (SimOptions::activity), else
// from r.spans; the same report either way. The second form consumes
// r.activity instead of copying it.
SimReport make_report(const Setup& s, const Program& p, const SimResult& r);
SimReport make_report(const Setup& s, const Program& p, SimResult&& r);

// The simulated iteration as a trace file (core/trace.hpp), source
// "simulated"; `info` supplies the plan and model names. Returns an error if
// the file cannot be written.
Result<void> write_trace(const std::string& path, const Program& p, const SimResult& r, TraceInfo info = {});

}  // namespace megascope::sim
