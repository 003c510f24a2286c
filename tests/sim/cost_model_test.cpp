// Cost model (sim/cost_model.hpp, docs/cost-model.md): the shipped profiles
// against the published measurements they were fitted to (Azure
// AI-benchmarking-guide microbenchmarks, copied with their source header in
// tests/reference/gpu_microbenchmarks_azure.csv), the end-to-end
// Megatron-LM throughputs as an upper context, and the pricing rules. The
// profile and calibration files themselves: profile_file_test.cpp.
#include "sim/cost_model.hpp"

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "sim/cost_model_support.hpp"
#include "sim/engine.hpp"
#include "support.hpp"

using namespace megascope;
using namespace megascope::sim;
using megascope::test::measured_clock_model_for;
using megascope::test::model_for;

namespace {

std::string fixture(const std::string& name) { return test::profile_fixture(name); }

using Row = std::map<std::string, std::string>;


std::vector<Row> azure(const std::string& gpu, const std::string& benchmark, const std::string& precision = "") {
  std::vector<Row> out;
  for (auto& r : test::read_csv("gpu_microbenchmarks_azure.csv"))
    if (r["gpu"] == gpu && r["benchmark"] == benchmark && (precision.empty() || r["precision"] == precision))
      out.push_back(r);
  return out;
}

double cell(const Row& r, const std::string& key) { return std::stod(r.at(key)); }

// Every Azure GEMM row of one GPU: predicted vs measured time, all within `tolerance`.
void check_gemm_rows(const std::string& cluster, const std::string& gpu, const std::string& precision, Precision p,
                     double tolerance, double rms_bound) {
  const CostModel cm = measured_clock_model_for(cluster);
  const auto rows = azure(gpu, "gemm", precision);
  REQUIRE(rows.size() >= 8);
  std::string table = fmt::format("{} {} cuBLASLt GEMM, profile '{}'\n{:>22} {:>10} {:>10} {:>8}\n", gpu, precision,
                                  cm.profile().device, "m x n x k", "measured", "predicted", "error");
  std::vector<double> errors;
  for (const auto& r : rows) {
    const auto m = static_cast<std::int64_t>(cell(r, "m")), n = static_cast<std::int64_t>(cell(r, "n")),
               k = static_cast<std::int64_t>(cell(r, "k"));
    // superbench's cublaslt_gemm reports m * n * (2k - 1) FLOPs over the mean time of its loop.
    const double flops = static_cast<double>(m) * static_cast<double>(n) * (2.0 * static_cast<double>(k) - 1);
    const double measured_s = flops / (cell(r, "value") * 1e12);
    const double predicted_s = cm.gemm_s({m, n, k}, p);
    const double err = predicted_s / measured_s - 1;
    errors.push_back(err);
    table += fmt::format("{:>22} {:>10.1f} {:>10.1f} {:>+7.1f}%\n", fmt::format("{}x{}x{}", m, n, k),
                         cell(r, "value"), flops / predicted_s / 1e12, 100 * err);
  }
  double sum = 0;
  for (double e : errors) sum += std::log1p(e) * std::log1p(e);
  const double rms = std::sqrt(sum / static_cast<double>(errors.size()));
  table += fmt::format("RMS of log time error {:.1f}% (bound {:.0f}%), per-row bound {:.0f}%", 100 * rms,
                       100 * rms_bound, 100 * tolerance);
  INFO(table);
  for (double e : errors) CHECK(std::abs(e) <= tolerance);
  CHECK(rms <= rms_bound);
}

AttentionShape causal(std::int64_t b, std::int64_t heads, std::int64_t s, std::int64_t d) {
  AttentionShape a;
  a.batch = b;
  a.heads = heads;
  a.kv_heads = heads;
  a.seq_q = s;
  a.seq_kv = s;
  a.head_dim = d;
  a.causal = true;
  return a;
}

// One transformer layer on one GPU for one micro-batch: the four GEMMs
// forward, their data- and weight-gradient GEMMs, fused attention, and the
// recomputed forward when asked. Norms and elementwise kernels are left out.
double layer_compute_s(const CostModel& cm, std::int64_t h, std::int64_t heads, std::int64_t tp, std::int64_t s,
                       std::int64_t b, bool recompute) {
  const std::int64_t m = b * s;
  const std::int64_t nk[4][2] = {{3 * h / tp, h}, {h, h / tp}, {4 * h / tp, h}, {h, 4 * h / tp}};
  double fwd = cm.attention_fwd_s(causal(b, heads / tp, s, h / heads));
  double bwd = cm.attention_bwd_s(causal(b, heads / tp, s, h / heads));
  for (const auto& g : nk) {
    fwd += cm.gemm_s({m, g[0], g[1]}, Precision::bf16);
    bwd += cm.gemm_s({m, g[1], g[0]}, Precision::bf16) + cm.gemm_s({g[1], g[0], m}, Precision::bf16);
  }
  return (recompute ? 2 : 1) * fwd + bwd;
}

const std::vector<std::string> kClusters = {"dgx-a100", "dgx-h100", "dgx-h200", "dgx-b200",
                                            "gb200-nvl72", "pcie-8gpu", "cpu-host"};

}  // namespace

