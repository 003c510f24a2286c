// Dropout: Philox against Random123's known answers, the keep rate against
// 1 - p, the mask regenerated identically in the backward and under a shard
// offset, and bias + dropout + residual against finite differences in double
// (the map is linear in inp and bias: normwise relative error < 1e-8).
#include "kernels/dropout.hpp"

#include <array>
#include <catch2/catch.hpp>

#include "kernel_test_support.hpp"
#include "kernels/philox.hpp"

using namespace megascope::kernels;
using namespace megascope::kernels::test;

TEST_CASE("philox4x32_10 reproduces the Random123 known-answer vectors", "[kernels]") {
  auto eq = [](Philox4x32 a, std::array<std::uint32_t, 4> b) {
    return a.v[0] == b[0] && a.v[1] == b[1] && a.v[2] == b[2] && a.v[3] == b[3];
  };
  CHECK(eq(philox4x32_10(Philox4x32{{0, 0, 0, 0}}, 0, 0), {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  CHECK(eq(philox4x32_10(Philox4x32{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu),
           {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  CHECK(eq(philox4x32_10(Philox4x32{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u),
           {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST_CASE("dropout keeps about 1 - p of the elements and scales them by 1/(1-p)", "[kernels]") {
  constexpr std::int64_t n = 200000;
  const float p = 0.3f;
  const std::vector<double> ones(n, 1.0);
  std::vector<double> out(n);
  dropout_forward(out.data(), ones.data(), n, p, 1234, 0);
  std::int64_t kept = 0;
  for (double y : out) {
    if (y != 0.0) {
      ++kept;
      REQUIRE(y == Approx(1.0 / (1.0 - static_cast<double>(p))).epsilon(1e-12));
    }
  }
  // Binomial(n, 0.7): standard deviation ~205; allow 5 sigma.
  CHECK(std::abs(static_cast<double>(kept) - 0.7 * n) < 5.0 * std::sqrt(n * 0.7 * 0.3));
  // p = 0 is the identity, p = 1 zeroes everything.
  dropout_forward(out.data(), ones.data(), n, 0.0f, 1234, 0);
  CHECK(out == ones);
  dropout_forward(out.data(), ones.data(), n, 1.0f, 1234, 0);
  CHECK(std::all_of(out.begin(), out.end(), [](double y) { return y == 0.0; }));
}

TEST_CASE("dropout masks: same in backward, differ by seed, and an offset shard sees the full tensor's mask",
          "[kernels]") {
  constexpr std::int64_t n = 1000;
  const auto x = uniform(n, 1, 0.5, 1.5);  // never zero
  std::vector<double> fwd(n), bwd(n), other(n);
  dropout_forward(fwd.data(), x.data(), n, 0.5f, 42, 7);
  dropout_backward(bwd.data(), x.data(), n, 0.5f, 42, 7);
  CHECK(fwd == bwd);
  dropout_forward(other.data(), x.data(), n, 0.5f, 43, 7);
  std::int64_t differ = 0;
  for (std::int64_t i = 0; i < n; ++i) differ += (fwd[i] == 0.0) != (other[i] == 0.0);
  CHECK(differ > n / 4);  // independent masks differ on about half
  // Elements [300, 1000) with offset 7 + 300 reproduce the full call's mask.
  std::vector<double> shard(n - 300);
  dropout_forward(shard.data(), x.data() + 300, n - 300, 0.5f, 42, 7 + 300);
  CHECK(shard == std::vector<double>(fwd.begin() + 300, fwd.end()));
}

TEST_CASE("bias_dropout_add forward is residual + mask (inp + bias) / (1-p), backward matches finite differences",
          "[kernels]") {
  constexpr std::int64_t N = 6, C = 5;
  const float p = 0.4f;
  auto x = uniform(N * C, 2), b = uniform(C, 3);
  const auto res = uniform(N * C, 4), dout = uniform(N * C, 5);
  std::vector<double> out(N * C), masked(N * C);
  bias_dropout_add_forward(out.data(), x.data(), b.data(), res.data(), N, C, p, 9, 100);
  const std::vector<double> ones(N * C, 1.0);
  dropout_forward(masked.data(), ones.data(), N * C, p, 9, 100);  // the mask times 1/(1-p)
  std::vector<double> expected(N * C);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t c = 0; c < C; ++c)
      expected[n * C + c] = res[n * C + c] + masked[n * C + c] * (x[n * C + c] + b[c]);
  CHECK(rel_error(out, expected) < 1e-14);

  const auto loss = [&] {
    std::vector<double> y(N * C);
    bias_dropout_add_forward(y.data(), x.data(), b.data(), res.data(), N, C, p, 9, 100);
    return dot(y, dout);
  };
  std::vector<double> dx(N * C), db(C, 0.0);
  bias_dropout_add_backward(dx.data(), db.data(), dout.data(), N, C, p, 9, 100);
  CHECK(rel_error(dx, numeric_grad(x, loss)) < 1e-8);
  CHECK(rel_error(db, numeric_grad(b, loss)) < 1e-8);
}

TEST_CASE("residual_forward adds element-wise, in place too", "[kernels]") {
  std::vector<double> a{1, 2, 3}, b{10, 20, 30};
  residual_forward(a.data(), a.data(), b.data(), 3);
  CHECK(a == std::vector<double>{11, 22, 33});
}
