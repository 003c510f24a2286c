// CPU MoE router and token permutation. See kernels/moe.hpp.
#include "kernels/moe.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/check.hpp"

namespace megascope::kernels {

template <typename T>
void moe_router_forward(T* probs, std::int32_t* experts, T* scores, const T* logits, std::int64_t N, std::int64_t E,
                        std::int64_t k, bool renormalize) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && E > 0 && k > 0 && k <= E);
  std::vector<bool> taken(static_cast<std::size_t>(E));
  for (std::int64_t n = 0; n < N; ++n) {
    const T* l = logits + n * E;  // (E)
    T* s = scores + n * E;        // (E)
    const T mx = *std::max_element(l, l + E);
    T sum = 0;
    for (std::int64_t e = 0; e < E; ++e) sum += (s[e] = std::exp(l[e] - mx));
    for (std::int64_t e = 0; e < E; ++e) s[e] /= sum;
    // k passes of argmax: descending, ties to the lower index.
    std::fill(taken.begin(), taken.end(), false);
    T total = 0;
    for (std::int64_t j = 0; j < k; ++j) {
      std::int64_t best = -1;
      for (std::int64_t e = 0; e < E; ++e)
        if (!taken[static_cast<std::size_t>(e)] && (best < 0 || s[e] > s[best])) best = e;
      taken[static_cast<std::size_t>(best)] = true;
      experts[n * k + j] = static_cast<std::int32_t>(best);
      probs[n * k + j] = s[best];
      total += s[best];
    }
    if (renormalize)
      for (std::int64_t j = 0; j < k; ++j) probs[n * k + j] /= total;
  }
}

template <typename T>
void moe_router_backward(T* dlogits, const T* dprobs, const std::int32_t* experts, const T* scores, std::int64_t N,
                         std::int64_t E, std::int64_t k, bool renormalize) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && E > 0 && k > 0 && k <= E);
  std::vector<T> ds(static_cast<std::size_t>(E));  // dL/dscores of one row
  for (std::int64_t n = 0; n < N; ++n) {
    const T* s = scores + n * E;               // (E)
    const T* dp = dprobs + n * k;              // (k)
    const std::int32_t* ex = experts + n * k;  // (k)
    std::fill(ds.begin(), ds.end(), T(0));
    if (renormalize) {
      // p_j = s_j / Z, Z = sum of the chosen s: ds_j = (dp_j - sum_i dp_i p_i) / Z.
      T Z = 0;
      for (std::int64_t j = 0; j < k; ++j) Z += s[ex[j]];
      T dot = 0;
      for (std::int64_t j = 0; j < k; ++j) dot += dp[j] * s[ex[j]] / Z;
      for (std::int64_t j = 0; j < k; ++j) ds[static_cast<std::size_t>(ex[j])] = (dp[j] - dot) / Z;
    } else {
      for (std::int64_t j = 0; j < k; ++j) ds[static_cast<std::size_t>(ex[j])] = dp[j];
    }
    // Softmax backward: dl = s (ds - sum_e ds_e s_e).
    T dot = 0;
    for (std::int64_t e = 0; e < E; ++e) dot += ds[static_cast<std::size_t>(e)] * s[e];
    for (std::int64_t e = 0; e < E; ++e) dlogits[n * E + e] = s[e] * (ds[static_cast<std::size_t>(e)] - dot);
  }
}

void moe_permute_indices(std::int32_t* row_to_slot, std::int32_t* slot_to_row, std::int64_t* counts,
                         const std::int32_t* experts, std::int64_t N, std::int64_t E, std::int64_t k) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && E > 0 && k > 0);
  MEGASCOPE_KERNEL_REQUIRE(N * k <= std::numeric_limits<std::int32_t>::max());
  const std::int64_t slots = N * k;
  std::fill(counts, counts + E, std::int64_t{0});
  for (std::int64_t s = 0; s < slots; ++s) {
    MEGASCOPE_KERNEL_REQUIRE(experts[s] >= 0 && experts[s] < E);
    ++counts[experts[s]];
  }
  std::vector<std::int64_t> next(static_cast<std::size_t>(E));  // next free row of each expert
  std::int64_t start = 0;
  for (std::int64_t e = 0; e < E; ++e) {
    next[static_cast<std::size_t>(e)] = start;
    start += counts[e];
  }
  for (std::int64_t s = 0; s < slots; ++s) {  // slots in order: stable within an expert
    const std::int64_t r = next[static_cast<std::size_t>(experts[s])]++;
    row_to_slot[r] = static_cast<std::int32_t>(s);
    slot_to_row[s] = static_cast<std::int32_t>(r);
  }
}

