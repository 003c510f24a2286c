// The finite-difference checker itself: it must see a 1% error in a gradient,
// or every backward test below could pass with a wrong gradient.
#include <catch2/catch.hpp>

#include "kernel_test_support.hpp"

using namespace megascope::kernels::test;

TEST_CASE("Finite differences reproduce a known gradient and flag a 1% error", "[kernels]") {
  // loss(x) = sum_i sin(x_i) * w_i, gradient cos(x_i) w_i.
  auto x = uniform(20, 1);
  const auto w = uniform(20, 2);
  const auto loss = [&] {
    double s = 0.0;
    for (std::size_t i = 0; i < x.size(); ++i) s += std::sin(x[i]) * w[i];
    return s;
  };
  std::vector<double> exact(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) exact[i] = std::cos(x[i]) * w[i];
  const auto num = numeric_grad(x, loss);
  CHECK(rel_error(exact, num) < 1e-8);
  auto wrong = exact;
  wrong[7] *= 1.01;
  CHECK(rel_error(wrong, num) > 1e-4);
  CHECK(rel_error(std::vector<double>(3), num) == INFINITY);  // size mismatch never passes
}
