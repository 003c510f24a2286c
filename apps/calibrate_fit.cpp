// The fits of `megascope calibrate` (docs/cost-model.md section 6) and the
// files it writes. Every fit minimises the squared log error of the cost
// model's own prediction (sim::CostModel, sim::isolated_time) against the
// measured times, so that the written numbers reproduce the measurements
// through the same code that simulates.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "apps/calibrate.hpp"
#include "sim/network.hpp"

namespace megascope::cli {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The profile's key prefix of a kind ([memory] <kind>_GBps).
std::string kind_name(MemoryOp op) {
  switch (op) {
    case MemoryOp::norm: return "norm";
    case MemoryOp::activation: return "activation";
    case MemoryOp::dropout_residual: return "dropout_residual";
    case MemoryOp::embedding: return "embedding";
    case MemoryOp::cross_entropy: return "cross_entropy";
    case MemoryOp::optimizer: return "optimizer";
    case MemoryOp::other: return "other";
  }
  return "other";
}

// Golden-section minimum of f over [lo, hi] (f unimodal enough; 80 steps).
double golden(const std::function<double(double)>& f, double lo, double hi, int iterations = 80) {
  const double r = (std::sqrt(5.0) - 1) / 2;
  double a = lo, b = hi, c = b - r * (b - a), d = a + r * (b - a);
  double fc = f(c), fd = f(d);
  for (int i = 0; i < iterations; ++i) {
    if (fc < fd) {
      b = d;
      d = c;
      fd = fc;
      c = b - r * (b - a);
      fc = f(c);
    } else {
      a = c;
      c = d;
      fc = fd;
      d = a + r * (b - a);
      fd = f(d);
    }
  }
  return (a + b) / 2;
}

double sq_log(double predicted, double measured) {
  if (!(predicted > 0) || !(measured > 0)) return 0;
  const double e = std::log(predicted / measured);
  return e * e;
}

double rms(double sum_sq, std::size_t n) { return n ? std::sqrt(sum_sq / static_cast<double>(n)) : 0.0; }

// A fitted bandwidth's name: the kind, with "_bwd" for the backward kernels'.
std::string fit_name(MemoryOp op, bool backward) { return kind_name(op) + (backward ? "_bwd" : ""); }

// Memory kernels: t = bytes / bw + L. Per kind and direction (forward
// kernels, backward kernels: a LayerNorm's backward runs at a third of its
// forward's bandwidth on an H200) the bandwidth, then the shared launch
// overhead L, three rounds.
void fit_memory(const CalibrationData& d, CalibrationFit& f) {
  using Key = std::pair<MemoryOp, bool>;   // (kind, backward)
  std::map<Key, std::vector<std::pair<double, double>>> by_kind;   // (program bytes, seconds)
  for (std::size_t i = 0; i < d.memory.size(); ++i) {
    const exec::MemoryCase& c = d.memory[i];
    if (d.memory_t[i].seconds > 0)
      by_kind[{exec::memory_op_of(c.kernel), exec::is_backward(c.kernel)}].push_back(
          {exec::program_bytes(c.kernel, c.rows, c.width), d.memory_t[i].seconds});
  }
  if (by_kind.empty()) return;
  double L = 0, t_min = kInf;
  for (const auto& [op, pts] : by_kind)
    for (const auto& p : pts) t_min = std::min(t_min, p.second);
  std::map<Key, double> bw;
  for (int round = 0; round < 3; ++round) {
    for (const auto& [op, pts] : by_kind) {
      const double lg = golden(
          [&](double x) {
            double s = 0;
            for (const auto& [b, t] : pts) s += sq_log(b / std::exp(x) + L, t);
            return s;
          },
          std::log(1e6), std::log(1e13));
      bw[op] = std::exp(lg);
    }
    L = golden(
        [&](double l) {
          double s = 0;
          for (const auto& [op, pts] : by_kind)
            for (const auto& [b, t] : pts) s += sq_log(b / bw[op] + l, t);
          return s;
        },
        0.0, 0.5 * t_min);
  }
  f.profile.launch_overhead_s = L;
  // The kernels measured at a Program's own size as measured entries, keyed
  // as the cost model looks them up: (kind, Program bytes). A key that two
  // different kernels share (a forward and a backward, LayerNorm and RMSNorm
  // of two models, or one kernel at two dropout probabilities) is left out:
  // the kind's bandwidth prices it.
  struct Exact {
    double seconds = 0;
    exec::MemoryKernel kernel = exec::MemoryKernel::adamw;
    float dropout = 0;
    bool ambiguous = false;
  };
  std::map<std::pair<MemoryOp, std::int64_t>, Exact> exact;
  for (std::size_t i = 0; i < d.memory.size(); ++i) {
    const exec::MemoryCase& c = d.memory[i];
    if (!c.program || !(d.memory_t[i].seconds > 0)) continue;
    const bool drops = c.kernel == exec::MemoryKernel::bias_dropout_add_fwd ||
                       c.kernel == exec::MemoryKernel::bias_dropout_add_bwd;
    const float dropout = drops ? c.dropout : 0.0f;   // the other kernels ignore it
    const std::pair<MemoryOp, std::int64_t> key{exec::memory_op_of(c.kernel),
                                                std::llround(exec::program_bytes(c.kernel, c.rows, c.width))};
    auto [it, fresh] = exact.try_emplace(key, Exact{d.memory_t[i].seconds, c.kernel, dropout, false});
    if (!fresh && (it->second.kernel != c.kernel || it->second.dropout != dropout)) it->second.ambiguous = true;
  }
  for (const auto& [key, e] : exact)
    if (!e.ambiguous) f.profile.memory_seconds[key] = e.seconds;
  for (const auto& [key, pts] : by_kind) {
    const auto [op, backward] = key;
    (backward ? f.profile.memory_bwd_Bps : f.profile.memory_Bps)[op] = bw[key];
    double s = 0;
    for (const auto& [b, t] : pts) s += sq_log(b / bw[key] + L, t);
    f.quality.memory_rms[fit_name(op, backward)] = rms(s, pts.size());
    f.quality.memory_GBps[fit_name(op, backward)] = bw[key] / 1e9;
  }
}

// GEMMs: the size curve (max_efficiency, half_size) over every case; the
// exact shapes of the Programs as measured entries (the mean over the passes
// that share a shape, weighted by how often each occurs).
void fit_gemm(const CalibrationData& d, const DeviceSpec& device, CalibrationFit& f) {
  std::vector<std::pair<GemmShape, double>> pts;
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t>, std::pair<double, double>> exact;   // (weighted sum, uses)
  for (std::size_t i = 0; i < d.gemms.size(); ++i) {
    const double t = d.gemm_t[i].seconds;
    if (!(t > 0)) continue;
    const GemmShape s = d.gemms[i].shape;
    pts.push_back({s, t});
    if (d.gemm_uses[i] > 0) {
      auto& e = exact[{s.m, s.n, s.k}];
      e.first += d.gemm_uses[i] * t;
      e.second += d.gemm_uses[i];
    }
  }
  if (pts.empty()) return;
  sim::CostProfile p = f.profile;
  p.gemm_seconds.clear();
  auto error = [&](double max_eff, double half) {
    p.gemm_max_efficiency = max_eff;
    p.gemm_half_size = half;
    const sim::CostModel m(device, p);
    double s = 0;
    for (const auto& [shape, t] : pts) s += sq_log(m.gemm_s(shape, Precision::bf16), t);
    return s;
  };
  double best = kInf, best_eff = 1, best_half = 0;
  for (int i = -1; i <= 40; ++i) {   // half_size 0, then 1e2 .. 1e10
    const double half = i < 0 ? 0.0 : std::pow(10.0, 2.0 + 0.2 * i);
    const double eff = std::exp(golden([&](double x) { return error(std::exp(x), half); }, std::log(1e-4), 0.0));
    const double e = error(eff, half);
    if (e < best) {
      best = e;
      best_eff = eff;
      best_half = half;
    }
  }
  f.profile.gemm_max_efficiency = best_eff;
  f.profile.gemm_half_size = best_half;
  f.profile.sms = 0;
  f.quality.gemm_curve_rms = rms(best, pts.size());
  for (const auto& [key, e] : exact)
    f.profile.gemm_seconds[{std::get<0>(key), std::get<1>(key), std::get<2>(key), static_cast<int>(Precision::bf16)}] =
        e.first / e.second;
}

void fit_attention(const CalibrationData& d, const DeviceSpec& device, CalibrationFit& f) {
  // The executor's attention kernels apply no dropout: a replayed program
  // with attention dropout runs them as measured (whether or not a pass
  // below has points to fit).
  f.profile.attention_fwd_dropout_factor = f.profile.attention_bwd_dropout_factor = 1.0;
  // One efficiency per direction, whatever the call's size: the measured
  // kernels are the executor's own, not the shipped profile's cuDNN curve.
  f.profile.attention_fwd_half_flops = f.profile.attention_bwd_half_flops = 0;
  // Nor the cuDNN kernels' head-dimension term: the efficiencies are fitted
  // on the measured calls at their own head dims.
  f.profile.attention_exp_share = 0;
  for (const bool backward : {false, true}) {
    std::vector<std::pair<double, double>> pts;   // (FLOPs, seconds)
    for (std::size_t i = 0; i < d.attention.size(); ++i)
      if (d.attention[i].backward == backward && d.attention_t[i].seconds > 0)
        pts.push_back({backward ? sim::attention_bwd_flops(d.attention[i].shape) : sim::attention_fwd_flops(d.attention[i].shape),
                       d.attention_t[i].seconds});
    if (pts.empty()) continue;
    const double L = f.profile.launch_overhead_s, P = device.peak_bf16_flops;
    auto err = [&](double eff) {
      double s = 0;
      for (const auto& [F, t] : pts) s += sq_log(F / (P * eff) + L, t);
      return s;
    };
    const double eff = std::exp(golden([&](double x) { return err(std::exp(x)); }, std::log(1e-5), 0.0));
    (backward ? f.profile.attention_bwd_efficiency : f.profile.attention_fwd_efficiency) = eff;
    (backward ? f.quality.attention_bwd_rms : f.quality.attention_fwd_rms) = rms(err(eff), pts.size());
  }
}

sim::Collective collective_of(exec::CommOp op) {
  switch (op) {
    case exec::CommOp::all_reduce: return sim::Collective::all_reduce;
    case exec::CommOp::reduce_scatter: return sim::Collective::reduce_scatter;
    case exec::CommOp::all_gather: return sim::Collective::all_gather;
    case exec::CommOp::all_to_all: return sim::Collective::all_to_all;
    case exec::CommOp::send_recv: return sim::Collective::send_recv;
  }
  return sim::Collective::send_recv;
}

// Scale-up bandwidth and latency of the cluster's node, so that the
// simulator's collectives over the measured group sizes take the measured times.
void fit_network(const CalibrationData& d, CalibrationFit& f) {
  std::vector<std::size_t> used;
  for (std::size_t i = 0; i < d.comms.size(); ++i)
    if (d.comm_t[i].seconds > 0) used.push_back(i);
  if (used.empty()) return;
  int devices = 2;
  for (std::size_t i : used) devices = std::max(devices, d.comms[i].group);
  ClusterSpec c = f.cluster;
  c.node.devices_per_node = std::max(c.node.devices_per_node, devices);
  c.scale_up_domain = c.node.devices_per_node;
  c.num_nodes = 1;
  auto error = [&](double bw, double lat) {
    c.node.scale_up_bandwidth_Bps = bw;
    c.node.pcie_bandwidth_Bps = bw;
    c.node.scale_up_latency_s = lat;
    const sim::Topology topo = sim::Topology::build(c, c.node.devices_per_node);
    double s = 0;
    for (std::size_t i : used) {
      const exec::CommCase& cc = d.comms[i];
      std::vector<int> members;
      for (int r = 0; r < (cc.op == exec::CommOp::send_recv ? 2 : cc.group); ++r) members.push_back(r);
      s += sq_log(sim::isolated_time(topo, sim::collective_flow(topo, collective_of(cc.op), members, cc.bytes)),
                  d.comm_t[i].seconds);
    }
    return s;
  };
  double best = kInf, best_bw = 0, best_lat = 0;
  const auto best_latency = [&](double bw) { return golden([&](double l) { return error(bw, l); }, 0.0, 200e-6); };
  for (int i = 0; i <= 40; ++i) {   // 0.1 .. 1000 GB/s
    const double bw = std::pow(10.0, 8.0 + 0.1 * i);
    const double lat = best_latency(bw);
    const double e = error(bw, lat);
    if (e < best) {
      best = e;
      best_bw = bw;
      best_lat = lat;
    }
  }
  // Then the rate between the grid's neighbours of the best.
  const double centre = std::log10(best_bw);
  const double refined = golden([&](double x) { return error(std::pow(10.0, x), best_latency(std::pow(10.0, x))); },
                                centre - 0.1, centre + 0.1, 24);   // 0.2 decades to ~1e-6
  if (const double bw = std::pow(10.0, refined), lat = best_latency(bw); error(bw, lat) < best) {
    best = error(bw, lat);
    best_bw = bw;
    best_lat = lat;
  }
  f.cluster.node.scale_up_bandwidth_Bps = best_bw;
  f.cluster.node.pcie_bandwidth_Bps = best_bw;
  f.cluster.node.scale_up_latency_s = best_lat;
  f.network_fitted = true;
  f.quality.comm_rms = rms(best, used.size());
  f.quality.comm_cases = static_cast<int>(used.size());
}

}  // namespace

