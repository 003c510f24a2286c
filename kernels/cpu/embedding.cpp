// CPU vocab-parallel embedding. See kernels/embedding.hpp.
#include "kernels/embedding.hpp"

#include "kernels/check.hpp"

namespace megascope::kernels {

template <typename T>
void embedding_forward(T* out, const std::int32_t* tokens, const T* wte, nullable<const T> wpe, const std::int32_t* pos,
                       std::int64_t N, std::int64_t C, std::int64_t vocab_start, std::int64_t vocab_end) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && C >= 0 && vocab_start >= 0 && vocab_end >= vocab_start);
  MEGASCOPE_KERNEL_REQUIRE(wpe == nullptr || pos != nullptr);
  for (std::int64_t n = 0; n < N; ++n) {
    T* y = out + n * C;  // (C)
    const std::int64_t tok = tokens[n];
    if (tok >= vocab_start && tok < vocab_end) {
      const T* row = wte + (tok - vocab_start) * C;
      for (std::int64_t c = 0; c < C; ++c) y[c] = row[c];
    } else {
      for (std::int64_t c = 0; c < C; ++c) y[c] = T(0);
    }
    if (wpe != nullptr) {
      const T* prow = wpe + static_cast<std::int64_t>(pos[n]) * C;
      for (std::int64_t c = 0; c < C; ++c) y[c] += prow[c];
    }
  }
}

template <typename T>
void embedding_backward(T* dwte, nullable<T> dwpe, const T* dout, const std::int32_t* tokens, const std::int32_t* pos,
                        std::int64_t N, std::int64_t C, std::int64_t vocab_start, std::int64_t vocab_end) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && C >= 0 && vocab_start >= 0 && vocab_end >= vocab_start);
  MEGASCOPE_KERNEL_REQUIRE(dwpe == nullptr || pos != nullptr);
  for (std::int64_t n = 0; n < N; ++n) {
    const T* dy = dout + n * C;  // (C)
    const std::int64_t tok = tokens[n];
    if (tok >= vocab_start && tok < vocab_end) {
      T* row = dwte + (tok - vocab_start) * C;
      for (std::int64_t c = 0; c < C; ++c) row[c] += dy[c];
    }
    if (dwpe != nullptr) {
      T* prow = dwpe + static_cast<std::int64_t>(pos[n]) * C;
      for (std::int64_t c = 0; c < C; ++c) prow[c] += dy[c];
    }
  }
}

#define MEGASCOPE_INSTANTIATE(T)                                                                                     \
  template void embedding_forward<T>(T*, const std::int32_t*, const T*, const T*, const std::int32_t*, std::int64_t, \
                                     std::int64_t, std::int64_t, std::int64_t);                                      \
  template void embedding_backward<T>(T*, T*, const T*, const std::int32_t*, const std::int32_t*, std::int64_t,      \
                                      std::int64_t, std::int64_t, std::int64_t);
MEGASCOPE_INSTANTIATE(float)
MEGASCOPE_INSTANTIATE(double)
#undef MEGASCOPE_INSTANTIATE

}  // namespace megascope::kernels
