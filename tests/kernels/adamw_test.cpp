// AdamW against hand-computed steps, grad_scale against scaling the
// gradients, and the clipping helpers against their definitions.
#include "kernels/adamw.hpp"

#include <catch2/catch.hpp>

#include "kernel_test_support.hpp"

using namespace megascope::kernels;
using namespace megascope::kernels::test;

TEST_CASE("adamw_update matches two hand-computed steps", "[kernels]") {
  // Hyper-parameters exact in float: lr 1/8, betas (7/8, 31/32), eps 2^-20,
  // weight decay 1/16; p0 = 1, g1 = 0.5, g2 = -0.25.
  const float lr = 0.125f, b1 = 0.875f, b2 = 0.96875f, eps = 1.0f / 1048576.0f, wd = 0.0625f;
  const double e = 1.0 / 1048576.0;
  double p = 1.0, m = 0.0, v = 0.0;
  double g = 0.5;
  adamw_update(&p, &g, &m, &v, 1, lr, b1, b2, eps, wd, 1);
  // Step 1: m = 1/8 * 0.5, v = 1/32 * 0.25, mhat = 0.5, vhat = 0.25;
  // p = 1 (1 - 1/128) - 1/8 * 0.5 / (0.5 + eps).
  CHECK(m == 0.0625);
  CHECK(v == 0.0078125);
  const double p1 = 0.9921875 - 0.0625 / (0.5 + e);
  CHECK(p == Approx(p1).epsilon(1e-14));
  g = -0.25;
  adamw_update(&p, &g, &m, &v, 1, lr, b1, b2, eps, wd, 2);
  // Step 2: m = 7/8 * 0.0625 - 1/8 * 0.25 = 0.0234375,
  // v = 31/32 * 0.0078125 + 1/32 * 0.0625 = 0.009521484375,
  // mhat = m / (1 - (7/8)^2) = 0.1, vhat = v / (1 - (31/32)^2).
  CHECK(m == 0.0234375);
  CHECK(v == 0.009521484375);
  const double vhat = 0.009521484375 / 0.0615234375;
  const double p2 = p1 * 0.9921875 - 0.125 * 0.1 / (std::sqrt(vhat) + e);
  CHECK(p == Approx(p2).epsilon(1e-14));
}

TEST_CASE("adamw_update with grad_scale equals the update on pre-scaled gradients", "[kernels]") {
  auto p1 = uniform(100, 1), p2 = p1, m1 = uniform(100, 2, 0.0, 0.1), m2 = m1, v1 = uniform(100, 3, 0.0, 0.1), v2 = v1;
  const auto g = uniform(100, 4);
  auto g_scaled = g;
  for (auto& x : g_scaled) x *= static_cast<double>(0.25f);
  adamw_update(p1.data(), g.data(), m1.data(), v1.data(), 100, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 7, 0.25f);
  adamw_update(p2.data(), g_scaled.data(), m2.data(), v2.data(), 100, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 7);
  CHECK(rel_error(p1, p2) < 1e-15);
  CHECK(rel_error(m1, m2) < 1e-15);
  CHECK(rel_error(v1, v2) < 1e-15);
}

TEST_CASE("sum_squares accumulates over tensors and clip_coefficient clips only above max_norm", "[kernels]") {
  const std::vector<float> a{3.0f, 4.0f}, b{12.0f};
  double total = 0.0;
  sum_squares(&total, a.data(), 2);
  sum_squares(&total, b.data(), 1);
  CHECK(total == 169.0);
  CHECK(clip_coefficient(std::sqrt(total), 1.0) == Approx(1.0 / 13.0).epsilon(1e-6));
  CHECK(clip_coefficient(0.5, 1.0) == 1.0f);
  std::vector<float> x{2.0f, -4.0f};
  scale_inplace(x.data(), 2, 0.5f);
  CHECK(x == std::vector<float>{1.0f, -2.0f});
}
