// Vocab-parallel cross-entropy: the pieces give -log softmax(target), two
// shards with the caller's MAX and SUM reductions give the unsharded loss and
// gradient, and the backward matches finite differences in double
// (normwise relative error < 1e-6).
#include "kernels/cross_entropy.hpp"

#include <catch2/catch.hpp>

#include "kernel_test_support.hpp"

using namespace megascope::kernels;
using namespace megascope::kernels::test;

namespace {

constexpr std::int64_t N = 4, V = 11;
const std::vector<std::int32_t> kTargets{3, 0, 10, 6};

struct Out {
  std::vector<double> loss, row_max, sumexp;
};

// The four pieces on one shard holding the whole vocabulary.
Out unsharded(const std::vector<double>& logits) {
  Out o{std::vector<double>(N), std::vector<double>(N), std::vector<double>(N)};
  std::vector<double> target(N);
  cross_entropy_local_max(o.row_max.data(), logits.data(), N, V);
  cross_entropy_local_sumexp(o.sumexp.data(), logits.data(), o.row_max.data(), N, V);
  cross_entropy_local_target(target.data(), logits.data(), kTargets.data(), N, V, 0);
  cross_entropy_loss(o.loss.data(), o.row_max.data(), o.sumexp.data(), target.data(), N);
  return o;
}

// Columns [v0, v1) of logits (N, V).
std::vector<double> columns(const std::vector<double>& logits, std::int64_t v0, std::int64_t v1) {
  std::vector<double> out;
  for (std::int64_t n = 0; n < N; ++n) out.insert(out.end(), logits.begin() + n * V + v0, logits.begin() + n * V + v1);
  return out;
}

}  // namespace

TEST_CASE("cross-entropy pieces give log(sum exp(logits)) - logit[target], even for logits near 1000", "[kernels]") {
  for (double shift : {0.0, 1000.0}) {
    auto logits = uniform(N * V, 1, -3.0, 3.0);
    for (auto& l : logits) l += shift;
    const auto o = unsharded(logits);
    for (std::int64_t n = 0; n < N; ++n) {
      double s = 0.0;  // the textbook form, in a safe range once the shift is taken out
      for (std::int64_t v = 0; v < V; ++v) s += std::exp(logits[n * V + v] - shift);
      const double want = std::log(s) - (logits[n * V + kTargets[n]] - shift);
      CHECK(o.loss[n] == Approx(want).epsilon(1e-12));
    }
  }
}

TEST_CASE("cross-entropy on two vocab shards with MAX and SUM reductions equals the unsharded loss and gradient",
          "[kernels]") {
  const auto logits = uniform(N * V, 2, -4.0, 4.0);
  const auto dloss = uniform(N, 3, 0.1, 1.0);
  const auto whole = unsharded(logits);
  std::vector<double> dwhole(N * V);
  cross_entropy_backward(dwhole.data(), logits.data(), whole.row_max.data(), whole.sumexp.data(), kTargets.data(),
                         dloss.data(), N, V, 0);

  const std::int64_t split = 5;  // shard 0: ids [0, 5), shard 1: [5, 11)
  const auto l0 = columns(logits, 0, split), l1 = columns(logits, split, V);
  std::vector<double> m0(N), m1(N), mx(N), s0(N), s1(N), sum(N), t0(N), t1(N), tgt(N), loss(N);
  cross_entropy_local_max(m0.data(), l0.data(), N, split);
  cross_entropy_local_max(m1.data(), l1.data(), N, V - split);
  for (std::int64_t n = 0; n < N; ++n) mx[n] = std::max(m0[n], m1[n]);  // all-reduce MAX
  cross_entropy_local_sumexp(s0.data(), l0.data(), mx.data(), N, split);
  cross_entropy_local_sumexp(s1.data(), l1.data(), mx.data(), N, V - split);
  cross_entropy_local_target(t0.data(), l0.data(), kTargets.data(), N, split, 0);
  cross_entropy_local_target(t1.data(), l1.data(), kTargets.data(), N, V - split, split);
  for (std::int64_t n = 0; n < N; ++n) {  // all-reduce SUM
    sum[n] = s0[n] + s1[n];
    tgt[n] = t0[n] + t1[n];
  }
  cross_entropy_loss(loss.data(), mx.data(), sum.data(), tgt.data(), N);
  CHECK(rel_error(loss, whole.loss) < 1e-14);
  std::vector<double> d0(N * split), d1(N * (V - split));
  cross_entropy_backward(d0.data(), l0.data(), mx.data(), sum.data(), kTargets.data(), dloss.data(), N, split, 0);
  cross_entropy_backward(d1.data(), l1.data(), mx.data(), sum.data(), kTargets.data(), dloss.data(), N, V - split,
                         split);
  CHECK(rel_error(d0, columns(dwhole, 0, split)) < 1e-14);
  CHECK(rel_error(d1, columns(dwhole, split, V)) < 1e-14);
}

TEST_CASE("cross_entropy_backward matches finite differences of sum(loss * dloss)", "[kernels]") {
  auto logits = uniform(N * V, 4, -2.0, 2.0);
  const auto dloss = uniform(N, 5, 0.1, 1.0);
  const auto loss = [&] { return dot(unsharded(logits).loss, dloss); };
  const auto o = unsharded(logits);
  std::vector<double> dlogits(N * V);
  cross_entropy_backward(dlogits.data(), logits.data(), o.row_max.data(), o.sumexp.data(), kTargets.data(),
                         dloss.data(), N, V, 0);
  CHECK(rel_error(dlogits, numeric_grad(logits, loss)) < 1e-6);
}