// ---- the fits -------------------------------------------------------------

TEST_CASE("The A100 profile reproduces each Azure A100 FP16 GEMM row within 17 percent of its time", "[sim]") {
  check_gemm_rows("dgx-a100", "A100-SXM4-80GB", "FP16", Precision::bf16, 0.17, 0.07);
}

TEST_CASE("The H200 profile reproduces each Azure H200 FP8 GEMM row within 5 percent on the fp8 path", "[sim]") {
  check_gemm_rows("dgx-h200", "H200-141GB", "FP8", Precision::fp8, 0.05, 0.025);
}

TEST_CASE("The GB200 profile reproduces each Azure GB200 FP8 GEMM row within 14 percent on the fp8 path", "[sim]") {
  check_gemm_rows("gb200-nvl72", "GB200-185GB", "FP8", Precision::fp8, 0.14, 0.07);
}

TEST_CASE("The A100 and H200 profiles reproduce the Azure HBM copy, triad and dot bandwidths within 7 percent",
          "[sim]") {
  // BabelStream's default arrays: 2^25 doubles; copy and dot touch two arrays, triad three.
  const double array = 33554432.0 * 8;
  const std::map<std::string, double> arrays = {{"hbm_copy", 2}, {"hbm_triad", 3}, {"hbm_dot", 2}};
  for (const auto& [cluster, gpu] : {std::pair{"dgx-a100", "A100-SXM4-80GB"}, std::pair{"dgx-h200", "H200-141GB"}}) {
    const CostModel cm = model_for(cluster);
    int seen = 0;
    for (const auto& r : test::read_csv("gpu_microbenchmarks_azure.csv")) {
      if (r.at("gpu") != gpu || !arrays.count(r.at("benchmark"))) continue;
      const double bytes = arrays.at(r.at("benchmark")) * array;
      const double predicted = bytes / cm.memory_s(MemoryOp::other, bytes) / 1e12;
      INFO(fmt::format("{} {}: measured {:.2f} TB/s, predicted {:.3f} TB/s", gpu, r.at("benchmark"), cell(r, "value"),
                       predicted));
      CHECK(predicted == Approx(cell(r, "value")).epsilon(0.07));
      ++seen;
    }
    CHECK(seen == 3);
  }
}

TEST_CASE("The A100 profile reproduces the Azure FlashAttention-2 forward plus backward rate within 1 percent, the H200 "
          "and GB200 profiles (cuDNN) run faster than it",
          "[sim]") {
  // flash-attention's benchmark_flash_attention.py: dim 2048 (heads = 2048 / d), batch 2, seqlen 8192;
  // head dim 64 on A100, 128 on H200 and GB200. For the A100 and H200 the guide's scripts kept the
  // first block of that output with these sizes, which is not causal (its loops run causal = False
  // first); the GB200 run does not say. The rate per counted FLOP is the model's either way.
  const std::vector<std::tuple<std::string, std::string, std::int64_t>> cases = {
      {"dgx-a100", "A100-SXM4-80GB", 64}, {"dgx-h200", "H200-141GB", 128}, {"gb200-nvl72", "GB200-185GB", 128}};
  for (const auto& [cluster, gpu, d] : cases) {
    const CostModel cm = measured_clock_model_for(cluster);
    const auto rows = azure(gpu, "flash_attention2");
    REQUIRE(rows.size() == 1);
    AttentionShape a = causal(2, 2048 / d, 8192, d);
    a.causal = false;
    const double f = attention_fwd_flops(a);
    const double rate = 3.5 * f / (cm.attention_fwd_s(a) + cm.attention_bwd_s(a)) / 1e12;
    INFO(fmt::format("{}: measured {:.1f} TFLOP/s, predicted {:.1f}", gpu, cell(rows[0], "value"), rate));
    if (cluster == "dgx-a100") {
      CHECK(rate == Approx(cell(rows[0], "value")).epsilon(0.01));
    } else {
      // cuDNN's fused attention: 1.4-1.7x FlashAttention-2 on an H100 (FlashAttention-3 paper, Fig. 5).
      CHECK(rate > 1.3 * cell(rows[0], "value"));
    }
  }
}

