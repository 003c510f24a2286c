#include "apps/run.hpp"
#include "apps/run_cuda.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <string_view>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "config/library.hpp"
#include "config/plan_settings.hpp"
#include "apps/simulate.hpp"
#include "core/accounting/memory.hpp"
#include "core/program/builder.hpp"
#include "core/units.hpp"
#include "sim/network.hpp"
#include "sim/timed_program.hpp"
#include "exec/mpi_env.hpp"

namespace megascope::cli {

void add_run_options(CLI::App& cmd, RunCommandOptions& o) {
  cmd.add_option("--backend", o.backend,
                 "cpu: train on CPU kernels and MPI; cuda: replay the plan's kernels and NCCL on GPUs, for timing")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd.add_option("--model", o.scenario.model, "shipped model name (e.g. tiny-gpt, tiny-llama), model TOML or config.json");
  cmd.add_option("--cluster", o.scenario.cluster,
                 "cluster the plan is validated against (default: cpu-host; cuda: the GPU's shipped cluster)");
  cmd.add_option("--plan", o.scenario.plan, "inline plan (tp=2,pp=2,...) or plan TOML file");
  cmd.add_option("--global-batch", o.scenario.global_batch, "sequences per step (default 8)");
  cmd.add_option("--seq-len", o.scenario.seq_len, "tokens per sequence (default: the model's)");
  cmd.add_option("--training", o.scenario.training,
                 "a training TOML: its [training] global_batch_size and seq_length, and with [training.lengths] "
                 "variable-length training (documents of sampled lengths, packed or padded; cpu backend); "
                 "instead of --global-batch and --seq-len");
  cmd.add_option("--steps", o.run.steps, "training steps to run (default 1)")->check(CLI::PositiveNumber);
  cmd.add_option("--data", o.run.data, "training text, read as bytes (default: the GNU GPL text Debian ships)");
  cmd.add_option("--trace", o.run.trace, "write the measured trace of the last step (same format as simulate --trace)");
  cmd.add_option("--checkpoint-dir", o.run.checkpoint_dir, "write sharded checkpoints here (one file per rank)");
  cmd.add_option("--save-every", o.run.save_every, "steps between checkpoints (default: only the last step)")
      ->check(CLI::PositiveNumber);
  cmd.add_flag("--resume", o.run.resume, "continue from the latest checkpoint in --checkpoint-dir");
  cmd.add_option("--seed", o.run.seed, "initialisation and dropout seed (default 1234)");
  // NaN and infinity pass CLI11's number checks (a comparison with NaN is false): refused here.
  const auto finite_at_least = [](double lo, bool strict) {
    return CLI::Validator(
        [lo, strict](std::string& text) -> std::string {
          char* end = nullptr;
          const double v = std::strtod(text.c_str(), &end);
          if (end == text.c_str() || *end != '\0' || !std::isfinite(v) || v < lo || (strict && v == lo))
            return fmt::format("must be a finite number {} {}, found {}", strict ? ">" : ">=", lo, text);
          return {};
        },
        strict ? "FINITE > 0" : "FINITE >= 0");
  };
  cmd.add_option("--lr", o.run.lr, "AdamW learning rate (default 1e-3)")->check(finite_at_least(0, false));
  cmd.add_option("--clip-grad", o.run.clip_grad, "global gradient-norm clipping (default 1.0; 0: off)")
      ->check(finite_at_least(0, false));
  cmd.add_option("--recv-timeout", o.run.recv_timeout_s,
                 "seconds a pipeline receive or a collective waits for its peers before naming them and aborting (default 120)")
      ->check(finite_at_least(0, true));
  cmd.add_flag("--json", o.json, "print the steps as one JSON object");
  cmd.add_option("--inject-failure", o.inject_failure,
                 "RANK:STEP[:hang|:nan]: that rank exits abruptly at the start of that step, or with :hang stays "
                 "alive and does nothing more, or with :nan gets a NaN gradient (tests the failure paths)");
  cmd.add_flag("--skip-nonfinite-steps", o.run.skip_nonfinite,
               "a step whose gradient norm is NaN or infinite (its loss finite) makes no update and the run goes on, "
               "as Megatron-LM's loss scaler skips an iteration (default: the run stops before that step's checkpoint)");
  cmd.add_option("--shard", o.shard, "cuda: measure the compute of this rank of the plan on one GPU (no mpirun)");
  cmd.add_option("--warmup", o.warmup, "cuda: untimed steps before the measured ones (default 1)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_flag("--train", o.train,
               "cuda: train on the GPU kernels (the cpu backend's losses to compare; fp32, or --bf16) instead of replaying");
  cmd.add_flag("--bf16", o.run.bf16,
               "training (cpu, or cuda --train): the linear layers' GEMMs in bf16 (operands and outputs rounded to bf16, "
               "fp32 accumulation, fp32 master weights and gradients); other kernels stay fp32");
  cmd.add_option("--gpus", o.scenario.gpus, "GPUs of the plan (cuda --shard: the plan's world; default: the MPI job's)");
}

Result<Program> build_run_program(const Setup& s) {
  // zb-1p/zb-2p: the order `simulate` places from the device's priced times,
  // so that a measured trace and a simulated one match op by op.
  auto cost = cost_model_for(s, std::nullopt);
  if (!cost) return tl::unexpected(cost.error());
  const sim::Topology topo = sim::Topology::build(s.cluster, s.world);
  auto program = sim::build_timed_program(s, *cost, topo);
  if (!program) return tl::unexpected(program.error());
  return std::move(program->program);
}

Result<RunProgram> load_run_program(const ScenarioOptions& sc) {
  auto scenario = load_scenario(sc);
  if (!scenario) return tl::unexpected(scenario.error());
  auto program = build_run_program(scenario->setup);
  if (!program) return tl::unexpected(program.error());
  return RunProgram{std::move(*scenario), std::move(*program)};
}

int run_command(RunCommandOptions o, std::ostream& out, std::ostream& err) {
  if (o.inject_failure) {
    // Exactly RANK:STEP, two non-negative integers, or RANK:STEP:hang, and
    // nothing else ("1:3:4" was read as 1:3).
    std::string text = *o.inject_failure;
    for (const auto& [suffix, kind] : {std::pair{std::string_view(":hang"), exec::RunOptions::Fail::hang},
                                       std::pair{std::string_view(":nan"), exec::RunOptions::Fail::nan}})
      if (text.size() > suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0) {
        o.run.fail = kind;
        text.resize(text.size() - suffix.size());
        break;
      }
    const auto colon = text.find(':');
    const auto number = [](const std::string& t) {
      return !t.empty() && t.size() <= 9 && t.find_first_not_of("0123456789") == std::string::npos;
    };
    try {
      if (colon == std::string::npos || !number(text.substr(0, colon)) || !number(text.substr(colon + 1)))
        throw std::invalid_argument("not RANK:STEP");
      o.run.fail_rank = std::stoi(text.substr(0, colon));
      o.run.fail_step = std::stoi(text.substr(colon + 1));
    } catch (const std::exception&) {
      err << "megascope run: error: --inject-failure: expected RANK:STEP, RANK:STEP:hang or RANK:STEP:nan, found \""
          << *o.inject_failure
          << "\"\n";
      return 2;
    }
  }
  // One source of the batch and the length: the training TOML, or the options.
  if (o.scenario.training && (o.scenario.global_batch || o.scenario.seq_len)) {
    err << fmt::format("megascope run: error: --training: {} given as well; the training TOML sets the global batch "
                       "(global_batch_size) and the sequence length (seq_length): give one or the other\n",
                       o.scenario.global_batch ? "--global-batch" : "--seq-len");
    return 2;
  }
  const bool cuda_train = o.backend == "cuda" && o.train;
  if (o.backend == "cuda" && !o.train && o.run.bf16) {
    err << "megascope run: error: --bf16: a training option (the cpu backend, or --backend cuda --train); the replay "
           "runs the Program's own precision\n";
    return 2;
  }
  if (o.backend == "cuda" && !o.train) return run_cuda_command(o, out, err);
  if (o.train && o.backend != "cuda") {
    err << "megascope run: error: --train: the cpu backend always trains; --train selects training on --backend cuda\n";
    return 2;
  }
  if (o.shard) {
    err << (cuda_train ? "megascope run: error: --shard measures the replay of one rank; --train runs every rank\n"
                       : "megascope run: error: --shard measures one rank on one GPU: it needs --backend cuda\n");
    return 2;
  }
  ScenarioOptions sc = o.scenario;
  if (!sc.model) {
    err << "megascope run: error: --model is required (e.g. --model tiny-gpt)\n";
    return 2;
  }
  if (!sc.plan) sc.plan = "tp=1";   // one rank per DP replica by default
  if (!sc.global_batch && !sc.training) sc.global_batch = 8;
  const bool mpi = exec::launched_by_mpi();
  const int world = mpi ? exec::MpiEnv::get().size() : 1;
  const bool root = !mpi || exec::MpiEnv::get().rank() == 0;
  if (!sc.gpus && !sc.nodes) sc.gpus = world;
  if (!sc.cluster) {   // the CPU host, one device per rank of the job, all in one shared-memory domain
    auto host = resolve_cluster("cpu-host");
    if (!host) {
      err << "megascope run: error: " << host.error().str() << "\n";
      return 1;
    }
    host->node.devices_per_node = std::max(host->node.devices_per_node, world);
    host->scale_up_domain = host->node.devices_per_node;
    host->num_nodes = 1;
    sc.cluster_spec = *host;
  }
  std::ostringstream quiet;
  std::ostream& log = root ? out : quiet;
  std::ostream& errs = root ? err : quiet;
  auto loaded = load_run_program(sc);
  if (!loaded) {
    errs << "megascope run: error: " << loaded.error().str() << "\n";
    return 1;
  }
  const Setup& s = loaded->scenario.setup;
  const Program* program = &loaded->program;
  if (o.run.fail_rank && *o.run.fail_rank >= s.world) {   // it would never fire
    errs << fmt::format("megascope run: error: --inject-failure: rank {} is not one of the plan's {} ranks\n",
                        *o.run.fail_rank, s.world);
    return 2;
  }
  if (o.run.fail_rank && !o.run.resume && (o.run.fail_step < 1 || o.run.fail_step > o.run.steps)) {   // nor would this
    errs << fmt::format("megascope run: error: --inject-failure: step {} is not one of the run's steps (1 to {})\n",
                        o.run.fail_step, o.run.steps);
    return 2;
  }
  if (!cuda_train) {
    // The ranks share this host's memory: a model that cannot fit is one
    // clear error here, not an allocation failure mid-run.
    const double page = static_cast<double>(sysconf(_SC_PAGE_SIZE)), pages = static_cast<double>(sysconf(_SC_PHYS_PAGES));
    const double host = page > 0 && pages > 0 ? page * pages : 0;
    const double need = memory_report(s).peak_bytes * s.world;
    if (host > 0 && need > host) {
      errs << fmt::format("megascope run: error: --model: {} needs about {:.1f} GiB on this host ({} rank{} of {:.1f} GiB "
                          "each: weights, gradients, optimizer state and activations) and the host has {:.1f} GiB; "
                          "use a smaller model (tiny-gpt, tiny-llama, tiny-moe), a shorter --seq-len, or more hosts\n",
                          s.model.name, need / units::GiB, s.world, s.world == 1 ? "" : "s", need / s.world / units::GiB, host / units::GiB);
      return 1;
    }
  }
  o.run.plan_text = format_inline_plan(s.plan);
  o.run.model_name = s.model.name;
  o.run.build_program = build_run_program;   // a packed step's Program, built as the run's
  const VarlenSpec* varlen = s.training.varlen.get();
  if (!o.json) {
    log << fmt::format("run: {} on {} {} rank{} ({}), plan {}, global batch {}, ", s.model.name, s.world,
                       cuda_train ? "GPU" : "CPU", s.world == 1 ? "" : "s",
                       fmt::format("{}, {}", cuda_train ? "cuda backend: the GPU kernels" : "cpu backend",
                                   o.run.bf16 ? "bf16 GEMMs" : "fp32"),
                       o.run.plan_text, s.training.global_batch_size);
    if (!varlen)
      log << fmt::format("{} micro-batches of {} x {} tokens\n", s.num_microbatches, s.plan.micro_batch_size,
                         s.seq_length);
    else if (varlen->packing == Packing::pack)
      log << fmt::format("documents of {} lengths packed into micro-batches of up to {} tokens (dp_balanced; "
                         "micro-batches per step from the schedule)\n",
                         to_string(varlen->lengths.kind), s.seq_length);
    else
      log << fmt::format("documents of {} lengths, each padded to {} tokens, {} micro-batches of {}\n",
                         to_string(varlen->lengths.kind), s.seq_length, s.num_microbatches, s.plan.micro_batch_size);
  }
  std::ostringstream steps_text;
  auto logs = cuda_train ? train_cuda(s, *program, o.run, o.json ? steps_text : log)
                         : exec::run_cpu(s, *program, o.run, o.json ? steps_text : log);
  if (!logs) {
    errs << "megascope run: error: " << logs.error().str() << "\n";
    return 1;
  }
  if (o.json) {
    nlohmann::json j;
    j["backend"] = o.backend;
    j["bf16"] = o.run.bf16;
    j["model"] = s.model.name;
    j["plan"] = o.run.plan_text;
    j["world"] = s.world;
    for (const exec::StepLog& l : *logs)
      j["steps"].push_back({{"step", l.step},
                            {"loss", l.loss},
                            {"grad_norm", std::isfinite(l.grad_norm) ? nlohmann::json(l.grad_norm) : nlohmann::json()},
                            {"step_time_s", l.step_time_s},
                            {"skipped", l.skipped}});
    log << j.dump(2) << "\n";
  } else if (o.run.trace) {
    log << "trace: " << *o.run.trace << " (measured; compare with `megascope compare`)\n";
  }
  return 0;
}

}  // namespace megascope::cli
