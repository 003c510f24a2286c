// CUDA AdamW and clipping helpers (kernels/cuda/optim.cu) against the CPU
// twin. The arithmetic is fp32 on both sides (bf16 gradients are inputs, not
// outputs), so both dtypes are held to 1e-5.
#include <catch2/catch.hpp>

#include "gpu_support.hpp"
#include "kernels/adamw.hpp"
#include "kernels/cuda/kernels.hpp"

using namespace megascope::kernels;
using namespace megascope::kernels::gpu_test;
namespace cu = megascope::kernels::cuda;

TEMPLATE_TEST_CASE("CUDA adamw_update, sum_squares and scale_inplace match the CPU twin", "[gpu]", float, bf16, fp16) {
  using T = TestType;
  constexpr std::int64_t n = 70001;
  auto p = uniform<float>(n, 1), m = uniform<float>(n, 2, -0.01, 0.01), v = uniform<float>(n, 3, 0.0, 1e-4);
  const auto g = random<T>(n, 4);
  DeviceBuffer<float> pd(p), md(m), vd(v);
  const auto gd = to_device<T>(g);
  adamw_update(p.data(), g.data(), m.data(), v.data(), n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 11, 0.5f);
  cu::adamw_update(pd.get(), gd.get(), md.get(), vd.get(), n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 11, 0.5f, nullptr);
  CHECK(rel_error(pd.download(), p) < 1e-5);
  CHECK(rel_error(md.download(), m) < 1e-5);
  CHECK(rel_error(vd.download(), v) < 1e-5);

  double want = 1.5;
  sum_squares(&want, g.data(), n);
  DeviceBuffer<double> acc(std::vector<double>{1.5});
  cu::sum_squares(acc.get(), gd.get(), n, nullptr);
  CHECK(acc.download()[0] == Approx(want).epsilon(1e-6));  // double sums of the same squares, another order

  auto gs = g;
  scale_inplace(gs.data(), n, 0.25f);  // a power of two: exact in float, and in T while the result stays normal
  auto gsd = to_device<T>(g);
  cu::scale_inplace(gsd.get(), n, 0.25f, nullptr);
  // The GPU stores T: fp16 results under 2^-14 are subnormal and lose their
  // low bits, rounded to nearest even on both sides.
  CHECK(to_host(gsd) == rounded<T>(gs));
}
