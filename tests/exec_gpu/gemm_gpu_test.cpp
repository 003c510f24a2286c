// cuBLASLt GEMMs (exec/cuda/gemm.hpp) against the CPU twins of
// kernels/matmul.hpp on the same (rounded) inputs: fp32 within 1e-5, bf16
// outputs within 2e-2 (normwise relative), fp32 gradients of bf16 inputs
// within 1e-4 (only the summation order differs).
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "exec/cuda/gemm.hpp"
#include "kernels/matmul.hpp"
#include "kernels_gpu/gpu_support.hpp"

namespace xc = megascope::exec::cuda;
namespace k = megascope::kernels;
using namespace megascope::kernels::gpu_test;

namespace {

struct Shape {
  std::int64_t N, C, OC;
};
// Odd sizes (unaligned leading dimensions) and a larger aligned one.
const std::vector<Shape> kShapes = {{7, 5, 3}, {64, 48, 80}, {130, 257, 96}, {512, 384, 640}};

template <typename T>
void check_linear(xc::Gemm& gemm, Shape s, bool with_bias, std::uint64_t seed) {
  const auto [N, C, OC] = s;
  const auto n = [](std::int64_t x) { return static_cast<std::size_t>(x); };
  const auto inp = random<T>(n(N * C), seed), w = random<T>(n(OC * C), seed + 1), bias = random<T>(n(OC), seed + 2);
  const auto dout = random<T>(n(N * OC), seed + 3);
  const auto dw0 = uniform<float>(n(OC * C), seed + 4), db0 = uniform<float>(n(OC), seed + 5);
  auto d_inp = to_device<T>(inp), d_w = to_device<T>(w), d_bias = to_device<T>(bias), d_dout = to_device<T>(dout);
  DeviceBuffer<T> d_out(n(N * OC)), d_dinp(n(N * C));
  DeviceBuffer<float> d_dw(dw0), d_db(db0);

  gemm.forward<T>(d_out.get(), d_inp.get(), d_w.get(), with_bias ? d_bias.get() : nullptr, N, C, OC, nullptr);
  gemm.backward_input<T>(d_dinp.get(), d_dout.get(), d_w.get(), N, C, OC, nullptr);
  gemm.backward_weight<T>(d_dw.get(), with_bias ? d_db.get() : nullptr, d_dout.get(), d_inp.get(), N, C, OC, nullptr);

  std::vector<float> out(n(N * OC)), dinp(n(N * C)), dw = dw0, db = db0;
  k::matmul_forward<float>(out.data(), inp.data(), w.data(), with_bias ? bias.data() : nullptr, N, C, OC);
  k::matmul_backward_input<float>(dinp.data(), dout.data(), w.data(), N, C, OC);
  k::matmul_backward_weight<float>(dw.data(), with_bias ? db.data() : nullptr, dout.data(), inp.data(), N, C, OC);

  INFO("N " << N << " C " << C << " OC " << OC << " bias " << with_bias);
  CHECK(rel_error(to_host(d_out), rounded<T>(out)) <= tolerance<T>());
  CHECK(rel_error(to_host(d_dinp), rounded<T>(dinp)) <= tolerance<T>());
  const double grad_tol = std::is_same_v<T, float> ? 1e-5 : 1e-4;
  CHECK(rel_error(d_dw.download(), dw) <= grad_tol);
  CHECK(rel_error(d_db.download(), db) <= grad_tol);   // untouched without bias: equal to db0
}

}  // namespace

TEMPLATE_TEST_CASE("cuBLASLt linear layer equals the CPU twin: forward, input and weight gradients", "[exec][gpu]",
                   float, bf16) {
  xc::Gemm gemm;
  std::uint64_t seed = 10;
  for (const Shape& s : kShapes)
    for (const bool bias : {false, true}) check_linear<TestType>(gemm, s, bias, seed += 10);
}

TEST_CASE("cuBLASLt plans are cached per shape: a repeated call adds none", "[exec][gpu]") {
  xc::Gemm gemm;
  check_linear<bf16>(gemm, {64, 48, 80}, true, 1);
  const std::size_t plans = gemm.cached_plans();
  CHECK(plans == 3);   // forward with bias, backward_input, backward_weight
  check_linear<bf16>(gemm, {64, 48, 80}, true, 2);
  CHECK(gemm.cached_plans() == plans);
  check_linear<bf16>(gemm, {64, 48, 96}, true, 3);
  CHECK(gemm.cached_plans() == plans + 3);
  // Bounded: MoE row counts change every step; past kGemmMaxPlans the cache starts again.
  const std::size_t rows = xc::kGemmMaxPlans + 8;
  DeviceBuffer<bf16> x(rows * 16), w(16 * 16), y(rows * 16);
  for (std::int64_t n = 1; n <= static_cast<std::int64_t>(rows); ++n) {
    gemm.forward<bf16>(y.get(), x.get(), w.get(), nullptr, n, 16, 16, nullptr);
    CHECK(gemm.cached_plans() <= xc::kGemmMaxPlans);
  }
  MEGASCOPE_CUDA_CHECK(cudaDeviceSynchronize());
}

