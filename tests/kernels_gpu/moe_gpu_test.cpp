// CUDA MoE routing (kernels/cuda/moe.cu) against the CPU twin: the router's
// choices exactly, its weights and gradients within tolerance, the
// permutation indices exactly (same order as the CPU), and the gathers.
#include <catch2/catch.hpp>

#include "gpu_support.hpp"
#include "kernels/cuda/kernels.hpp"
#include "kernels/moe.hpp"

using namespace megascope::kernels;
using namespace megascope::kernels::gpu_test;
namespace cu = megascope::kernels::cuda;

TEMPLATE_TEST_CASE("CUDA MoE router and permutation match the CPU twin", "[gpu]", float, bf16, fp16) {
  using T = TestType;
  constexpr std::int64_t N = 500, E = 16, k = 2, C = 80;
  for (bool renormalize : {false, true}) {
    const auto logits = random<T>(N * E, 1, -2.0, 2.0);
    const auto dprobs = uniform<float>(N * k, 2);
    std::vector<float> probs(N * k), scores(N * E), dlogits(N * E);
    std::vector<std::int32_t> experts(N * k);
    moe_router_forward(probs.data(), experts.data(), scores.data(), logits.data(), N, E, k, renormalize);
    moe_router_backward(dlogits.data(), dprobs.data(), experts.data(), scores.data(), N, E, k, renormalize);

    const auto ld = to_device<T>(logits);
    const DeviceBuffer<float> dpd(dprobs);
    DeviceBuffer<float> pd(N * k), sd(N * E);
    DeviceBuffer<std::int32_t> ed(N * k);
    DeviceBuffer<T> dld(N * E);
    cu::moe_router_forward(pd.get(), ed.get(), sd.get(), ld.get(), N, E, k, renormalize, nullptr);
    CHECK(ed.download() == experts);
    CHECK(rel_error(pd.download(), probs) < 1e-5);
    CHECK(rel_error(sd.download(), scores) < 1e-5);
    cu::moe_router_backward(dld.get(), dpd.get(), ed.get(), sd.get(), N, E, k, renormalize, nullptr);
    CHECK(rel_error(to_host(dld), dlogits) < tolerance<T>());
  }

  // Permutation of the float router's choices.
  const auto logits = uniform<float>(N * E, 3);
  std::vector<float> probs(N * k), scores(N * E);
  std::vector<std::int32_t> experts(N * k), r2s(N * k), s2r(N * k);
  std::vector<std::int64_t> counts(E);
  moe_router_forward(probs.data(), experts.data(), scores.data(), logits.data(), N, E, k, true);
  moe_permute_indices(r2s.data(), s2r.data(), counts.data(), experts.data(), N, E, k);
  const DeviceBuffer<std::int32_t> ed(experts);
  DeviceBuffer<std::int32_t> r2sd(N * k), s2rd(N * k);
  DeviceBuffer<std::int64_t> cd(E);
  cu::moe_permute_indices(r2sd.get(), s2rd.get(), cd.get(), ed.get(), N, E, k, nullptr);
  CHECK(cd.download() == counts);
  CHECK(r2sd.download() == r2s);
  CHECK(s2rd.download() == s2r);

  const auto x = random<T>(N * C, 4), eo = random<T>(N * k * C, 5), dperm = random<T>(N * k * C, 6),
             dout = random<T>(N * C, 7);
  std::vector<float> perm(N * k * C), dx(N * C), out(N * C), deo(N * k * C), dprobs(N * k);
  moe_permute_forward(perm.data(), x.data(), r2s.data(), N, C, k);
  moe_permute_backward(dx.data(), dperm.data(), s2r.data(), N, C, k);
  moe_unpermute_forward(out.data(), eo.data(), probs.data(), s2r.data(), N, C, k);
  moe_unpermute_backward(deo.data(), dprobs.data(), dout.data(), eo.data(), probs.data(), s2r.data(), N, C, k);

  const auto xd = to_device<T>(x), eod = to_device<T>(eo), dpermd = to_device<T>(dperm), doutd = to_device<T>(dout);
  const DeviceBuffer<float> probsd(probs);
  DeviceBuffer<T> permd(N * k * C), dxd(N * C), outd(N * C), deod(N * k * C);
  DeviceBuffer<float> dprobsd(N * k);
  cu::moe_permute_forward(permd.get(), xd.get(), r2sd.get(), N, C, k, nullptr);
  CHECK(to_host(permd) == perm);  // a gather is exact
  cu::moe_permute_backward(dxd.get(), dpermd.get(), s2rd.get(), N, C, k, nullptr);
  CHECK(rel_error(to_host(dxd), dx) < tolerance<T>());
  cu::moe_unpermute_forward(outd.get(), eod.get(), probsd.get(), s2rd.get(), N, C, k, nullptr);
  CHECK(rel_error(to_host(outd), out) < tolerance<T>());
  cu::moe_unpermute_backward(deod.get(), dprobsd.get(), doutd.get(), eod.get(), probsd.get(), s2rd.get(), N, C, k,
                             nullptr);
  CHECK(rel_error(to_host(deod), deo) < tolerance<T>());
  CHECK(rel_error(dprobsd.download(), dprobs) < 1e-5);
}
