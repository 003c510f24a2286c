// Helpers for the kernel tests: seeded random tensors, central finite
// differences, a normwise relative error, and naive reference loops.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

namespace megascope::kernels::test {

// n values uniform in [lo, hi), reproducible from `seed`.
template <typename T = double>
std::vector<T> uniform(std::size_t n, std::uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(dist(rng));
  return v;
}

template <typename To, typename From>
std::vector<To> cast(const std::vector<From>& v) {
  std::vector<To> out(v.size());
  std::transform(v.begin(), v.end(), out.begin(), [](From x) { return static_cast<To>(x); });
  return out;
}

// sum_i a[i] * b[i]: the scalar "loss" whose gradient the backward computes
// when b is the upstream gradient.
template <typename T>
double dot(const std::vector<T>& a, const std::vector<T>& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return s;
}

// Central differences of loss() with respect to every element of x (which
// loss() reads by reference): g[i] = (loss(x + h e_i) - loss(x - h e_i)) / 2h.
inline std::vector<double> numeric_grad(std::vector<double>& x, const std::function<double()>& loss, double h = 1e-5) {
  std::vector<double> g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double lp = loss();
    x[i] = saved - h;
    const double lm = loss();
    x[i] = saved;
    g[i] = (lp - lm) / (2.0 * h);
  }
  return g;
}

// Normwise relative error max_i |a_i - e_i| / max_i |e_i| (absolute when
// expected is all zeros). Sizes must match, else +inf.
template <typename A, typename E>
double rel_error(const std::vector<A>& actual, const std::vector<E>& expected) {
  if (actual.size() != expected.size()) return INFINITY;
  double diff = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double a = static_cast<double>(actual[i]), e = static_cast<double>(expected[i]);
    if (std::isnan(a) || std::isnan(e)) return INFINITY;
    diff = std::max(diff, std::abs(a - e));
    scale = std::max(scale, std::abs(e));
  }
  return scale > 0.0 ? diff / scale : diff;
}

// Naive out (N, OC) = inp (N, C) . weight (OC, C)^T.
inline std::vector<double> naive_matmul(const std::vector<double>& inp, const std::vector<double>& weight,
                                        std::int64_t N, std::int64_t C, std::int64_t OC) {
  std::vector<double> out(static_cast<std::size_t>(N * OC), 0.0);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t o = 0; o < OC; ++o) {
      double s = 0.0;
      for (std::int64_t c = 0; c < C; ++c)
        s += inp[static_cast<std::size_t>(n * C + c)] * weight[static_cast<std::size_t>(o * C + c)];
      out[static_cast<std::size_t>(n * OC + o)] = s;
    }
  return out;
}

}  // namespace megascope::kernels::test
