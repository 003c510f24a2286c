// CUDA attention (kernels/cuda/attention.cu) against the CPU twin: causal GQA
// with a head dim that is a multiple of 32 and one that is not, query
// positions of a context-parallel chunk, the non-causal case, and the merge
// of two partial results. The GPU backward is fed the GPU forward's out and
// lse, as the executor does. Tolerances: 1e-5 (float), 2e-2 (bf16), 3e-3 (fp16) forward;
// the backward sums longer chains: 3e-5 (float), 5e-2 (bf16), 1e-2 (fp16).
#include <catch2/catch.hpp>

#include "gpu_support.hpp"
#include "kernels/attention.hpp"
#include "kernels/cuda/kernels.hpp"

using namespace megascope::kernels;
using namespace megascope::kernels::gpu_test;
namespace cu = megascope::kernels::cuda;

namespace {

struct Case {
  std::int64_t B, Tq, Tk, Hq, Hkv, D;
  bool causal;
  std::int32_t q_start;  // q_pos = q_start + i (kv_pos = j); -1: no positions arrays
};

template <typename T>
void compare(const Case& c, std::uint64_t seed) {
  const auto q = random<T>(c.B * c.Tq * c.Hq * c.D, seed), k = random<T>(c.B * c.Tk * c.Hkv * c.D, seed + 1),
             v = random<T>(c.B * c.Tk * c.Hkv * c.D, seed + 2), dout = random<T>(q.size(), seed + 3);
  std::vector<std::int32_t> qp(c.Tq), kp(c.Tk);
  for (std::int64_t i = 0; i < c.Tq; ++i) qp[i] = c.q_start + static_cast<std::int32_t>(i);
  for (std::int64_t j = 0; j < c.Tk; ++j) kp[j] = static_cast<std::int32_t>(j);
  const bool with_pos = c.q_start >= 0;
  const std::int32_t* qh = with_pos ? qp.data() : nullptr;
  const std::int32_t* kh = with_pos ? kp.data() : nullptr;

  std::vector<float> out(q.size()), lse(c.B * c.Hq * c.Tq), dq(q.size()), dk(k.size()), dv(v.size());
  attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), qh, kh, c.B, c.Tq, c.Tk, c.Hq, c.Hkv, c.D,
                    c.causal);
  attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(),
                     qh, kh, c.B, c.Tq, c.Tk, c.Hq, c.Hkv, c.D, c.causal);

  const auto qd = to_device<T>(q), kd = to_device<T>(k), vd = to_device<T>(v), doutd = to_device<T>(dout);
  const DeviceBuffer<std::int32_t> qpd(qp), kpd(kp);
  DeviceBuffer<T> outd(q.size()), dqd(q.size()), dkd(k.size()), dvd(v.size());
  DeviceBuffer<float> lsed(lse.size());
  const std::int32_t* qdp = with_pos ? qpd.get() : nullptr;
  const std::int32_t* kdp = with_pos ? kpd.get() : nullptr;
  cu::attention_forward(outd.get(), lsed.get(), qd.get(), kd.get(), vd.get(), qdp, kdp, c.B, c.Tq, c.Tk, c.Hq, c.Hkv,
                        c.D, c.causal, std::nullopt, nullptr);
  CHECK(rel_error(to_host(outd), out) < tolerance<T>());
  CHECK(rel_error(lsed.download(), lse) < 1e-5);
  cu::attention_backward(dqd.get(), dkd.get(), dvd.get(), doutd.get(), qd.get(), kd.get(), vd.get(), outd.get(),
                         lsed.get(), qdp, kdp, c.B, c.Tq, c.Tk, c.Hq, c.Hkv, c.D, c.causal, std::nullopt, nullptr);
  const double tol = std::is_same_v<T, float> ? 3e-5 : std::is_same_v<T, bf16> ? 5e-2 : 1e-2;
  CHECK(rel_error(to_host(dqd), dq) < tol);
  CHECK(rel_error(to_host(dkd), dk) < tol);
  CHECK(rel_error(to_host(dvd), dv) < tol);
}

}  // namespace

TEMPLATE_TEST_CASE("CUDA attention forward and backward match the CPU twin", "[gpu]", float, bf16, fp16) {
  SECTION("causal GQA, D = 64, several key tiles") { compare<TestType>({2, 100, 100, 4, 2, 64, true, -1}, 10); }
  SECTION("causal, D = 40 (partial lanes), MQA") { compare<TestType>({1, 70, 70, 4, 1, 40, true, -1}, 20); }
  SECTION("a CP chunk: queries at positions 96..127 against keys 0..127") {
    compare<TestType>({2, 32, 128, 2, 2, 128, true, 96}, 30);
  }
  SECTION("queries that precede every key get zeros") { compare<TestType>({1, 16, 40, 2, 2, 32, true, -100}, 40); }
  SECTION("non-causal, D = 256") { compare<TestType>({1, 33, 65, 2, 1, 256, false, -1}, 50); }
}

TEMPLATE_TEST_CASE("CUDA attention_merge matches the CPU twin", "[gpu]", float, bf16, fp16) {
  using T = TestType;
  constexpr std::int64_t B = 2, Tq = 50, H = 3, D = 48;
  const auto o1 = random<T>(B * Tq * H * D, 60), o2 = random<T>(B * Tq * H * D, 61);
  auto l1 = uniform<float>(B * H * Tq, 62, -2.0, 2.0), l2 = uniform<float>(B * H * Tq, 63, -2.0, 2.0);
  l1[0] = l2[0] = -INFINITY;  // a row neither block saw
  l1[1] = -INFINITY;          // a row only the second block saw
  auto out = o1, lse = l1;
  attention_merge(out.data(), lse.data(), o2.data(), l2.data(), B, Tq, H, D);
  auto o1d = to_device<T>(o1);
  const auto o2d = to_device<T>(o2);
  DeviceBuffer<float> l1d(l1);
  const DeviceBuffer<float> l2d(l2);
  cu::attention_merge(o1d.get(), l1d.get(), o2d.get(), l2d.get(), B, Tq, H, D, nullptr);
  CHECK(rel_error(to_host(o1d), out) < tolerance<T>());
  const auto lse_gpu = l1d.download();
  CHECK(lse_gpu[0] == -INFINITY);
  std::vector<float> finite_gpu(lse_gpu.begin() + 1, lse_gpu.end()), finite_cpu(lse.begin() + 1, lse.end());
  CHECK(rel_error(finite_gpu, finite_cpu) < 1e-5);
}
