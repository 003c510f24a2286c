// Rotary position embedding, rotate-half convention (Megatron, Llama / HF):
// for i < D/2, with x1 = x[i], x2 = x[i + D/2], angle = pos * theta^(-2i/D):
//   out[i]       = x1 cos(angle) - x2 sin(angle)
//   out[i + D/2] = x2 cos(angle) + x1 sin(angle)
// Applied to q (B, S, Hq, D) and k (B, S, Hkv, D) alike (H is either; S is
// the sequence length, Megatron's s).
// Does not: interleaved (GPT-J) pairs, partial rotary (rotary_percent < 1),
// frequency scaling (YaRN, Llama 3.1 low/high-frequency factors).
// Element-wise: out == inp is allowed.
#pragma once

#include <cstdint>

namespace megascope::kernels {

// out (B, S, H, D) = rope(inp (B, S, H, D)); pos (S) absolute positions
// (nullptr = 0..S-1; with context parallelism pass the chunk's global
// positions). D must be even.
template <typename T>
void rope_forward(T* out, const T* inp, const std::int32_t* pos /*nullable*/, std::int64_t B, std::int64_t S,
                  std::int64_t H, std::int64_t D, float theta);

// dinp (B, S, H, D) = the inverse rotation of dout. Overwrites.
template <typename T>
void rope_backward(T* dinp, const T* dout, const std::int32_t* pos /*nullable*/, std::int64_t B, std::int64_t S,
                   std::int64_t H, std::int64_t D, float theta);

}  // namespace megascope::kernels
