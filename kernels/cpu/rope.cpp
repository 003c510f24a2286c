// CPU rotary embedding (rotate-half). Angles are computed in T: float on the
// executor's path, double in the finite-difference tests. See kernels/rope.hpp.
#include "kernels/rope.hpp"

#include <cmath>
#include <vector>

#include "kernels/check.hpp"

namespace megascope::kernels {

namespace {

// sign = +1 rotates by +angle (forward), -1 by -angle (backward: the
// rotation is orthogonal, so its transpose is its inverse).
template <typename T>
void rotate(T* out, const T* inp, const std::int32_t* pos, std::int64_t B, std::int64_t S, std::int64_t H,
            std::int64_t D, float theta, T sign) {
  MEGASCOPE_KERNEL_REQUIRE(B >= 0 && S >= 0 && H >= 0 && D > 0 && D % 2 == 0 && theta > 0.0f);
  const std::int64_t half = D / 2;
  std::vector<T> inv_freq(static_cast<std::size_t>(half));  // (D/2)
  for (std::int64_t i = 0; i < half; ++i)
    inv_freq[static_cast<std::size_t>(i)] =
        T(1) / std::pow(static_cast<T>(theta), static_cast<T>(2 * i) / static_cast<T>(D));
  std::vector<T> cs(static_cast<std::size_t>(half)), sn(static_cast<std::size_t>(half));
  for (std::int64_t t = 0; t < S; ++t) {
    const T p = static_cast<T>(pos != nullptr ? pos[t] : t);
    for (std::int64_t i = 0; i < half; ++i) {
      const T angle = p * inv_freq[static_cast<std::size_t>(i)];
      cs[static_cast<std::size_t>(i)] = std::cos(angle);
      sn[static_cast<std::size_t>(i)] = sign * std::sin(angle);
    }
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t h = 0; h < H; ++h) {
        const std::int64_t base = ((b * S + t) * H + h) * D;
        for (std::int64_t i = 0; i < half; ++i) {
          const T x1 = inp[base + i], x2 = inp[base + half + i];
          const T c = cs[static_cast<std::size_t>(i)], s = sn[static_cast<std::size_t>(i)];
          out[base + i] = x1 * c - x2 * s;
          out[base + half + i] = x2 * c + x1 * s;
        }
      }
    }
  }
}

}  // namespace

template <typename T>
void rope_forward(T* out, const T* inp, const std::int32_t* pos, std::int64_t B, std::int64_t S, std::int64_t H,
                  std::int64_t D, float theta) {
  rotate(out, inp, pos, B, S, H, D, theta, T(1));
}

template <typename T>
void rope_backward(T* dinp, const T* dout, const std::int32_t* pos, std::int64_t B, std::int64_t S, std::int64_t H,
                   std::int64_t D, float theta) {
  rotate(dinp, dout, pos, B, S, H, D, theta, T(-1));
}

#define MEGASCOPE_INSTANTIATE(T)                                                                              \
  template void rope_forward<T>(T*, const T*, const std::int32_t*, std::int64_t, std::int64_t, std::int64_t,  \
                                std::int64_t, float);                                                         \
  template void rope_backward<T>(T*, const T*, const std::int32_t*, std::int64_t, std::int64_t, std::int64_t, \
                                 std::int64_t, float);
MEGASCOPE_INSTANTIATE(float)
MEGASCOPE_INSTANTIATE(double)
#undef MEGASCOPE_INSTANTIATE

}  // namespace megascope::kernels