TEST_CASE("The H100 profile at its measurement clock reproduces cuDNN fused attention measured on an H100 within 2 percent, "
          "forward and backward",
          "[sim]") {
  // PyTorch SDPA (cuDNN), bf16, causal, batch 1, seq 4096, head dim 128 (docs/cost-model.md, fused attention).
  const CostModel cm = measured_clock_model_for("dgx-h100");
  const double fwd[3] = {460, 536, 585}, bwd[3] = {388, 447, 474};
  for (int i = 0; i < 3; ++i) {
    const AttentionShape a = causal(1, 16 << i, 4096, 128);
    const double f = attention_fwd_flops(a), b = attention_bwd_flops(a);
    INFO((16 << i) << " heads");
    CHECK(f / cm.attention_fwd_s(a) / 1e12 == Approx(fwd[i]).epsilon(0.02));
    CHECK(b / cm.attention_bwd_s(a) / 1e12 == Approx(bwd[i]).epsilon(0.02));
  }
  // At the sustained clock of training load every call takes 1 / sustained_clock as long (less the launch).
  const CostModel shipped = model_for("dgx-h100");
  const AttentionShape a = causal(1, 32, 4096, 128);
  const double launch = cm.profile().launch_overhead_s;
  CHECK((shipped.attention_fwd_s(a) - launch) * shipped.profile().sustained_clock ==
        Approx(cm.attention_fwd_s(a) - launch).epsilon(1e-12));
  CHECK(shipped.profile().sustained_clock < 1.0);
}

namespace {

// The kernels of flash-attention's PyTorch standard attention (benchmark_flash_attention.py,
// attention_pytorch, not causal, dropout 0 so no dropout kernel): S = scale x QK^T (baddbmm),
// softmax (read and write the score matrix), O = PV; backward dP = dO V^T, dV = P^T dO, the softmax
// backward (read P and dP, write dS), dQ = dS K, dK = dS^T Q. The layout the Program builder emits for
// unfused attention (core/program/layer_ops.cpp), without Megatron's dropout.
std::vector<Kernel> standard_attention(std::int64_t b, std::int64_t heads, std::int64_t s, std::int64_t d) {
  const std::int64_t rows = b * heads * s;
  const double E = static_cast<double>(rows) * static_cast<double>(s);
  std::vector<Kernel> k;
  auto gemm = [&](std::int64_t m, std::int64_t n, std::int64_t kk) {
    Kernel x;
    x.kind = KernelKind::gemm;
    x.gemm = {m, n, kk};
    k.push_back(x);
  };
  auto memory = [&](double bytes) {
    Kernel x;
    x.kind = KernelKind::memory;
    x.memory = MemoryOp::activation;
    x.bytes = bytes;
    k.push_back(x);
  };
  gemm(rows, s, d);
  memory(4 * E);
  gemm(rows, d, s);
  gemm(rows, s, d);
  gemm(rows, d, s);
  memory(6 * E);
  gemm(rows, d, s);
  gemm(rows, d, s);
  for (Kernel& x : k) x.unfused_attention = true;
  return k;
}

double standard_attention_tflops(const CostModel& cm, std::int64_t d) {
  const std::int64_t b = 2, heads = 2048 / d, s = 8192;
  double t = 0;
  for (const Kernel& k : standard_attention(b, heads, s, d)) t += cm.kernel_s(k);
  return 3.5 * 4.0 * static_cast<double>(b * heads * d) * static_cast<double>(s) * static_cast<double>(s) / t / 1e12;
}

}  // namespace

