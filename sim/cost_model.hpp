// Cost model: how long one operation takes on one device (docs/cost-model.md).
//
//   GEMM       compute time FLOPs / (peak(dtype) x efficiency(m, n, k)), the
//              efficiency a fitted size curve times a wave-quantization term,
//              blended with the HBM time of its operands (a soft roofline),
//              fitted to published cuBLASLt measurements;
//   memory     bytes moved / (HBM bandwidth x achievable fraction, or a
//              calibrated bandwidth per kind of kernel);
//   attention  FLOPs / (bf16 peak x attention efficiency x F / (F + half)),
//              forward and backward (Hopper and Blackwell: cuDNN fused
//              attention as Transformer Engine runs it; A100: FlashAttention-2); unfused
//              attention's GEMMs and memory kernels at their own efficiency
//              (fitted to PyTorch standard attention measurements);
//   each op    plus a launch overhead.
// Shipped default profiles (topologies/profiles/*.toml) per device name; a
// calibration profile (the same format, written by `megascope calibrate`)
// overrides any entry, and exact measured shapes override the curve.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>

#include "core/cluster.hpp"
#include "core/program/work.hpp"
#include "core/result.hpp"
#include "core/training.hpp"

namespace megascope::sim {

// The kernels the program builder emits (core/program/work.hpp).
using megascope::AttentionShape;
using megascope::GemmShape;
using megascope::Kernel;
using megascope::KernelKind;
using megascope::MemoryOp;

// The parameters of the model, as read from a profile file. The defaults are
// the generic profile used for a device with no shipped profile.
struct CostProfile {
  std::string device;                      // device name the profile is for
  std::string source;                      // where the numbers come from
  std::string date;                        // when they were measured or fitted
  // The fraction of the clock its efficiencies were measured at that the
  // tensor cores hold under training load (power and thermal limits):
  // GEMMs' compute term and fused attention take 1 / sustained_clock as
  // long; memory-bound kernels and exact measured shapes do not change.
  double sustained_clock = 1.0;
  // GEMM efficiency (fraction of the dtype's peak) = max_eff * x / (x + half_size),
  // x = m*n*k, times a wave-quantization factor over the tile grid (sms = 0: none).
  double gemm_max_efficiency = 0.75;       // bf16 (and fp16)
  double gemm_half_size = 5e8;             // m*n*k at which the size curve is half of max
  double gemm_fp8_max_efficiency = 0.68;   // fraction of the fp8 peak
  double gemm_fp8_half_size = 1e9;
  int tile_m = 128, tile_n = 128;          // output tile for the wave-quantization term
  int sms = 0;                             // 0: no wave quantization
  double gemm_roofline_exponent = 1.5;     // t = (t_compute^p + t_memory^p)^(1/p)
  double memory_efficiency = 0.85;         // achievable fraction of HBM bandwidth
  double attention_fwd_efficiency = 0.4;   // fraction of bf16 peak, fused attention forward
  double attention_bwd_efficiency = 0.34;
  // Fused attention's size curve: a call of F FLOPs runs at efficiency x
  // F / (F + half_flops), as a kernel whose last wave and longest causal rows
  // add a time of their own to the work of the call (0: no curve, the
  // efficiency whatever the size).
  double attention_fwd_half_flops = 0;
  double attention_bwd_half_flops = 0;
  // Fused attention with dropout on its probabilities (AttentionShape::dropout)
  // runs at these fractions of the efficiencies above: the kernel draws a
  // random number per score (1: not priced, the generic assumption).
  double attention_fwd_dropout_factor = 1.0;
  double attention_bwd_dropout_factor = 1.0;
  // Fused attention's softmax: one exponential per query-key score, on the
  // SMs' special-function units, whatever the head dimension, while the
  // GEMM work per score grows with it. The efficiencies above are measured
  // at head dimension `attention_ref_head_dim`; `attention_exp_share` is the
  // part of such a forward call's time that its exponentials take (the
  // backward recomputes the same exponentials against 2.5x the GEMM work, so
  // its share follows: exp_share x (bwd_eff / fwd_eff) x 512 / 1280). At a
  // smaller head dimension the call's FLOP-priced time is scaled by
  // (1 - share) + share x (GEMM FLOPs per score at the reference / here),
  // at a larger one not at all; dropout's per-score surplus scales likewise
  // (CostModel::attention_time_factor). 0: no such term.
  double attention_exp_share = 0;
  int attention_ref_head_dim = 128;
  // Unfused attention's kernels over the score matrix (Kernel::unfused_attention:
  // batched QK^T and PV GEMMs, softmax, dropout, their backwards) run at this
  // fraction of their GEMM-curve and HBM prices (fitted to PyTorch's standard
  // attention; the generic value sits between the fitted GPUs').
  double attention_unfused_efficiency = 0.65;
  double launch_overhead_s = 1e-6;
  // The host's time per kernel launch of an eager (not graph-captured)
  // PyTorch / Transformer Engine training step: the framework's Python and
  // C++ work for the op and the launch itself. It paces the GPU only where
  // the host cannot run ahead (Op::host_paced). A grouped GEMM is one launch
  // per group. 0: the host is never the bottleneck (the generic assumption).
  double host_launch_s = 0;
  // Compute ops of a forward pass (Phase::forward, and Phase::recompute, which
  // runs the forward again) cost their price (kernels and op overhead)
  // divided by this fraction: what a framework's forward pass costs beyond
  // its kernels, fitted to per-stage forward times measured in training
  // (docs/cost-model.md 4.7). 1: the kernels' price alone, the generic
  // assumption.
  double forward_efficiency = 1.0;
  // The streaming multiprocessors a running collective (NCCL's kernels, one
  // per channel, or Transformer Engine's userbuffers) holds on its GPU from
  // the moment it is launched until it ends: compute ops of the same GPU run
  // meanwhile at (1 - n comm_sms / sms) of their rate with n collectives
  // running (docs/simulator.md, interference). 0: collectives take nothing
  // from compute (the generic assumption).
  int comm_sms = 0;
  // Added once to every compute op that launches kernels: the runtime's own
  // work per op (a CPU executor's bookkeeping, buffers and copies). 0 for GPUs.
  double op_overhead_s = 0;
  // Measured overrides (calibration): exact shapes, seconds per call.
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t, int>, double> gemm_seconds;  // (m,n,k,Precision)
  std::map<MemoryOp, double> memory_Bps;    // per-kind achieved bandwidth (both directions, unless below)
  std::map<MemoryOp, double> memory_bwd_Bps;   // per-kind achieved bandwidth of backward kernels (Kernel::backward)
  // (kind, bytes as the Program counts them): seconds per call, measured.
  std::map<std::pair<MemoryOp, std::int64_t>, double> memory_seconds;
};

class CostModel {
 public:
  CostModel(DeviceSpec device, CostProfile profile);

