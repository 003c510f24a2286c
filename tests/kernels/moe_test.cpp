// MoE: the router's choices and weights against their definition (and
// Megatron's top-k-then-softmax form), permutation order and counts against
// a hand-worked example, and every backward against finite differences in
// double (normwise relative error < 1e-6).
#include "kernels/moe.hpp"

#include <catch2/catch.hpp>

#include "kernel_test_support.hpp"

using namespace megascope::kernels;
using namespace megascope::kernels::test;

TEST_CASE("moe_router_forward picks the k largest scores, ties to the lower expert", "[kernels]") {
  constexpr std::int64_t N = 2, E = 4, k = 2;
  const std::vector<double> logits{0.1, 2.0, -1.0, 1.5,   // top: 1, 3
                                   0.5, 0.5, 0.5,  0.2};  // a tie: 0, 1
  std::vector<double> probs(N * k), scores(N * E), renorm(N * k), scores2(N * E);
  std::vector<std::int32_t> experts(N * k), experts2(N * k);
  moe_router_forward(probs.data(), experts.data(), scores.data(), logits.data(), N, E, k, false);
  CHECK(experts == std::vector<std::int32_t>{1, 3, 0, 1});
  double z = 0.0;
  for (std::int64_t e = 0; e < E; ++e) z += std::exp(logits[e]);
  CHECK(scores[1] == Approx(std::exp(2.0) / z).epsilon(1e-14));
  CHECK(probs[0] == scores[1]);
  CHECK(probs[1] == scores[3]);
  // Renormalised: a softmax over the chosen logits only (Megatron's default).
  moe_router_forward(renorm.data(), experts2.data(), scores2.data(), logits.data(), N, E, k, true);
  CHECK(experts2 == experts);
  CHECK(renorm[0] == Approx(std::exp(2.0) / (std::exp(2.0) + std::exp(1.5))).epsilon(1e-14));
  CHECK(renorm[2] + renorm[3] == Approx(1.0).epsilon(1e-14));
}

TEST_CASE("moe_router_backward matches finite differences, renormalised or not", "[kernels]") {
  constexpr std::int64_t N = 3, E = 6, k = 2;
  for (bool renormalize : {false, true}) {
    auto logits = uniform(N * E, 1, -2.0, 2.0);  // distinct scores: the choice is stable under h = 1e-5
    const auto dprobs = uniform(N * k, 2);
    std::vector<double> probs(N * k), scores(N * E);
    std::vector<std::int32_t> experts(N * k);
    const auto loss = [&] {
      moe_router_forward(probs.data(), experts.data(), scores.data(), logits.data(), N, E, k, renormalize);
      return dot(probs, dprobs);
    };
    loss();
    std::vector<double> dlogits(N * E, 3.0);
    moe_router_backward(dlogits.data(), dprobs.data(), experts.data(), scores.data(), N, E, k, renormalize);
    CHECK(rel_error(dlogits, numeric_grad(logits, loss)) < 1e-6);
  }
}

TEST_CASE("moe_permute_indices groups slots by expert in slot order and counts them", "[kernels]") {
  // 3 tokens, k = 2: slots 0..5 go to experts 2,0 | 1,2 | 0,2.
  const std::vector<std::int32_t> experts{2, 0, 1, 2, 0, 2};
  std::vector<std::int32_t> row_to_slot(6), slot_to_row(6);
  std::vector<std::int64_t> counts(4);
  moe_permute_indices(row_to_slot.data(), slot_to_row.data(), counts.data(), experts.data(), 3, 4, 2);
  CHECK(counts == std::vector<std::int64_t>{2, 1, 3, 0});
  CHECK(row_to_slot == std::vector<std::int32_t>{1, 4, 2, 0, 3, 5});
  for (std::int32_t r = 0; r < 6; ++r) CHECK(slot_to_row[row_to_slot[r]] == r);
  const std::vector<std::int32_t> bad{0, 4};
  CHECK_THROWS_AS(moe_permute_indices(row_to_slot.data(), slot_to_row.data(), counts.data(), bad.data(), 1, 4, 2),
                  std::invalid_argument);
}

TEST_CASE("permute then unpermute with identity experts gives the probability-weighted sum", "[kernels]") {
  constexpr std::int64_t N = 3, C = 4, E = 3, k = 2;
  const std::vector<std::int32_t> experts{2, 0, 1, 2, 0, 2};
  const auto x = uniform(N * C, 3), probs = uniform(N * k, 4, 0.0, 1.0);
  std::vector<std::int32_t> r2s(N * k), s2r(N * k);
  std::vector<std::int64_t> counts(E);
  moe_permute_indices(r2s.data(), s2r.data(), counts.data(), experts.data(), N, E, k);
  std::vector<double> permuted(N * k * C), out(N * C);
  moe_permute_forward(permuted.data(), x.data(), r2s.data(), N, C, k);
  for (std::int64_t c = 0; c < C; ++c) CHECK(permuted[0 * C + c] == x[0 * C + c]);  // row 0 = slot 1 = token 0
  moe_unpermute_forward(out.data(), permuted.data(), probs.data(), s2r.data(), N, C, k);
  std::vector<double> want(N * C);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t c = 0; c < C; ++c) want[n * C + c] = (probs[n * k] + probs[n * k + 1]) * x[n * C + c];
  CHECK(rel_error(out, want) < 1e-14);
}

TEST_CASE("moe permute and unpermute backward match finite differences", "[kernels]") {
  constexpr std::int64_t N = 4, C = 3, E = 3, k = 2;
  const std::vector<std::int32_t> experts{0, 1, 2, 0, 1, 2, 2, 1};
  std::vector<std::int32_t> r2s(N * k), s2r(N * k);
  std::vector<std::int64_t> counts(E);
  moe_permute_indices(r2s.data(), s2r.data(), counts.data(), experts.data(), N, E, k);
  auto x = uniform(N * C, 5), eo = uniform(N * k * C, 6), probs = uniform(N * k, 7, 0.0, 1.0);
  const auto dperm = uniform(N * k * C, 8), dout = uniform(N * C, 9);

  const auto permute_loss = [&] {
    std::vector<double> p(N * k * C);
    moe_permute_forward(p.data(), x.data(), r2s.data(), N, C, k);
    return dot(p, dperm);
  };
  std::vector<double> dx(N * C, 1.0);
  moe_permute_backward(dx.data(), dperm.data(), s2r.data(), N, C, k);
  CHECK(rel_error(dx, numeric_grad(x, permute_loss)) < 1e-6);

  const auto unpermute_loss = [&] {
    std::vector<double> y(N * C);
    moe_unpermute_forward(y.data(), eo.data(), probs.data(), s2r.data(), N, C, k);
    return dot(y, dout);
  };
  std::vector<double> deo(N * k * C, 1.0), dprobs(N * k, 1.0);
  moe_unpermute_backward(deo.data(), dprobs.data(), dout.data(), eo.data(), probs.data(), s2r.data(), N, C, k);
  CHECK(rel_error(deo, numeric_grad(eo, unpermute_loss)) < 1e-6);
  CHECK(rel_error(dprobs, numeric_grad(probs, unpermute_loss)) < 1e-6);
}
