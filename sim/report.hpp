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
//   busiest-stage  the bubble of the stage that waits least (its compute and
//   bubble         its communication in flight count as busy) / step time:
//                  1 - the busiest stage's work / step, the zero-bubble
//                  paper's bubble rate (Qi et al. 2024) where communication
//                  is hidden; only the pace-setting stage's idle time counts
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
  double span_s = 0;          // the rank's first op's start to its last op's end
  std::array<double, kCommKinds> exposed_comm_s{};
  std::map<std::string, double> compute_by_label_s;   // attention, mlp, ...
};

struct SimReport {
  // The iteration time: the makespan, or with post_validation the longest
  // rank's own span (first op to last), the period of repeated iterations.
  double step_time_s = 0;
  double makespan_s = 0;                // first op of any rank to last op of any
  double tokens_per_s = 0;
  double model_flops = 0;
  double tflops_per_gpu = 0;
  double mfu = 0;
  double tflops_per_gpu_no_causal = 0;
  double mfu_no_causal = 0;
  double hardware_tflops_per_gpu_no_causal = 0;   // with recomputation: the Narayanan Table 1 convention
  double bubble_fraction = 0;           // mean over stages of idle time / step (see above)
  double busiest_bubble_fraction = 0;   // the least-idle stage's bubble / step (see above)
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