TEST_CASE("The A100, H100 and H200 profiles reproduce the Azure PyTorch standard attention rates within 1 percent",
          "[sim]") {
  // Same benchmark and sizes as the FlashAttention-2 rows (not causal), FLOPs counted as
  // FlashAttention counts them (3.5 x the forward's 4 b h s^2 d).
  struct Case {
    std::string cluster;
    std::int64_t d;
    double measured;
  };
  std::vector<Case> cases;
  for (const auto& [cluster, gpu, d] : {std::tuple{"dgx-a100", "A100-SXM4-80GB", 64}, std::tuple{"dgx-h200", "H200-141GB", 128}}) {
    const auto rows = azure(gpu, "pytorch_standard_attention");
    REQUIRE(rows.size() == 1);
    cases.push_back({cluster, d, cell(rows[0], "value")});
  }
  // Azure AI-benchmarking-guide, "Azure Results/ND_H100_v5_results.md" (not in the reference CSV).
  cases.push_back({"dgx-h100", 128, 145.1});
  for (const auto& c : cases) {
    const CostModel cm = measured_clock_model_for(c.cluster);
    const double rate = standard_attention_tflops(cm, c.d);
    INFO(fmt::format("{}: measured {:.1f} TFLOP/s, predicted {:.1f}", c.cluster, c.measured, rate));
    CHECK(rate == Approx(c.measured).epsilon(0.01));
    // Without the fitted efficiency the GEMM curve and HBM rate price it 36-76% faster.
    CostProfile plain = cm.profile();
    plain.attention_unfused_efficiency = 1.0;
    CHECK(standard_attention_tflops(CostModel(cm.device(), plain), c.d) > 1.3 * c.measured);
  }
}

TEST_CASE("The unfused attention efficiency prices unfused attention kernels unless their exact size is measured",
          "[sim]") {
  CostModel cm = model_for("dgx-a100");
  const double eff = cm.profile().attention_unfused_efficiency;
  REQUIRE(eff < 1.0);
  const double L = cm.profile().launch_overhead_s;
  const GemmShape shape{4096, 4096, 4096};
  const double bytes = 25165824;
  // Curve and HBM prices: the kernel's own time (launch excluded) divided by the efficiency.
  CHECK(cm.gemm_s(shape, Precision::bf16, true) - L == Approx((cm.gemm_s(shape, Precision::bf16) - L) / eff));
  CHECK(cm.memory_s(MemoryOp::dropout_residual, bytes, true) - L ==
        Approx((cm.memory_s(MemoryOp::dropout_residual, bytes) - L) / eff));
  Kernel k;
  k.kind = KernelKind::memory;
  k.memory = MemoryOp::norm;
  k.bytes = bytes;
  const double plain = cm.kernel_s(k);
  k.unfused_attention = true;
  CHECK(cm.kernel_s(k) - L == Approx((plain - L) / eff));
  // Exact measurements win unchanged: a GEMM shape and a (kind, bytes).
  REQUIRE(cm.apply_calibration(fixture("calibration-exact.toml")).has_value());
  CHECK(cm.gemm_s(shape, Precision::bf16, true) == 0.0125);
  CHECK(cm.memory_s(MemoryOp::dropout_residual, bytes, true) == 0.002);
  // A calibrated per-kind bandwidth comes from the executor's GELU or bias-dropout-add
  // kernels, not from a softmax over scores: the factor applies to it.
  REQUIRE(cm.apply_calibration(fixture("calibration-partial.toml")).has_value());
  const double launch = cm.profile().launch_overhead_s;
  CHECK(cm.memory_s(MemoryOp::norm, bytes) == Approx(bytes / 1e12 + launch));
  CHECK(cm.memory_s(MemoryOp::norm, bytes, true) == Approx(bytes / 1e12 / eff + launch));
  CHECK(cm.profile().attention_unfused_efficiency == eff);   // neither file sets it
}

TEST_CASE("Attention FLOPs follow FlashAttention's count with causal halving and a backward of 2.5 times forward",
          "[sim]") {
  AttentionShape a = causal(2, 16, 8192, 128);
  CHECK(attention_fwd_flops(a) == Approx(4.0 * 2 * 8192.0 * 8192.0 * 16 * 128 / 2));
  CHECK(attention_bwd_flops(a) == Approx(2.5 * attention_fwd_flops(a)));
  a.causal = false;
  CHECK(attention_fwd_flops(a) == Approx(4.0 * 2 * 8192.0 * 8192.0 * 16 * 128));
  // A query block at the end of a longer key sequence sees all earlier keys.
  a.causal = true;
  a.seq_q = 4096;
  CHECK(attention_fwd_flops(a) == Approx(4.0 * 2 * 16 * 128 * (4096.0 * 8192 - 4096.0 * 4096 / 2)));
  // MLA: a value head dim of its own.
  AttentionShape mla = causal(1, 128, 4096, 192);
  mla.head_dim_v = 128;
  CHECK(attention_fwd_flops(mla) == Approx(2.0 * 128 * 4096.0 * 4096 / 2 * (192 + 128)));
  CHECK(attention_bwd_flops(mla) == Approx(2.0 * 128 * 4096.0 * 4096 / 2 * (3 * 192 + 2 * 128)));
  CHECK(attention_fwd_flops(AttentionShape{}) == 0);
}

