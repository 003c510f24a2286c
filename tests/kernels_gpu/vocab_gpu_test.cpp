// CUDA vocab-parallel embedding and cross-entropy pieces (kernels/cuda/vocab.cu)
// against their CPU twins on one vocabulary shard. Statistics and parameter
// gradients are fp32 on the GPU: 1e-5; T outputs as gpu_support.hpp.
#include <catch2/catch.hpp>

#include "gpu_support.hpp"
#include "kernels/cross_entropy.hpp"
#include "kernels/cuda/kernels.hpp"
#include "kernels/embedding.hpp"

using namespace megascope::kernels;
using namespace megascope::kernels::gpu_test;
namespace cu = megascope::kernels::cuda;

TEMPLATE_TEST_CASE("CUDA embedding forward and backward match the CPU twin on a vocab shard", "[gpu]", float, bf16, fp16) {
  using T = TestType;
  constexpr std::int64_t N = 300, C = 96, V0 = 100, V1 = 200, P = 64;
  std::vector<std::int32_t> tokens(N), pos(N);
  for (std::int64_t n = 0; n < N; ++n) {
    tokens[n] = static_cast<std::int32_t>((n * 37) % 300);  // a third in the shard, with repeats
    pos[n] = static_cast<std::int32_t>(n % P);
  }
  const auto wte = random<T>((V1 - V0) * C, 1), wpe = random<T>(P * C, 2), dout = random<T>(N * C, 3);
  std::vector<float> out(N * C), dwte(wte.size(), 0.25f), dwpe(wpe.size(), 0.0f);
  embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), pos.data(), N, C, V0, V1);
  embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), pos.data(), N, C, V0, V1);

  const DeviceBuffer<std::int32_t> tokd(tokens), posd(pos);
  const auto wted = to_device<T>(wte), wped = to_device<T>(wpe), doutd = to_device<T>(dout);
  DeviceBuffer<T> outd(N * C);
  DeviceBuffer<float> dwted(std::vector<float>(wte.size(), 0.25f)), dwped(std::vector<float>(wpe.size(), 0.0f));
  cu::embedding_forward(outd.get(), tokd.get(), wted.get(), wped.get(), posd.get(), N, C, V0, V1, nullptr);
  CHECK(rel_error(to_host(outd), out) < tolerance<T>());
  cu::embedding_backward(dwted.get(), dwped.get(), doutd.get(), tokd.get(), posd.get(), N, C, V0, V1, nullptr);
  CHECK(rel_error(dwted.download(), dwte) < 1e-5);
  CHECK(rel_error(dwped.download(), dwpe) < 1e-5);
}

TEMPLATE_TEST_CASE("CUDA cross-entropy pieces match the CPU twin on a vocab shard", "[gpu]", float, bf16, fp16) {
  using T = TestType;
  constexpr std::int64_t N = 64, V = 5000, V0 = 5000;  // this shard holds ids [5000, 10000)
  std::vector<std::int32_t> targets(N);
  for (std::int64_t n = 0; n < N; ++n) targets[n] = static_cast<std::int32_t>((n * 997) % 10000);
  const auto logits = random<T>(N * V, 4, -6.0, 6.0);
  const auto dloss = uniform<float>(N, 5, 0.0, 1.0);
  std::vector<float> mx(N), sum(N), tgt(N), loss(N), dlogits(N * V);
  cross_entropy_local_max(mx.data(), logits.data(), N, V);
  cross_entropy_local_sumexp(sum.data(), logits.data(), mx.data(), N, V);
  cross_entropy_local_target(tgt.data(), logits.data(), targets.data(), N, V, V0);
  cross_entropy_loss(loss.data(), mx.data(), sum.data(), tgt.data(), N);
  cross_entropy_backward(dlogits.data(), logits.data(), mx.data(), sum.data(), targets.data(), dloss.data(), N, V, V0);

  const auto ld = to_device<T>(logits);
  const DeviceBuffer<std::int32_t> td(targets);
  const DeviceBuffer<float> dlossd(dloss);
  DeviceBuffer<float> mxd(N), sumd(N), tgtd(N), lossd(N);
  DeviceBuffer<T> dld(N * V);
  cu::cross_entropy_local_max(mxd.get(), ld.get(), N, V, nullptr);
  CHECK(mxd.download() == mx);  // a max is exact
  cu::cross_entropy_local_sumexp(sumd.get(), ld.get(), mxd.get(), N, V, nullptr);
  CHECK(rel_error(sumd.download(), sum) < 1e-5);
  cu::cross_entropy_local_target(tgtd.get(), ld.get(), td.get(), N, V, V0, nullptr);
  CHECK(tgtd.download() == tgt);  // a copy is exact
  cu::cross_entropy_loss(lossd.get(), mxd.get(), sumd.get(), tgtd.get(), N, nullptr);
  CHECK(rel_error(lossd.download(), loss) < 1e-5);
  cu::cross_entropy_backward(dld.get(), ld.get(), mxd.get(), sumd.get(), td.get(), dlossd.get(), N, V, V0, nullptr);
  CHECK(rel_error(to_host(dld), dlogits) < tolerance<T>());
}
