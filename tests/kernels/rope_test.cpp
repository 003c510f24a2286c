// Rotary embedding: the D = 2 closed form, the relative-position property,
// positions arrays against slices of the full sequence, backward against
// finite differences in double (normwise relative error < 1e-6).
#include "kernels/rope.hpp"

#include <catch2/catch.hpp>

#include "kernel_test_support.hpp"

using namespace megascope::kernels;
using namespace megascope::kernels::test;

TEST_CASE("rope with D = 2 rotates (x1, x2) by the position in radians", "[kernels]") {
  // Frequency index 0 has inv_freq = theta^0 = 1, so the angle is the position.
  const std::vector<double> x{1.0, 0.0, 0.0, 1.0, 0.6, -0.8};  // (1, 3, 1, 2) at positions 0, 1, 2
  std::vector<double> out(6);
  rope_forward(out.data(), x.data(), nullptr, 1, 3, 1, 2, 10000.0f);
  const std::vector<double> want{1.0,
                                 0.0,
                                 -std::sin(1.0),
                                 std::cos(1.0),
                                 0.6 * std::cos(2.0) + 0.8 * std::sin(2.0),
                                 -0.8 * std::cos(2.0) + 0.6 * std::sin(2.0)};
  CHECK(rel_error(out, want) < 1e-14);
}

TEST_CASE("rope: q.k after rotation depends only on the position difference, and norms are kept", "[kernels]") {
  constexpr std::int64_t D = 8;
  const auto q = uniform(D, 1), k = uniform(D, 2);
  auto rotated_dot = [&](std::int32_t m, std::int32_t n) {
    std::vector<double> qr(D), kr(D);
    const std::int32_t pm[1] = {m}, pn[1] = {n};
    rope_forward(qr.data(), q.data(), pm, 1, 1, 1, D, 500.0f);
    rope_forward(kr.data(), k.data(), pn, 1, 1, 1, D, 500.0f);
    return dot(qr, kr);
  };
  CHECK(rotated_dot(7, 3) == Approx(rotated_dot(104, 100)).epsilon(1e-12));
  CHECK(rotated_dot(7, 3) != Approx(rotated_dot(7, 4)).epsilon(1e-6));
  std::vector<double> qr(D);
  const std::int32_t p[1] = {12345};
  rope_forward(qr.data(), q.data(), p, 1, 1, 1, D, 500.0f);
  CHECK(dot(qr, qr) == Approx(dot(q, q)).epsilon(1e-12));
}

TEST_CASE("rope with a positions array equals the matching rows of the full sequence", "[kernels]") {
  constexpr std::int64_t B = 2, S = 10, H = 3, D = 4;
  const auto x = uniform(B * S * H * D, 3);
  std::vector<double> full(x.size());
  rope_forward(full.data(), x.data(), nullptr, B, S, H, D, 10000.0f);
  // Positions 6..9 (a CP chunk): rows 6..9 of each batch.
  const std::int32_t pos[4] = {6, 7, 8, 9};
  std::vector<double> chunk_in, chunk_want;
  for (std::int64_t b = 0; b < B; ++b) {
    chunk_in.insert(chunk_in.end(), x.begin() + (b * S + 6) * H * D, x.begin() + (b * S + 10) * H * D);
    chunk_want.insert(chunk_want.end(), full.begin() + (b * S + 6) * H * D, full.begin() + (b * S + 10) * H * D);
  }
  std::vector<double> chunk_out(chunk_in.size());
  rope_forward(chunk_out.data(), chunk_in.data(), pos, B, 4, H, D, 10000.0f);
  CHECK(rel_error(chunk_out, chunk_want) < 1e-14);
}

TEST_CASE("rope_backward matches finite differences", "[kernels]") {
  constexpr std::int64_t B = 2, S = 3, H = 2, D = 6;
  auto x = uniform(B * S * H * D, 4);
  const auto dout = uniform(x.size(), 5);
  const std::int32_t pos[3] = {5, 0, 900};
  const auto loss = [&] {
    std::vector<double> out(x.size());
    rope_forward(out.data(), x.data(), pos, B, S, H, D, 10000.0f);
    return dot(out, dout);
  };
  std::vector<double> dx(x.size());
  rope_backward(dx.data(), dout.data(), pos, B, S, H, D, 10000.0f);
  CHECK(rel_error(dx, numeric_grad(x, loss)) < 1e-6);
}

TEST_CASE("rope rejects an odd head dimension", "[kernels]") {
  std::vector<double> x(3);
  CHECK_THROWS_AS(rope_forward(x.data(), x.data(), nullptr, 1, 1, 1, 3, 10000.0f), std::invalid_argument);
}