TEST_CASE("GEMM throughput never falls as square shapes grow or as full waves of tiles are added", "[sim]") {
  for (const auto& cluster : kClusters) {
    const CostModel cm = model_for(cluster);
    for (Precision p : {Precision::bf16, Precision::fp8}) {
      INFO(cluster << (p == Precision::fp8 ? " fp8" : " bf16"));
      double prev = 0;
      for (std::int64_t s = 128; s <= 32768; s *= 2) {
        const double rate = 2.0 * std::pow(static_cast<double>(s), 3) / cm.gemm_s({s, s, s}, p);
        INFO("square " << s << ": " << rate / 1e12 << " TFLOP/s");
        CHECK(rate >= prev);
        prev = rate;
      }
      prev = 0;
      const std::int64_t wave_rows = std::int64_t{cm.profile().tile_m} * std::max(cm.profile().sms, 1);
      for (std::int64_t w = 1; w <= 16; ++w) {
        const std::int64_t m = w * wave_rows, n = cm.profile().tile_n, k = 4096;
        const double rate =
            2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) / cm.gemm_s({m, n, k}, p);
        INFO("waves " << w << ": " << rate / 1e12 << " TFLOP/s");
        CHECK(rate >= prev);
        prev = rate;
      }
      // Never above the peak of the dtype.
      const double peak = p == Precision::fp8 && cm.device().peak_fp8_flops ? *cm.device().peak_fp8_flops
                                                                           : cm.device().peak_bf16_flops;
      CHECK(prev < peak);
    }
  }
}

TEST_CASE("FP8 GEMMs run at the FP8 peak with their own efficiency and fall back to BF16 without FP8 units",
          "[sim]") {
  const CostModel h100 = model_for("dgx-h100");
  const GemmShape big{8192, 8192, 8192};
  const double bf16 = h100.gemm_s(big, Precision::bf16), fp8 = h100.gemm_s(big, Precision::fp8);
  // Measured MAMF speedup on H100 is 1402.6 / 794.5 = 1.77 (stas00/ml-engineering).
  CHECK(bf16 / fp8 == Approx(1402.6 / 794.5).epsilon(0.05));
  const CostModel a100 = model_for("dgx-a100");
  CHECK_FALSE(a100.device().peak_fp8_flops.has_value());
  CHECK(a100.gemm_s(big, Precision::fp8) == a100.gemm_s(big, Precision::bf16));
}

TEST_CASE("Every GPU profile prices the published best-shape matmul rates below the measured maximum and within 30 percent of it",
          "[sim]") {
  // stas00/ml-engineering, compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison
  // table": the best shape of a sweep, mean of 100 iterations after 50 warmups. Out of sample for the
  // fits (Azure: fixed shapes, 10,000 warmups), and biased upward by the choice of the best shape.
  struct Mamf {
    const char* cluster;
    Precision p;
    std::int64_t m, n, k;
    double tflops;
  };
  const std::vector<Mamf> rows = {{"dgx-a100", Precision::bf16, 1024, 10240, 5120, 271.2},
                                  {"dgx-h100", Precision::bf16, 2048, 2048, 13312, 794.5},
                                  {"dgx-h100", Precision::fp8, 1024, 9216, 14336, 1402.6},
                                  {"dgx-h200", Precision::fp8, 1280, 4096, 12032, 1453.4},
                                  {"dgx-b200", Precision::bf16, 1792, 16128, 3072, 1745.0},
                                  {"dgx-b200", Precision::fp8, 15360, 4096, 3072, 3432.5},
                                  {"gb200-nvl72", Precision::bf16, 4096, 9728, 2048, 1822.0},
                                  {"gb200-nvl72", Precision::fp8, 19456, 5120, 1536, 3615.6}};
  for (const auto& r : rows) {
    const CostModel cm = measured_clock_model_for(r.cluster);
    const double flops = 2.0 * static_cast<double>(r.m) * static_cast<double>(r.n) * static_cast<double>(r.k);
    const double rate = flops / cm.gemm_s({r.m, r.n, r.k}, r.p) / 1e12;
    INFO(fmt::format("{} {} {}x{}x{}: MAMF {:.1f} TFLOP/s, predicted {:.1f} ({:+.1f}%)", r.cluster,
                     r.p == Precision::fp8 ? "fp8" : "bf16", r.m, r.n, r.k, r.tflops, rate,
                     100 * (rate / r.tflops - 1)));
    CHECK(rate < r.tflops);
    CHECK(rate > 0.7 * r.tflops);
  }
}

