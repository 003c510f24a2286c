// Cost model (sim/cost_model.hpp, docs/cost-model.md): the shipped profiles
// against the published measurements they were fitted to (Azure
// AI-benchmarking-guide microbenchmarks, copied with their source header in
// tests/reference/gpu_microbenchmarks_azure.csv), the end-to-end
// Megatron-LM throughputs as an upper context, calibration overlays and the
// errors of bad profile files.
#include "sim/cost_model.hpp"

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "support.hpp"

using namespace megascope;
using namespace megascope::sim;

namespace {

using Row = std::map<std::string, std::string>;

std::string fixture(const std::string& name) { return std::string(MEGASCOPE_TEST_FIXTURES) + "/profiles/" + name; }

std::vector<Row> azure(const std::string& gpu, const std::string& benchmark, const std::string& precision = "") {
  std::vector<Row> out;
  for (auto& r : test::read_csv("gpu_microbenchmarks_azure.csv"))
    if (r["gpu"] == gpu && r["benchmark"] == benchmark && (precision.empty() || r["precision"] == precision))
      out.push_back(r);
  return out;
}

double cell(const Row& r, const std::string& key) { return std::stod(r.at(key)); }

// The TOML files of a folder of the shipped data (profiles, calibrations), sorted.
std::vector<std::filesystem::path> toml_files(const std::string& folder) {
  std::vector<std::filesystem::path> out;
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(MEGASCOPE_DATA_DIR_FOR_TESTS) / folder))
    if (e.path().extension() == ".toml") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

CostModel model_for(const std::string& cluster) {
  auto m = CostModel::for_device(test::shipped_cluster(cluster).device);
  if (!m) FAIL(m.error().str());
  return *m;
}

Error profile_error(const std::string& name) {
  auto r = load_cost_profile(fixture(name));
  REQUIRE_FALSE(r.has_value());
  return r.error();
}

