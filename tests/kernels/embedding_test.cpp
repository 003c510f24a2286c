// Vocab-parallel embedding: two shards summed equal the unsharded lookup,
// positions are added, and the backward matches finite differences in double
// (the map is linear: normwise relative error < 1e-8) and accumulates.
#include "kernels/embedding.hpp"

#include <catch2/catch.hpp>

#include "kernel_test_support.hpp"

using namespace megascope::kernels;
using namespace megascope::kernels::test;

namespace {
constexpr std::int64_t N = 6, C = 3, V = 10, P = 8;
const std::vector<std::int32_t> kTokens{0, 9, 4, 5, 4, 2};
const std::vector<std::int32_t> kPos{0, 1, 2, 7, 1, 3};
}  // namespace

TEST_CASE("embedding on two vocab shards sums to the unsharded lookup plus the position rows", "[kernels]") {
  const auto wte = uniform(V * C, 1), wpe = uniform(P * C, 2);
  std::vector<double> full(N * C), lo(N * C), hi(N * C);
  embedding_forward(full.data(), kTokens.data(), wte.data(), wpe.data(), kPos.data(), N, C, 0, V);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t c = 0; c < C; ++c) CHECK(full[n * C + c] == wte[kTokens[n] * C + c] + wpe[kPos[n] * C + c]);
  // Shard [0, 5) gets wpe (one TP rank only), shard [5, 10) does not.
  embedding_forward(lo.data(), kTokens.data(), wte.data(), wpe.data(), kPos.data(), N, C, 0, 5);
  embedding_forward(hi.data(), kTokens.data(), wte.data() + 5 * C, nullptr, nullptr, N, C, 5, 10);
  for (std::int64_t c = 0; c < C; ++c) CHECK(hi[0 * C + c] == 0.0);  // token 0 is not in [5, 10)
  std::vector<double> sum(N * C);
  for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = lo[i] + hi[i];
  CHECK(rel_error(sum, full) < 1e-15);
}

TEST_CASE("embedding_backward matches finite differences and accumulates, per shard", "[kernels]") {
  auto wte = uniform(V * C, 3), wpe = uniform(P * C, 4);
  const auto dout = uniform(N * C, 5);
  const auto loss = [&] {
    std::vector<double> out(N * C);
    embedding_forward(out.data(), kTokens.data(), wte.data(), wpe.data(), kPos.data(), N, C, 0, V);
    return dot(out, dout);
  };
  std::vector<double> dwte(V * C, 0.0), dwpe(P * C, 0.0);
  embedding_backward(dwte.data(), dwpe.data(), dout.data(), kTokens.data(), kPos.data(), N, C, 0, V);
  const auto num_wte = numeric_grad(wte, loss);
  CHECK(rel_error(dwte, num_wte) < 1e-8);
  CHECK(rel_error(dwpe, numeric_grad(wpe, loss)) < 1e-8);
  // The upper shard's gradient is the upper half of the full one, added to what was there.
  std::vector<double> dhi(5 * C, 1.0);
  embedding_backward(dhi.data(), nullptr, dout.data(), kTokens.data(), nullptr, N, C, 5, 10);
  std::vector<double> want(num_wte.begin() + 5 * C, num_wte.end());
  for (auto& g : want) g += 1.0;
  CHECK(rel_error(dhi, want) < 1e-8);
}