CalibrationFit fit_calibration(const CalibrationData& d, const ClusterSpec& cluster, const sim::CostProfile& base) {
  CalibrationFit f;
  f.profile = base;
  f.profile.gemm_seconds.clear();
  f.profile.memory_Bps.clear();
  f.profile.memory_bwd_Bps.clear();
  f.profile.memory_seconds.clear();
  f.cluster = cluster;
  fit_memory(d, f);
  fit_gemm(d, cluster.device, f);
  fit_attention(d, cluster.device, f);
  fit_network(d, f);
  return f;
}

std::string profile_toml(const CalibrationFit& f) {
  const sim::CostProfile& p = f.profile;
  std::string t;
  t += "# Calibration profile written by `megascope calibrate` (format: docs/cost-model.md section 2;\n";
  t += "# how each number is measured and fitted: section 6). Lay it over the shipped profile with\n";
  t += "# `megascope simulate --calibration FILE`.\n";
  t += fmt::format("[profile]\ndevice = \"{}\"\nsource = \"{}\"\ndate = \"{}\"\n\n", p.device, p.source, p.date);
  t += "[gemm]\n";
  t += fmt::format("max_efficiency = {:.6g}      # size curve fitted to every measured GEMM (RMS log error {:.3f})\n",
                   p.gemm_max_efficiency, f.quality.gemm_curve_rms);
  t += fmt::format("half_size = {:.6g}\n", p.gemm_half_size);
  t += "sms = 0\n";
  t += fmt::format("roofline_exponent = {:.6g}\n\n", p.gemm_roofline_exponent);
  t += "[memory]\n";
  for (const bool backward : {false, true})
    for (const auto& [op, bw] : backward ? p.memory_bwd_Bps : p.memory_Bps) {
      const std::string name = fit_name(op, backward);
      t += fmt::format("{}_GBps = {:.6g}   # {} kernels: bytes as the Program counts them per second (RMS log error {:.3f})\n",
                       name, bw / 1e9, backward ? "backward" : op == MemoryOp::optimizer ? "optimizer" : "forward", f.quality.memory_rms.count(name) ? f.quality.memory_rms.at(name) : 0.0);
    }
  t += "\n[attention]\n";
  t += fmt::format("fwd_efficiency = {:.6g}   # RMS log error {:.3f}\n", p.attention_fwd_efficiency,
                   f.quality.attention_fwd_rms);
  t += fmt::format("bwd_efficiency = {:.6g}   # RMS log error {:.3f}\n", p.attention_bwd_efficiency,
                   f.quality.attention_bwd_rms);
  t += fmt::format("fwd_dropout_factor = {:.6g}   # the executor's attention kernels apply no dropout (replays run them as measured)\n",
                   p.attention_fwd_dropout_factor);
  t += fmt::format("bwd_dropout_factor = {:.6g}   # as fwd_dropout_factor\n", p.attention_bwd_dropout_factor);
  t += "fwd_half_flops = 0   # one efficiency whatever the call's size (replaces the shipped profile's size curve)\n";
  t += "bwd_half_flops = 0\n";
  t += "exp_share = 0   # fitted at the measured calls' own head dims (replaces the shipped profile's head-dimension term)\n";
  t += "# unfused_efficiency is not measured here: the profile this file is laid over keeps its own\n\n";
  t += "[launch]\n";
  t += fmt::format("overhead_us = {:.6g}      # per kernel\n", p.launch_overhead_s * 1e6);
  t += fmt::format("op_overhead_us = {:.6g}   # per compute op: the executor's own work\n", p.op_overhead_s * 1e6);
  t += "# [passes] forward_efficiency is not measured here: the profile this file is laid over keeps its own\n";
  for (const auto& [key, seconds] : p.gemm_seconds)
    t += fmt::format("\n[[gemm.measured]]\nm = {}\nn = {}\nk = {}\ndtype = \"bf16\"\nseconds = {:.6g}\n", std::get<0>(key),
                     std::get<1>(key), std::get<2>(key), seconds);
  for (const auto& [key, seconds] : p.memory_seconds)
    t += fmt::format("\n[[memory.measured]]\nkind = \"{}\"\nbytes = {}\nseconds = {:.6g}\n", kind_name(key.first), key.second,
                     seconds);
  return t;
}