// Every Azure GEMM row of one GPU: predicted vs measured time, all within `tolerance`.
void check_gemm_rows(const std::string& cluster, const std::string& gpu, const std::string& precision, Precision p,
                     double tolerance, double rms_bound) {
  const CostModel cm = model_for(cluster);
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

struct EnvGuard {
  std::optional<std::string> old;
  explicit EnvGuard(const std::string& value) {
    if (const char* v = std::getenv("MEGASCOPE_DATA_DIR")) old = v;
    ::setenv("MEGASCOPE_DATA_DIR", value.c_str(), 1);
  }
  ~EnvGuard() {
    if (old)
      ::setenv("MEGASCOPE_DATA_DIR", old->c_str(), 1);
    else
      ::unsetenv("MEGASCOPE_DATA_DIR");
  }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;
};

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

TEST_CASE("The A100, H200 and GB200 profiles reproduce the Azure FlashAttention-2 forward plus backward rates within 1 percent",
          "[sim]") {
  // flash-attention's benchmark_flash_attention.py: dim 2048 (heads = 2048 / d), batch 2, seqlen 8192;
  // head dim 64 on A100, 128 on H200 and GB200. For the A100 and H200 the guide's scripts kept the
  // first block of that output with these sizes, which is not causal (its loops run causal = False
  // first); the GB200 run does not say. The rate per counted FLOP is the model's either way.
  const std::vector<std::tuple<std::string, std::string, std::int64_t>> cases = {
      {"dgx-a100", "A100-SXM4-80GB", 64}, {"dgx-h200", "H200-141GB", 128}, {"gb200-nvl72", "GB200-185GB", 128}};
  for (const auto& [cluster, gpu, d] : cases) {
    const CostModel cm = model_for(cluster);
    const auto rows = azure(gpu, "flash_attention2");
    REQUIRE(rows.size() == 1);
    AttentionShape a = causal(2, 2048 / d, 8192, d);
    a.causal = false;
    const double f = attention_fwd_flops(a);
    const double rate = 3.5 * f / (cm.attention_fwd_s(a) + cm.attention_bwd_s(a)) / 1e12;
    INFO(fmt::format("{}: measured {:.1f} TFLOP/s, predicted {:.1f}", gpu, cell(rows[0], "value"), rate));
    CHECK(rate == Approx(cell(rows[0], "value")).epsilon(0.01));
  }
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
    const CostModel cm = model_for(c.cluster);
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
    const CostModel cm = model_for(r.cluster);
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

// ---- shipped profiles ---------------------------------------------------------

TEST_CASE("Every shipped cluster device gets its shipped profile and an unknown device gets a generic one that says so",
          "[sim]") {
  const std::map<std::string, std::string> expected = {
      {"dgx-a100", "a100"}, {"dgx-h100", "h100"}, {"dgx-h200", "h200"}, {"dgx-b200", "b200"},
      {"gb200-nvl72", "gb200"}, {"pcie-8gpu", "h100-pcie"}, {"cpu-host", "cpu"}};
  for (const auto& [cluster, name] : expected) {
    const DeviceSpec d = test::shipped_cluster(cluster).device;
    INFO(cluster << ": " << d.name);
    CHECK(shipped_profile_name(d) == name);
    const CostModel cm = model_for(cluster);
    CHECK(cm.profile().device == d.name);
    CHECK_FALSE(cm.profile().source.empty());
    CHECK(cm.profile().source.find("generic") == std::string::npos);
  }
  DeviceSpec mystery = test::shipped_cluster("dgx-h100").device;
  mystery.name = "MI300X";
  auto cm = CostModel::for_device(mystery);
  REQUIRE(cm.has_value());
  CHECK_FALSE(shipped_profile_name(mystery).has_value());
  REQUIRE_THAT(cm->profile().source, Catch::Contains("generic") && Catch::Contains("MI300X"));
  CHECK(cm->profile().sms == 132);  // the device's own SM count
  CHECK(cm->gemm_s({4096, 4096, 4096}, Precision::bf16) > 0);

  DeviceSpec broken = mystery;
  broken.peak_bf16_flops = 0;
  auto bad = CostModel::for_device(broken);
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error().field == "device.peak_bf16_flops");
}

TEST_CASE("Shipped profiles are looked up under MEGASCOPE_DATA_DIR and a missing one falls back to generic",
          "[sim]") {
  const DeviceSpec a100 = test::shipped_cluster("dgx-a100").device;
  const auto dir = std::filesystem::temp_directory_path() / "megascope-cost-model-test-empty";
  std::filesystem::create_directories(dir);
  const EnvGuard env(dir.string());
  auto cm = CostModel::for_device(a100);
  REQUIRE(cm.has_value());
  REQUIRE_THAT(cm->profile().source, Catch::Contains("generic") && Catch::Contains("missing"));
}

TEST_CASE("Every shipped profile loads and every number in it carries a comment naming its source", "[sim]") {
  const auto files = toml_files("profiles");
  for (const auto& path : files) {
    INFO(path.string());
    auto p = load_cost_profile(path.string());
    if (!p) FAIL(p.error().str());
    CHECK_FALSE(p->source.empty());
    CHECK_FALSE(p->device.empty());
    std::ifstream in(path);
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
      ++n;
      const auto eq = line.find('=');
      if (line.empty() || line[0] == '#' || line[0] == '[' || eq == std::string::npos) continue;
      const std::string key = line.substr(0, line.find_first_of(" =\t"));
      if (key == "device" || key == "source" || key == "date") continue;
      INFO("line " << n << ": " << line);
      const auto hash = line.find('#', eq);
      REQUIRE(hash != std::string::npos);
      const std::string comment = line.substr(hash);
      const bool sourced = comment.find("fit") != std::string::npos || comment.find("derived") != std::string::npos ||
                           comment.find("assumption") != std::string::npos || comment.find(".csv") != std::string::npos ||
                           comment.find(".toml") != std::string::npos;
      CHECK(sourced);
    }
  }
  CHECK(files.size() >= 7);
}

// ---- calibration --------------------------------------------------------------

TEST_CASE("An exact measured shape in a calibration file returns the measured seconds and other shapes keep the curve",
          "[sim]") {
  CostModel cm = model_for("dgx-a100");
  const GemmShape shape{4096, 4096, 4096}, other{4096, 4096, 4095};
  const double curve = cm.gemm_s(shape, Precision::bf16), curve_other = cm.gemm_s(other, Precision::bf16);
  CHECK(curve != Approx(0.0125));
  REQUIRE(cm.apply_calibration(fixture("calibration-exact.toml")).has_value());
  CHECK(cm.gemm_s(shape, Precision::bf16) == 0.0125);
  CHECK(cm.gemm_s(shape, Precision::fp8) == 0.0125);  // A100 runs fp8 as bf16
  CHECK(cm.gemm_s(other, Precision::bf16) == curve_other);
  REQUIRE_THAT(cm.profile().source, Catch::Contains("one measured shape") && Catch::Contains("Azure ND A100"));

  // On an FP8 device the bf16 measurement does not answer an fp8 question.
  CostModel h100 = model_for("dgx-h100");
  const double fp8 = h100.gemm_s(shape, Precision::fp8);
  REQUIRE(h100.apply_calibration(fixture("calibration-exact.toml")).has_value());
  CHECK(h100.gemm_s(shape, Precision::bf16) == 0.0125);
  CHECK(h100.gemm_s(shape, Precision::fp8) == fp8);
}

