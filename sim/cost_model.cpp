// Cost model evaluation and the choice of the shipped profile
// (docs/cost-model.md). Profile files are read in sim/cost_profile.cpp.
#include "sim/cost_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <utility>

namespace fs = std::filesystem;

namespace megascope::sim {

namespace {

// The shipped library, found like config/library.cpp's data_dir().
std::string data_dir() {
  if (const char* env = std::getenv("MEGASCOPE_DATA_DIR"); env && *env) return env;
  if (fs::is_directory(MEGASCOPE_SOURCE_DATA_DIR)) return MEGASCOPE_SOURCE_DATA_DIR;
  return MEGASCOPE_INSTALL_DATA_DIR;
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// Fraction of the SMs busy over the waves of output tiles: tiles / (waves * sms).
double wave_factor(std::int64_t m, std::int64_t n, const CostProfile& p) {
  if (p.sms <= 0 || p.tile_m <= 0 || p.tile_n <= 0) return 1.0;
  const std::int64_t tiles = ((m + p.tile_m - 1) / p.tile_m) * ((n + p.tile_n - 1) / p.tile_n);
  const std::int64_t waves = (tiles + p.sms - 1) / p.sms;
  return static_cast<double>(tiles) / (static_cast<double>(waves) * p.sms);
}

// (a^p + b^p)^(1/p) without overflow: the soft maximum of two times.
double soft_max(double a, double b, double p) {
  const double hi = std::max(a, b), lo = std::min(a, b);
  if (hi <= 0) return 0;
  return hi * std::pow(1.0 + std::pow(lo / hi, p), 1.0 / p);
}

bool empty(const AttentionShape& a) {
  return a.batch <= 0 || a.heads <= 0 || a.seq_q <= 0 || a.seq_kv <= 0 || a.head_dim <= 0;
}

double hbm_Bps(const DeviceSpec& d, const CostProfile& p) { return d.memory_bandwidth_Bps * p.memory_efficiency; }

}  // namespace

std::optional<std::string> shipped_profile_name(const DeviceSpec& device) {
  if (device.kind == DeviceKind::cpu) return "cpu";
  const std::string n = upper(device.name);
  auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
  if (has("GB200")) return "gb200";
  if (has("B200")) return "b200";
  if (has("H200")) return "h200";
  if (has("H100")) return has("PCIE") ? "h100-pcie" : "h100";
  if (has("H800")) return has("PCIE") ? "h100-pcie" : "h100";   // the H100's compute and memory with less NVLink (dgx-h800.toml)
  if (has("A100")) return "a100";
  if (has("V100")) return "v100";
  return std::nullopt;
}

double attention_fwd_flops(const AttentionShape& a) {
  if (empty(a)) return 0;
  const double d = static_cast<double>(a.head_dim);
  const double dv = static_cast<double>(a.head_dim_v > 0 ? a.head_dim_v : a.head_dim);
  return 2.0 * static_cast<double>(a.batch) * static_cast<double>(a.heads) * attention_pairs(a) * (d + dv);
}

double attention_bwd_flops(const AttentionShape& a) {
  if (empty(a)) return 0;
  // Recomputed S = QK^T (d), dV = P^T dO (d_v), dP = dO V^T (d_v), dQ = dS K (d), dK = dS^T Q (d).
  const double d = static_cast<double>(a.head_dim);
  const double dv = static_cast<double>(a.head_dim_v > 0 ? a.head_dim_v : a.head_dim);
  return 2.0 * static_cast<double>(a.batch) * static_cast<double>(a.heads) * attention_pairs(a) * (3 * d + 2 * dv);
}

CostModel::CostModel(DeviceSpec device, CostProfile profile) : device_(std::move(device)), profile_(std::move(profile)) {
  MEGASCOPE_CHECK(device_.peak_bf16_flops > 0, "cost model: device peak_bf16_flops must be positive");
  MEGASCOPE_CHECK(device_.memory_bandwidth_Bps > 0, "cost model: device memory bandwidth must be positive");
  const CostProfile& p = profile_;
  MEGASCOPE_CHECK(p.gemm_max_efficiency > 0 && p.gemm_fp8_max_efficiency > 0 && p.memory_efficiency > 0 &&
                      p.attention_fwd_efficiency > 0 && p.attention_bwd_efficiency > 0 &&
                      p.attention_unfused_efficiency > 0 && p.attention_fwd_dropout_factor > 0 &&
                      p.attention_bwd_dropout_factor > 0 && p.forward_efficiency > 0 && p.sustained_clock > 0,
                  "cost model: profile efficiencies must be positive");
  MEGASCOPE_CHECK(p.gemm_half_size >= 0 && p.gemm_fp8_half_size >= 0 && p.gemm_roofline_exponent >= 1,
                  "cost model: profile half sizes must be >= 0 and the roofline exponent >= 1");
  for (const auto& [op, bw] : p.memory_Bps) MEGASCOPE_CHECK(bw > 0, "cost model: per-kind bandwidths must be positive");
  for (const auto& [op, bw] : p.memory_bwd_Bps) MEGASCOPE_CHECK(bw > 0, "cost model: per-kind bandwidths must be positive");
}

Result<CostModel> CostModel::for_device(const DeviceSpec& device) {
  if (device.peak_bf16_flops <= 0)
    return fail("device.peak_bf16_flops", fmt::format("device '{}' needs a positive BF16 peak for a cost model", device.name));
  if (device.memory_bandwidth_Bps <= 0)
    return fail("device.memory_bandwidth_Bps",
                fmt::format("device '{}' needs a positive memory bandwidth for a cost model", device.name));
  std::string note;
  if (auto name = shipped_profile_name(device)) {
    const fs::path path = fs::path(data_dir()) / "profiles" / (*name + ".toml");
    if (fs::is_regular_file(path)) {
      auto profile = load_cost_profile(path.string());
      if (!profile) return tl::unexpected(profile.error());
      return CostModel(device, std::move(*profile));
    }
    note = fmt::format(" (its shipped profile {} is missing)", path.string());
  }
  CostProfile generic;
  generic.device = device.name;
  generic.sms = device.kind == DeviceKind::gpu ? device.sms.value_or(0) : 0;
  generic.source = fmt::format(
      "generic profile from the device's peaks: no shipped profile for '{}'{}; efficiencies are the "
      "generic assumptions of docs/cost-model.md",
      device.name, note);
  return CostModel(device, std::move(generic));
}

double CostModel::gemm_s(GemmShape s, Precision p, bool unfused_attention) const {
  if (s.m <= 0 || s.n <= 0 || s.k <= 0) return 0;
  const bool fp8 = p == Precision::fp8 && device_.peak_fp8_flops && *device_.peak_fp8_flops > 0;
  // Exact measured shapes win (the dtype asked for, then the one it runs in).
  const auto& measured = profile_.gemm_seconds;
  if (auto it = measured.find({s.m, s.n, s.k, static_cast<int>(p)}); it != measured.end()) return it->second;
  if (p == Precision::fp8 && !fp8)
    if (auto it = measured.find({s.m, s.n, s.k, static_cast<int>(Precision::bf16)}); it != measured.end())
      return it->second;

  const double m = static_cast<double>(s.m), n = static_cast<double>(s.n), k = static_cast<double>(s.k);
  const double x = m * n * k;
  const double peak = fp8 ? *device_.peak_fp8_flops : device_.peak_bf16_flops;
  const double max_eff = fp8 ? profile_.gemm_fp8_max_efficiency : profile_.gemm_max_efficiency;
  const double half = fp8 ? profile_.gemm_fp8_half_size : profile_.gemm_half_size;
  const double eff = max_eff * (x / (x + half)) * wave_factor(s.m, s.n, profile_);
  const double t_compute = 2.0 * x / (peak * eff * profile_.sustained_clock);
  // Operands in the GEMM's input dtype, the output in bf16.
  const double bytes = (fp8 ? 1.0 : 2.0) * (m * k + k * n) + 2.0 * m * n;
  const double t_memory = bytes / hbm_Bps(device_, profile_);
  const double t = soft_max(t_compute, t_memory, profile_.gemm_roofline_exponent);
  return (unfused_attention ? t / profile_.attention_unfused_efficiency : t) + profile_.launch_overhead_s;
}

double CostModel::memory_s(MemoryOp op, double bytes, bool unfused_attention, bool backward) const {
  if (bytes <= 0) return 0;
  // An exact measured kernel wins, as for GEMMs.
  if (!profile_.memory_seconds.empty())
    if (auto it = profile_.memory_seconds.find({op, std::llround(bytes)}); it != profile_.memory_seconds.end())
      return it->second;
  // A calibrated bandwidth of the kind is measured on the executor's kernels of
  // that kind (GELU, bias-dropout-add, ...), not on a softmax over scores: the
  // unfused factor still applies to it.
  // A backward kernel takes its kind's backward bandwidth where the profile
  // has one, else the kind's, else the HBM's.
  double bw = hbm_Bps(device_, profile_);
  if (auto it = profile_.memory_Bps.find(op); it != profile_.memory_Bps.end()) bw = it->second;
  if (backward)
    if (auto it = profile_.memory_bwd_Bps.find(op); it != profile_.memory_bwd_Bps.end()) bw = it->second;
  const double t = bytes / bw;
  return (unfused_attention ? t / profile_.attention_unfused_efficiency : t) + profile_.launch_overhead_s;
}

// The softmax's exponentials, one per score, take a fixed time per score,
// while the GEMM work per score is 2 (d + d_v) FLOPs forward and
// 2 (3d + 2d_v) backward: at the reference head dimension the forward's
// exponentials take `attention_exp_share` of the call; the backward
// recomputes them against 2.5x the GEMM work at its own efficiency. The
// FLOP-priced time is scaled by (1 - share) + share x (GEMM FLOPs per score
// at the reference / here): 1 at the reference head dimension. Above it the
// factor stays 1: the two parts summed would have the GEMMs pass the tensor
// cores' peak there (the kernels overlap the exponentials with the GEMMs),
// and no measurement supports a faster rate.
double CostModel::attention_head_dim_factor(const AttentionShape& a, bool backward) const {
  const double share_fwd = profile_.attention_exp_share;
  if (share_fwd <= 0) return 1.0;
  const double share =
      backward ? std::min(1.0, share_fwd * (profile_.attention_bwd_efficiency / profile_.attention_fwd_efficiency) * 0.4)
               : share_fwd;
  return std::max(1.0, (1 - share) + share * score_work_ratio(a, backward));
}

// GEMM FLOPs per score at the profile's reference head dimension over those of `a`.
double CostModel::score_work_ratio(const AttentionShape& a, bool backward) const {
  const double d = static_cast<double>(a.head_dim);
  const double dv = static_cast<double>(a.head_dim_v > 0 ? a.head_dim_v : a.head_dim);
  const double ref = static_cast<double>(profile_.attention_ref_head_dim);
  return backward ? 10 * ref / (2 * (3 * d + 2 * dv)) : 4 * ref / (2 * (d + dv));
}

// A fused attention call's time over its FLOP-priced time at the profile's
// efficiency: the head-dimension factor, and dropout's. Dropout draws a
// random number per score, a fixed time per score like the exponentials:
// with the head-dimension term on, its surplus over the undropped call,
// (1 / factor - 1) of the call at the reference head dim, scales with the
// scores, not the FLOPs; without it, the call runs at `factor` of its
// efficiency.
double CostModel::attention_time_factor(const AttentionShape& a, bool backward) const {
  const double h = attention_head_dim_factor(a, backward);
  if (!a.dropout) return h;
  const double factor = backward ? profile_.attention_bwd_dropout_factor : profile_.attention_fwd_dropout_factor;
  if (profile_.attention_exp_share <= 0) return h / factor;
  return h + (1.0 / factor - 1.0) * score_work_ratio(a, backward);
}

namespace {
// A packed call runs its documents' tiles, not their pairs: its FLOPs scaled
// by the tiles it computes over the pairs it counts (AttentionShape::packed).
double tiled_flops(const AttentionShape& a, double flops) {
  return a.packed == a.packed_tiles || a.packed <= 0 ? flops : flops * (a.packed_tiles / a.packed);
}
}  // namespace

double CostModel::attention_fwd_s(const AttentionShape& a) const {
  if (empty(a)) return 0;
  const double f = tiled_flops(a, attention_fwd_flops(a));
  const double base = (f + profile_.attention_fwd_half_flops) /
                      (device_.peak_bf16_flops * profile_.attention_fwd_efficiency * profile_.sustained_clock);
  return base * attention_time_factor(a, false) + profile_.launch_overhead_s;
}

double CostModel::attention_bwd_s(const AttentionShape& a) const {
  if (empty(a)) return 0;
  const double f = tiled_flops(a, attention_bwd_flops(a));
  const double base = (f + profile_.attention_bwd_half_flops) /
                      (device_.peak_bf16_flops * profile_.attention_bwd_efficiency * profile_.sustained_clock);
  return base * attention_time_factor(a, true) + profile_.launch_overhead_s;
}

double CostModel::kernel_s(const Kernel& k) const {
  switch (k.kind) {
    case KernelKind::gemm: return static_cast<double>(k.groups) * gemm_s(k.gemm, k.precision, k.unfused_attention);
    case KernelKind::attention_fwd: return attention_fwd_s(k.attention);
    case KernelKind::attention_bwd: return attention_bwd_s(k.attention);
    case KernelKind::memory: return memory_s(k.memory, k.bytes, k.unfused_attention, k.backward);
  }
  return 0;
}

}  // namespace megascope::sim
