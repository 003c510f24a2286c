// CPU residual add, dropout and bias + dropout + residual. The mask comes
// from kernels/philox.hpp and is regenerated in the backward. See
// kernels/dropout.hpp.
#include "kernels/dropout.hpp"

#include "kernels/check.hpp"
#include "kernels/philox.hpp"

namespace megascope::kernels {

namespace {

// 1/(1-p), or 0 when everything is dropped.
template <typename T>
T keep_scale(float p) {
  return p >= 1.0f ? T(0) : static_cast<T>(1.0 / (1.0 - static_cast<double>(p)));
}

void check_p(float p) { MEGASCOPE_KERNEL_REQUIRE(p >= 0.0f && p <= 1.0f); }

}  // namespace

template <typename T>
void residual_forward(T* out, const T* a, const T* b, std::int64_t n) {
  MEGASCOPE_KERNEL_REQUIRE(n >= 0);
  for (std::int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <typename T>
void dropout_forward(T* out, const T* inp, std::int64_t n, float p, std::uint64_t seed, std::uint64_t offset) {
  MEGASCOPE_KERNEL_REQUIRE(n >= 0);
  check_p(p);
  const std::uint64_t threshold = dropout_threshold(p);
  const T scale = keep_scale<T>(p);
  for (std::int64_t i = 0; i < n; ++i) {
    const bool keep = dropout_keep(seed, offset + static_cast<std::uint64_t>(i), threshold);
    out[i] = keep ? inp[i] * scale : T(0);
  }
}

template <typename T>
void dropout_backward(T* dinp, const T* dout, std::int64_t n, float p, std::uint64_t seed, std::uint64_t offset) {
  // The same map as the forward: d(keep x / (1-p)) / dx = keep / (1-p).
  dropout_forward(dinp, dout, n, p, seed, offset);
}

template <typename T>
void bias_dropout_add_forward(T* out, const T* inp, nullable<const T> bias, const T* residual, std::int64_t N,
                              std::int64_t C, float p, std::uint64_t seed, std::uint64_t offset) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && C >= 0);
  check_p(p);
  const std::uint64_t threshold = dropout_threshold(p);
  const T scale = keep_scale<T>(p);
  for (std::int64_t n = 0; n < N; ++n) {
    for (std::int64_t c = 0; c < C; ++c) {
      const std::int64_t i = n * C + c;
      const T x = inp[i] + (bias != nullptr ? bias[c] : T(0));
      const bool keep = dropout_keep(seed, offset + static_cast<std::uint64_t>(i), threshold);
      out[i] = residual[i] + (keep ? x * scale : T(0));
    }
  }
}

template <typename T>
void bias_dropout_add_backward(T* dinp, nullable<T> dbias, const T* dout, std::int64_t N, std::int64_t C, float p,
                               std::uint64_t seed, std::uint64_t offset) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && C >= 0);
  dropout_backward(dinp, dout, N * C, p, seed, offset);
  if (dbias == nullptr) return;
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t c = 0; c < C; ++c) dbias[c] += dinp[n * C + c];
}

#define MEGASCOPE_INSTANTIATE(T)                                                                                 \
  template void residual_forward<T>(T*, const T*, const T*, std::int64_t);                                       \
  template void dropout_forward<T>(T*, const T*, std::int64_t, float, std::uint64_t, std::uint64_t);             \
  template void dropout_backward<T>(T*, const T*, std::int64_t, float, std::uint64_t, std::uint64_t);            \
  template void bias_dropout_add_forward<T>(T*, const T*, const T*, const T*, std::int64_t, std::int64_t, float, \
                                            std::uint64_t, std::uint64_t);                                       \
  template void bias_dropout_add_backward<T>(T*, T*, const T*, std::int64_t, std::int64_t, float, std::uint64_t, \
                                             std::uint64_t);
MEGASCOPE_INSTANTIATE(float)
MEGASCOPE_INSTANTIATE(double)
#undef MEGASCOPE_INSTANTIATE

}  // namespace megascope::kernels
