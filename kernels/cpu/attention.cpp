// CPU softmax attention, one (batch, query head) at a time, in tiles of
// query rows so that at most kTile x Tk scores live at once. The backward
// recomputes the probabilities from the saved lse (as FlashAttention does).
// See kernels/attention.hpp.
#include "kernels/attention.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/check.hpp"

namespace megascope::kernels {

namespace {

constexpr std::int64_t kTile = 64;  // query rows per score tile

template <typename T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using Strided = Eigen::Map<Mat<T>, 0, Eigen::OuterStride<>>;
template <typename T>
using ConstStrided = Eigen::Map<const Mat<T>, 0, Eigen::OuterStride<>>;

struct Dims {
  std::int64_t B, Tq, Tk, Hq, Hkv, D;
};

void check_dims(const Dims& d) {
  MEGASCOPE_KERNEL_REQUIRE(d.B >= 0 && d.Tq >= 0 && d.Tk >= 0 && d.D > 0);
  MEGASCOPE_KERNEL_REQUIRE(d.Hkv > 0 && d.Hq > 0 && d.Hq % d.Hkv == 0);
}

// Visibility of key j to query i: in the same document (packed sequences;
// q_doc and kv_doc point at the current sequence's ids, null without
// documents) and, causal, not after it by positions.
struct Mask {
  const std::int32_t* q_pos;
  const std::int32_t* kv_pos;
  bool causal;
  const std::int32_t* q_doc = nullptr;
  const std::int32_t* kv_doc = nullptr;
  [[nodiscard]] bool visible(std::int64_t i, std::int64_t j) const {
    if (q_doc != nullptr && q_doc[i] != kv_doc[j]) return false;
    if (!causal) return true;
    const std::int64_t qp = q_pos != nullptr ? q_pos[i] : i;
    const std::int64_t kp = kv_pos != nullptr ? kv_pos[j] : j;
    return kp <= qp;
  }
};

// Views of head h of batch b in a (B, T, H, D) tensor as (T, D).
template <typename T>
ConstStrided<T> head(const T* base, std::int64_t b, std::int64_t h, std::int64_t Tn, std::int64_t H, std::int64_t D) {
  return ConstStrided<T>(base + (b * Tn * H + h) * D, Tn, D, Eigen::OuterStride<>(H * D));
}
template <typename T>
Strided<T> head(T* base, std::int64_t b, std::int64_t h, std::int64_t Tn, std::int64_t H, std::int64_t D) {
  return Strided<T>(base + (b * Tn * H + h) * D, Tn, D, Eigen::OuterStride<>(H * D));
}

// The forward and backward over any Mask; the documents' ids (B, Tq) and
// (B, Tk), or null.
template <typename T>
void forward_masked(T* out, T* lse, const T* q, const T* k, const T* v, const std::int32_t* q_pos,
                    const std::int32_t* kv_pos, const std::int32_t* q_doc, const std::int32_t* kv_doc, std::int64_t B,
                    std::int64_t Tq, std::int64_t Tk, std::int64_t Hq, std::int64_t Hkv, std::int64_t D, bool causal,
                    std::optional<float> scale) {
  const Dims dims{B, Tq, Tk, Hq, Hkv, D};
  check_dims(dims);
  MEGASCOPE_KERNEL_REQUIRE((q_doc == nullptr) == (kv_doc == nullptr));
  const T sc = scale ? static_cast<T>(*scale) : T(1) / std::sqrt(static_cast<T>(D));
  Mask mask{q_pos, kv_pos, causal};
  const std::int64_t group = Hq / Hkv;
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  Mat<T> S, P;
  for (std::int64_t b = 0; b < B; ++b) {
    if (q_doc != nullptr) {
      mask.q_doc = q_doc + b * Tq;
      mask.kv_doc = kv_doc + b * Tk;
    }
    for (std::int64_t h = 0; h < Hq; ++h) {
      const auto Q = head(q, b, h, Tq, Hq, D);           // (Tq, D)
      const auto K = head(k, b, h / group, Tk, Hkv, D);  // (Tk, D)
      const auto V = head(v, b, h / group, Tk, Hkv, D);  // (Tk, D)
      auto O = head(out, b, h, Tq, Hq, D);               // (Tq, D)
      T* L = lse + (b * Hq + h) * Tq;                    // (Tq)
      for (std::int64_t i0 = 0; i0 < Tq; i0 += kTile) {
        const std::int64_t rows = std::min(kTile, Tq - i0);
        S.noalias() = (Q.middleRows(i0, rows) * K.transpose()) * sc;  // (rows, Tk)
        P.resize(rows, Tk);
        for (std::int64_t r = 0; r < rows; ++r) {
          const std::int64_t i = i0 + r;
          T mx = kNegInf;
          for (std::int64_t j = 0; j < Tk; ++j)
            if (mask.visible(i, j)) mx = std::max(mx, S(r, j));
          if (mx == kNegInf) {  // no visible key
            P.row(r).setZero();
            L[i] = kNegInf;
            continue;
          }
          T sum = 0;
          for (std::int64_t j = 0; j < Tk; ++j) {
            const T p = mask.visible(i, j) ? std::exp(S(r, j) - mx) : T(0);
            P(r, j) = p;
            sum += p;
          }
          P.row(r) /= sum;
          L[i] = mx + std::log(sum);
        }
        O.middleRows(i0, rows).noalias() = P * V;
      }
    }
  }
}

template <typename T>
void backward_masked(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                     const T* lse, const std::int32_t* q_pos, const std::int32_t* kv_pos, const std::int32_t* q_doc,
                     const std::int32_t* kv_doc, std::int64_t B, std::int64_t Tq, std::int64_t Tk, std::int64_t Hq,
                     std::int64_t Hkv, std::int64_t D, bool causal, std::optional<float> scale) {
  const Dims dims{B, Tq, Tk, Hq, Hkv, D};
  check_dims(dims);
  MEGASCOPE_KERNEL_REQUIRE((q_doc == nullptr) == (kv_doc == nullptr));
  const T sc = scale ? static_cast<T>(*scale) : T(1) / std::sqrt(static_cast<T>(D));
  Mask mask{q_pos, kv_pos, causal};
  const std::int64_t group = Hq / Hkv;
  std::fill(dk, dk + B * Tk * Hkv * D, T(0));
  std::fill(dv, dv + B * Tk * Hkv * D, T(0));
  Mat<T> S, dP;
  for (std::int64_t b = 0; b < B; ++b) {
    if (q_doc != nullptr) {
      mask.q_doc = q_doc + b * Tq;
      mask.kv_doc = kv_doc + b * Tk;
    }
    for (std::int64_t h = 0; h < Hq; ++h) {
      const auto Q = head(q, b, h, Tq, Hq, D);           // (Tq, D)
      const auto K = head(k, b, h / group, Tk, Hkv, D);  // (Tk, D)
      const auto V = head(v, b, h / group, Tk, Hkv, D);  // (Tk, D)
      const auto O = head(out, b, h, Tq, Hq, D);         // (Tq, D)
      const auto dO = head(dout, b, h, Tq, Hq, D);       // (Tq, D)
      auto dQ = head(dq, b, h, Tq, Hq, D);               // (Tq, D)
      auto dK = head(dk, b, h / group, Tk, Hkv, D);      // (Tk, D), sums over the group
      auto dV = head(dv, b, h / group, Tk, Hkv, D);      // (Tk, D)
      const T* L = lse + (b * Hq + h) * Tq;              // (Tq)
      for (std::int64_t i0 = 0; i0 < Tq; i0 += kTile) {
        const std::int64_t rows = std::min(kTile, Tq - i0);
        // P = exp(scale Q K^T - lse) on visible keys (S becomes P in place).
        S.noalias() = (Q.middleRows(i0, rows) * K.transpose()) * sc;  // (rows, Tk)
        for (std::int64_t r = 0; r < rows; ++r) {
          const std::int64_t i = i0 + r;
          const bool empty = std::isinf(L[i]);
          for (std::int64_t j = 0; j < Tk; ++j)
            S(r, j) = (!empty && mask.visible(i, j)) ? std::exp(S(r, j) - L[i]) : T(0);
        }
        const auto dOt = dO.middleRows(i0, rows);  // (rows, D)
        dV.noalias() += S.transpose() * dOt;
        dP.noalias() = dOt * V.transpose();  // (rows, Tk)
        // dS = P (dP - delta), delta_i = dO_i . O_i (= sum_j P_ij dP_ij).
        for (std::int64_t r = 0; r < rows; ++r) {
          const T delta = dOt.row(r).dot(O.row(i0 + r));
          dP.row(r) = (S.row(r).array() * (dP.row(r).array() - delta)).matrix();
        }
        dQ.middleRows(i0, rows).noalias() = (dP * K) * sc;
        dK.noalias() += (dP.transpose() * Q.middleRows(i0, rows)) * sc;
      }
    }
  }
}

}  // namespace

template <typename T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const std::int32_t* q_pos,
                       const std::int32_t* kv_pos, std::int64_t B, std::int64_t Tq, std::int64_t Tk, std::int64_t Hq,
                       std::int64_t Hkv, std::int64_t D, bool causal, std::optional<float> scale) {
  forward_masked(out, lse, q, k, v, q_pos, kv_pos, nullptr, nullptr, B, Tq, Tk, Hq, Hkv, D, causal, scale);
}