TEST_CASE("cuBLASLt empty dimensions behave as the CPU twin: bias rows, zeros, nothing", "[exec][gpu]") {
  xc::Gemm gemm;
  const std::int64_t N = 3, OC = 4;
  const auto bias = random<float>(OC, 5);
  auto d_bias = to_device<float>(bias);
  DeviceBuffer<float> out(static_cast<std::size_t>(N * OC));
  gemm.forward<float>(out.get(), nullptr, nullptr, d_bias.get(), N, 0, OC, nullptr);   // C = 0: out = bias on every row
  const auto o = out.download();
  for (std::int64_t r = 0; r < N; ++r)
    for (std::int64_t c = 0; c < OC; ++c) CHECK(o[static_cast<std::size_t>(r * OC + c)] == bias[static_cast<std::size_t>(c)]);
  DeviceBuffer<float> dinp(std::vector<float>(6, 1.0f));
  gemm.backward_input<float>(dinp.get(), nullptr, nullptr, 2, 3, 0, nullptr);   // OC = 0: dinp = 0
  for (float x : dinp.download()) CHECK(x == 0.0f);
  CHECK_THROWS_AS(gemm.forward<float>(out.get(), nullptr, nullptr, nullptr, -1, 2, 3, nullptr), std::invalid_argument);
  CHECK(gemm.cached_plans() == 0);
}

TEST_CASE("FP8 forward equals the CPU twin on the dequantised E4M3 inputs (devices with FP8 only)", "[exec][gpu]") {
  xc::Gemm gemm;
  if (!gemm.fp8_supported()) {
    WARN("no FP8 on " << gemm.device().name << ": forward_fp8 not exercised");
    CHECK_THROWS_AS(gemm.forward_fp8(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 16, 16, 16, nullptr),
                    std::runtime_error);
    return;
  }
  const std::int64_t N = 40, C = 64, OC = 48;
  const float si = 0.5f, sw = 2.0f;
  auto fp8_values = [](std::vector<float> v) {   // values an E4M3 tensor holds
    std::vector<xc::fp8e4m3> q(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
      q[i] = xc::fp8e4m3(v[i]);
      v[i] = static_cast<float>(q[i]);
    }
    return std::make_pair(q, v);
  };
  const auto [qi, vi] = fp8_values(uniform<float>(N * C, 1, -2, 2));
  const auto [qw, vw] = fp8_values(uniform<float>(OC * C, 2, -2, 2));
  const auto bias = random<bf16>(OC, 3);
  DeviceBuffer<xc::fp8e4m3> d_i(qi), d_w(qw);
  auto d_bias = to_device<bf16>(bias);
  // The scales 16-byte aligned (what cuBLASLt takes) and 4-byte aligned (copied to an aligned slot first).
  DeviceBuffer<float> scales(std::vector<float>{si, 0, 0, 0, sw}), packed(std::vector<float>{0, si, sw});
  DeviceBuffer<bf16> out(static_cast<std::size_t>(N * OC));
  std::vector<float> xi = vi, xw = vw;
  for (float& x : xi) x *= si;
  for (float& x : xw) x *= sw;
  for (const bool with_bias : {false, true})
  for (const bool aligned : {true, false}) {
    INFO((with_bias ? "with" : "without") << " the bias epilogue, scales " << (aligned ? "16-byte" : "4-byte")
                                          << " aligned");
    const float* s_in = aligned ? scales.get() : packed.get() + 1;
    const float* s_w = aligned ? scales.get() + 4 : packed.get() + 2;
    out.upload(std::vector<bf16>(static_cast<std::size_t>(N * OC), from_float<bf16>(std::nanf(""))));   // poisoned
    CHECK_NOTHROW(gemm.forward_fp8(out.get(), d_i.get(), d_w.get(), with_bias ? d_bias.get() : nullptr, s_in, s_w, N,
                                   C, OC, nullptr));
    std::vector<float> expected(static_cast<std::size_t>(N * OC));
    k::matmul_forward<float>(expected.data(), xi.data(), xw.data(), with_bias ? bias.data() : nullptr, N, C, OC);
    CHECK(rel_error(to_host(out), expected) <= tolerance<bf16>());
  }
  CHECK_THROWS_AS(gemm.forward_fp8(out.get(), d_i.get(), d_w.get(), nullptr, scales.get(), scales.get() + 4, N, 60, OC,
                                   nullptr),
                  std::invalid_argument);   // C not a multiple of 16
}
