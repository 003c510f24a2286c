// `megascope simulate`: one iteration of a plan, event by event on the
// cluster, with a report, JSON and a Perfetto trace.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "apps/scenario.hpp"
#include "core/program/program.hpp"
#include "core/schedule/schedule.hpp"
#include "sim/engine.hpp"
#include "sim/report.hpp"
#include "sim/varlen_sim.hpp"

namespace megascope::cli {

struct SimulateOptions {
  std::optional<std::string> trace;        // Perfetto JSON file
  std::optional<std::string> calibration;  // cost-model profile to apply
  sim::Mode mode = sim::Mode::reduced;
};

struct SimulateOutcome {
  Program program;
  sim::SimResult result;
  sim::SimReport report;
  std::string profile_source;
  double wall_s = 0;
  // zb-1p / zb-2p: the stage times their order was placed from, and the candidate kept.
  AutoScheduleInputs auto_inputs;
  std::string auto_chosen;
  // Variable-length training: the sampled steps (the report above is the
  // step with every sequence at seq_length).
  std::optional<sim::VarlenReport> varlen;
};

// The device's shipped cost model, with `calibration` laid over it when given.
Result<sim::CostModel> cost_model_for(const Setup& s, const std::optional<std::string>& calibration);
Result<SimulateOutcome> run_simulation(const Scenario& sc, const SimulateOptions& o);
nlohmann::json simulate_json(const Scenario& sc, const SimulateOutcome& out, const SimulateOptions& o);
std::string simulate_text(const Scenario& sc, const SimulateOutcome& out, const SimulateOptions& o);

}  // namespace megascope::cli