template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                        const T* lse, const std::int32_t* q_pos, const std::int32_t* kv_pos, std::int64_t B,
                        std::int64_t Tq, std::int64_t Tk, std::int64_t Hq, std::int64_t Hkv, std::int64_t D,
                        bool causal, std::optional<float> scale) {
  backward_masked(dq, dk, dv, dout, q, k, v, out, lse, q_pos, kv_pos, nullptr, nullptr, B, Tq, Tk, Hq, Hkv, D, causal,
                  scale);
}

template <typename T>
void attention_forward_packed(T* out, T* lse, const T* q, const T* k, const T* v, const std::int32_t* q_pos,
                              const std::int32_t* kv_pos, const std::int32_t* q_doc, const std::int32_t* kv_doc,
                              std::int64_t B, std::int64_t Tq, std::int64_t Tk, std::int64_t Hq, std::int64_t Hkv,
                              std::int64_t D, bool causal, std::optional<float> scale) {
  forward_masked(out, lse, q, k, v, q_pos, kv_pos, q_doc, kv_doc, B, Tq, Tk, Hq, Hkv, D, causal, scale);
}

template <typename T>
void attention_backward_packed(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                               const T* lse, const std::int32_t* q_pos, const std::int32_t* kv_pos,
                               const std::int32_t* q_doc, const std::int32_t* kv_doc, std::int64_t B, std::int64_t Tq,
                               std::int64_t Tk, std::int64_t Hq, std::int64_t Hkv, std::int64_t D, bool causal,
                               std::optional<float> scale) {
  backward_masked(dq, dk, dv, dout, q, k, v, out, lse, q_pos, kv_pos, q_doc, kv_doc, B, Tq, Tk, Hq, Hkv, D, causal,
                  scale);
}