template <typename T>
void moe_permute_forward(T* permuted, const T* inp, const std::int32_t* row_to_slot, std::int64_t N, std::int64_t C,
                         std::int64_t k) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && C >= 0 && k > 0);
  for (std::int64_t r = 0; r < N * k; ++r) {
    const T* x = inp + (row_to_slot[r] / k) * C;  // (C)
    std::copy(x, x + C, permuted + r * C);
  }
}

template <typename T>
void moe_permute_backward(T* dinp, const T* dpermuted, const std::int32_t* slot_to_row, std::int64_t N, std::int64_t C,
                          std::int64_t k) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && C >= 0 && k > 0);
  for (std::int64_t n = 0; n < N; ++n) {
    T* dx = dinp + n * C;  // (C)
    std::fill(dx, dx + C, T(0));
    for (std::int64_t j = 0; j < k; ++j) {
      const T* d = dpermuted + static_cast<std::int64_t>(slot_to_row[n * k + j]) * C;
      for (std::int64_t c = 0; c < C; ++c) dx[c] += d[c];
    }
  }
}

template <typename T>
void moe_unpermute_forward(T* out, const T* expert_out, const T* probs, const std::int32_t* slot_to_row, std::int64_t N,
                           std::int64_t C, std::int64_t k) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && C >= 0 && k > 0);
  for (std::int64_t n = 0; n < N; ++n) {
    T* y = out + n * C;  // (C)
    std::fill(y, y + C, T(0));
    for (std::int64_t j = 0; j < k; ++j) {
      const T w = probs[n * k + j];
      const T* e = expert_out + static_cast<std::int64_t>(slot_to_row[n * k + j]) * C;
      for (std::int64_t c = 0; c < C; ++c) y[c] += w * e[c];
    }
  }
}

template <typename T>
void moe_unpermute_backward(T* dexpert_out, T* dprobs, const T* dout, const T* expert_out, const T* probs,
                            const std::int32_t* slot_to_row, std::int64_t N, std::int64_t C, std::int64_t k) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && C >= 0 && k > 0);
  for (std::int64_t s = 0; s < N * k; ++s) {
    const T* dy = dout + (s / k) * C;  // (C)
    const std::int64_t r = slot_to_row[s];
    const T* e = expert_out + r * C;  // (C)
    T* de = dexpert_out + r * C;      // (C)
    T dot = 0;
    for (std::int64_t c = 0; c < C; ++c) {
      de[c] = probs[s] * dy[c];
      dot += dy[c] * e[c];
    }
    dprobs[s] = dot;
  }
}

#define MEGASCOPE_INSTANTIATE(T)                                                                                      \
  template void moe_router_forward<T>(T*, std::int32_t*, T*, const T*, std::int64_t, std::int64_t, std::int64_t,      \
                                      bool);                                                                          \
  template void moe_router_backward<T>(T*, const T*, const std::int32_t*, const T*, std::int64_t, std::int64_t,       \
                                       std::int64_t, bool);                                                           \
  template void moe_permute_forward<T>(T*, const T*, const std::int32_t*, std::int64_t, std::int64_t, std::int64_t);  \
  template void moe_permute_backward<T>(T*, const T*, const std::int32_t*, std::int64_t, std::int64_t, std::int64_t); \
  template void moe_unpermute_forward<T>(T*, const T*, const T*, const std::int32_t*, std::int64_t, std::int64_t,     \
                                         std::int64_t);                                                               \
  template void moe_unpermute_backward<T>(T*, T*, const T*, const T*, const T*, const std::int32_t*, std::int64_t,    \
                                          std::int64_t, std::int64_t);
MEGASCOPE_INSTANTIATE(float)
MEGASCOPE_INSTANTIATE(double)
#undef MEGASCOPE_INSTANTIATE

}  // namespace megascope::kernels
