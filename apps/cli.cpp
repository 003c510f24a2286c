#include "apps/cli.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <ostream>
#include <string>
#include <vector>

#include "apps/calibrate.hpp"
#include "apps/compare.hpp"
#include "apps/estimate.hpp"
#include "apps/plan.hpp"
#include "apps/run.hpp"
#include "apps/scenario.hpp"
#include "apps/simulate.hpp"
#include "apps/sweep.hpp"
#include "config/edit_distance.hpp"
#include "config/library.hpp"
#include "core/accounting/memory.hpp"

namespace megascope::cli {

namespace {

void add_scenario_options(CLI::App& cmd, ScenarioOptions& o) {
  cmd.add_option("--model", o.model, "shipped model name, model TOML file or Hugging Face config.json");
  cmd.add_option("--cluster", o.cluster, "shipped cluster name or cluster TOML file");
  cmd.add_option("--plan", o.plan, "inline plan (tp=8,pp=2,mbs=1,...) or plan TOML file");
  cmd.add_option("--megatron-args", o.megatron_args,
                 "a Megatron-LM launch line; replaces --model, --plan and the batch options");
  cmd.add_option("--deepspeed-config", o.deepspeed_config,
                 "a DeepSpeed ds_config.json: its ZeRO stage, overlap, buckets, batch and precision replace the plan's");
  cmd.add_option("--example", o.example, "an [example] TOML file (default: the shipped default example)");
  auto* nodes = cmd.add_option("--nodes", o.nodes, "nodes used (default: as --gpus)");
  cmd.add_option("--gpus", o.gpus,
                 "devices used (default: the example's, else the fewest the plan runs on, with a note)")->excludes(nodes);
  cmd.add_option("--global-batch", o.global_batch, "sequences per iteration");
  cmd.add_option("--seq-len", o.seq_len, "tokens per sequence (default: the model's)");
  cmd.add_option("--training", o.training,
                 "a TOML file with a [training] table: precision, FP8 recipe, dtypes, the precision-aware optimizer, "
                 "and its batch and length unless --global-batch or --seq-len are given (replaces an example's)");
  cmd.add_option("--moe-imbalance", o.moe_imbalance,
                 "MoE: the busiest EP rank's tokens over the mean (default: the model's load_imbalance, 1 if unset)");
  cmd.add_option("--moe-histogram", o.moe_histogram,
                 "MoE: a measured per-expert token distribution, one line of counts per layer (replaces --moe-imbalance)");
  cmd.add_option("--mtp-layers", o.mtp_layers, "multi-token-prediction layers (default: the model's; 0: trained without)");
}

// The unexpected arguments of a parse, as one message: each unknown option
// of the command with the nearest option it has ("did you mean"), and what
// to do when no command was given.
std::string unexpected_message(const CLI::App& app, const std::vector<std::string>& extras) {
  const CLI::App* cmd = nullptr;
  for (const CLI::App* sub : app.get_subcommands()) cmd = sub;
  std::string msg;
  for (const std::string& x : extras) {
    if (x.rfind("--", 0) != 0) continue;
    const std::string name = x.substr(0, x.find('='));
    std::string best;
    std::size_t best_d = 4;   // suggest only names within 3 edits
    if (cmd)
      for (const CLI::Option* opt : cmd->get_options())
        for (const std::string& l : opt->get_lnames()) {
          const std::size_t d = edit_distance(name.substr(2), l);
          if (d < best_d) best_d = d, best = "--" + l;
        }
    msg += fmt::format("{}unknown option {}{}", msg.empty() ? "" : "; ", name,
                       best.empty() ? "" : fmt::format(" (did you mean {}?)", best));
  }
  if (msg.empty()) {
    std::string list;
    for (const std::string& x : extras) list += (list.empty() ? "" : " ") + x;
    msg = "unexpected arguments: " + list;
  }
  if (cmd) return fmt::format("megascope {}: {}; see megascope {} --help", cmd->get_name(), msg, cmd->get_name());
  return fmt::format("megascope: {}; give a command first (estimate, simulate, plan, sweep, compare, run, calibrate, "
                     "list), as in megascope simulate --help", msg);
}

}  // namespace

int run_cli(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  CLI::App app{"Megascope: plan, simulate and measure 5-D parallel transformer training"};
  app.require_subcommand(0, 1);
  app.set_version_flag("--version", std::string("megascope ") + MEGASCOPE_VERSION);

  ScenarioOptions est;
  bool json = false;
  auto* estimate = app.add_subcommand(
      "estimate", "parameters, FLOPs and memory per pipeline stage of one plan (no options: the default example)");
  add_scenario_options(*estimate, est);
  estimate->add_flag("--json", json, "print one JSON object");

  ScenarioOptions simo;
  SimulateOptions sim_opts;
  bool sim_json = false;
  std::string mode = "reduced";
  auto* simulate = app.add_subcommand(
      "simulate", "one training iteration, event by event on the cluster (no options: the default example)");
  add_scenario_options(*simulate, simo);
  simulate->add_option("--trace", sim_opts.trace, "write a Chrome/Perfetto trace (JSON) of the iteration");
  simulate->add_option("--calibration", sim_opts.calibration, "a cost-model profile (TOML) applied over the default");
  simulate->add_option("--mode", mode, "full (every rank) or reduced (one rank per pipeline stage)")
      ->check(CLI::IsMember({"full", "reduced"}));
  simulate->add_flag("--json", sim_json, "print one JSON object");

  PlanCommandOptions plan_opts;
  auto* plan = app.add_subcommand(
      "plan", "search every legal plan for a model, a cluster and a batch; rank the best by simulation");
  add_plan_options(*plan, plan_opts);
  plan->add_option("--top", plan_opts.top, "plans simulated and ranked (default 32)");
  plan->add_option("--explain", plan_opts.explain, "where a given plan (inline or TOML) ranks, and why");
  plan->add_flag("--json", plan_opts.json, "print one JSON object");
  plan->add_flag("--csv", plan_opts.csv, "print the ranked table as CSV");
  plan->add_flag("--no-progress", plan_opts.no_progress, "no progress bar on the terminal");

  SweepOptions sweep_opts;
  auto* sweep = app.add_subcommand(
      "sweep", "the best plan at every point of a sweep over GPU counts, models, clusters and cluster variants "
               "(also under mpirun)");
  add_sweep_options(*sweep, sweep_opts);

  CompareOptions compare_opts;
  auto* compare =
      app.add_subcommand("compare", "step time and per-op-kind error of a simulated trace against a measured one");
  add_compare_options(*compare, compare_opts);

  RunCommandOptions run_opts;
  auto* run = app.add_subcommand(
      "run", "train a plan for real, one process per rank: mpirun -np <world> megascope run --backend cpu ...");
  add_run_options(*run, run_opts);

  CalibrateOptions calibrate_opts;
  auto* calibrate = app.add_subcommand(
      "calibrate", "measure the executor's kernels and collectives on this machine and write a calibration profile "
                   "and cluster (under mpirun: mpirun -np 2 megascope calibrate --backend cpu)");
  add_calibrate_options(*calibrate, calibrate_opts);

  auto* list = app.add_subcommand("list", "the shipped models, clusters with their devices, and examples");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    out << app.help();
    return 0;
  } catch (const CLI::CallForVersion& e) {
    out << e.what() << "\n";
    return 0;
  } catch (const CLI::ExtrasError&) {
    std::vector<std::string> extras = app.remaining();
    for (const CLI::App* sub : app.get_subcommands())
      for (const std::string& x : sub->remaining()) extras.push_back(x);
    err << unexpected_message(app, extras) << "\n";
    return 2;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {
      out << (e.get_name() == "CallForAllHelp" ? app.help("", CLI::AppFormatMode::All) : app.help());
      return 0;
    }
    std::string who = "megascope";
    for (const CLI::App* sub : app.get_subcommands()) who += " " + sub->get_name();
    err << who << ": " << e.what() << (who == "megascope" ? "" : "; see " + who + " --help") << "\n";
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
    return memory_report(sc->setup).fits ? 0 : kExitDoesNotFit;
  }
  if (*simulate) {
    sim_opts.mode = mode == "full" ? sim::Mode::full : sim::Mode::reduced;
    auto sc = load_scenario(simo);
    if (!sc) {
      err << "megascope simulate: error: " << sc.error().str() << "\n";
      return 1;
    }
    auto outcome = run_simulation(*sc, sim_opts);
    if (!outcome) {
      err << "megascope simulate: error: " << outcome.error().str() << "\n";
      return 1;
    }
    if (sim_json) out << simulate_json(*sc, *outcome, sim_opts).dump(2) << "\n";
    else out << simulate_text(*sc, *outcome, sim_opts);
    return memory_report(sc->setup).fits ? 0 : kExitDoesNotFit;
  }
  if (*plan) return run_plan(plan_opts, out, err);
  if (*sweep) return run_sweep(sweep_opts, out, err);
  if (*compare) return run_compare(compare_opts, out, err);
  if (*run) return run_command(run_opts, out, err);
  if (*calibrate) return run_calibrate(calibrate_opts, out, err);
  if (*list) {
    out << "models   (" << data_dir() << "/models):\n";
    for (const auto& m : shipped_models()) out << "  " << m << "\n";
    out << "clusters (" << data_dir() << "/clusters), each with its device (sweep --device takes either):\n";
    for (const auto& c : shipped_clusters()) {
      const auto spec = resolve_cluster(c);
      out << fmt::format("  {:<14} {}\n", c, spec ? spec->device.name : "(does not load: " + spec.error().str() + ")");
    }
    out << "examples (" << data_dir() << "/examples; simulate --example FILE):\n";
    for (const auto& e : shipped_examples()) out << "  " << e << ".toml\n";
    return 0;
  }
  out << app.help();
  return 0;
}

}  // namespace megascope::cli