TEST_CASE("Layer compute priced by the cost model runs faster than the end-to-end TFLOP/s Megatron-LM reports on A100 and H100",
          "[sim]") {
  // Achieved TFLOP/s per GPU include communication, pipeline bubbles, the
  // optimizer and the logits: the layers' compute alone must price faster,
  // and those overheads take well under half of an iteration in these runs.
  const CostModel a100 = model_for("dgx-a100");
  for (const auto& r : test::read_csv("narayanan2021_table1_weak_scaling.csv")) {
    const auto h = static_cast<std::int64_t>(test::num(r, "hidden_size"));
    const auto heads = static_cast<std::int64_t>(test::num(r, "attention_heads"));
    const auto tp = static_cast<std::int64_t>(test::num(r, "tp"));
    const auto b = static_cast<std::int64_t>(test::num(r, "micro_batch"));
    const std::int64_t s = 2048;
    // Narayanan Eq. 3 per layer and micro-batch, with the recomputed forward (96 = 4 x 24).
    const double hd = static_cast<double>(h), sd = static_cast<double>(s);
    const double flops = 96.0 * static_cast<double>(b) * sd * hd * hd * (1 + sd / (6 * hd)) / static_cast<double>(tp);
    const double rate = flops / layer_compute_s(a100, h, heads, tp, s, b, true) / 1e12;
    const double achieved = test::num(r, "tflops_per_gpu");
    INFO(r.at("params_b") << "B: compute-only " << rate << " TFLOP/s, achieved " << achieved);
    CHECK(achieved < rate);
    CHECK(achieved > 0.5 * rate);
  }
  const CostModel h100 = model_for("dgx-h100");
  for (const auto& r : test::read_csv("megatron_readme_h100_weak_scaling.csv")) {
    const auto h = static_cast<std::int64_t>(test::num(r, "hidden_size"));
    const auto heads = static_cast<std::int64_t>(test::num(r, "attention_heads"));
    const auto tp = static_cast<std::int64_t>(test::num(r, "tp"));
    const std::int64_t s = 4096, b = 1;  // assumption: micro-batch 1 (the README does not say)
    // The README's counter: 72 B s L h^2 (1 + s/(6h) + ...), no recomputation.
    const double hd = static_cast<double>(h), sd = static_cast<double>(s);
    const double flops = 72.0 * static_cast<double>(b) * sd * hd * hd * (1 + sd / (6 * hd)) / static_cast<double>(tp);
    const double rate = flops / layer_compute_s(h100, h, heads, tp, s, b, false) / 1e12;
    const double achieved = test::num(r, "tflops_per_gpu");
    INFO(r.at("model") << ": compute-only " << rate << " TFLOP/s, achieved " << achieved);
    CHECK(achieved < rate);
    CHECK(achieved > 0.5 * rate);
  }
}

// ---- overheads and memory ---------------------------------------------------

TEST_CASE("Memory ops use a calibrated per-kind bandwidth when present and HBM times efficiency otherwise", "[sim]") {
  CostModel cm = model_for("dgx-a100");
  const double bytes = 1e9;
  const double hbm = cm.device().memory_bandwidth_Bps * cm.profile().memory_efficiency;
  CHECK(cm.memory_s(MemoryOp::norm, bytes) == Approx(bytes / hbm + cm.profile().launch_overhead_s));
  REQUIRE(cm.apply_calibration(fixture("calibration-partial.toml")).has_value());
  CHECK(cm.memory_s(MemoryOp::norm, bytes) == Approx(bytes / 1e12 + 3e-6));
  CHECK(cm.memory_s(MemoryOp::optimizer, bytes) == Approx(bytes / (cm.device().memory_bandwidth_Bps * 0.5) + 3e-6));
}

