// CPU vocab-parallel cross-entropy pieces. See kernels/cross_entropy.hpp for
// the reductions the caller does between them.
#include "kernels/cross_entropy.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/check.hpp"

namespace megascope::kernels {

template <typename T>
void cross_entropy_local_max(T* row_max, const T* logits, std::int64_t N, std::int64_t V) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && V >= 0);
  for (std::int64_t n = 0; n < N; ++n) {
    const T* l = logits + n * V;  // (V)
    T mx = -std::numeric_limits<T>::infinity();
    for (std::int64_t v = 0; v < V; ++v) mx = std::max(mx, l[v]);
    row_max[n] = mx;
  }
}

template <typename T>
void cross_entropy_local_sumexp(T* sumexp, const T* logits, const T* row_max, std::int64_t N, std::int64_t V) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && V >= 0);
  for (std::int64_t n = 0; n < N; ++n) {
    const T* l = logits + n * V;  // (V)
    double s = 0.0;
    for (std::int64_t v = 0; v < V; ++v) s += static_cast<double>(std::exp(l[v] - row_max[n]));
    sumexp[n] = static_cast<T>(s);
  }
}

template <typename T>
void cross_entropy_local_target(T* target_logit, const T* logits, const std::int32_t* targets, std::int64_t N,
                                std::int64_t V, std::int64_t vocab_start) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && V >= 0 && vocab_start >= 0);
  for (std::int64_t n = 0; n < N; ++n) {
    const std::int64_t local = static_cast<std::int64_t>(targets[n]) - vocab_start;
    target_logit[n] = (local >= 0 && local < V) ? logits[n * V + local] : T(0);
  }
}

template <typename T>
void cross_entropy_loss(T* loss, const T* row_max, const T* sumexp, const T* target_logit, std::int64_t N) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0);
  for (std::int64_t n = 0; n < N; ++n) loss[n] = std::log(sumexp[n]) + row_max[n] - target_logit[n];
}

template <typename T>
void cross_entropy_backward(T* dlogits, const T* logits, const T* row_max, const T* sumexp, const std::int32_t* targets,
                            const T* dloss, std::int64_t N, std::int64_t V, std::int64_t vocab_start) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && V >= 0 && vocab_start >= 0);
  for (std::int64_t n = 0; n < N; ++n) {
    const T* l = logits + n * V;  // (V)
    T* dl = dlogits + n * V;      // (V)
    const T inv_sum = T(1) / sumexp[n], mx = row_max[n], g = dloss[n];
    const std::int64_t local = static_cast<std::int64_t>(targets[n]) - vocab_start;
    for (std::int64_t v = 0; v < V; ++v) {
      const T prob = std::exp(l[v] - mx) * inv_sum;
      dl[v] = (prob - (v == local ? T(1) : T(0))) * g;
    }
  }
}

#define MEGASCOPE_INSTANTIATE(T)                                                                             \
  template void cross_entropy_local_max<T>(T*, const T*, std::int64_t, std::int64_t);                        \
  template void cross_entropy_local_sumexp<T>(T*, const T*, const T*, std::int64_t, std::int64_t);           \
  template void cross_entropy_local_target<T>(T*, const T*, const std::int32_t*, std::int64_t, std::int64_t, \
                                              std::int64_t);                                                 \
  template void cross_entropy_loss<T>(T*, const T*, const T*, const T*, std::int64_t);                       \
  template void cross_entropy_backward<T>(T*, const T*, const T*, const T*, const std::int32_t*, const T*,   \
                                          std::int64_t, std::int64_t, std::int64_t);
MEGASCOPE_INSTANTIATE(float)
MEGASCOPE_INSTANTIATE(double)
#undef MEGASCOPE_INSTANTIATE

}  // namespace megascope::kernels