TEST_CASE("A measured memory kernel is used at its kind and exact bytes, the bandwidth elsewhere", "[sim]") {
  CostModel cm = model_for("dgx-a100");
  const double bytes = 25165824;   // 6 bytes x 2048 tokens x 2048 hidden
  const double curve = cm.memory_s(MemoryOp::dropout_residual, bytes);
  CHECK(curve != Approx(0.002));
  REQUIRE(cm.apply_calibration(fixture("calibration-exact.toml")).has_value());
  CHECK(cm.memory_s(MemoryOp::dropout_residual, bytes) == 0.002);
  CHECK(cm.memory_s(MemoryOp::dropout_residual, bytes + 6) == Approx(curve).epsilon(1e-6));   // not the measured size
  CHECK(cm.memory_s(MemoryOp::norm, bytes) == Approx(cm.memory_s(MemoryOp::norm, bytes + 1)).epsilon(1e-6));  // another kind
  Kernel k;
  k.kind = KernelKind::memory;
  k.memory = MemoryOp::dropout_residual;
  k.bytes = bytes;
  CHECK(cm.kernel_s(k) == 0.002);

  const Error kind = profile_error("bad-memory-measured.toml");
  CHECK(kind.field == "memory.measured[0].kind");
  REQUIRE(kind.where.has_value());
  CHECK(kind.where->line == 5);
  REQUIRE_THAT(kind.message, Catch::Contains("\"dropout_residual\"") && Catch::Contains("softmax"));

  const Error twice = profile_error("twice-memory-measured.toml");
  REQUIRE(twice.where.has_value());
  CHECK(twice.where->line == 9);
  REQUIRE_THAT(twice.message, Catch::Contains("norm kernel of 4096 bytes is measured twice"));
}

TEST_CASE("A partial calibration file changes only the keys it sets", "[sim]") {
  CostModel cm = model_for("dgx-h200");
  const CostProfile before = cm.profile();
  REQUIRE(cm.apply_calibration(fixture("calibration-partial.toml")).has_value());
  const CostProfile& after = cm.profile();
  CHECK(after.memory_efficiency == 0.5);
  CHECK(after.launch_overhead_s == Approx(3e-6));
  REQUIRE(after.memory_Bps.size() == 1);
  CHECK(after.memory_Bps.at(MemoryOp::norm) == Approx(1e12));
  CHECK(after.device == before.device);
  CHECK(after.date == before.date);
  CHECK(after.gemm_max_efficiency == before.gemm_max_efficiency);
  CHECK(after.gemm_half_size == before.gemm_half_size);
  CHECK(after.gemm_fp8_max_efficiency == before.gemm_fp8_max_efficiency);
  CHECK(after.gemm_fp8_half_size == before.gemm_fp8_half_size);
  CHECK(after.tile_m == before.tile_m);
  CHECK(after.tile_n == before.tile_n);
  CHECK(after.sms == before.sms);
  CHECK(after.gemm_roofline_exponent == before.gemm_roofline_exponent);
  CHECK(after.attention_fwd_efficiency == before.attention_fwd_efficiency);
  CHECK(after.attention_bwd_efficiency == before.attention_bwd_efficiency);
  CHECK(after.attention_unfused_efficiency == before.attention_unfused_efficiency);
  CHECK(after.gemm_seconds == before.gemm_seconds);
  REQUIRE_THAT(after.source, Catch::Contains("partial calibration") && Catch::Contains(before.source));
}

TEST_CASE("Every measured calibration in topologies/calibrations applies over its device's shipped profile",
          "[sim]") {
  const auto files = toml_files("calibrations");
  for (const auto& path : files) {
    INFO(path.string());
    auto p = load_cost_profile(path.string());
    if (!p) FAIL(p.error().str());
    // A measured file: the date and command in its header, measured shapes in it.
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    REQUIRE_THAT(text.str(), Catch::Contains("megascope calibrate --backend cuda") && Catch::Contains(p->date));
    REQUIRE_FALSE(p->gemm_seconds.empty());
    // The shipped cluster whose device it measured.
    std::optional<CostModel> cm;
    for (const char* cluster : {"dgx-a100", "dgx-h100", "dgx-h200", "dgx-b200", "gb200-nvl72", "pcie-8gpu"}) {
      const DeviceSpec d = test::shipped_cluster(cluster).device;
      if (d.name == p->device) cm = CostModel::for_device(d).value();
    }
    REQUIRE(cm.has_value());
    REQUIRE(cm->apply_calibration(path.string()).has_value());
    for (const auto& [key, seconds] : p->gemm_seconds) {
      const auto [m, n, k, prec] = key;
      CHECK(cm->gemm_s({m, n, k}, static_cast<Precision>(prec)) == seconds);
      // Measured, not invented: no GEMM beats the device's peak.
      CHECK(2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) / seconds <
            cm->device().peak_bf16_flops);
    }
  }
  CHECK(files.size() >= 1);
}