TEST_CASE("Fused attention's FLOP rate falls with the head dimension as the FlashAttention-3 paper measured cuDNN on an H100, "
          "and only where a profile prices the softmax's exponentials",
          "[sim]") {
  // arXiv:2407.08608 Fig. 5 (H100 SXM5, BF16, 16k tokens, hidden 2048: heads = 2048 / d): cuDNN's
  // forward at sequence 2k, 4k, 8k and 16k, TFLOP/s at head dim 64 and at 128.
  const double d64[4] = {395, 408, 412, 413}, d128[4] = {617, 609, 600, 595};
  const CostModel cm = measured_clock_model_for("dgx-h100");
  for (int i = 0; i < 4; ++i) {
    const std::int64_t s = 2048 << i;
    INFO("sequence " << s);
    const AttentionShape small = causal(16384 / s, 32, s, 64), ref = causal(16384 / s, 16, s, 128);
    REQUIRE(attention_fwd_flops(small) == attention_fwd_flops(ref));   // the same work, counted
    const double ratio = cm.attention_fwd_s(ref) / cm.attention_fwd_s(small);
    CHECK(ratio == Approx(d64[i] / d128[i]).epsilon(0.06));
  }
  // The factor: 1 at the reference head dim, 1 + share at half of it forward; the
  // backward's share follows from 2.5x the GEMM work per exponential.
  const auto& p = cm.profile();
  REQUIRE(p.attention_ref_head_dim == 128);
  REQUIRE(p.attention_exp_share == Approx(0.49));
  CHECK(cm.attention_head_dim_factor(causal(1, 8, 4096, 128), false) == Approx(1.0));
  CHECK(cm.attention_head_dim_factor(causal(1, 8, 4096, 128), true) == Approx(1.0));
  CHECK(cm.attention_head_dim_factor(causal(1, 8, 4096, 64), false) == Approx(1.49));
  const double share_bwd = 0.49 * p.attention_bwd_efficiency / p.attention_fwd_efficiency * 512 / 1280;
  CHECK(cm.attention_head_dim_factor(causal(1, 8, 4096, 64), true) == Approx(1 + share_bwd));
  // Above the reference (MLA's query-key head dim 192 with value head dim 128, or 256) the rate
  // is held at the reference's: the parts summed would have the GEMMs pass the peak.
  AttentionShape mla = causal(1, 8, 4096, 192);
  mla.head_dim_v = 128;
  CHECK(cm.attention_head_dim_factor(mla, false) == 1.0);
  CHECK(cm.attention_head_dim_factor(causal(1, 8, 4096, 256), true) == 1.0);
  // Dropout's random numbers are per score too: at head dim 64 its surplus is twice the reference's per FLOP.
  AttentionShape dropped = causal(1, 8, 4096, 64);
  dropped.dropout = true;
  CHECK(cm.attention_time_factor(dropped, false) == Approx(1.49 + (1 / p.attention_fwd_dropout_factor - 1) * 2));
  dropped.head_dim = 128;
  CHECK(cm.attention_time_factor(dropped, false) == Approx(1 / p.attention_fwd_dropout_factor));
  // The A100 profile (FlashAttention-2 fitted at head dim 64) and a generic one price no such term.
  for (const char* cluster : {"dgx-a100", "dgx-2h"}) {
    INFO(cluster);
    const CostModel other = model_for(cluster);
    CHECK(other.attention_head_dim_factor(causal(1, 8, 4096, 64), false) == 1.0);
    CHECK(other.attention_head_dim_factor(causal(1, 8, 4096, 256), true) == 1.0);
  }
  // Blackwell: twice Hopper's tensor FLOPs per SM per clock against the same exponential rate.
  CHECK(model_for("dgx-b200").profile().attention_exp_share > p.attention_exp_share);
}

TEST_CASE("Fused attention with dropout is priced at the H100's measured cuDNN slowdown and not at all where unmeasured",
          "[sim]") {
  // cuDNN fused attention on an H100 SXM (PyTorch SDPA, bf16, s 4096, d 128,
  // causal), TFLOP/s without and with dropout 0.1 (docs/validation.md):
  // heads, forward, forward with dropout, backward, backward with dropout.
  const double measured[3][5] = {{16, 460, 220, 388, 321}, {32, 536, 256, 447, 358}, {64, 585, 272, 474, 395}};
  const CostModel h100 = model_for("dgx-h100");
  const double launch = h100.profile().launch_overhead_s;
  for (const auto& row : measured) {
    INFO(row[0] << " heads");
    AttentionShape a = causal(1, static_cast<std::int64_t>(row[0]), 4096, 128);
    const double fwd = h100.attention_fwd_s(a) - launch, bwd = h100.attention_bwd_s(a) - launch;
    a.dropout = true;
    const double fwd_d = h100.attention_fwd_s(a) - launch, bwd_d = h100.attention_bwd_s(a) - launch;
    // The kernel slows by the measured ratio (within 3%), whatever its own speed.
    CHECK(fwd / fwd_d == Approx(row[2] / row[1]).epsilon(0.03));
    CHECK(bwd / bwd_d == Approx(row[4] / row[3]).epsilon(0.03));
    CHECK(fwd / fwd_d == Approx(h100.profile().attention_fwd_dropout_factor).epsilon(1e-12));
  }
  // The A100 profile (FlashAttention-2, dropout not measured) prices none,
  // nor does a calibration-free generic profile.
  for (const char* cluster : {"dgx-a100", "dgx-b200"}) {
    INFO(cluster);
    const CostModel cm = model_for(cluster);
    AttentionShape a = causal(2, 16, 4096, 128);
    const double fwd = cm.attention_fwd_s(a), bwd = cm.attention_bwd_s(a);
    a.dropout = true;
    CHECK(cm.attention_fwd_s(a) == fwd);
    CHECK(cm.attention_bwd_s(a) == bwd);
  }
}

