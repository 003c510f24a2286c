// MLP activations, element-wise.
// GeLU is the tanh approximation (GPT-2, Megatron's --openai-gelu and its
// fused bias-GeLU): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), not the
// erf form. SwiGLU follows Megatron's chunk order (--swiglu): the gate is the
// FIRST half of the fc1 output, the up projection the second half.
// Does not: fuse the bias (matmul_forward adds it), squared ReLU, GeGLU.
// Element-wise kernels allow out == inp.
#pragma once

#include <cstdint>

namespace megascope::kernels {

// out (n) = gelu(inp (n)).
template <typename T>
void gelu_forward(T* out, const T* inp, std::int64_t n);

// dinp (n) = gelu'(inp) * dout. Overwrites dinp.
template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, std::int64_t n);

// inp (N, 2F) = [gate | up]; out (N, F) = silu(gate) * up, silu(x) = x sigmoid(x).
template <typename T>
void swiglu_forward(T* out, const T* inp, std::int64_t N, std::int64_t F);

// dinp (N, 2F) from dout (N, F) and the forward's inp (N, 2F). Overwrites dinp.
template <typename T>
void swiglu_backward(T* dinp, const T* inp, const T* dout, std::int64_t N, std::int64_t F);

}  // namespace megascope::kernels
