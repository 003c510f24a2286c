// TOML -> specs. Each loader reads its table ([model], [cluster], [training],
// [plan]) per docs/spec-format.md: unknown keys and wrong types are errors
// naming file, line, column and key; required keys have no default.
#pragma once

#include <optional>
#include <string>
#include <toml++/toml.h>

#include "core/cluster.hpp"
#include "core/model.hpp"
#include "core/plan.hpp"
#include "core/result.hpp"
#include "core/training.hpp"

namespace megascope {

// From an already parsed document (the file name is for messages).
Result<ModelSpec> model_from_toml(const toml::table& root, const std::string& file);
Result<ClusterSpec> cluster_from_toml(const toml::table& root, const std::string& file);
Result<TrainingSpec> training_from_toml(const toml::table& root, const std::string& file);
Result<PlanSpec> plan_from_toml(const toml::table& root, const std::string& file);

// From a file holding that table.
Result<ModelSpec> load_model_toml(const std::string& path);
Result<ClusterSpec> load_cluster_toml(const std::string& path);
Result<TrainingSpec> load_training_toml(const std::string& path);
// The same, with `batch` standing in for a [training] table that gives no
// global_batch_size (a command line's --global-batch).
Result<TrainingSpec> load_training_toml(const std::string& path, std::int64_t batch);
Result<PlanSpec> load_plan_toml(const std::string& path);

// An [example] file: names of (or paths to) a model and a cluster, an
// optional device count, and the [training] and [plan] tables.
struct ExampleSpec {
  std::string model;         // shipped name or path (resolved against the file's folder)
  std::string cluster;
  std::optional<int> gpus;
  TrainingSpec training;
  PlanSpec plan;
};
Result<ExampleSpec> load_example_toml(const std::string& path);

// Checks that the document's top-level entries are only the known tables.
Result<void> check_top_level(const toml::table& root, const std::string& file);

}  // namespace megascope
