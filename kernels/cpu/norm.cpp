// CPU LayerNorm and RMSNorm: one pass per row, row statistics accumulated in
// double whatever T is. See kernels/norm.hpp.
#include "kernels/norm.hpp"

#include <cmath>

#include "kernels/check.hpp"

namespace megascope::kernels {

template <typename T>
void layernorm_forward(T* out, nullable<T> mean, nullable<T> rstd, const T* inp, const T* weight,
                       nullable<const T> bias, std::int64_t N, std::int64_t C, float eps) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && C > 0);
  const double c = static_cast<double>(C);
  for (std::int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;  // (C)
    T* y = out + n * C;        // (C)
    double s = 0.0;
    for (std::int64_t i = 0; i < C; ++i) s += static_cast<double>(x[i]);
    const double m = s / c;
    double var = 0.0;
    for (std::int64_t i = 0; i < C; ++i) {
      const double d = static_cast<double>(x[i]) - m;
      var += d * d;
    }
    const double r = 1.0 / std::sqrt(var / c + static_cast<double>(eps));
    const T mt = static_cast<T>(m), rt = static_cast<T>(r);
    for (std::int64_t i = 0; i < C; ++i) {
      const T norm = (x[i] - mt) * rt;
      y[i] = norm * weight[i] + (bias != nullptr ? bias[i] : T(0));
    }
    if (mean != nullptr) mean[n] = mt;
    if (rstd != nullptr) rstd[n] = rt;
  }
}

template <typename T>
void layernorm_backward(T* dinp, T* dweight, nullable<T> dbias, const T* dout, const T* inp, const T* weight,
                        const T* mean, const T* rstd, std::int64_t N, std::int64_t C) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && C > 0);
  const double c = static_cast<double>(C);
  for (std::int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;    // (C)
    const T* dy = dout + n * C;  // (C)
    T* dx = dinp + n * C;        // (C)
    const T m = mean[n], r = rstd[n];
    // dinp = rstd (dnorm - mean(dnorm) - norm mean(dnorm norm)), dnorm = dout weight.
    double dnorm_mean = 0.0, dnorm_norm_mean = 0.0;
    for (std::int64_t i = 0; i < C; ++i) {
      const double norm = static_cast<double>((x[i] - m) * r);
      const double dnorm = static_cast<double>(dy[i] * weight[i]);
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    const T a = static_cast<T>(dnorm_mean / c), b = static_cast<T>(dnorm_norm_mean / c);
    for (std::int64_t i = 0; i < C; ++i) {
      const T norm = (x[i] - m) * r;
      dx[i] = (dy[i] * weight[i] - a - norm * b) * r;
      dweight[i] += norm * dy[i];
      if (dbias != nullptr) dbias[i] += dy[i];
    }
  }
}

template <typename T>
void rmsnorm_forward(T* out, nullable<T> rstd, const T* inp, const T* weight, std::int64_t N, std::int64_t C,
                     float eps) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && C > 0);
  const double c = static_cast<double>(C);
  for (std::int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;  // (C)
    T* y = out + n * C;        // (C)
    double ss = 0.0;
    for (std::int64_t i = 0; i < C; ++i) ss += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    const T r = static_cast<T>(1.0 / std::sqrt(ss / c + static_cast<double>(eps)));
    for (std::int64_t i = 0; i < C; ++i) y[i] = x[i] * r * weight[i];
    if (rstd != nullptr) rstd[n] = r;
  }
}

template <typename T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, const T* rstd, std::int64_t N,
                      std::int64_t C) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && C > 0);
  const double c = static_cast<double>(C);
  for (std::int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;    // (C)
    const T* dy = dout + n * C;  // (C)
    T* dx = dinp + n * C;        // (C)
    const T r = rstd[n];
    // dinp = rstd (dnorm - norm mean(dnorm norm)), dnorm = dout weight.
    double dnorm_norm_mean = 0.0;
    for (std::int64_t i = 0; i < C; ++i)
      dnorm_norm_mean += static_cast<double>(dy[i] * weight[i]) * static_cast<double>(x[i] * r);
    const T b = static_cast<T>(dnorm_norm_mean / c);
    for (std::int64_t i = 0; i < C; ++i) {
      const T norm = x[i] * r;
      dx[i] = (dy[i] * weight[i] - norm * b) * r;
      dweight[i] += norm * dy[i];
    }
  }
}

#define MEGASCOPE_INSTANTIATE(T)                                                                                   \
  template void layernorm_forward<T>(T*, T*, T*, const T*, const T*, const T*, std::int64_t, std::int64_t, float); \
  template void layernorm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, std::int64_t,  \
                                      std::int64_t);                                                               \
  template void rmsnorm_forward<T>(T*, T*, const T*, const T*, std::int64_t, std::int64_t, float);                 \
  template void rmsnorm_backward<T>(T*, T*, const T*, const T*, const T*, const T*, std::int64_t, std::int64_t);
MEGASCOPE_INSTANTIATE(float)
MEGASCOPE_INSTANTIATE(double)
#undef MEGASCOPE_INSTANTIATE

}  // namespace megascope::kernels
