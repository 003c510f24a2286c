// `megascope calibrate --backend cuda` (apps/calibrate_cuda.hpp): which cases
// the GPU measures, then the CPU backend's fits and files (apps/calibrate_fit.cpp).
#include "apps/calibrate_cuda.hpp"

#include <fmt/format.h>

#ifdef MEGASCOPE_HAVE_EXEC_CUDA
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <fstream>
#include <map>
#include <set>

#include "apps/gpu_cluster.hpp"
#include "config/library.hpp"
#include "config/plan_settings.hpp"
#include "core/program/builder.hpp"
#include "exec/cuda/calibrate_cuda.hpp"
#include "exec/mpi_env.hpp"
#endif

namespace megascope::cli {

#ifndef MEGASCOPE_HAVE_EXEC_CUDA

int run_calibrate_cuda(const CalibrateOptions&, std::ostream&, std::ostream& err) {
  err << "megascope calibrate: error: --backend cuda: no CUDA device support in this build (nvcc was not found when it "
         "was configured)\n";
  return 1;
}

#else

namespace {

namespace xc = exec::cuda;

struct GpuCases {
  CalibrationData data;
  std::vector<std::string> programs;
};

// The Programs' GEMM and attention shapes (stage 0 of tp=T, mbs=M on T GPUs),
// the memory kernels at the models' widths plus a size sweep, a GEMM sweep,
// and the collectives over 2, 4, ... world GPUs.
Result<GpuCases> make_cases(const std::vector<std::string>& models, const std::vector<int>& tps,
                            const std::vector<int>& mbss, const ClusterSpec& base, bool quick, int world) {
  GpuCases c;
  CalibrationData& d = c.data;
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t, int>, double> uses;
  std::set<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, bool, bool>> attention;
  std::set<std::tuple<int, std::int64_t, std::int64_t>> memory;
  std::set<std::tuple<int, std::int64_t, std::int64_t, float>> program_memory;   // sizes the Programs use, with the dropout
  using K = exec::MemoryKernel;
  for (const std::string& name : models) {
    auto model = resolve_model(name);
    if (!model) return tl::unexpected(model.error());
    const ModelSpec& m = *model;
    const bool rope = m.position_embedding == PositionEmbedding::rope;
    for (int tp : tps)
      for (int mbs : mbss) {
        auto plan = parse_inline_plan(fmt::format("tp={},mbs={}", tp, mbs));
        if (!plan) return tl::unexpected(plan.error());
        TrainingSpec t;
        t.global_batch_size = mbs;
        auto s = validate_setup(m, base, t, *plan, tp);
        if (!s) return tl::unexpected(s.error());
        auto prog = build_program(*s);
        if (!prog) return tl::unexpected(prog.error());
        c.programs.push_back(fmt::format("{} tp={} mbs={}", m.name, tp, mbs));
        const StageProgram& st = prog->stages[0];
        for (const Op& op : st.ops) {
          if (op.kind != OpKind::compute) continue;
          const exec::GemmPass pass = op.phase == Phase::backward_input    ? exec::GemmPass::backward_input
                                      : op.phase == Phase::backward_weight ? exec::GemmPass::backward_weight
                                                                           : exec::GemmPass::forward;
          for (std::uint32_t k = op.kernel_begin; k < op.kernel_begin + op.kernel_count; ++k) {
            const Kernel& kr = st.kernels[k];
            if (kr.kind == KernelKind::gemm)
              uses[{kr.gemm.m, kr.gemm.n, kr.gemm.k, static_cast<int>(pass)}] += 1;
            else if (kr.kind != KernelKind::memory)
              attention.insert({kr.attention.batch, kr.attention.heads, kr.attention.kv_heads, kr.attention.seq_q,
                                kr.attention.head_dim, kr.kind == KernelKind::attention_bwd, rope});
          }
        }
        const std::int64_t T = s->seq_length * mbs, h = m.hidden_size, f = m.ffn_hidden_size / tp,
                           V = s->padded_vocab / tp;
        // A squared-ReLU MLP is measured with the GeLU kernel (no squared-ReLU kernel; the same bytes).
        const bool ln = m.norm == Norm::layernorm, swiglu = m.activation == Activation::swiglu;
        const auto drop = static_cast<float>(m.hidden_dropout);
        for (std::int64_t rows : {T, T / tp})
          for (K kk : {ln ? K::layernorm_fwd : K::rmsnorm_fwd, ln ? K::layernorm_bwd : K::rmsnorm_bwd,
                       K::bias_dropout_add_fwd, K::bias_dropout_add_bwd, K::embedding_fwd, K::embedding_bwd})
            program_memory.insert({static_cast<int>(kk), rows, h, drop});
        program_memory.insert({static_cast<int>(swiglu ? K::swiglu_fwd : K::gelu_fwd), T, f, drop});
        program_memory.insert({static_cast<int>(swiglu ? K::swiglu_bwd : K::gelu_bwd), T, f, drop});
        program_memory.insert({static_cast<int>(K::cross_entropy_fwd), T, V, drop});
        program_memory.insert({static_cast<int>(K::cross_entropy_bwd), T, V, drop});
      }
  }
  for (const auto& [key, n] : uses) {
    d.gemms.push_back({{std::get<0>(key), std::get<1>(key), std::get<2>(key)}, static_cast<exec::GemmPass>(std::get<3>(key))});
    d.gemm_uses.push_back(n);
  }
  // The size curve: squares, and thin shapes (a few wide rows, a narrow output).
  std::vector<GemmShape> sweep;
  for (std::int64_t x : quick ? std::vector<std::int64_t>{1024, 4096} : std::vector<std::int64_t>{512, 1024, 2048, 4096, 8192, 16384})
    sweep.push_back({x, x, x});
  if (!quick)
    for (GemmShape g : {GemmShape{32768, 256, 4096}, GemmShape{32768, 4096, 256}, GemmShape{256, 4096, 32768},
                        GemmShape{8192, 1024, 8192}, GemmShape{2048, 28672, 8192}})
      sweep.push_back(g);
  for (GemmShape g : sweep) {
    d.gemms.push_back({g, exec::GemmPass::forward});
    d.gemm_uses.push_back(0);
  }
  // Memory kernels over sizes at a width of 4096 (vocabulary shard 32768 for cross-entropy).
  for (std::int64_t rows : quick ? std::vector<std::int64_t>{4096} : std::vector<std::int64_t>{256, 2048, 16384}) {
    for (int kk = 0; kk < exec::kMemoryKernelCount; ++kk) {
      const auto kind = static_cast<K>(kk);
      if (kind == K::adamw) continue;
      const bool ce = kind == K::cross_entropy_fwd || kind == K::cross_entropy_bwd;
      memory.insert({kk, ce ? std::min<std::int64_t>(rows, 4096) : rows, ce ? 32768 : 4096});
    }
  }
  // The Programs' own sizes (exact entries, with the model's dropout), then
  // the size sweep (the bandwidth fit only) where it adds a size.
  for (const auto& [kernel, rows, width, drop] : program_memory)
    d.memory.push_back({static_cast<K>(kernel), rows, width, drop, true});
  for (const auto& [kernel, rows, width] : memory) {
    bool listed = false;
    for (const auto& pm : program_memory)
      listed = listed || (std::get<0>(pm) == kernel && std::get<1>(pm) == rows && std::get<2>(pm) == width);
    if (!listed) d.memory.push_back({static_cast<K>(kernel), rows, width});
  }
  for (std::int64_t n : quick ? std::vector<std::int64_t>{1 << 22} : std::vector<std::int64_t>{1 << 20, 1 << 24, 1 << 27})
    d.memory.push_back({K::adamw, n, 1});
  for (const auto& [b, heads, kv, seq, dim, bwd, rope] : attention)
    d.attention.push_back(exec::self_attention_case(b, heads, kv, seq, dim, bwd, rope));
  d.world = world;
  std::vector<int> groups;
  for (int g = 2; g < world; g *= 2) groups.push_back(g);
  if (world >= 2) groups.push_back(world);
  const std::vector<double> sizes = quick ? std::vector<double>{65536, 4194304}
                                          : std::vector<double>{1024, 65536, 1048576, 16777216, 268435456};
  for (int g : groups)
    for (exec::CommOp op : {exec::CommOp::all_reduce, exec::CommOp::reduce_scatter, exec::CommOp::all_gather,
                            exec::CommOp::all_to_all})
      for (double b : sizes) d.comms.push_back({op, g, b});
  if (world >= 2)
    for (double b : sizes) d.comms.push_back({exec::CommOp::send_recv, 2, b});
  return c;
}


int measure(const CalibrateOptions& o, std::ostream& out, std::ostream& err) {
  exec::MpiEnv& env = exec::MpiEnv::get();
  const bool root = env.rank() == 0;
  const int world = env.size();
  const xc::GpuDescription gpu = xc::describe_gpu();
  // CPU defaults are replaced by GPU ones (apps/calibrate_cuda.hpp).
  std::string cluster_name = o.cluster;
  if (cluster_name == "cpu-host") {
    const auto c = shipped_cluster_of_gpu(gpu.device.name);
    if (!c) {
      if (root)
        err << fmt::format("megascope calibrate: error: --backend cuda: no shipped cluster for '{}': give its cluster "
                           "with --cluster FILE\n",
                           gpu.device.name);
      return 1;
    }
    cluster_name = *c;
  }
  const bool cpu_models = o.models == std::vector<std::string>{"tiny-gpt", "tiny-llama"};
  const std::vector<std::string> models =
      !cpu_models ? o.models
      : o.quick   ? std::vector<std::string>{"llama3-8b"}
                  : std::vector<std::string>{"llama3-8b", "llama3-70b", "gpt3-175b"};
  const std::vector<int> tps = o.tp != std::vector<int>{1, 2} ? o.tp : o.quick ? std::vector<int>{8} : std::vector<int>{1, 2, 4, 8};
  const std::vector<int> mbss =
      o.micro_batches != std::vector<int>{1, 2, 4, 8} ? o.micro_batches : o.quick ? std::vector<int>{1} : std::vector<int>{1, 2};

  auto base = resolve_cluster(cluster_name);
  if (!base) {
    if (root) err << "megascope calibrate: error: " << base.error().str() << "\n";
    return 1;
  }
  if (base->device.kind == DeviceKind::cpu) {
    if (root)
      err << fmt::format("megascope calibrate: error: --cluster {}: device '{}' is a CPU; the cuda backend calibrates a GPU\n",
                         cluster_name, base->device.name);
    return 1;
  }
  auto shipped = sim::CostModel::for_device(base->device);
  if (!shipped) {
    if (root) err << "megascope calibrate: error: " << shipped.error().str() << "\n";
    return 1;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto cases = make_cases(models, tps, mbss, *base, o.quick, world);
  if (!cases) {
    if (root) err << "megascope calibrate: error: " << cases.error().str() << "\n";
    return 1;
  }
  CalibrationData& d = cases->data;
  exec::CalibrationSettings settings;
  if (o.quick) {
    settings.repeats = 3;
    settings.min_sample_s = 5e-4;
    settings.warmup_s = 2e-4;
  }
  auto section = [&](const std::string& what) {
    if (root && !o.json) err << "megascope calibrate: " << what << "\n";
  };
  const exec::Progress none;
  section(fmt::format("{} GEMMs (bf16) from {} Programs and a sweep", d.gemms.size(), cases->programs.size()));
  d.gemm_t = xc::time_gemms(d.gemms, settings, none);
  std::vector<exec::GemmCase> fp8_cases;
  std::vector<double> fp8_bf16;   // bf16 time of each fp8 case
  if (gpu.device.fp8())
    for (std::size_t i = 0; i < d.gemms.size(); ++i)
      if (d.gemms[i].pass == exec::GemmPass::forward && d.gemm_t[i].seconds > 0) {
        fp8_cases.push_back(d.gemms[i]);
        fp8_bf16.push_back(d.gemm_t[i].seconds);
      }
  std::vector<exec::Timing> fp8_t;
  std::string fp8_error;
  if (!fp8_cases.empty()) {
    section(fmt::format("{} forward GEMMs in FP8 (E4M3)", fp8_cases.size()));
    // FP8 is reported, not written to the profile: a library that refuses it
    // costs the report its FP8 line, not the calibration.
    try {
      fp8_t = xc::time_gemms(fp8_cases, settings, none, xc::GemmDtype::fp8_e4m3);
    } catch (const std::runtime_error& e) {
      fp8_error = e.what();
      fp8_t.clear();
      section(fmt::format("FP8 GEMMs not measured: {}", fp8_error));
    }
  }
  section(fmt::format("{} memory-bound kernels and the device-to-device copy", d.memory.size()));
  const double copy_bytes = o.quick ? 64.0 * (1 << 20) : 1024.0 * (1 << 20);
  const exec::Timing copy = xc::time_copy(copy_bytes, settings);
  const double copy_Bps = copy.seconds > 0 ? 2 * copy_bytes / copy.seconds : 0;
  d.memory_t = xc::time_memory(d.memory, settings, none);
  section(fmt::format("{} attention kernels", d.attention.size()));
  d.attention_t = xc::time_attention(d.attention, settings, none);
  if (!d.comms.empty()) section(fmt::format("{} NCCL collectives over {} GPUs", d.comms.size(), world));
  d.comm_t = xc::time_comms(d.comms, settings, none);
  const exec::Timing empty = xc::time_empty_op(settings);

  sim::CostProfile base_profile = shipped->profile();
  base_profile.device = base->device.name;
  base_profile.date = today();
  base_profile.source = fmt::format(
      "megascope calibrate --backend cuda on {}: {} (cc {}.{}, {} SMs), {} GPU{} measuring at once, CUDA runtime {}, "
      "cuBLASLt {}, NCCL {}; exact shapes of {}",
      host_name(), gpu.device.name, gpu.device.cc_major, gpu.device.cc_minor, gpu.device.sms, world, world == 1 ? "" : "s",
      gpu.device.runtime_version, gpu.cublaslt_version, gpu.nccl_version, fmt::join(models, ", "));
  CalibrationFit fit = fit_calibration(d, *base, base_profile);
  fit.profile.op_overhead_s = 0;   // no GPU runtime yet to measure it with
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!root) return 0;

  const std::string cluster_out = o.cluster_output.value_or([&] {
    std::string stem = o.output;
    if (stem.size() > 5 && stem.substr(stem.size() - 5) == ".toml") stem.resize(stem.size() - 5);
    return stem + "-cluster.toml";
  }());
  for (const auto& [path, text] : {std::pair<std::string, std::string>{o.output, profile_toml(fit)},
                                   {cluster_out, cluster_toml(fit, base->name)}}) {
    std::ofstream f(path, std::ios::trunc);
    f << text;
    if (!f) {
      err << fmt::format("megascope calibrate: error: {}: write failed\n", path);
      return 1;
    }
  }
  // Achieved bandwidth per kind at its largest case, against the copy.
  std::map<std::string, std::pair<double, double>> largest;   // kind -> (program bytes, GB/s)
  for (std::size_t i = 0; i < d.memory.size(); ++i) {
    const double bytes = exec::program_bytes(d.memory[i].kernel, d.memory[i].rows, d.memory[i].width);
    auto& e = largest[exec::to_string(d.memory[i].kernel)];
    if (d.memory_t[i].seconds > 0 && bytes >= e.first) e = {bytes, bytes / d.memory_t[i].seconds / 1e9};
  }
  std::vector<double> speedups;
  for (std::size_t i = 0; i < fp8_t.size(); ++i)
    if (fp8_t[i].seconds > 0) speedups.push_back(fp8_bf16[i] / fp8_t[i].seconds);
  const sim::CostProfile& p = fit.profile;
  const double peak = base->device.peak_bf16_flops;
  if (o.json) {
    nlohmann::json j;
    j["backend"] = "cuda";
    j["device"] = {{"name", gpu.device.name}, {"cc", fmt::format("{}.{}", gpu.device.cc_major, gpu.device.cc_minor)},
                   {"sms", gpu.device.sms}, {"cublaslt", gpu.cublaslt_version}, {"nccl", gpu.nccl_version}};
    j["profile"] = o.output;
    j["cluster"] = cluster_out;
    j["world"] = world;
    j["wall_s"] = wall;
    j["programs"] = cases->programs;
    j["copy_GBps"] = copy_Bps / 1e9;
    j["empty_kernel_us"] = empty.seconds * 1e6;
    j["gemm"] = {{"max_efficiency", p.gemm_max_efficiency}, {"half_size", p.gemm_half_size},
                 {"rms_log_error", fit.quality.gemm_curve_rms}, {"measured_shapes", p.gemm_seconds.size()}};
    j["fp8"] = {{"cases", fp8_t.size()}, {"median_speedup_over_bf16", median(speedups)}};
    if (!fp8_error.empty()) j["fp8"]["error"] = fp8_error;
    j["memory_GBps"] = fit.quality.memory_GBps;
    nlohmann::json kernels = nlohmann::json::object();
    for (const auto& [k, e] : largest) kernels[k] = {{"GBps", e.second}, {"of_copy", copy_Bps > 0 ? e.second * 1e9 / copy_Bps : 0}};
    j["memory_kernels"] = kernels;
    j["attention"] = {{"fwd_efficiency", p.attention_fwd_efficiency}, {"bwd_efficiency", p.attention_bwd_efficiency}};
    j["network"] = {{"fitted", fit.network_fitted}, {"scale_up_bandwidth_GBps", fit.cluster.node.scale_up_bandwidth_Bps / 1e9},
                    {"scale_up_latency_us", fit.cluster.node.scale_up_latency_s * 1e6}, {"rms_log_error", fit.quality.comm_rms}};
    out << j.dump(2) << "\n";
    return 0;
  }
  out << fmt::format("megascope calibrate: cuda backend, {} GPU{} ({}, cc {}.{}, {} SMs; cuBLASLt {}, NCCL {}) on {}; "
                     "{} GEMMs, {} memory kernels, {} attention kernels, {} collectives in {:.1f} s\n",
                     world, world == 1 ? "" : "s", gpu.device.name, gpu.device.cc_major, gpu.device.cc_minor,
                     gpu.device.sms, gpu.cublaslt_version, gpu.nccl_version, host_name(), d.gemms.size(),
                     d.memory.size(), d.attention.size(), d.comms.size(), wall);
  out << fmt::format("  gemm       {} exact shapes of {} Programs; size curve max_efficiency {:.4g} ({:.1f} TFLOP/s), "
                     "half_size {:.3g} (RMS log error {:.3f})\n",
                     p.gemm_seconds.size(), cases->programs.size(), p.gemm_max_efficiency,
                     p.gemm_max_efficiency * peak / 1e12, p.gemm_half_size, fit.quality.gemm_curve_rms);
  if (!speedups.empty())
    out << fmt::format("  fp8        {} forward GEMMs, median {:.2f}x as fast as bf16 ({:.2f}x its time; not written to the profile)\n",
                       speedups.size(), median(speedups), 1.0 / median(speedups));
  if (!fp8_error.empty()) out << fmt::format("  fp8        not measured: {}\n", fp8_error);
  out << fmt::format("  copy       {:.0f} GB/s device to device (2 x {:.0f} MiB per copy)\n", copy_Bps / 1e9,
                     copy_bytes / (1 << 20));
  for (const auto& [k, e] : largest)
    out << fmt::format("  memory     {:<22} {:8.0f} GB/s  {:5.1f}% of copy (largest case)\n", k, e.second,
                       copy_Bps > 0 ? 100 * e.second * 1e9 / copy_Bps : 0.0);
  out << fmt::format("  attention  fwd {:.4g} ({:.1f} TFLOP/s), bwd {:.4g} ({:.1f} TFLOP/s)\n", p.attention_fwd_efficiency,
                     p.attention_fwd_efficiency * peak / 1e12, p.attention_bwd_efficiency,
                     p.attention_bwd_efficiency * peak / 1e12);
  out << fmt::format("  launch     {:.2f} us per kernel (fit), empty kernel back to back {:.2f} us\n",
                     p.launch_overhead_s * 1e6, empty.seconds * 1e6);
  if (fit.network_fitted)
    out << fmt::format("  network    scale-up {:.3g} GB/s, latency {:.3g} us ({} cases, RMS log error {:.3f})\n",
                       fit.cluster.node.scale_up_bandwidth_Bps / 1e9, fit.cluster.node.scale_up_latency_s * 1e6,
                       fit.quality.comm_cases, fit.quality.comm_rms);
  else
    out << "  network    not measured (one GPU: launch under mpirun -np 2 or more to fit it)\n";
  out << fmt::format("profile: {}\ncluster: {}\nuse:     megascope simulate --cluster {} --calibration {} ...\n", o.output,
                     cluster_out, cluster_out, o.output);
  return 0;
}

}  // namespace

int run_calibrate_cuda(const CalibrateOptions& o, std::ostream& out, std::ostream& err) {
  try {
    xc::require_device();
  } catch (const xc::NoCudaDevice& e) {
    err << "megascope calibrate: error: --backend cuda: " << e.what() << "\n";
    return 1;
  }
  try {
    return measure(o, out, err);
  } catch (const std::exception& e) {
    err << "megascope calibrate: error: --backend cuda: " << e.what() << "\n";
    return 1;
  }
}

#endif

}  // namespace megascope::cli
