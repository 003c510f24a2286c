// `megascope run --backend cuda` (apps/run_cuda.hpp).
#include "apps/run_cuda.hpp"

#include <fmt/format.h>

#ifdef MEGASCOPE_HAVE_EXEC_CUDA
#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>

#include "apps/gpu_cluster.hpp"
#include "config/plan_settings.hpp"
#include "core/program/builder.hpp"
#include "exec/cuda/check.hpp"
#include "exec/cuda/device.hpp"
#include "exec/cuda/kernel_ops_cuda.hpp"
#include "exec/cuda/replay_cuda.hpp"
#include "exec/mpi_env.hpp"
#endif

namespace megascope::cli {

#ifndef MEGASCOPE_HAVE_EXEC_CUDA

int run_cuda_command(const RunCommandOptions&, std::ostream&, std::ostream& err) {
  err << "megascope run: error: --backend cuda: no CUDA device support in this build (nvcc was not found when it was "
         "configured)\n";
  return 1;
}

Result<std::vector<exec::StepLog>> train_cuda(const Setup&, const Program&, const exec::RunOptions&, std::ostream&) {
  return fail("--backend", "cuda: no CUDA device support in this build (nvcc was not found when it was configured)");
}

#else

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int replay(const RunCommandOptions& o, std::ostream& out, std::ostream& err) {
  // Before CUDA starts: one hardware queue per stream the replay uses (CUDA's
  // default of 8 would make its 5 to 15 streams share queues and wait on
  // each other); a value the user set is kept.
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  const char* cpu_only = o.run.checkpoint_dir ? "--checkpoint-dir"
                         : o.run.resume       ? "--resume"
                         : !o.run.data.empty() ? "--data"
                         : o.inject_failure   ? "--inject-failure"
                                              : nullptr;
  if (cpu_only) {
    err << fmt::format("megascope run: error: {}: the cuda backend replays the plan's kernels for timing and does not "
                       "train; use --backend cpu to train\n",
                       cpu_only);
    return 2;
  }
  ScenarioOptions sc = o.scenario;
  if (!sc.model) {
    err << "megascope run: error: --model is required (e.g. --model llama3-8b)\n";
    return 2;
  }
  exec::MpiEnv& env = exec::MpiEnv::get();
  const bool root = env.rank() == 0;
  std::ostringstream quiet;
  std::ostream& log = root ? out : quiet;
  std::ostream& errs = root ? err : quiet;
  if (o.shard && !sc.gpus) {
    errs << "megascope run: error: --shard: give the plan's GPU count with --gpus N\n";
    return 2;
  }
  if (!sc.plan) sc.plan = "tp=1";
  if (!sc.global_batch && !sc.training) sc.global_batch = 8;   // a training TOML carries its own
  if (!sc.gpus && !sc.nodes) sc.gpus = env.size();
  if (!sc.cluster) {   // the shipped cluster of this GPU
    exec::cuda::require_device();
    const std::string name = exec::cuda::device_info().name;
    const auto c = shipped_cluster_of_gpu(name);
    if (!c) {
      errs << fmt::format("megascope run: error: --backend cuda: no shipped cluster for '{}': give one with --cluster\n",
                          name);
      return 1;
    }
    sc.cluster = *c;
  }
  auto loaded = load_run_program(sc);
  if (!loaded) {
    errs << "megascope run: error: " << loaded.error().str() << "\n";
    return 1;
  }
  const Setup& s = loaded->scenario.setup;
  const Program* program = &loaded->program;
  exec::cuda::ReplayOptions ro;
  ro.steps = o.run.steps;
  ro.warmup = o.warmup;
  ro.shard = o.shard;
  ro.trace = o.run.trace;
  ro.plan_text = format_inline_plan(s.plan);
  ro.model_name = s.model.name;
  ro.timeout_s = o.run.recv_timeout_s;
  auto report = exec::cuda::run_replay(s, *program, ro);
  if (!report) {
    errs << "megascope run: error: " << report.error().str() << "\n";
    return 1;
  }
  const exec::cuda::ReplayReport& r = *report;
  const double step = median(r.step_times_s);
  const double tflops = step > 0 ? r.gemm_flops / step / 1e12 : 0;
  const int measured_rank = o.shard.value_or(0);
  if (o.json) {
    nlohmann::json j;
    j["backend"] = "cuda";
    j["mode"] = o.shard ? "shard" : "replay";
    j["model"] = s.model.name;
    j["plan"] = ro.plan_text;
    j["world"] = s.world;
    j["device"] = r.device;
    j["rank"] = measured_rank;
    for (std::size_t k = 0; k < r.step_times_s.size(); ++k)
      j["steps"].push_back({{"step", k + 1}, {"step_time_s", r.step_times_s[k]}});
    j["median_step_time_s"] = step;
    if (!o.shard) j["tokens_per_s"] = step > 0 ? static_cast<double>(s.tokens_per_iteration()) / step : 0.0;
    j["gemm_tflops"] = tflops;
    j["ops"] = r.ops;
    j["ops_run"] = r.ops_run;
    j["kernel_launches"] = r.kernels;
    j["distinct_kernels"] = r.distinct_kernels;
    j["skipped_kernel_launches"] = r.skipped_kernels;
    j["skipped_kernels"] = r.skipped;
    log << j.dump(2) << "\n";
    return 0;
  }
  if (o.shard)
    log << fmt::format("replay (shard): {}, rank {} of {} (pipeline stage {}), plan {}, on one {}: compute only, "
                       "communication not run\n",
                       s.model.name, measured_rank, s.world, program->grid.coord(measured_rank).pp, ro.plan_text,
                       r.device);
  else
    log << fmt::format("replay: {} on {} GPU{} ({}), plan {}, global batch {}, {} micro-batches of {} x {} tokens\n",
                       s.model.name, s.world, s.world == 1 ? "" : "s", r.device, ro.plan_text,
                       s.training.global_batch_size, s.num_microbatches, s.plan.micro_batch_size, s.seq_length);
  log << fmt::format("rank {}: {} ops run of {}, {} kernel launches ({} distinct), {} without a GPU kernel\n",
                     measured_rank, r.ops_run, r.ops, r.kernels, r.distinct_kernels, r.skipped_kernels);
  for (const std::string& k : r.skipped) log << "  not launched: " << k << "\n";
  for (std::size_t k = 0; k < r.step_times_s.size(); ++k)
    log << fmt::format("step {:>4}  {} {:.4f} s\n", k + 1, o.shard ? "compute time" : "time", r.step_times_s[k]);
  log << fmt::format("median {:.4f} s", step);
  if (!o.shard && step > 0) log << fmt::format(", {:.4g} tokens/s", static_cast<double>(s.tokens_per_iteration()) / step);
  log << fmt::format("; rank {}: {:.1f} TFLOP/s of GEMM work (the Program's GEMM FLOPs / step time)\n", measured_rank,
                     tflops);
  log << "synthetic data: the replay measures time, not losses (--train runs the training on the GPU kernels)\n";
  if (o.run.trace) log << "trace: " << *o.run.trace << " (measured; compare with `megascope compare`)\n";
  return 0;
}

}  // namespace

Result<std::vector<exec::StepLog>> train_cuda(const Setup& s, const Program& p, const exec::RunOptions& o,
                                              std::ostream& out) {
  try {
    return exec::cuda::run_cuda_training(s, p, o, out);
  } catch (const std::exception& e) {   // NoCudaDevice, a CUDA error, a kernel's argument check
    return fail("--backend", fmt::format("cuda: {}", e.what()));
  }
}

int run_cuda_command(const RunCommandOptions& o, std::ostream& out, std::ostream& err) {
  try {
    return replay(o, out, err);
  } catch (const exec::cuda::NoCudaDevice& e) {
    err << "megascope run: error: --backend cuda: " << e.what() << "\n";
    return 1;
  } catch (const std::runtime_error& e) {
    err << "megascope run: error: --backend cuda: " << e.what() << "\n";
    return 1;
  }
}

#endif

}  // namespace megascope::cli
