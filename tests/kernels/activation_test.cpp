// GeLU (tanh form) and SwiGLU (Megatron chunk order): forward against
// literal values / the definition, backward against finite differences in
// double (normwise relative error < 1e-6).
#include "kernels/activation.hpp"

#include <catch2/catch.hpp>

#include "kernel_test_support.hpp"

using namespace megascope::kernels;
using namespace megascope::kernels::test;

TEST_CASE("gelu_forward is the tanh approximation, not the erf form", "[kernels]") {
  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), evaluated offline; the
  // erf form differs by > 1e-5 at each of these points.
  const std::vector<double> x{1.0, -0.5, 2.0, -3.0};
  const std::vector<double> tanh_form{0.8411919906082768, -0.15428599017485606, 1.954597694087775,
                                      -0.0036373920817729943};
  std::vector<double> out(4);
  gelu_forward(out.data(), x.data(), 4);
  CHECK(rel_error(out, tanh_form) < 1e-14);
  std::vector<float> outf(4);
  const auto xf = cast<float>(x);
  gelu_forward(outf.data(), xf.data(), 4);
  CHECK(rel_error(outf, tanh_form) < 1e-6);
}

TEST_CASE("gelu_backward matches finite differences", "[kernels]") {
  auto x = uniform(50, 1, -4.0, 4.0);
  const auto dout = uniform(50, 2);
  const auto loss = [&] {
    std::vector<double> out(x.size());
    gelu_forward(out.data(), x.data(), 50);
    return dot(out, dout);
  };
  std::vector<double> dx(50);
  gelu_backward(dx.data(), x.data(), dout.data(), 50);
  CHECK(rel_error(dx, numeric_grad(x, loss)) < 1e-6);
}

TEST_CASE("swiglu_forward is silu of the first half times the second half", "[kernels]") {
  constexpr std::int64_t N = 3, F = 4;
  const auto x = uniform(N * 2 * F, 3, -3.0, 3.0);
  std::vector<double> out(N * F), expected(N * F);
  swiglu_forward(out.data(), x.data(), N, F);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t i = 0; i < F; ++i) {
      const double g = x[n * 2 * F + i], u = x[n * 2 * F + F + i];
      expected[n * F + i] = g / (1.0 + std::exp(-g)) * u;
    }
  CHECK(rel_error(out, expected) < 1e-14);
}

TEST_CASE("swiglu_backward matches finite differences for gate and up halves", "[kernels]") {
  constexpr std::int64_t N = 3, F = 5;
  auto x = uniform(N * 2 * F, 4, -3.0, 3.0);
  const auto dout = uniform(N * F, 5);
  const auto loss = [&] {
    std::vector<double> out(N * F);
    swiglu_forward(out.data(), x.data(), N, F);
    return dot(out, dout);
  };
  std::vector<double> dx(N * 2 * F);
  swiglu_backward(dx.data(), x.data(), dout.data(), N, F);
  CHECK(rel_error(dx, numeric_grad(x, loss)) < 1e-6);
}
