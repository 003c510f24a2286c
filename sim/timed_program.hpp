// A Setup's Program for the schedules whose order depends on the stages'
// priced times: the automatic zero-bubble schedules zb-1p and zb-2p (Qi et
// al. 2024, Sec. 3, core/schedule/zb_auto.cpp). As the paper's runs profile
// their first iterations and then place the passes, the Program is built
// first with the order of equal unit passes, simulated, and each stage's F, B
// and W times (the median over micro-batches of a pass's first op start to
// its last op end on the stage's representative rank) and the pipeline
// transfer time (the median of a send's flow, from when both sides posted it
// to its end) are read off that run; the order placed from them under the
// schedule's memory limit is built instead. Every other schedule: build_program.
#pragma once

#include <string>

#include "core/program/builder.hpp"
#include "core/schedule/schedule.hpp"
#include "core/setup.hpp"
#include "sim/cost_model.hpp"
#include "sim/engine.hpp"
#include "sim/network.hpp"

namespace megascope::sim {

struct TimedProgram {
  Program program;
  // The automatic schedules: the times their order was placed from, and
  // which candidate won (AutoSchedule::chosen). Empty for other schedules.
  AutoScheduleInputs inputs;
  std::string chosen;
};

Result<TimedProgram> build_timed_program(const Setup& s, const CostModel& cost, const Topology& topo);

// The per-rank pass times and the transfer time of a simulated Program with
// one model chunk per rank (see above), and each rank's M_W / M_B from the
// activation accounting (a micro-batch's weight-gradient state over its
// stored activations).
AutoScheduleInputs measured_stage_times(const Setup& s, const Program& p, const SimResult& r);

}  // namespace megascope::sim