void document_ids(std::int32_t* doc, std::int32_t* doc_pos, const std::int32_t* cu_seqlens, std::int64_t docs,
                  std::int64_t S) {
  MEGASCOPE_KERNEL_REQUIRE(docs >= 0 && S >= 0 && doc != nullptr && cu_seqlens != nullptr);
  MEGASCOPE_KERNEL_REQUIRE(cu_seqlens[0] == 0 && cu_seqlens[docs] <= S);
  for (std::int64_t i = 0; i < docs; ++i) MEGASCOPE_KERNEL_REQUIRE(cu_seqlens[i] <= cu_seqlens[i + 1]);
  std::int64_t i = 0;
  for (std::int64_t p = 0; p < S; ++p) {
    while (i < docs && p >= cu_seqlens[i + 1]) ++i;   // past document i: the next (padding once i = docs)
    doc[p] = static_cast<std::int32_t>(i);
    if (doc_pos != nullptr) doc_pos[p] = static_cast<std::int32_t>(p - cu_seqlens[i]);
  }
}

template <typename T>
void attention_merge(T* out, T* lse, const T* out2, const T* lse2, std::int64_t B, std::int64_t Tq, std::int64_t H,
                     std::int64_t D) {
  MEGASCOPE_KERNEL_REQUIRE(B >= 0 && Tq >= 0 && H >= 0 && D >= 0);
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < H; ++h) {
      for (std::int64_t t = 0; t < Tq; ++t) {
        T& l1 = lse[(b * H + h) * Tq + t];
        const T l2 = lse2[(b * H + h) * Tq + t];
        const T mx = std::max(l1, l2);
        if (mx == kNegInf) continue;  // neither saw a key
        const T merged = mx + std::log(std::exp(l1 - mx) + std::exp(l2 - mx));
        const T w1 = std::exp(l1 - merged), w2 = std::exp(l2 - merged);
        T* o = out + ((b * Tq + t) * H + h) * D;          // (D)
        const T* o2 = out2 + ((b * Tq + t) * H + h) * D;  // (D)
        for (std::int64_t d = 0; d < D; ++d) o[d] = w1 * o[d] + w2 * o2[d];
        l1 = merged;
      }
    }
  }
}

#define MEGASCOPE_INSTANTIATE(T)                                                                                     \
  template void attention_forward<T>(T*, T*, const T*, const T*, const T*, const std::int32_t*, const std::int32_t*, \
                                     std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,           \
                                     std::int64_t, bool, std::optional<float>);                                      \
  template void attention_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, const T*,        \
                                      const std::int32_t*, const std::int32_t*, std::int64_t, std::int64_t,          \
                                      std::int64_t, std::int64_t, std::int64_t, std::int64_t, bool,                  \
                                      std::optional<float>);                                                         \
  template void attention_forward_packed<T>(T*, T*, const T*, const T*, const T*, const std::int32_t*,               \
                                            const std::int32_t*, const std::int32_t*, const std::int32_t*,            \
                                            std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,    \
                                            std::int64_t, bool, std::optional<float>);                               \
  template void attention_backward_packed<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, const T*, \
                                             const std::int32_t*, const std::int32_t*, const std::int32_t*,           \
                                             const std::int32_t*, std::int64_t, std::int64_t, std::int64_t,           \
                                             std::int64_t, std::int64_t, std::int64_t, bool, std::optional<float>);   \
  template void attention_merge<T>(T*, T*, const T*, const T*, std::int64_t, std::int64_t, std::int64_t, std::int64_t);
MEGASCOPE_INSTANTIATE(float)
MEGASCOPE_INSTANTIATE(double)
#undef MEGASCOPE_INSTANTIATE

}  // namespace megascope::kernels
