// LayerNorm and RMSNorm: forward against the textbook formula computed here,
// backward against finite differences in double (normwise relative error < 1e-6).
#include "kernels/norm.hpp"

#include <catch2/catch.hpp>

#include "kernel_test_support.hpp"

using namespace megascope::kernels;
using namespace megascope::kernels::test;

namespace {
constexpr std::int64_t N = 4, C = 9;
constexpr float kEps = 1e-5f;
}  // namespace

TEST_CASE("layernorm_forward equals (x - mean) / sqrt(var + eps) * w + b with its row statistics", "[kernels]") {
  const auto x = uniform(N * C, 1, -2.0, 3.0), w = uniform(C, 2), b = uniform(C, 3);
  std::vector<double> out(N * C), mean(N), rstd(N), expected(N * C);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, kEps);
  for (std::int64_t n = 0; n < N; ++n) {
    double m = 0.0, v = 0.0;
    for (std::int64_t c = 0; c < C; ++c) m += x[n * C + c] / C;
    for (std::int64_t c = 0; c < C; ++c) v += (x[n * C + c] - m) * (x[n * C + c] - m) / C;
    const double r = 1.0 / std::sqrt(v + static_cast<double>(kEps));
    CHECK(mean[n] == Approx(m).epsilon(1e-14));
    CHECK(rstd[n] == Approx(r).epsilon(1e-14));
    for (std::int64_t c = 0; c < C; ++c) expected[n * C + c] = (x[n * C + c] - m) * r * w[c] + b[c];
  }
  CHECK(rel_error(out, expected) < 1e-14);
  std::vector<float> outf(N * C);
  const auto xf = cast<float>(x), wf = cast<float>(w), bf = cast<float>(b);
  layernorm_forward(outf.data(), nullptr, nullptr, xf.data(), wf.data(), bf.data(), N, C, kEps);
  CHECK(rel_error(outf, expected) < 1e-5);
}

TEST_CASE("layernorm_backward matches finite differences for input, weight and bias", "[kernels]") {
  auto x = uniform(N * C, 4, -2.0, 3.0), w = uniform(C, 5), b = uniform(C, 6);
  const auto dout = uniform(N * C, 7);
  std::vector<double> out(N * C), mean(N), rstd(N);
  const auto loss = [&] {
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, kEps);
    return dot(out, dout);
  };
  loss();
  std::vector<double> dx(N * C, 5.0), dw(C, 1.0), db(C, -1.0);
  layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
  CHECK(rel_error(dx, numeric_grad(x, loss)) < 1e-6);
  auto num_w = numeric_grad(w, loss), num_b = numeric_grad(b, loss);
  for (auto& g : num_w) g += 1.0;  // accumulated onto the initial 1.0
  for (auto& g : num_b) g -= 1.0;
  CHECK(rel_error(dw, num_w) < 1e-6);
  CHECK(rel_error(db, num_b) < 1e-6);
}

TEST_CASE("rmsnorm_forward equals x / sqrt(mean(x^2) + eps) * w", "[kernels]") {
  const auto x = uniform(N * C, 8), w = uniform(C, 9);
  std::vector<double> out(N * C), rstd(N), expected(N * C);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, kEps);
  for (std::int64_t n = 0; n < N; ++n) {
    double ms = 0.0;
    for (std::int64_t c = 0; c < C; ++c) ms += x[n * C + c] * x[n * C + c] / C;
    const double r = 1.0 / std::sqrt(ms + static_cast<double>(kEps));
    CHECK(rstd[n] == Approx(r).epsilon(1e-14));
    for (std::int64_t c = 0; c < C; ++c) expected[n * C + c] = x[n * C + c] * r * w[c];
  }
  CHECK(rel_error(out, expected) < 1e-14);
}

TEST_CASE("rmsnorm_backward matches finite differences for input and weight", "[kernels]") {
  auto x = uniform(N * C, 10), w = uniform(C, 11);
  const auto dout = uniform(N * C, 12);
  std::vector<double> out(N * C), rstd(N);
  const auto loss = [&] {
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, kEps);
    return dot(out, dout);
  };
  loss();
  std::vector<double> dx(N * C, 5.0), dw(C, 0.0);
  rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);
  CHECK(rel_error(dx, numeric_grad(x, loss)) < 1e-6);
  CHECK(rel_error(dw, numeric_grad(w, loss)) < 1e-6);
}
