// The shipped library (topologies/) and name-or-path resolution for the CLI.
//
// The data folder is $MEGASCOPE_DATA_DIR if set, else the source tree's
// topologies/ (for a build-tree binary), else the installed share folder.
#pragma once

#include <string>
#include <vector>

#include "config/spec_toml.hpp"
#include "core/cluster.hpp"
#include "core/model.hpp"
#include "core/plan.hpp"
#include "core/result.hpp"

namespace megascope {

std::string data_dir();
std::vector<std::string> shipped_models();     // file stems under models/, sorted
std::vector<std::string> shipped_clusters();   // file stems under clusters/, sorted
std::vector<std::string> shipped_examples();   // file stems under examples/, sorted
std::string default_example_path();            // examples/default.toml

// A shipped name, a TOML file or (models only) a Hugging Face config.json.
Result<ModelSpec> resolve_model(const std::string& name_or_path);
Result<ClusterSpec> resolve_cluster(const std::string& name_or_path);
// A TOML file with a [plan] table, or an inline plan "tp=8,pp=2,...".
Result<PlanSpec> resolve_plan(const std::string& file_or_inline);

}  // namespace megascope
