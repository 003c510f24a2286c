// Inputs: the model, cluster, training setup and plan the GUI works on, kept
// apart (the GUI edits each one) and validated into a Setup on every change.
// loadInputs resolves names and files the way the CLI's --example, --model,
// --cluster, --plan, --gpus, --nodes, --global-batch and --seq-len do.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/result.hpp"
#include "core/setup.hpp"

namespace megascope::gui {

struct StartOptions {
  std::optional<std::string> example;      // [example] file; the default example when nothing is given
  std::optional<std::string> model;
  std::optional<std::string> cluster;
  std::optional<std::string> plan;
  std::optional<int> nodes;
  std::optional<int> gpus;
  std::optional<std::int64_t> globalBatch;
  std::optional<std::int64_t> seqLen;
};

struct Inputs {
  std::string modelName;                   // as given: shipped name or path
  std::string clusterName;
  ModelSpec model;
  ClusterSpec cluster;                     // as loaded (its own node count)
  TrainingSpec training;
  PlanSpec plan;
  int gpus = 0;                            // devices used
  std::string source;                      // "the default example (...)", "command line"
};

Result<Inputs> loadInputs(const StartOptions& o);

// The cluster sized for `in.gpus`, then validate_setup.
Result<Setup> makeSetup(const Inputs& in);

}  // namespace megascope::gui