TEST_CASE("Empty ops cost nothing and every other op pays the launch overhead", "[sim]") {
  const CostModel cm = model_for("dgx-h100");
  const double launch = cm.profile().launch_overhead_s;
  CHECK(launch == Approx(1e-6));
  CHECK(cm.gemm_s({0, 4096, 4096}, Precision::bf16) == 0);
  CHECK(cm.memory_s(MemoryOp::other, 0) == 0);
  CHECK(cm.attention_fwd_s(AttentionShape{}) == 0);
  CHECK(cm.attention_bwd_s(AttentionShape{}) == 0);
  CHECK(cm.gemm_s({1, 1, 1}, Precision::bf16) > launch);
  CHECK(cm.memory_s(MemoryOp::other, 1) > launch);
  CHECK(cm.attention_fwd_s(causal(1, 1, 1, 64)) > launch);
}

TEST_CASE("A kernel is priced by the cost of its kind", "[sim]") {
  const CostModel cm = model_for("dgx-h100");
  Kernel k;
  k.kind = KernelKind::gemm;
  k.gemm = {4096, 4096, 4096};
  k.precision = Precision::fp8;
  CHECK(cm.kernel_s(k) == cm.gemm_s(k.gemm, Precision::fp8));
  k.kind = KernelKind::attention_fwd;
  k.attention = causal(1, 8, 4096, 128);
  CHECK(cm.kernel_s(k) == cm.attention_fwd_s(k.attention));
  k.kind = KernelKind::attention_bwd;
  CHECK(cm.kernel_s(k) == cm.attention_bwd_s(k.attention));
  k.kind = KernelKind::memory;
  k.memory = MemoryOp::dropout_residual;
  k.bytes = 3e8;
  CHECK(cm.kernel_s(k) == cm.memory_s(MemoryOp::dropout_residual, 3e8));
}

TEST_CASE("A grouped GEMM costs its groups times one GEMM of its shape, a host-paced op lasts at least its launches' "
          "host time, other ops their kernels' time",
          "[sim]") {
  const CostModel cm = model_for("dgx-h100");
  Kernel one;
  one.kind = KernelKind::gemm;
  one.gemm = {512, 1536, 2048};
  one.precision = Precision::bf16;
  Kernel grouped = one;
  grouped.groups = 16;
  CHECK(cm.kernel_s(grouped) == Approx(16 * cm.kernel_s(one)).epsilon(1e-12));
  // Sixteen GEMMs of a sixteenth of the tokens each take longer than one merged GEMM (smaller shapes run less efficiently).
  Kernel merged = one;
  merged.gemm.m = 16 * 512;
  CHECK(cm.kernel_s(grouped) > cm.kernel_s(merged));

  CostProfile prof = cm.profile();
  prof.host_launch_s = 1e-3;   // a slow host: 1 ms per launch
  const CostModel slow(cm.device(), prof);
  CHECK(slow.host_s(grouped) == Approx(16e-3));
  CHECK(slow.host_s(one) == Approx(1e-3));
  StageProgram st;
  st.kernels = {grouped, one};
  Op op;
  op.kind = OpKind::compute;
  op.phase = Phase::backward_input;
  op.kernel_begin = 0;
  op.kernel_count = 2;
  st.ops = {op, op};
  st.ops[1].host_paced = true;
  const std::vector<double> d = compute_durations(st, slow);
  CHECK(d[0] == Approx(slow.kernel_s(grouped) + slow.kernel_s(one) + slow.op_overhead_s()));
  CHECK(d[1] == Approx(17e-3));   // 16 + 1 launches: the host is slower than the GPU here
  // With a fast host the paced op is the GPU's time again.
  prof.host_launch_s = 1e-9;
  CHECK(compute_durations(st, CostModel(cm.device(), prof))[1] == Approx(d[0]));
}