std::string cluster_toml(const CalibrationFit& f, const std::string& base_name) {
  const ClusterSpec& c = f.cluster;
  const DeviceSpec& d = c.device;
  const NodeSpec& n = c.node;
  std::string t;
  t += fmt::format("# {} with its scale-up network {} by `megascope calibrate` (docs/cost-model.md section 6).\n",
                   base_name, f.network_fitted ? "fitted to measured MPI collectives" : "unchanged (no collectives measured)");
  if (f.network_fitted)
    t += fmt::format("# {} collective and send/recv cases, RMS log error {:.3f}. Device figures as in {}.\n",
                     f.quality.comm_cases, f.quality.comm_rms, base_name);
  t += fmt::format("[cluster]\nname = \"{}-calibrated\"\nnum_nodes = 1\n\n", c.name);
  t += fmt::format("[cluster.device]\nname = \"{}\"\nkind = \"{}\"\npeak_bf16_tflops = {:.6g}\n", d.name, to_string(d.kind),
                   d.peak_bf16_flops / 1e12);
  if (d.peak_fp8_flops) t += fmt::format("peak_fp8_tflops = {:.6g}\n", *d.peak_fp8_flops / 1e12);
  t += fmt::format("peak_fp32_tflops = {:.6g}\nmemory_GiB = {:.6g}\nmemory_bandwidth_TBps = {:.6g}\n", d.peak_fp32_flops / 1e12,
                   d.memory_bytes / (1024.0 * 1024.0 * 1024.0), d.memory_bandwidth_Bps / 1e12);
  if (d.sms) t += fmt::format("sms = {}\n", *d.sms);
  if (d.mx_formats) t += "mx_formats = true\n";
  t += fmt::format("\n[cluster.node]\ndevices = {}\nscale_up = \"{}\"\n", n.devices_per_node, to_string(n.scale_up));
  t += fmt::format("scale_up_bandwidth_GBps = {:.6g}{}\n", n.scale_up_bandwidth_Bps / 1e9,
                   f.network_fitted ? "   # fitted" : "");
  t += fmt::format("scale_up_latency_us = {:.6g}{}\n", n.scale_up_latency_s * 1e6, f.network_fitted ? "   # fitted" : "");
  t += fmt::format("nvls = {}\npcie_bandwidth_GBps = {:.6g}\nnics = 0\n", n.nvls ? "true" : "false", n.pcie_bandwidth_Bps / 1e9);
  return t;
}

}  // namespace megascope::cli