namespace {
// Mean and RMS of log(shipped curve's time / measured time) over the bf16
// GEMMs of a measured calibration file.
std::tuple<int, double, double> curve_against(const char* cluster, const char* file) {
  const auto path = std::filesystem::path(MEGASCOPE_DATA_DIR_FOR_TESTS) / "calibrations" / file;
  auto measured = load_cost_profile(path.string());
  if (!measured) FAIL(measured.error().str());
  const CostModel shipped = model_for(cluster);
  double sum = 0, sum2 = 0;
  int n = 0;
  for (const auto& [key, seconds] : measured->gemm_seconds) {
    const auto [m, nn, k, prec] = key;
    if (static_cast<Precision>(prec) != Precision::bf16) continue;
    const double e = std::log(shipped.gemm_s({m, nn, k}, Precision::bf16) / seconds);
    sum += e;
    sum2 += e * e;
    ++n;
  }
  return {n, n ? sum / n : 0.0, n ? std::sqrt(sum2 / n) : 0.0};
}
}  // namespace

TEST_CASE("The shipped H200 BF16 GEMM curve is within 8 percent on average of cuBLASLt measured on an H200",
          "[sim]") {
  // Out of sample: the shipped BF16 curve is derived from Azure's FP8 rows and
  // the MAMF BF16/FP8 ratio (docs/cost-model.md 4.2); these are 252 bf16
  // GEMMs of real models' shapes (all three passes) measured by `megascope
  // calibrate --backend cuda` on one H200.
  const auto [n, mean, rms] = curve_against("dgx-h200", "h200-measured-2026-11-27.toml");
  REQUIRE(n >= 200);
  INFO(fmt::format("{} shapes: mean log error {:+.3f}, RMS {:.3f}", n, mean, rms));
  CHECK(std::abs(mean) < 0.08);   // measured: -0.057 (the curve is slightly optimistic)
  CHECK(rms < 0.14);              // measured: 0.118
}

TEST_CASE("The shipped H100 BF16 GEMM curve is within 8 percent on average of cuBLASLt measured on an H100",
          "[sim]") {
  // Out of sample twice over: the shipped H100 curve is the H200 derivation
  // reused for the same GH100 compute (topologies/profiles/h100.toml); these
  // are the same 252 shapes measured on one H100 SXM.
  const auto [n, mean, rms] = curve_against("dgx-h100", "h100-measured-2026-11-27.toml");
  REQUIRE(n >= 200);
  INFO(fmt::format("{} shapes: mean log error {:+.3f}, RMS {:.3f}", n, mean, rms));
  CHECK(std::abs(mean) < 0.08);   // measured: -0.035
  CHECK(rms < 0.14);              // measured: 0.109
}

