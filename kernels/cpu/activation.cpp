// CPU GeLU (tanh form) and SwiGLU. See kernels/activation.hpp.
#include "kernels/activation.hpp"

#include <cmath>

#include "kernels/check.hpp"

namespace megascope::kernels {

namespace {

constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2/pi)
constexpr double kGeluCubic = 0.044715;

template <typename T>
T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

}  // namespace

template <typename T>
void gelu_forward(T* out, const T* inp, std::int64_t n) {
  MEGASCOPE_KERNEL_REQUIRE(n >= 0);
  const T s = static_cast<T>(kSqrt2OverPi), c3 = static_cast<T>(kGeluCubic);
  for (std::int64_t i = 0; i < n; ++i) {
    const T x = inp[i];
    out[i] = T(0.5) * x * (T(1) + std::tanh(s * (x + c3 * x * x * x)));
  }
}

template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, std::int64_t n) {
  MEGASCOPE_KERNEL_REQUIRE(n >= 0);
  const T s = static_cast<T>(kSqrt2OverPi), c3 = static_cast<T>(kGeluCubic);
  for (std::int64_t i = 0; i < n; ++i) {
    const T x = inp[i];
    const T th = std::tanh(s * (x + c3 * x * x * x));
    const T sech2 = T(1) - th * th;
    const T grad = T(0.5) * (T(1) + th) + T(0.5) * x * sech2 * s * (T(1) + T(3) * c3 * x * x);
    dinp[i] = grad * dout[i];
  }
}

template <typename T>
void swiglu_forward(T* out, const T* inp, std::int64_t N, std::int64_t F) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && F >= 0);
  for (std::int64_t n = 0; n < N; ++n) {
    const T* gate = inp + n * 2 * F;  // (F)
    const T* up = gate + F;           // (F)
    T* y = out + n * F;               // (F)
    for (std::int64_t i = 0; i < F; ++i) y[i] = gate[i] * sigmoid(gate[i]) * up[i];
  }
}

template <typename T>
void swiglu_backward(T* dinp, const T* inp, const T* dout, std::int64_t N, std::int64_t F) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && F >= 0);
  for (std::int64_t n = 0; n < N; ++n) {
    const T* gate = inp + n * 2 * F;  // (F)
    const T* up = gate + F;           // (F)
    const T* dy = dout + n * F;       // (F)
    T* dgate = dinp + n * 2 * F;      // (F)
    T* dup = dgate + F;               // (F)
    for (std::int64_t i = 0; i < F; ++i) {
      const T g = gate[i], sg = sigmoid(g);
      // d silu(g) / dg = sigmoid(g) (1 + g (1 - sigmoid(g)))
      dgate[i] = dy[i] * up[i] * sg * (T(1) + g * (T(1) - sg));
      dup[i] = dy[i] * g * sg;
    }
  }
}

#define MEGASCOPE_INSTANTIATE(T)                                             \
  template void gelu_forward<T>(T*, const T*, std::int64_t);                 \
  template void gelu_backward<T>(T*, const T*, const T*, std::int64_t);      \
  template void swiglu_forward<T>(T*, const T*, std::int64_t, std::int64_t); \
  template void swiglu_backward<T>(T*, const T*, const T*, std::int64_t, std::int64_t);
MEGASCOPE_INSTANTIATE(float)
MEGASCOPE_INSTANTIATE(double)
#undef MEGASCOPE_INSTANTIATE

}  // namespace megascope::kernels
