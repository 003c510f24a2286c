// CpuKernelOps with bf16 GEMMs: the fp32 kernels on operands rounded to bf16,
// the forward and input-gradient outputs rounded to bf16, the weight gradient
// accumulated in fp32; fp32 GEMMs otherwise (exec/kernel_ops.hpp).
#include "exec/kernel_ops.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "kernels/bf16.hpp"
#include "kernels/matmul.hpp"

namespace k = megascope::kernels;
using megascope::exec::CpuKernelOps;

namespace {

std::vector<float> values(std::size_t n, float scale) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = scale * std::sin(0.37f * static_cast<float>(i) + 0.1f);
  return v;
}

std::vector<float> rounded(std::vector<float> v) {
  k::round_to_bf16(v.data(), static_cast<std::int64_t>(v.size()));
  return v;
}

bool all_bf16(const std::vector<float>& v) {
  for (float x : v)
    if (k::round_to_bf16(x) != x) return false;
  return true;
}

}  // namespace

TEST_CASE("bf16 GEMMs of CpuKernelOps: the fp32 kernels on bf16-rounded operands, outputs rounded", "[exec]") {
  const std::int64_t N = 6, C = 10, OC = 4;
  const auto x = values(N * C, 1.3f), w = values(OC * C, 0.7f), b = values(OC, 0.2f), dy = values(N * OC, 0.9f);
  CpuKernelOps fp32, bf16(true);
  CHECK(std::string(bf16.name()) == "cpu (bf16 GEMMs)");

  std::vector<float> y32(N * OC), y16(N * OC), want(N * OC);
  fp32.matmul_forward(y32.data(), x.data(), w.data(), b.data(), N, C, OC);
  bf16.matmul_forward(y16.data(), x.data(), w.data(), b.data(), N, C, OC);
  k::matmul_forward<float>(want.data(), rounded(x).data(), rounded(w).data(), rounded(b).data(), N, C, OC);
  CHECK(y16 == rounded(want));
  CHECK(all_bf16(y16));
  CHECK(y16 != y32);   // the rounding shows

  std::vector<float> dx16(N * C), dxw(N * C);
  bf16.matmul_backward_input(dx16.data(), dy.data(), w.data(), N, C, OC);
  k::matmul_backward_input<float>(dxw.data(), rounded(dy).data(), rounded(w).data(), N, C, OC);
  CHECK(dx16 == rounded(dxw));

  // The weight gradient accumulates in fp32 onto what is there: not rounded.
  std::vector<float> dw16(OC * C, 0.25f), dww(OC * C, 0.25f), db16(OC, 0.5f), dbw(OC, 0.5f);
  bf16.matmul_backward_weight(dw16.data(), db16.data(), dy.data(), x.data(), N, C, OC);
  k::matmul_backward_weight<float>(dww.data(), dbw.data(), rounded(dy).data(), rounded(x).data(), N, C, OC);
  CHECK(dw16 == dww);
  CHECK(db16 == dbw);
  CHECK_FALSE(all_bf16(dw16));
}
