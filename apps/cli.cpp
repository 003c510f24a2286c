#include "apps/cli.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <ostream>

#include "apps/estimate.hpp"
#include "apps/scenario.hpp"
#include "config/library.hpp"

namespace megascope::cli {

namespace {

void add_scenario_options(CLI::App& cmd, ScenarioOptions& o) {
  cmd.add_option("--model", o.model, "shipped model name, model TOML file or Hugging Face config.json");
  cmd.add_option("--cluster", o.cluster, "shipped cluster name or cluster TOML file");
  cmd.add_option("--plan", o.plan, "inline plan (tp=8,pp=2,mbs=1,...) or plan TOML file");
  cmd.add_option("--megatron-args", o.megatron_args,
                 "a Megatron-LM launch line; replaces --model, --plan and the batch options");
  cmd.add_option("--example", o.example, "an [example] TOML file (default: the shipped default example)");
  auto* nodes = cmd.add_option("--nodes", o.nodes, "nodes used (default: the cluster's)");
  cmd.add_option("--gpus", o.gpus, "devices used (default: the cluster's or the example's)")->excludes(nodes);
  cmd.add_option("--global-batch", o.global_batch, "sequences per iteration");
  cmd.add_option("--seq-len", o.seq_len, "tokens per sequence (default: the model's)");
}

}  // namespace

int run_cli(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  CLI::App app{"Megascope: plan, simulate and measure 5-D parallel transformer training"};
  app.require_subcommand(0, 1);

  ScenarioOptions est;
  bool json = false;
  auto* estimate = app.add_subcommand(
      "estimate", "parameters, FLOPs and memory per pipeline stage of one plan (no options: the default example)");
  add_scenario_options(*estimate, est);
  estimate->add_flag("--json", json, "print one JSON object");

  auto* list = app.add_subcommand("list", "the shipped models and clusters");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    out << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {
      out << (e.get_name() == "CallForAllHelp" ? app.help("", CLI::AppFormatMode::All) : app.help());
      return 0;
    }
    err << "megascope: " << e.what() << "\n";
    return 2;
  }

  if (*estimate) {
    auto sc = load_scenario(est);
    if (!sc) {
      err << "megascope estimate: error: " << sc.error().str() << "\n";
      return 1;
    }
    if (json) out << estimate_json(*sc).dump(2) << "\n";
    else out << estimate_text(*sc);
    return 0;
  }
  if (*list) {
    out << "models   (" << data_dir() << "/models):\n";
    for (const auto& m : shipped_models()) out << "  " << m << "\n";
    out << "clusters (" << data_dir() << "/clusters):\n";
    for (const auto& c : shipped_clusters()) out << "  " << c << "\n";
    return 0;
  }
  out << app.help();
  return 0;
}

}  // namespace megascope::cli
