// matmul: forward against a naive triple loop, both backward halves against
// finite differences in double (normwise relative error < 1e-6).
#include "kernels/matmul.hpp"

#include <catch2/catch.hpp>

#include "kernel_test_support.hpp"

using namespace megascope::kernels;
using namespace megascope::kernels::test;

namespace {
constexpr std::int64_t N = 5, C = 7, OC = 3;
}

TEST_CASE("matmul_forward equals a naive inp . weight^T + bias in float and double", "[kernels]") {
  const auto x = uniform(N * C, 1), w = uniform(OC * C, 2), b = uniform(OC, 3);
  auto expected = naive_matmul(x, w, N, C, OC);
  std::vector<double> out(N * OC);
  matmul_forward(out.data(), x.data(), w.data(), nullptr, N, C, OC);
  CHECK(rel_error(out, expected) < 1e-14);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t o = 0; o < OC; ++o) expected[n * OC + o] += b[o];
  matmul_forward(out.data(), x.data(), w.data(), b.data(), N, C, OC);
  CHECK(rel_error(out, expected) < 1e-14);
  const auto xf = cast<float>(x), wf = cast<float>(w), bf = cast<float>(b);
  std::vector<float> outf(N * OC);
  matmul_forward(outf.data(), xf.data(), wf.data(), bf.data(), N, C, OC);
  CHECK(rel_error(outf, expected) < 1e-6);
}

TEST_CASE("matmul backward halves match finite differences and the weight half accumulates", "[kernels]") {
  auto x = uniform(N * C, 4), w = uniform(OC * C, 5), b = uniform(OC, 6);
  const auto dout = uniform(N * OC, 7);
  const auto loss = [&] {
    std::vector<double> out(N * OC);
    matmul_forward(out.data(), x.data(), w.data(), b.data(), N, C, OC);
    return dot(out, dout);
  };
  std::vector<double> dx(N * C, 99.0), dw(OC * C, 0.0), db(OC, 0.0);
  matmul_backward_input(dx.data(), dout.data(), w.data(), N, C, OC);
  matmul_backward_weight(dw.data(), db.data(), dout.data(), x.data(), N, C, OC);
  CHECK(rel_error(dx, numeric_grad(x, loss)) < 1e-6);  // 99.0 overwritten
  const auto num_w = numeric_grad(w, loss), num_b = numeric_grad(b, loss);
  CHECK(rel_error(dw, num_w) < 1e-6);
  CHECK(rel_error(db, num_b) < 1e-6);
  // A second micro-batch adds the same gradient again.
  matmul_backward_weight(dw.data(), db.data(), dout.data(), x.data(), N, C, OC);
  auto twice_w = num_w, twice_b = num_b;
  for (auto& g : twice_w) g *= 2.0;
  for (auto& g : twice_b) g *= 2.0;
  CHECK(rel_error(dw, twice_w) < 1e-6);
  CHECK(rel_error(db, twice_b) < 1e-6);
  // No bias: dbias untouched (nullptr), dweight still right.
  std::vector<double> dw2(OC * C, 0.0);
  matmul_backward_weight(dw2.data(), nullptr, dout.data(), x.data(), N, C, OC);
  CHECK(rel_error(dw2, num_w) < 1e-6);
}

TEST_CASE("matmul rejects negative sizes", "[kernels]") {
  std::vector<double> a(4);
  CHECK_THROWS_AS(matmul_forward(a.data(), a.data(), a.data(), nullptr, -1, 2, 2), std::invalid_argument);
}