TEST_CASE("A backward bandwidth prices a kind's backward kernels only, and a file without one prices both directions",
          "[sim]") {
  const auto dir = std::filesystem::temp_directory_path() / "megascope-bwd-bandwidth-test";
  std::filesystem::create_directories(dir);
  const auto write = [&](const char* name, const std::string& text) {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  };
  const std::string both = write("both.toml", "[profile]\nsource = \"test\"\n[memory]\nnorm_GBps = 1000\nnorm_bwd_GBps = 250\n");
  const std::string fwd_only = write("fwd.toml", "[profile]\nsource = \"test\"\n[memory]\nnorm_GBps = 500\n");
  CostModel cm = model_for("dgx-h200");
  const double hbm = cm.memory_s(MemoryOp::activation, 1e9, false, true);
  REQUIRE(cm.apply_calibration(both).has_value());
  const double L = cm.profile().launch_overhead_s;
  CHECK(cm.memory_s(MemoryOp::norm, 1e9) == Approx(1e9 / 1000e9 + L));
  CHECK(cm.memory_s(MemoryOp::norm, 1e9, false, true) == Approx(1e9 / 250e9 + L));
  CHECK(cm.memory_s(MemoryOp::activation, 1e9, false, true) == hbm);   // another kind: the HBM's
  // Through the Program's kernels: the flag decides.
  Kernel k;
  k.kind = KernelKind::memory;
  k.memory = MemoryOp::norm;
  k.bytes = 1e9;
  CHECK(cm.kernel_s(k) == Approx(1e9 / 1000e9 + L));
  k.backward = true;
  CHECK(cm.kernel_s(k) == Approx(1e9 / 250e9 + L));
  // A file that sets only the kind's bandwidth prices both directions with it.
  REQUIRE(cm.apply_calibration(fwd_only).has_value());
  CHECK(cm.memory_s(MemoryOp::norm, 1e9, false, true) == Approx(1e9 / 500e9 + L));
  CHECK(cm.profile().memory_bwd_Bps.empty());
  // Bad values are refused like the others.
  const std::string bad = write("bad.toml", "[profile]\nsource = \"test\"\n[memory]\nnorm_bwd_GBps = 0\n");
  const auto r = cm.apply_calibration(bad);
  REQUIRE_FALSE(r.has_value());
  CHECK_THAT(r.error().str(), Catch::Contains("norm_bwd_GBps"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("A bad calibration file leaves the model unchanged", "[sim]") {
  CostModel cm = model_for("dgx-a100");
  const double before = cm.gemm_s({4096, 4096, 4096}, Precision::bf16);
  const std::string source = cm.profile().source;
  auto r = cm.apply_calibration(fixture("out-of-range.toml"));
  REQUIRE_FALSE(r.has_value());
  CHECK(cm.gemm_s({4096, 4096, 4096}, Precision::bf16) == before);
  CHECK(cm.profile().source == source);
  CHECK_FALSE(cm.apply_calibration(fixture("does-not-exist.toml")).has_value());
}

// ---- bad files ------------------------------------------------------------------

TEST_CASE("A malformed profile file is an error naming the file, line and column", "[sim]") {
  const Error e = profile_error("malformed.toml");
  REQUIRE(e.where.has_value());
  CHECK(e.where->file == fixture("malformed.toml"));
  CHECK(e.where->line == 3);
  CHECK(e.where->column.has_value());
  REQUIRE_THAT(e.message, Catch::Contains("TOML syntax error"));
  REQUIRE_THAT(e.str(), Catch::Contains("malformed.toml:3:"));
}

TEST_CASE("An unknown key or table in a profile is an error naming the file, line and dotted key", "[sim]") {
  const Error key = profile_error("unknown-key.toml");
  CHECK(key.field == "gemm.max_eficiency");
  REQUIRE(key.where.has_value());
  CHECK(key.where->line == 6);
  REQUIRE_THAT(key.str(), Catch::Contains("unknown-key.toml:6:1: gemm.max_eficiency: unknown key"));

  const Error table = profile_error("unknown-table.toml");
  CHECK(table.field == "gemms");
  REQUIRE(table.where.has_value());
  CHECK(table.where->line == 4);
  REQUIRE_THAT(table.message, Catch::Contains("unknown table"));
}

TEST_CASE("A value of the wrong type in a profile is an error naming the file, line and expected type", "[sim]") {
  const Error e = profile_error("wrong-type.toml");
  CHECK(e.field == "memory.efficiency");
  REQUIRE(e.where.has_value());
  CHECK(e.where->file == fixture("wrong-type.toml"));
  CHECK(e.where->line == 5);
  REQUIRE_THAT(e.message, Catch::Contains("expected a number") && Catch::Contains("string"));
}

TEST_CASE("Out-of-range values and an unknown measured dtype are errors naming the file and line", "[sim]") {
  const Error range = profile_error("out-of-range.toml");
  CHECK(range.field == "attention.fwd_efficiency");
  REQUIRE(range.where.has_value());
  CHECK(range.where->line == 5);
  REQUIRE_THAT(range.message, Catch::Contains("(0, 1]") && Catch::Contains("1.5"));

  const Error unfused = profile_error("unfused-out-of-range.toml");
  CHECK(unfused.field == "attention.unfused_efficiency");
  REQUIRE(unfused.where.has_value());
  CHECK(unfused.where->line == 7);
  REQUIRE_THAT(unfused.message, Catch::Contains("(0, 1]"));

  const Error dtype = profile_error("bad-measured.toml");
  CHECK(dtype.field == "gemm.measured[0].dtype");
  REQUIRE(dtype.where.has_value());
  CHECK(dtype.where->line == 8);
  REQUIRE_THAT(dtype.message, Catch::Contains("\"bf16\", \"fp8\"") && Catch::Contains("fp16"));
}
