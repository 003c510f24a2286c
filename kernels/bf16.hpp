// Rounding an fp32 value to the nearest bfloat16 (round to nearest, ties to
// even), kept in an fp32: the host twin of CUDA's __float2bfloat16 followed by
// __bfloat162float. Infinities stay, NaN stays NaN, a finite value past the
// largest bf16 rounds to infinity (as __float2bfloat16 does).
#pragma once

#include <cstdint>
#include <cstring>

namespace megascope::kernels {

inline float round_to_bf16(float x) {
  std::uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7F800000u) == 0x7F800000u) {   // infinity or NaN: keep a NaN a NaN once truncated
    if (u & 0x007FFFFFu) u |= 0x00400000u;
  } else {
    u += 0x7FFFu + ((u >> 16) & 1u);
  }
  u &= 0xFFFF0000u;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// x[i] = round_to_bf16(x[i]) for i < n.
inline void round_to_bf16(float* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) x[i] = round_to_bf16(x[i]);
}

}  // namespace megascope::kernels
