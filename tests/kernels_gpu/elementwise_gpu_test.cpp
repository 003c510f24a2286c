// CUDA element-wise kernels (kernels/cuda/elementwise.cu) against their CPU
// twins on the same (T-rounded) inputs: GeLU, SwiGLU, residual, dropout with
// the identical Philox mask, bias + dropout + residual, rotary embedding.
// Tolerance: normwise relative, 1e-5 for float, 2e-2 for bf16, 3e-3 for fp16 (gpu_support.hpp).
#include <catch2/catch.hpp>

#include "gpu_support.hpp"
#include "kernels/activation.hpp"
#include "kernels/cuda/kernels.hpp"
#include "kernels/dropout.hpp"
#include "kernels/rope.hpp"

using namespace megascope::kernels;
using namespace megascope::kernels::gpu_test;
namespace cu = megascope::kernels::cuda;

TEMPLATE_TEST_CASE("CUDA gelu and swiglu, forward and backward, match the CPU twins", "[gpu]", float, bf16, fp16) {
  using T = TestType;
  // F = 301: SwiGLU element by element, and n = 11137 gives the 128-bit
  // GeLU and residual a tail of single elements for every type; F = 304:
  // 128-bit SwiGLU for every type, n = 11248 a whole number of packs.
  const std::int64_t N = 37, F = GENERATE(301, 304), n = N * F;
  INFO("F = " << F);
  const auto x = random<T>(N * 2 * F, 1, -4.0, 4.0), dout = random<T>(n, 2);
  const auto xd = to_device<T>(x), doutd = to_device<T>(dout);
  DeviceBuffer<T> y(n), dx(N * 2 * F);
  std::vector<float> want(n), dwant(N * 2 * F);

  gelu_forward(want.data(), x.data(), n);
  cu::gelu_forward(y.get(), xd.get(), n, nullptr);
  CHECK(rel_error(to_host(y), want) < tolerance<T>());
  gelu_backward(dwant.data(), x.data(), dout.data(), n);
  cu::gelu_backward(dx.get(), xd.get(), doutd.get(), n, nullptr);
  const auto dx_gelu = to_host(dx);  // the first n of N * 2F entries
  CHECK(rel_error(std::vector<float>(dx_gelu.begin(), dx_gelu.begin() + n),
                  std::vector<float>(dwant.begin(), dwant.begin() + n)) < tolerance<T>());

  swiglu_forward(want.data(), x.data(), N, F);
  cu::swiglu_forward(y.get(), xd.get(), N, F, nullptr);
  CHECK(rel_error(to_host(y), want) < tolerance<T>());
  swiglu_backward(dwant.data(), x.data(), dout.data(), N, F);
  cu::swiglu_backward(dx.get(), xd.get(), doutd.get(), N, F, nullptr);
  CHECK(rel_error(to_host(dx), dwant) < tolerance<T>());

  residual_forward(want.data(), x.data(), dout.data(), n);
  cu::residual_forward(y.get(), xd.get(), doutd.get(), n, nullptr);
  CHECK(rel_error(to_host(y), want) < tolerance<T>());

  // Pointers off the 16-byte grid take the element-by-element path.
  gelu_forward(want.data(), x.data() + 1, n - 1);
  cu::gelu_forward(y.get() + 1, xd.get() + 1, n - 1, nullptr);
  const auto shifted = to_host(y);
  CHECK(rel_error(std::vector<float>(shifted.begin() + 1, shifted.end()),
                  std::vector<float>(want.begin(), want.begin() + (n - 1))) < tolerance<T>());
}

TEMPLATE_TEST_CASE("CUDA dropout draws the CPU's mask, forward and backward", "[gpu]", float, bf16, fp16) {
  using T = TestType;
  constexpr std::int64_t n = 100003;
  const auto x = random<T>(n, 3, 0.5, 1.5);  // never zero: a zero output is a dropped element
  const auto xd = to_device<T>(x);
  DeviceBuffer<T> y(n);
  std::vector<float> want(n);
  dropout_forward(want.data(), x.data(), n, 0.25f, 77, 1000);
  cu::dropout_forward(y.get(), xd.get(), n, 0.25f, 77, 1000, nullptr);
  auto got = to_host(y);
  std::int64_t mask_mismatch = 0;
  for (std::int64_t i = 0; i < n; ++i) mask_mismatch += (got[i] == 0.0f) != (want[i] == 0.0f);
  CHECK(mask_mismatch == 0);
  CHECK(rel_error(got, want) < tolerance<T>());
  cu::dropout_backward(y.get(), xd.get(), n, 0.25f, 77, 1000, nullptr);
  CHECK(to_host(y) == got);
}

