// CPU AdamW and the gradient-clipping helpers. See kernels/adamw.hpp.
#include "kernels/adamw.hpp"

#include <cmath>

#include "kernels/check.hpp"

namespace megascope::kernels {

template <typename T>
void adamw_update(T* params, const T* grads, T* m, T* v, std::int64_t n, float lr, float beta1, float beta2, float eps,
                  float weight_decay, std::int64_t step, float grad_scale) {
  MEGASCOPE_KERNEL_REQUIRE(n >= 0 && step >= 1);
  MEGASCOPE_KERNEL_REQUIRE(beta1 >= 0.0f && beta1 < 1.0f && beta2 >= 0.0f && beta2 < 1.0f);
  const double t = static_cast<double>(step);
  const T b1 = beta1, b2 = beta2;
  const T bc1 = static_cast<T>(1.0 - std::pow(static_cast<double>(beta1), t));  // bias corrections
  const T bc2 = static_cast<T>(1.0 - std::pow(static_cast<double>(beta2), t));
  const T decay = T(1) - T(lr) * T(weight_decay);
  for (std::int64_t i = 0; i < n; ++i) {
    const T g = grads[i] * T(grad_scale);
    m[i] = b1 * m[i] + (T(1) - b1) * g;
    v[i] = b2 * v[i] + (T(1) - b2) * g * g;
    const T mhat = m[i] / bc1, vhat = v[i] / bc2;
    params[i] = params[i] * decay - T(lr) * mhat / (std::sqrt(vhat) + T(eps));
  }
}

template <typename T>
void sum_squares(double* acc, const T* x, std::int64_t n) {
  MEGASCOPE_KERNEL_REQUIRE(acc != nullptr && n >= 0);
  double s = 0.0;
  for (std::int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  *acc += s;
}

template <typename T>
void scale_inplace(T* x, std::int64_t n, float s) {
  MEGASCOPE_KERNEL_REQUIRE(n >= 0);
  for (std::int64_t i = 0; i < n; ++i) x[i] *= T(s);
}

#define MEGASCOPE_INSTANTIATE(T)                                                                                     \
  template void adamw_update<T>(T*, const T*, T*, T*, std::int64_t, float, float, float, float, float, std::int64_t, \
                                float);                                                                              \
  template void sum_squares<T>(double*, const T*, std::int64_t);                                                     \
  template void scale_inplace<T>(T*, std::int64_t, float);
MEGASCOPE_INSTANTIATE(float)
MEGASCOPE_INSTANTIATE(double)
#undef MEGASCOPE_INSTANTIATE

}  // namespace megascope::kernels
