// `megascope calibrate` (apps/calibrate.hpp): which cases are measured, the
// short reference run that gives the executor's overhead per op, and the
// files and report. The fits are in apps/calibrate_fit.cpp.
#include "apps/calibrate.hpp"
#include "apps/calibrate_cuda.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "config/library.hpp"
#include "config/plan_settings.hpp"
#include "config/trace_file.hpp"
#include "core/program/builder.hpp"
#include "exec/mpi_env.hpp"
#include "exec/runner.hpp"
#include "sim/engine.hpp"

namespace megascope::cli {

namespace {

// The base cluster resized to `devices` ranks on one host (as `megascope run` sizes it).
ClusterSpec host_of(ClusterSpec c, int devices) {
  c.node.devices_per_node = std::max(c.node.devices_per_node, devices);
  c.scale_up_domain = c.node.devices_per_node;
  c.num_nodes = 1;
  return c;
}

Result<Setup> setup_of(const ModelSpec& m, const ClusterSpec& base, const std::string& plan, std::int64_t global_batch) {
  auto p = parse_inline_plan(plan);
  if (!p) return tl::unexpected(p.error());
  TrainingSpec t;
  t.global_batch_size = global_batch;
  const int world = p->tp * p->pp * std::max(1, p->dp.value_or(1)) * p->cp;
  return validate_setup(m, host_of(base, world), t, *p, world);
}

exec::GemmPass pass_of(Phase p) {
  switch (p) {
    case Phase::backward_input: return exec::GemmPass::backward_input;
    case Phase::backward_weight: return exec::GemmPass::backward_weight;
    default: return exec::GemmPass::forward;
  }
}

struct Cases {
  CalibrationData data;
  std::vector<std::string> programs;   // "tiny-gpt tp=2 mbs=4", ...
};

// The GEMMs and attention shapes of the models' Programs (every tp and
// micro-batch size asked for), the memory kernels at the models' widths,
// sweeps for the curves, and the collectives over 2..world ranks.
Result<Cases> make_cases(const CalibrateOptions& o, const ClusterSpec& base, int world) {
  Cases c;
  CalibrationData& d = c.data;
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t, int>, double> uses;
  std::set<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, bool, bool>> attention;
  std::set<std::tuple<int, std::int64_t, std::int64_t, float>> memory;
  for (const std::string& name : o.models) {
    auto model = resolve_model(name);
    if (!model) return tl::unexpected(model.error());
    const ModelSpec& m = *model;
    const bool rope = m.position_embedding == PositionEmbedding::rope;
    for (int tp : o.tp)
      for (int mbs : o.micro_batches) {
        auto s = setup_of(m, base, fmt::format("tp={},mbs={}", tp, mbs), mbs);
        if (!s) return tl::unexpected(s.error());
        auto prog = build_program(*s);
        if (!prog) return tl::unexpected(prog.error());
        c.programs.push_back(fmt::format("{} tp={} mbs={}", m.name, tp, mbs));
        const StageProgram& st = prog->stages[0];
        for (const Op& op : st.ops) {
          if (op.kind != OpKind::compute) continue;
          for (std::uint32_t k = op.kernel_begin; k < op.kernel_begin + op.kernel_count; ++k) {
            const Kernel& kr = st.kernels[k];
            if (kr.kind == KernelKind::gemm)
              uses[{kr.gemm.m, kr.gemm.n, kr.gemm.k, static_cast<int>(pass_of(op.phase))}] += 1;
            else if (kr.kind != KernelKind::memory)
              attention.insert({kr.attention.batch, kr.attention.heads, kr.attention.kv_heads, kr.attention.seq_q,
                                kr.attention.head_dim, kr.kind == KernelKind::attention_bwd, rope});
          }
        }
        const std::int64_t T = s->seq_length * mbs, h = m.hidden_size, f = m.ffn_hidden_size / tp,
                           V = s->padded_vocab / tp;
        // A squared-ReLU MLP (not gated) is measured with the GeLU kernel: the
        // executor has no squared-ReLU kernel, and both read and write one
        // element per element.
        const bool ln = m.norm == Norm::layernorm, swiglu = m.activation == Activation::swiglu;
        const auto drop = static_cast<float>(m.hidden_dropout);
        using K = exec::MemoryKernel;
        for (std::int64_t rows : {T, T / tp}) {
          for (K kk : {ln ? K::layernorm_fwd : K::rmsnorm_fwd, ln ? K::layernorm_bwd : K::rmsnorm_bwd,
                       K::bias_dropout_add_fwd, K::bias_dropout_add_bwd, K::embedding_fwd, K::embedding_bwd})
            memory.insert({static_cast<int>(kk), rows, h, drop});
        }
        memory.insert({static_cast<int>(swiglu ? K::swiglu_fwd : K::gelu_fwd), T, f, drop});
        memory.insert({static_cast<int>(swiglu ? K::swiglu_bwd : K::gelu_bwd), T, f, drop});
        memory.insert({static_cast<int>(K::cross_entropy_fwd), T, V, drop});
        memory.insert({static_cast<int>(K::cross_entropy_bwd), T, V, drop});
      }
  }
  for (const auto& [key, n] : uses) {
    d.gemms.push_back({{std::get<0>(key), std::get<1>(key), std::get<2>(key)}, static_cast<exec::GemmPass>(std::get<3>(key))});
    d.gemm_uses.push_back(n);
  }
  const std::vector<std::int64_t> dims = o.quick ? std::vector<std::int64_t>{32, 128} : std::vector<std::int64_t>{32, 128, 512};
  for (std::int64_t a : dims)
    for (std::int64_t b : dims)
      for (std::int64_t k : dims) {
        d.gemms.push_back({{a, b, k}, exec::GemmPass::forward});
        d.gemm_uses.push_back(0);
      }
  for (const auto& [kernel, rows, width, drop] : memory)
    d.memory.push_back({static_cast<exec::MemoryKernel>(kernel), rows, width, drop, true});
  for (std::int64_t n : o.quick ? std::vector<std::int64_t>{1 << 14} : std::vector<std::int64_t>{1 << 14, 1 << 16, 1 << 18})
    d.memory.push_back({exec::MemoryKernel::adamw, n, 1});
  for (const auto& [b, heads, kv, seq, dim, bwd, rope] : attention)
    d.attention.push_back(exec::self_attention_case(b, heads, kv, seq, dim, bwd, rope));
  d.world = world;
  const std::vector<double> sizes = o.quick ? std::vector<double>{1024, 262144}
                                            : std::vector<double>{64, 1024, 16384, 262144, 4194304};
  for (int g = 2; g <= world; ++g)
    for (exec::CommOp op : {exec::CommOp::all_reduce, exec::CommOp::reduce_scatter, exec::CommOp::all_gather,
                            exec::CommOp::all_to_all})
      for (double b : sizes) d.comms.push_back({op, g, b * g});
  if (world >= 2)
    for (double b : sizes) d.comms.push_back({exec::CommOp::send_recv, 2, b});
  return c;
}


// A short run of the executor (the first model, dp = world, micro-batch 1)
// whose compute ops, priced with the fitted kernels, leave the executor's own
// work per op: the median over its compute ops of measured minus priced.
Result<double> op_overhead(const CalibrateOptions& o, const ClusterSpec& base, const sim::CostProfile& fitted, int world,
                           std::string& what) {
  auto model = resolve_model(o.models.front());
  if (!model) return tl::unexpected(model.error());
  const std::string plan = world > 1 ? fmt::format("dp={}", world) : "tp=1";
  const int per_rank = o.quick ? 2 : 8;
  auto s = setup_of(*model, base, plan, per_rank * world);
  if (!s) return tl::unexpected(s.error());
  auto prog = build_program(*s);
  if (!prog) return tl::unexpected(prog.error());
  exec::RunOptions ro;
  ro.steps = 2;
  ro.plan_text = format_inline_plan(s->plan);
  ro.model_name = s->model.name;
  const std::string path =
      (std::filesystem::temp_directory_path() / fmt::format("megascope-calibrate-{}.json", getpid())).string();
  const std::string shared = exec::MpiEnv::get().broadcast(path);
  ro.trace = shared;
  std::ostringstream quiet;
  auto logs = exec::run_cpu(*s, *prog, ro, quiet);
  if (!logs) return tl::unexpected(logs.error());
  double overhead = 0;
  if (exec::MpiEnv::get().rank() == 0) {
    auto trace = read_trace(shared);
    std::error_code ec;
    std::filesystem::remove(shared, ec);
    if (!trace) return tl::unexpected(trace.error());
    const StageProgram& st = prog->stages[0];
    const std::vector<double> priced = sim::compute_durations(st, sim::CostModel(s->cluster.device, fitted));
    std::vector<double> residual;
    for (const TraceRecord& r : trace->spans) {
      if (r.op >= st.ops.size()) continue;
      const Op& op = st.ops[r.op];
      if (op.kind == OpKind::compute && op.kernel_count > 0) residual.push_back((r.end_s - r.start_s) - priced[r.op]);
    }
    overhead = std::max(0.0, median(residual));
    what = fmt::format("{} {}, {} micro-batches of 1 per rank, median of {} compute ops", s->model.name, plan, per_rank,
                       residual.size());
  }
  return std::stod(exec::MpiEnv::get().broadcast(fmt::format("{:.17g}", overhead)));
}

std::string default_cluster_output(const std::string& output) {
  std::string stem = output;
  if (stem.size() > 5 && stem.substr(stem.size() - 5) == ".toml") stem.resize(stem.size() - 5);
  return stem + "-cluster.toml";
}

// Opens (and creates) a file for appending: whether it can be written, without truncating it.
bool writable(const std::string& path) {
  std::ofstream f(path, std::ios::app);
  return static_cast<bool>(f);
}

}  // namespace

// Shared with the cuda backend (apps/calibrate.hpp).
std::string today() {
  const std::time_t t = std::time(nullptr);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::localtime(&t));
  return buf;
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "this host";
  return buf;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void add_calibrate_options(CLI::App& cmd, CalibrateOptions& o) {
  cmd.add_option("--backend", o.backend,
                 "cpu (the CPU executor's kernels and MPI) or cuda (cuBLASLt, the CUDA kernels, NCCL; one GPU per rank)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd.add_option("--output,-o", o.output, "calibration profile to write (default calibration.toml)");
  cmd.add_option("--cluster-output", o.cluster_output,
                 "calibrated cluster to write (default: the profile's name with -cluster.toml)");
  cmd.add_option("--cluster", o.cluster, "base cluster: device peaks and topology (default cpu-host)");
  cmd.add_option("--models", o.models, "models whose Programs give the exact GEMM and attention shapes")->delimiter(',');
  cmd.add_option("--micro-batches", o.micro_batches, "micro-batch sizes of those Programs (default 1,2,4,8)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  cmd.add_option("--tp", o.tp, "tensor-parallel sizes of those Programs (default 1,2)")->delimiter(',')->check(CLI::PositiveNumber);
  cmd.add_flag("--quick", o.quick, "tiny sweeps and few repeats (seconds; for tests, not for predictions)");
  cmd.add_flag("!--no-reference-run", o.reference_run, "skip the short executor run that measures the overhead per op");
  cmd.add_flag("--json", o.json, "print the fitted values and every measurement as one JSON object");
}

int run_calibrate(const CalibrateOptions& opts, std::ostream& out, std::ostream& err) {
  CalibrateOptions o = opts;
  if (o.quick) {   // one Program: the first model, tp and micro-batch size
    o.models.resize(std::min<std::size_t>(o.models.size(), 1));
    o.tp.resize(std::min<std::size_t>(o.tp.size(), 1));
    o.micro_batches.resize(std::min<std::size_t>(o.micro_batches.size(), 1));
  }
  if (o.backend == "cuda") return run_calibrate_cuda(opts, out, err);   // apps/calibrate_cuda.hpp (its own defaults)
  if (o.models.empty() || o.tp.empty() || o.micro_batches.empty()) {
    err << "megascope calibrate: error: --models, --tp and --micro-batches need at least one value each\n";
    return 2;
  }
  const std::string cluster_out = o.cluster_output.value_or(default_cluster_output(o.output));
  for (const auto& [flag, path] : {std::pair<const char*, std::string>{"--output", o.output}, {"--cluster-output", cluster_out}})
    if (!writable(path)) {
      err << fmt::format("megascope calibrate: error: {}: cannot write {}\n", flag, path);
      return 1;
    }
  auto base = resolve_cluster(o.cluster);
  if (!base) {
    err << "megascope calibrate: error: " << base.error().str() << "\n";
    return 1;
  }
  if (base->device.kind != DeviceKind::cpu) {
    err << fmt::format("megascope calibrate: error: --cluster {}: device '{}' is a GPU; the cpu backend calibrates a "
                       "CPU device (e.g. cpu-host)\n",
                       o.cluster, base->device.name);
    return 1;
  }
  auto shipped = sim::CostModel::for_device(base->device);
  if (!shipped) {
    err << "megascope calibrate: error: " << shipped.error().str() << "\n";
    return 1;
  }

  exec::MpiEnv& env = exec::MpiEnv::get();
  const int world = env.size();
  const bool root = env.rank() == 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto cases = make_cases(o, *base, world);
  if (!cases) {
    if (root) err << "megascope calibrate: error: " << cases.error().str() << "\n";
    return 1;
  }
  CalibrationData& d = cases->data;
  exec::CalibrationSettings settings;
  if (o.quick) {
    settings.repeats = 3;
    settings.min_sample_s = 2e-4;
    settings.warmup_s = 1e-4;
  }
  const exec::Progress none;
  d.gemm_t = exec::time_gemms(d.gemms, settings, none);
  d.memory_t = exec::time_memory(d.memory, settings, none);
  d.attention_t = exec::time_attention(d.attention, settings, none);
  d.comm_t = exec::time_comms(d.comms, settings, none);

  sim::CostProfile base_profile = shipped->profile();
  base_profile.device = base->device.name;
  base_profile.date = today();
  base_profile.source = fmt::format(
      "megascope calibrate --backend cpu on {}, {} rank{} measuring at once; exact shapes of {}", host_name(), world,
      world == 1 ? "" : "s", fmt::join(o.models, ", "));
  CalibrationFit fit = fit_calibration(d, host_of(*base, world), base_profile);
  std::string reference = "not measured (--no-reference-run)";
  if (o.reference_run) {
    auto per_op = op_overhead(o, *base, fit.profile, world, reference);
    if (!per_op) {
      if (root) err << "megascope calibrate: error: reference run: " << per_op.error().str() << "\n";
      return 1;
    }
    fit.profile.op_overhead_s = *per_op;
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!root) return 0;

  for (const auto& [path, text] : {std::pair<std::string, std::string>{o.output, profile_toml(fit)},
                                   {cluster_out, cluster_toml(fit, base->name)}}) {
    std::ofstream f(path, std::ios::trunc);
    f << text;
    if (!f) {
      err << fmt::format("megascope calibrate: error: {}: write failed\n", path);
      return 1;
    }
  }
  const sim::CostProfile& p = fit.profile;
  const double peak = base->device.peak_bf16_flops;
  if (o.json) {
    nlohmann::json j;
    j["profile"] = o.output;
    j["cluster"] = cluster_out;
    j["world"] = world;
    j["wall_s"] = wall;
    j["programs"] = cases->programs;
    j["gemm"] = {{"max_efficiency", p.gemm_max_efficiency}, {"half_size", p.gemm_half_size},
                 {"rms_log_error", fit.quality.gemm_curve_rms}, {"measured_shapes", p.gemm_seconds.size()}};
    j["memory_GBps"] = fit.quality.memory_GBps;
    j["memory_rms_log_error"] = fit.quality.memory_rms;
    j["attention"] = {{"fwd_efficiency", p.attention_fwd_efficiency}, {"bwd_efficiency", p.attention_bwd_efficiency}};
    j["launch"] = {{"overhead_us", p.launch_overhead_s * 1e6}, {"op_overhead_us", p.op_overhead_s * 1e6}, {"reference", reference}};
    j["network"] = {{"fitted", fit.network_fitted}, {"scale_up_bandwidth_GBps", fit.cluster.node.scale_up_bandwidth_Bps / 1e9},
                    {"scale_up_latency_us", fit.cluster.node.scale_up_latency_s * 1e6},
                    {"rms_log_error", fit.quality.comm_rms}, {"cases", fit.quality.comm_cases}};
    nlohmann::json comms = nlohmann::json::array();
    for (std::size_t i = 0; i < d.comms.size(); ++i)
      comms.push_back({{"op", exec::to_string(d.comms[i].op)}, {"group", d.comms[i].group}, {"bytes", d.comms[i].bytes},
                       {"seconds", d.comm_t[i].seconds}});
    j["comms"] = comms;
    out << j.dump(2) << "\n";
    return 0;
  }
  out << fmt::format("megascope calibrate: cpu backend, {} rank{} on {}; {} GEMMs, {} memory kernels, {} attention "
                     "kernels, {} collectives in {:.1f} s\n",
                     world, world == 1 ? "" : "s", host_name(), d.gemms.size(), d.memory.size(), d.attention.size(),
                     d.comms.size(), wall);
  out << fmt::format("  gemm       {} exact shapes of {} Programs; size curve max_efficiency {:.4g} ({:.2f} GFLOP/s), "
                     "half_size {:.3g} (RMS log error {:.3f})\n",
                     p.gemm_seconds.size(), cases->programs.size(), p.gemm_max_efficiency,
                     p.gemm_max_efficiency * peak / 1e9, p.gemm_half_size, fit.quality.gemm_curve_rms);
  std::string mem;
  for (const auto& [kind, e] : fit.quality.memory_rms)
    mem += fmt::format("{}{} {:.3g} (RMS {:.3f})", mem.empty() ? "" : ", ", kind, fit.quality.memory_GBps.at(kind), e);
  out << fmt::format("  memory     GB/s as the Program counts bytes, in the profile: {}\n", mem);
  out << fmt::format("  attention  fwd {:.4g} ({:.2f} GFLOP/s), bwd {:.4g} ({:.2f} GFLOP/s)\n", p.attention_fwd_efficiency,
                     p.attention_fwd_efficiency * peak / 1e9, p.attention_bwd_efficiency,
                     p.attention_bwd_efficiency * peak / 1e9);
  out << fmt::format("  launch     {:.2f} us per kernel, {:.1f} us per compute op ({})\n", p.launch_overhead_s * 1e6,
                     p.op_overhead_s * 1e6, reference);
  if (fit.network_fitted)
    out << fmt::format("  network    scale-up {:.3g} GB/s, latency {:.3g} us ({} cases, RMS log error {:.3f})\n",
                       fit.cluster.node.scale_up_bandwidth_Bps / 1e9, fit.cluster.node.scale_up_latency_s * 1e6,
                       fit.quality.comm_cases, fit.quality.comm_rms);
  else
    out << "  network    not measured (one rank: launch under mpirun -np 2 or more to fit it)\n";
  out << fmt::format("profile: {}\ncluster: {}\nuse:     megascope simulate --cluster {} --calibration {} ...\n", o.output,
                     cluster_out, cluster_out, o.output);
  return 0;
}

}  // namespace megascope::cli
