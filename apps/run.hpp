// `megascope run --backend cpu`: trains a plan for real, one MPI process per
// rank (mpirun -np <world> megascope run ...), printing the loss per step,
// writing the measured trace and sharded checkpoints (exec/runner.hpp).
// `megascope run --backend cuda`: replays the plan's Program on GPUs for
// timing (apps/run_cuda.hpp, exec/cuda/replay_cuda.hpp).
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <ostream>
#include <string>

#include "apps/scenario.hpp"
#include "exec/runner.hpp"

namespace megascope::cli {

struct RunCommandOptions {
  ScenarioOptions scenario;
  std::string backend = "cpu";
  exec::RunOptions run;
  bool json = false;
  std::optional<std::string> inject_failure;   // "RANK:STEP"
  std::optional<int> shard;                    // cuda: the rank of the plan one GPU measures
  int warmup = 1;                              // cuda: untimed steps first
  bool train = false;                          // cuda: train on the GPU kernels instead of replaying
};

void add_run_options(CLI::App& cmd, RunCommandOptions& o);

// The scenario of a run and the Program built from it.
struct RunProgram {
  Scenario scenario;
  Program program;
};
Result<RunProgram> load_run_program(const ScenarioOptions& sc);
// The Program `run` trains a Setup with (load_run_program's; packed
// variable-length steps build one per micro-batch count with it).
Result<Program> build_run_program(const Setup& s);
int run_command(RunCommandOptions o, std::ostream& out, std::ostream& err);

}  // namespace megascope::cli
