// CUDA LayerNorm and RMSNorm (kernels/cuda/norm.cu) against their CPU twins:
// outputs, saved statistics, input gradients, and parameter gradients added
// onto existing fp32 values. Tolerances as gpu_support.hpp.
#include <catch2/catch.hpp>

#include "gpu_support.hpp"
#include "kernels/cuda/kernels.hpp"
#include "kernels/norm.hpp"

using namespace megascope::kernels;
using namespace megascope::kernels::gpu_test;
namespace cu = megascope::kernels::cuda;


// C = 1000: a multiple of every pack (8 bf16 or fp16, 4 float) but not of 32,
// the 128-bit path; C = 1001: the element-by-element path. N = 77 gives the
// packed backward at most 8 rows a block, N = 3000 more (each warp takes
// several rows in its first pass).
TEMPLATE_TEST_CASE("CUDA layernorm forward and backward match the CPU twin", "[gpu]", float, bf16, fp16) {
  using T = TestType;
  const std::int64_t C = GENERATE(1000, 1001), N = GENERATE(77, 3000);
  INFO("N = " << N << ", C = " << C);
  const auto x = random<T>(N * C, 1, -2.0, 3.0), w = random<T>(C, 2), b = random<T>(C, 3), dout = random<T>(N * C, 4);
  std::vector<float> want(N * C), mean(N), rstd(N), dx_want(N * C), dw_want(C, 1.0f), db_want(C, -1.0f);
  layernorm_forward(want.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5f);
  layernorm_backward(dx_want.data(), dw_want.data(), db_want.data(), dout.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), N, C);

  const auto xd = to_device<T>(x), wd = to_device<T>(w), bd = to_device<T>(b), doutd = to_device<T>(dout);
  DeviceBuffer<T> y(N * C), dx(N * C);
  DeviceBuffer<float> meand(N), rstdd(N), dw(std::vector<float>(C, 1.0f)), db(std::vector<float>(C, -1.0f));
  cu::layernorm_forward(y.get(), meand.get(), rstdd.get(), xd.get(), wd.get(), bd.get(), N, C, 1e-5f, nullptr);
  CHECK(rel_error(to_host(y), want) < tolerance<T>());
  CHECK(rel_error(meand.download(), mean) < 1e-5);
  CHECK(rel_error(rstdd.download(), rstd) < 1e-5);
  cu::layernorm_backward(dx.get(), dw.get(), db.get(), doutd.get(), xd.get(), wd.get(), meand.get(), rstdd.get(), N, C,
                         nullptr);
  CHECK(rel_error(to_host(dx), dx_want) < tolerance<T>());
  CHECK(rel_error(dw.download(), dw_want) < 1e-4);  // fp32 sums of 77 rows in another order
  CHECK(rel_error(db.download(), db_want) < 1e-4);
}

TEMPLATE_TEST_CASE("CUDA rmsnorm forward and backward match the CPU twin", "[gpu]", float, bf16, fp16) {
  using T = TestType;
  const std::int64_t C = GENERATE(1000, 1001), N = GENERATE(77, 3000);
  INFO("N = " << N << ", C = " << C);
  const auto x = random<T>(N * C, 5), w = random<T>(C, 6), dout = random<T>(N * C, 7);
  std::vector<float> want(N * C), rstd(N), dx_want(N * C), dw_want(C, 0.0f);
  rmsnorm_forward(want.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6f);
  rmsnorm_backward(dx_want.data(), dw_want.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);

  const auto xd = to_device<T>(x), wd = to_device<T>(w), doutd = to_device<T>(dout);
  DeviceBuffer<T> y(N * C), dx(N * C);
  DeviceBuffer<float> rstdd(N), dw(std::vector<float>(C, 0.0f));
  cu::rmsnorm_forward(y.get(), rstdd.get(), xd.get(), wd.get(), N, C, 1e-6f, nullptr);
  CHECK(rel_error(to_host(y), want) < tolerance<T>());
  CHECK(rel_error(rstdd.download(), rstd) < 1e-5);
  cu::rmsnorm_backward(dx.get(), dw.get(), doutd.get(), xd.get(), wd.get(), rstdd.get(), N, C, nullptr);
  CHECK(rel_error(to_host(dx), dx_want) < tolerance<T>());
  CHECK(rel_error(dw.download(), dw_want) < 1e-4);
}