TEMPLATE_TEST_CASE("CUDA bias_dropout_add matches the CPU twin, dbias accumulated in fp32", "[gpu]", float, bf16, fp16) {
  using T = TestType;
  constexpr std::int64_t N = 333, C = 130;
  const auto x = random<T>(N * C, 4), b = random<T>(C, 5), res = random<T>(N * C, 6), dout = random<T>(N * C, 7);
  const auto xd = to_device<T>(x), bd = to_device<T>(b), resd = to_device<T>(res), doutd = to_device<T>(dout);
  DeviceBuffer<T> y(N * C), dx(N * C);
  std::vector<float> want(N * C), dwant(N * C), dbias_want(C, 0.5f);
  bias_dropout_add_forward(want.data(), x.data(), b.data(), res.data(), N, C, 0.1f, 5, 0);
  cu::bias_dropout_add_forward(y.get(), xd.get(), bd.get(), resd.get(), N, C, 0.1f, 5, 0, nullptr);
  CHECK(rel_error(to_host(y), want) < tolerance<T>());
  bias_dropout_add_backward(dwant.data(), dbias_want.data(), dout.data(), N, C, 0.1f, 5, 0);
  DeviceBuffer<float> dbias(std::vector<float>(C, 0.5f));
  cu::bias_dropout_add_backward(dx.get(), dbias.get(), doutd.get(), N, C, 0.1f, 5, 0, nullptr);
  CHECK(rel_error(to_host(dx), dwant) < tolerance<T>());
  CHECK(rel_error(dbias.download(), dbias_want) < 1e-5);  // sums of the same fp32 values
  // In place (dinp == dout, as the CPU twin allows): the same dinp and dbias.
  const auto inplace = to_device<T>(dout);
  DeviceBuffer<float> dbias2(std::vector<float>(C, 0.5f));
  cu::bias_dropout_add_backward(inplace.get(), dbias2.get(), inplace.get(), N, C, 0.1f, 5, 0, nullptr);
  CHECK(rel_error(to_host(inplace), dwant) < tolerance<T>());
  CHECK(rel_error(dbias2.download(), dbias_want) < 1e-5);
}

TEMPLATE_TEST_CASE("CUDA rope forward and backward match the CPU twin with a positions array", "[gpu]", float, bf16, fp16) {
  using T = TestType;
  constexpr std::int64_t B = 2, S = 24, H = 3, D = 64;
  const auto x = random<T>(B * S * H * D, 8);
  std::vector<std::int32_t> pos(S);
  for (std::int64_t s = 0; s < S; ++s) pos[s] = static_cast<std::int32_t>(100 + 3 * s);  // a CP chunk
  const auto xd = to_device<T>(x);
  const DeviceBuffer<std::int32_t> posd(pos);
  DeviceBuffer<T> y(x.size());
  std::vector<float> want(x.size());
  // fp32 angles up to ~170 rad: powf and sincosf on both sides differ by ~1e-5 absolute.
  const double tol = std::max(tolerance<T>(), 1e-4);
  rope_forward(want.data(), x.data(), pos.data(), B, S, H, D, 10000.0f);
  cu::rope_forward(y.get(), xd.get(), posd.get(), B, S, H, D, 10000.0f, nullptr);
  CHECK(rel_error(to_host(y), want) < tol);
  rope_backward(want.data(), x.data(), pos.data(), B, S, H, D, 10000.0f);
  cu::rope_backward(y.get(), xd.get(), posd.get(), B, S, H, D, 10000.0f, nullptr);
  CHECK(rel_error(to_host(y), want) < tol);
}