  // The shipped default profile for a device (by name), or a generic one built
  // from the device's peaks when none ships (with a note in profile().source).
  static Result<CostModel> for_device(const DeviceSpec& device);
  // Applies a calibration profile file (TOML) on top of this model: only the
  // keys the file sets change. On error the model is unchanged.
  Result<void> apply_calibration(const std::string& path);

  // unfused_attention: the kernel is one of unfused attention's (Kernel), priced
  // at attention_unfused_efficiency of the GEMM curve or of the kind's
  // bandwidth, unless its exact shape or (kind, bytes) is measured.
  [[nodiscard]] double gemm_s(GemmShape s, Precision p, bool unfused_attention = false) const;
  [[nodiscard]] double memory_s(MemoryOp op, double bytes, bool unfused_attention = false, bool backward = false) const;
  [[nodiscard]] double attention_fwd_s(const AttentionShape& a) const;
  [[nodiscard]] double attention_bwd_s(const AttentionShape& a) const;
  // The head-dimension factor on fused attention's FLOP-priced time
  // (CostProfile::attention_exp_share): 1 at the profile's reference head dim.
  [[nodiscard]] double attention_head_dim_factor(const AttentionShape& a, bool backward) const;
  // The call's time over its FLOP-priced time: the head-dimension factor and dropout's.
  [[nodiscard]] double attention_time_factor(const AttentionShape& a, bool backward) const;
  [[nodiscard]] double kernel_s(const Kernel& k) const;  // dispatches on k.kind
  // The host's time to launch `k` (CostProfile::host_launch_s per launch).
  [[nodiscard]] double host_s(const Kernel& k) const {
    return profile_.host_launch_s * static_cast<double>(k.kind == KernelKind::gemm ? k.groups : 1);
  }
  [[nodiscard]] double op_overhead_s() const { return profile_.op_overhead_s; }
  [[nodiscard]] double forward_efficiency() const { return profile_.forward_efficiency; }
  [[nodiscard]] const CostProfile& profile() const { return profile_; }
  [[nodiscard]] const DeviceSpec& device() const { return device_; }

 private:
  // GEMM FLOPs per score at the reference head dimension over those of `a`.
  [[nodiscard]] double score_work_ratio(const AttentionShape& a, bool backward) const;
  DeviceSpec device_;
  CostProfile profile_;
};

// Reads a profile TOML (docs/cost-model.md) over the generic defaults;
// unknown keys, wrong types and out-of-range values are errors naming the
// file, line and column.
Result<CostProfile> load_cost_profile(const std::string& path);

// The shipped profile for a device ("v100", "a100", "h100", "h100-pcie",
// "h200", "b200", "gb200", "cpu"), or nullopt when none matches its name.
std::optional<std::string> shipped_profile_name(const DeviceSpec& device);

// FLOPs of one fused attention call, as FlashAttention counts them (forward:
// 2 * b * heads * pairs * (d + d_v), pairs = s_q * s_kv, halved when causal;
// backward: 2 * b * heads * pairs * (3d + 2d_v), 2.5x forward when d_v = d).
double attention_fwd_flops(const AttentionShape& a);
double attention_bwd_flops(const AttentionShape& a);

}  // namespace megascope::sim
