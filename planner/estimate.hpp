// Stage 1: a closed-form estimate of one candidate plan, memory first.
//
// Memory is exact: the same sums as memory_report() (core/accounting), fed
// from caches of the per-layer activations, the per-rank parameters and the
// closed-form in-flight micro-batch counts; tests/planner checks equality on
// thousands of plans.
//
// Time per micro-batch and pipeline rank comes from the builder's own ops of
// one layer (probe_layer) and of the embedding and output (probe_edge),
// costed by the simulator's cost model, with their TP/CP/EP collectives timed
// on the idle topology and run on their streams as the engine would run them
// for one rank. A rank's forward F, input-gradient B (plus recomputation) and
// weight-gradient W per micro-batch then give the iteration by the
// schedules' closed forms (c = F + B + W per rank, m micro-batches, v chunks):
//   1f1b, gpipe    m c_max + (sum c - c_max)           = (m + p - 1) c when equal
//   interleaved    m c_max + (sum c - c_max) / v        (Narayanan: (p - 1)/(v m))
//   zb-h1          m c_max + (p - 1)(F + B - W)          (Qi et al. Table 2)
//   zb-v           m c_max + (p - 1) max(0, F + B - 2W) / 2
//   dualpipe(v)    m c_max + (p/2 - 1 or p - 1)(F + 2B - W), chunk units
// plus the pipeline fill and drain transfers, then per rank the gradient
// reduction (exposed beyond the last micro-batch's backward when overlapped),
// the optimizer step and the parameter all-gather (hidden when overlapped).
// Contention between concurrent flows, and everything else the simulator
// resolves event by event, is not in stage 1: docs/planner.md measures how
// far it is from the simulator.
#pragma once

#include <limits>
#include <memory>
#include <optional>

#include "planner/space.hpp"
#include "sim/cost_model.hpp"

namespace megascope::planner {

struct Estimate {
  double peak_bytes = 0;        // max over pipeline ranks, as memory_report()
  int peak_stage = 0;
  bool fits = false;            // peak + headroom <= capacity
  double step_s = 0;            // predicted iteration time
  double pipeline_s = 0;        // forward/backward part, bubble included
  double bubble_s = 0;          // pipeline_s minus the busiest rank's m x c
  double dp_exposed_s = 0;      // gradient reduction and parameter gather not hidden, on the slowest rank
  // Set by evaluate() with a bound: the plan was not timed in full, as a
  // lower bound of its time (the pipeline's compute and bubble before any
  // transfer, plus rank 0's optimizer step) already exceeded the bound.
  // step_s holds that lower bound, pipeline_s its pipeline part, bubble_s the
  // bubble; dp_exposed_s is 0.
  bool bounded = false;
};

class Estimator {
 public:
  // One estimator per search (not thread-safe: it fills its caches lazily).
  Estimator(const SearchInputs& in, const sim::CostModel& cost);
  ~Estimator();
  Estimator(Estimator&&) noexcept;
  Estimator& operator=(Estimator&&) noexcept;

  // Memory only (cheap); sets peak_bytes, peak_stage and fits. Both fail
  // only if the candidate is not a legal plan (validate_setup's message).
  Result<Estimate> memory(const Candidate& c);
  // Memory and time, or memory and a lower bound of the time (the Estimate
  // is `bounded`) when that bound exceeds `fit_bound` for a plan that fits,
  // or `reject_bound` for one that does not. The lower bound is the
  // pipeline's compute and bubble plus rank 0's optimizer step, to which the
  // full estimate only adds (transfers, the rest of the data-parallel tail),
  // so a bounded plan's full step_s would exceed its bound too: a
  // search that passes its K-th best time and its best rejected time skips
  // the communication terms (and the collective tables they build) of plans
  // that could enter neither, with the same result.
  // With no bounds (the defaults), always memory and time.
  Result<Estimate> evaluate(const Candidate& c, double fit_bound = std::numeric_limits<double>::infinity(),
                            double reject_bound = std::numeric_limits<double>::infinity());

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace megascope::planner
