// Case launchers shared by GPU calibration and the replay (exec/cuda/launch.hpp).
#include "exec/cuda/launch.hpp"

#include "exec/cuda/device_kernels.hpp"
#include "kernels/cuda/kernels.hpp"

namespace megascope::exec::cuda {

namespace {
namespace ku = megascope::kernels::cuda;
constexpr float kEps = 1e-5f, kTheta = 10000.0f;
}  // namespace

void Buffers::fill(float* p, std::int64_t n, float lo, float hi) { fill_uniform(p, n, ++seed_, lo, hi, stream()); }
void Buffers::fill(bf16* p, std::int64_t n, float lo, float hi) { fill_uniform(p, n, ++seed_, lo, hi, stream()); }
void Buffers::fill(fp8e4m3* p, std::int64_t n, float lo, float hi) { fill_uniform(p, n, ++seed_, lo, hi, stream()); }

std::optional<Call> gemm_call(const GemmCase& c, GemmDtype dtype, Gemm& gemm, Buffers& b) {
  const std::int64_t m = c.shape.m, n = c.shape.n, k = c.shape.k;
  const cudaStream_t st = b.stream();
  if (dtype == GemmDtype::fp8_e4m3) {   // forward only (gemm.hpp): out (m, n) = a (m, k) . w (n, k)^T
    if (c.pass != GemmPass::forward || !gemm.fp8_supported() || k % 16 != 0 || n % 16 != 0) return std::nullopt;
    auto* a = b.alloc<fp8e4m3>(m * k);
    auto* w = b.alloc<fp8e4m3>(n * k);
    auto* out = b.alloc<bf16>(m * n);
    auto* bias = c.bias ? b.alloc<bf16>(n) : nullptr;
    auto* scales = b.alloc<float>(8, 1.0f, 1.0f);   // two 16-byte-aligned scales: no staging copy in the timing
    return [=, &gemm] { gemm.forward_fp8(out, a, w, bias, scales, scales + 4, m, k, n, st); };
  }
  const bool f32 = dtype == GemmDtype::fp32;
  switch (c.pass) {
    case GemmPass::forward:   // forward(N = m, C = k, OC = n)
      if (f32) {
        auto *a = b.alloc<float>(m * k), *w = b.alloc<float>(n * k), *out = b.alloc<float>(m * n);
        auto* bias = c.bias ? b.alloc<float>(n) : nullptr;
        return [=, &gemm] { gemm.forward<float>(out, a, w, bias, m, k, n, st); };
      } else {
        auto *a = b.alloc<bf16>(m * k), *w = b.alloc<bf16>(n * k), *out = b.alloc<bf16>(m * n);
        auto* bias = c.bias ? b.alloc<bf16>(n) : nullptr;
        return [=, &gemm] { gemm.forward<bf16>(out, a, w, bias, m, k, n, st); };
      }
    case GemmPass::backward_input:   // backward_input(N = m, C = n, OC = k): dinp (m, n) = dout (m, k) . w (k, n)
      if (f32) {
        auto *dout = b.alloc<float>(m * k), *w = b.alloc<float>(k * n), *dinp = b.alloc<float>(m * n);
        return [=, &gemm] { gemm.backward_input<float>(dinp, dout, w, m, n, k, st); };
      } else {
        auto *dout = b.alloc<bf16>(m * k), *w = b.alloc<bf16>(k * n), *dinp = b.alloc<bf16>(m * n);
        return [=, &gemm] { gemm.backward_input<bf16>(dinp, dout, w, m, n, k, st); };
      }
    case GemmPass::backward_weight: {   // backward_weight(N = k, C = m, OC = n): dw (n, m) += dout (k, n)^T . inp (k, m)
      auto* dw = b.alloc<float>(n * m);
      auto* dbias = c.bias ? b.alloc<float>(n) : nullptr;
      if (f32) {
        auto *dout = b.alloc<float>(k * n), *inp = b.alloc<float>(k * m);
        return [=, &gemm] { gemm.backward_weight<float>(dw, dbias, dout, inp, k, m, n, st); };
      }
      auto *dout = b.alloc<bf16>(k * n), *inp = b.alloc<bf16>(k * m);
      return [=, &gemm] { gemm.backward_weight<bf16>(dw, dbias, dout, inp, k, m, n, st); };
    }
  }
  return std::nullopt;
}

std::optional<Call> memory_call(const MemoryCase& c, Buffers& b) {
  const std::int64_t N = c.rows, C = c.width, e = N * C;
  const cudaStream_t st = b.stream();
  switch (c.kernel) {
    case MemoryKernel::layernorm_fwd: {
      auto *y = b.alloc<bf16>(e), *x = b.alloc<bf16>(e), *w = b.alloc<bf16>(C), *wb = b.alloc<bf16>(C);
      auto *mean = b.alloc<float>(N), *rstd = b.alloc<float>(N);
      return [=] { ku::layernorm_forward<bf16>(y, mean, rstd, x, w, wb, N, C, kEps, st); };
    }
    case MemoryKernel::layernorm_bwd: {
      auto *dx = b.alloc<bf16>(e), *dy = b.alloc<bf16>(e), *x = b.alloc<bf16>(e), *w = b.alloc<bf16>(C);
      auto *dw = b.alloc<float>(C), *db = b.alloc<float>(C), *mean = b.alloc<float>(N), *rstd = b.alloc<float>(N, 0.5f, 2.0f);
      return [=] { ku::layernorm_backward<bf16>(dx, dw, db, dy, x, w, mean, rstd, N, C, st); };
    }
    case MemoryKernel::rmsnorm_fwd: {
      auto *y = b.alloc<bf16>(e), *x = b.alloc<bf16>(e), *w = b.alloc<bf16>(C);
      auto* rstd = b.alloc<float>(N);
      return [=] { ku::rmsnorm_forward<bf16>(y, rstd, x, w, N, C, kEps, st); };
    }
    case MemoryKernel::rmsnorm_bwd: {
      auto *dx = b.alloc<bf16>(e), *dy = b.alloc<bf16>(e), *x = b.alloc<bf16>(e), *w = b.alloc<bf16>(C);
      auto *dw = b.alloc<float>(C), *rstd = b.alloc<float>(N, 0.5f, 2.0f);
      return [=] { ku::rmsnorm_backward<bf16>(dx, dw, dy, x, w, rstd, N, C, st); };
    }
    case MemoryKernel::gelu_fwd: {
      auto *y = b.alloc<bf16>(e), *x = b.alloc<bf16>(e);
      return [=] { ku::gelu_forward<bf16>(y, x, e, st); };
    }
    case MemoryKernel::gelu_bwd: {
      auto *dx = b.alloc<bf16>(e), *x = b.alloc<bf16>(e), *dy = b.alloc<bf16>(e);
      return [=] { ku::gelu_backward<bf16>(dx, x, dy, e, st); };
    }
    case MemoryKernel::swiglu_fwd: {   // (N, 2C) -> (N, C)
      auto *y = b.alloc<bf16>(e), *x = b.alloc<bf16>(2 * e);
      return [=] { ku::swiglu_forward<bf16>(y, x, N, C, st); };
    }
    case MemoryKernel::swiglu_bwd: {
      auto *dx = b.alloc<bf16>(2 * e), *x = b.alloc<bf16>(2 * e), *dy = b.alloc<bf16>(e);
      return [=] { ku::swiglu_backward<bf16>(dx, x, dy, N, C, st); };
    }
    case MemoryKernel::bias_dropout_add_fwd: {
      auto *y = b.alloc<bf16>(e), *x = b.alloc<bf16>(e), *bias = b.alloc<bf16>(C), *res = b.alloc<bf16>(e);
      return [=] { ku::bias_dropout_add_forward<bf16>(y, x, bias, res, N, C, c.dropout, 17, 0, st); };
    }
    case MemoryKernel::bias_dropout_add_bwd: {
      auto *dx = b.alloc<bf16>(e), *dy = b.alloc<bf16>(e);
      auto* dbias = b.alloc<float>(C);
      return [=] { ku::bias_dropout_add_backward<bf16>(dx, dbias, dy, N, C, c.dropout, 17, 0, st); };
    }
    case MemoryKernel::embedding_fwd:
    case MemoryKernel::embedding_bwd: {
      // A vocabulary shard of 8192 rows: tokens spread over it (the atomics
      // of the backward see little contention, as with a real vocabulary).
      constexpr std::int64_t kVocab = 8192;
      auto* tokens = b.ids(N, kVocab);
      if (c.kernel == MemoryKernel::embedding_fwd) {
        auto *y = b.alloc<bf16>(e), *wte = b.alloc<bf16>(kVocab * C);
        return [=] { ku::embedding_forward<bf16>(y, tokens, wte, nullptr, nullptr, N, C, 0, kVocab, st); };
      }
      auto* dy = b.alloc<bf16>(e);
      auto* dwte = b.alloc<float>(kVocab * C);
      return [=] { ku::embedding_backward<bf16>(dwte, nullptr, dy, tokens, nullptr, N, C, 0, kVocab, st); };
    }
    case MemoryKernel::cross_entropy_fwd: {   // (N, V = C) logits: local max, sum of exps, target, loss
      auto* logits = b.alloc<bf16>(e);
      auto* targets = b.ids(N, C);
      auto *row_max = b.alloc<float>(N), *sumexp = b.alloc<float>(N), *target = b.alloc<float>(N), *loss = b.alloc<float>(N);
      return [=] {
        ku::cross_entropy_local_max<bf16>(row_max, logits, N, C, st);
        ku::cross_entropy_local_sumexp<bf16>(sumexp, logits, row_max, N, C, st);
        ku::cross_entropy_local_target<bf16>(target, logits, targets, N, C, 0, st);
        ku::cross_entropy_loss(loss, row_max, sumexp, target, N, st);
      };
    }
    case MemoryKernel::cross_entropy_bwd: {
      auto *logits = b.alloc<bf16>(e), *dlogits = b.alloc<bf16>(e);
      auto* targets = b.ids(N, C);
      auto *row_max = b.alloc<float>(N), *sumexp = b.alloc<float>(N), *dloss = b.alloc<float>(N, 1e-4f, 1e-4f);
      ku::cross_entropy_local_max<bf16>(row_max, logits, N, C, st);
      ku::cross_entropy_local_sumexp<bf16>(sumexp, logits, row_max, N, C, st);
      return [=] { ku::cross_entropy_backward<bf16>(dlogits, logits, row_max, sumexp, targets, dloss, N, C, 0, st); };
    }
    case MemoryKernel::adamw: {   // fp32 master weights and moments, bf16 gradients
      auto *p = b.alloc<float>(e), *m = b.alloc<float>(e), *v = b.alloc<float>(e, 0.0f, 1e-3f);
      auto* g = b.alloc<bf16>(e);
      return [=] { ku::adamw_update<bf16>(p, g, m, v, e, 1e-9f, 0.9f, 0.95f, 1e-8f, 0.01f, 10, 1.0f, st); };
    }
  }
  return std::nullopt;
}

std::optional<Call> attention_call(const AttentionCase& c, Buffers& b) {
  const AttentionShape& a = c.shape;
  const std::int64_t B = a.batch, Tq = a.seq_q, Tk = a.seq_kv > 0 ? a.seq_kv : a.seq_q, Hq = a.heads,
                     Hkv = a.kv_heads > 0 ? a.kv_heads : a.heads, D = a.head_dim;
  if (D > 256 || (a.head_dim_v != 0 && a.head_dim_v != a.head_dim)) return std::nullopt;   // not a kernel we have
  const bool causal = a.causal, rope = c.rope;
  const cudaStream_t st = b.stream();
  if (!c.backward) {
    auto *q = b.alloc<bf16>(B * Tq * Hq * D), *k = b.alloc<bf16>(B * Tk * Hkv * D), *v = b.alloc<bf16>(B * Tk * Hkv * D);
    auto *qr = b.alloc<bf16>(B * Tq * Hq * D), *kr = b.alloc<bf16>(B * Tk * Hkv * D);
    auto* o = b.alloc<bf16>(B * Tq * Hq * D);
    auto* lse = b.alloc<float>(B * Hq * Tq);
    return [=] {
      if (rope) {
        ku::rope_forward<bf16>(qr, q, nullptr, B, Tq, Hq, D, kTheta, st);
        ku::rope_forward<bf16>(kr, k, nullptr, B, Tk, Hkv, D, kTheta, st);
      }
      ku::attention_forward<bf16>(o, lse, rope ? qr : q, rope ? kr : k, v, nullptr, nullptr, B, Tq, Tk, Hq, Hkv, D,
                                  causal, std::nullopt, st);
    };
  }
  // The backward's work depends on the probabilities exp(q.k - lse): its
  // inputs are its own, and out and lse come from a forward on them.
  auto *q = b.own<bf16>(B * Tq * Hq * D), *k = b.own<bf16>(B * Tk * Hkv * D), *v = b.own<bf16>(B * Tk * Hkv * D);
  auto *qr = b.alloc<bf16>(B * Tq * Hq * D), *kr = b.alloc<bf16>(B * Tk * Hkv * D);
  auto* o = b.own<bf16>(B * Tq * Hq * D);
  auto* lse = b.own<float>(B * Hq * Tq);
  ku::attention_forward<bf16>(o, lse, q, k, v, nullptr, nullptr, B, Tq, Tk, Hq, Hkv, D, causal, std::nullopt, st);
  auto *dq = b.alloc<bf16>(B * Tq * Hq * D), *dk = b.alloc<bf16>(B * Tk * Hkv * D), *dv = b.alloc<bf16>(B * Tk * Hkv * D);
  auto* dout = b.alloc<bf16>(B * Tq * Hq * D);
  return [=] {
    ku::attention_backward<bf16>(dq, dk, dv, dout, q, k, v, o, lse, nullptr, nullptr, B, Tq, Tk, Hq, Hkv, D, causal,
                                 std::nullopt, st);
    if (rope) {
      ku::rope_backward<bf16>(qr, dq, nullptr, B, Tq, Hq, D, kTheta, st);
      ku::rope_backward<bf16>(kr, dk, nullptr, B, Tk, Hkv, D, kTheta, st);
    }
  };
}

}  // namespace megascope::exec::cuda
