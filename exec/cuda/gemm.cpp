// cuBLASLt GEMMs of a linear layer (exec/cuda/gemm.hpp).
#include "exec/cuda/gemm.hpp"

#include <string>
#include <type_traits>

#include "exec/cuda/cublaslt.hpp"
#include "exec/cuda/device_kernels.hpp"
#include "kernels/check.hpp"

namespace megascope::exec::cuda {

const char* to_string(GemmDtype d) {
  switch (d) {
    case GemmDtype::fp32: return "fp32";
    case GemmDtype::bfloat16: return "bf16";
    case GemmDtype::fp8_e4m3: return "fp8_e4m3";
  }
  return "?";
}

const char* Gemm::pass_name(Pass p) {
  switch (p) {
    case Pass::forward: return "forward";
    case Pass::backward_input: return "backward_input";
    case Pass::backward_weight: return "backward_weight";
  }
  return "?";
}

namespace {

template <typename T>
constexpr GemmDtype dtype_of() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, bf16>, "Gemm: T is float or __nv_bfloat16");
  return std::is_same_v<T, float> ? GemmDtype::fp32 : GemmDtype::bfloat16;
}

// log2 of the largest power of two <= 256 dividing the address (8 for null).
std::uint32_t align_log2(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t l = 0;
  while (l < 8 && (a & ((std::uintptr_t{1} << (l + 1)) - 1)) == 0) ++l;
  return l;
}

std::uint32_t alignments(const void* a, const void* b, const void* c, const void* d) {
  return align_log2(a) | align_log2(b) << 4 | align_log2(c) << 8 | align_log2(d) << 12;
}

void check_dims(std::int64_t N, std::int64_t C, std::int64_t OC) { MEGASCOPE_KERNEL_REQUIRE(N >= 0 && C >= 0 && OC >= 0); }

template <typename V>
void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const V& value) {
  MEGASCOPE_CUBLAS_CHECK(lt().cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}

}  // namespace

// Descriptors and the chosen algorithm of one cached GEMM.
struct Gemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  std::size_t workspace_bytes = 0;
  bool bias = false, scales = false;
  ~Plan() {
    if (a) (void)lt().cublasLtMatrixLayoutDestroy(a);
    if (b) (void)lt().cublasLtMatrixLayoutDestroy(b);
    if (c) (void)lt().cublasLtMatrixLayoutDestroy(c);
    if (d) (void)lt().cublasLtMatrixLayoutDestroy(d);
    if (desc) (void)lt().cublasLtMatmulDescDestroy(desc);
  }
};

Gemm::Gemm() : info_(device_info()) { MEGASCOPE_CUBLAS_CHECK(lt().cublasLtCreate(&handle_)); }

Gemm::~Gemm() {
  plans_.clear();
  if (handle_) (void)lt().cublasLtDestroy(handle_);
}

const float* Gemm::unit_scales() {
  if (unit_scales_.get() == nullptr) {
    unit_scales_ = DeviceMemory(sizeof(float));
    const float one = 1.0f;
    MEGASCOPE_CUDA_CHECK(cudaMemcpy(unit_scales_.get(), &one, sizeof(one), cudaMemcpyHostToDevice));
  }
  return static_cast<const float*>(unit_scales_.get());
}

void* Gemm::workspace(cudaStream_t stream) {
  auto it = workspaces_.find(stream);
  if (it == workspaces_.end()) it = workspaces_.emplace(stream, DeviceMemory(kGemmWorkspaceBytes)).first;
  return it->second.get();
}

Gemm::Plan& Gemm::plan(const Key& key) {
  if (auto it = plans_.find(key); it != plans_.end()) return *it->second;
  if (plans_.size() >= kGemmMaxPlans) plans_.clear();
  const auto [pass, dtype, N, C, OC, bias, align] = key;
  auto p = std::make_unique<Plan>();
  p->bias = bias;
  p->scales = dtype == GemmDtype::fp8_e4m3;

  const cudaDataType_t in = dtype == GemmDtype::fp32 ? CUDA_R_32F : dtype == GemmDtype::bfloat16 ? CUDA_R_16BF : CUDA_R_8F_E4M3;
  const cudaDataType_t out =
      dtype == GemmDtype::fp32 || pass == Pass::backward_weight ? CUDA_R_32F : CUDA_R_16BF;
  MEGASCOPE_CUBLAS_CHECK(lt().cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // Column-major views (gemm.hpp): stored (rows, cols, ld) of A, B and D, and the ops.
  struct View {
    std::uint64_t rows, cols;
    std::int64_t ld;
  };
  View va{}, vb{}, vd{};
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  const auto u = [](std::int64_t x) { return static_cast<std::uint64_t>(x); };
  switch (pass) {
    case Pass::forward:          // out^T (OC, N) = W (OC, C) . inp^T (C, N): A = weight stored (C, OC), transposed
      va = {u(C), u(OC), C};
      vb = {u(C), u(N), C};
      vd = {u(OC), u(N), OC};
      ta = CUBLAS_OP_T;
      break;
    case Pass::backward_input:   // dinp^T (C, N) = W^T (C, OC) . dout^T (OC, N)
      va = {u(C), u(OC), C};
      vb = {u(OC), u(N), OC};
      vd = {u(C), u(N), C};
      break;
    case Pass::backward_weight:  // dW^T (C, OC) = inp^T (C, N) . dout (N, OC): B = dout stored (OC, N), transposed
      va = {u(C), u(N), C};
      vb = {u(OC), u(N), OC};
      vd = {u(C), u(OC), C};
      tb = CUBLAS_OP_T;
      break;
  }
  set(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, ta);
  set(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, tb);
  if (bias) {
    set(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
    set(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, dtype == GemmDtype::fp32 ? CUDA_R_32F : CUDA_R_16BF);
  }
  if (p->scales) {   // the heuristic picks among scaled FP8 kernels only if the descriptor has scales
    const float* unit = unit_scales();
    set(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, unit);
    set(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, unit);
  }
  MEGASCOPE_CUBLAS_CHECK(lt().cublasLtMatrixLayoutCreate(&p->a, in, va.rows, va.cols, va.ld));
  MEGASCOPE_CUBLAS_CHECK(lt().cublasLtMatrixLayoutCreate(&p->b, in, vb.rows, vb.cols, vb.ld));
  MEGASCOPE_CUBLAS_CHECK(lt().cublasLtMatrixLayoutCreate(&p->c, out, vd.rows, vd.cols, vd.ld));
  MEGASCOPE_CUBLAS_CHECK(lt().cublasLtMatrixLayoutCreate(&p->d, out, vd.rows, vd.cols, vd.ld));

  cublasLtMatmulPreference_t pref = nullptr;
  MEGASCOPE_CUBLAS_CHECK(lt().cublasLtMatmulPreferenceCreate(&pref));
  const std::uint64_t ws = kGemmWorkspaceBytes;
  const std::uint32_t al_a = 1u << (align & 15), al_b = 1u << (align >> 4 & 15), al_c = 1u << (align >> 8 & 15),
                      al_d = 1u << (align >> 12 & 15);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t st = lt().cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = lt().cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = lt().cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = lt().cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = lt().cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof(al_d));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = lt().cublasLtMatmulAlgoGetHeuristic(handle_, p->desc, p->a, p->b, p->c, p->d, pref, 1, &result, &found);
  (void)lt().cublasLtMatmulPreferenceDestroy(pref);
  MEGASCOPE_CUBLAS_CHECK(st);
  if (found == 0 || result.state != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) +
                             ": cublasLtMatmulAlgoGetHeuristic: no algorithm for " + pass_name(pass) + " " +
                             to_string(dtype) + " N=" + std::to_string(N) + " C=" + std::to_string(C) +
                             " OC=" + std::to_string(OC) + ": " +
                             lt().cublasLtGetStatusName(found == 0 ? CUBLAS_STATUS_NOT_SUPPORTED : result.state));
  p->algo = result.algo;
  p->workspace_bytes = result.workspaceSize;
  return *plans_.emplace(key, std::move(p)).first->second;
}

void Gemm::run(Plan& p, const void* a, const void* b, const void* c, void* d, float beta, const void* bias,
               const float* a_scale, const float* b_scale, cudaStream_t stream) {
  if (p.bias) set(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  if (p.scales) {
    set(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a_scale);
    set(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, b_scale);
  }
  const float alpha = 1.0f;
  MEGASCOPE_CUBLAS_CHECK(lt().cublasLtMatmul(handle_, p.desc, &alpha, a, p.a, b, p.b, &beta, c, p.c, d, p.d, &p.algo,
                                             p.workspace_bytes > 0 ? workspace(stream) : nullptr, p.workspace_bytes,
                                             stream));
}

template <typename T>
void Gemm::forward(T* out, const T* inp, const T* weight, const T* bias, std::int64_t N, std::int64_t C,
                   std::int64_t OC, cudaStream_t stream) {
  check_dims(N, C, OC);
  if (N == 0 || OC == 0) return;
  MEGASCOPE_KERNEL_REQUIRE(out != nullptr);
  if (C == 0) {   // an empty inner dimension: the bias alone (the twin's Eigen product gives zeros)
    broadcast_rows(out, bias, N, OC, stream);
    return;
  }
  MEGASCOPE_KERNEL_REQUIRE(inp != nullptr && weight != nullptr);
  const Key key{Pass::forward, dtype_of<T>(), N, C, OC, bias != nullptr, alignments(weight, inp, out, out)};
  run(plan(key), weight, inp, out, out, 0.0f, bias, nullptr, nullptr, stream);
}

template <typename T>
void Gemm::backward_input(T* dinp, const T* dout, const T* weight, std::int64_t N, std::int64_t C, std::int64_t OC,
                          cudaStream_t stream) {
  check_dims(N, C, OC);
  if (N == 0 || C == 0) return;
  MEGASCOPE_KERNEL_REQUIRE(dinp != nullptr);
  if (OC == 0) {
    broadcast_rows<T>(dinp, nullptr, N, C, stream);
    return;
  }
  MEGASCOPE_KERNEL_REQUIRE(dout != nullptr && weight != nullptr);
  const Key key{Pass::backward_input, dtype_of<T>(), N, C, OC, false, alignments(weight, dout, dinp, dinp)};
  run(plan(key), weight, dout, dinp, dinp, 0.0f, nullptr, nullptr, nullptr, stream);
}

template <typename T>
void Gemm::backward_weight(float* dweight, float* dbias, const T* dout, const T* inp, std::int64_t N, std::int64_t C,
                           std::int64_t OC, cudaStream_t stream) {
  check_dims(N, C, OC);
  if (OC == 0) return;
  if (N > 0 && C > 0) {
    MEGASCOPE_KERNEL_REQUIRE(dweight != nullptr && dout != nullptr && inp != nullptr);
    const Key key{Pass::backward_weight, dtype_of<T>(), N, C, OC, false, alignments(inp, dout, dweight, dweight)};
    run(plan(key), inp, dout, dweight, dweight, 1.0f, nullptr, nullptr, nullptr, stream);
  }
  if (dbias != nullptr) bias_grad_accumulate(dbias, dout, N, OC, stream);
}

void Gemm::forward_fp8(bf16* out, const fp8e4m3* inp, const fp8e4m3* weight, const bf16* bias, const float* inp_scale,
                       const float* weight_scale, std::int64_t N, std::int64_t C, std::int64_t OC,
                       cudaStream_t stream) {
  check_dims(N, C, OC);
  MEGASCOPE_KERNEL_REQUIRE(C % 16 == 0 && OC % 16 == 0);
  if (!fp8_supported())
    throw std::runtime_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": FP8 GEMM needs compute capability >= 8.9; " +
                             info_.name + " is " + std::to_string(info_.cc_major) + "." + std::to_string(info_.cc_minor));
  if (N == 0 || OC == 0) return;
  if (C == 0) {
    broadcast_rows(out, bias, N, OC, stream);
    return;
  }
  MEGASCOPE_KERNEL_REQUIRE(out != nullptr && inp != nullptr && weight != nullptr);
  MEGASCOPE_KERNEL_REQUIRE(inp_scale != nullptr && weight_scale != nullptr);
  const Key key{Pass::forward, GemmDtype::fp8_e4m3, N, C, OC, bias != nullptr, alignments(weight, inp, out, out)};
  Plan& p = plan(key);
  // cuBLASLt (13.1, Hopper) refuses the matmul (CUBLAS_STATUS_NOT_SUPPORTED) when
  // a scale pointer is not 16-byte aligned: such a scale is copied, on the
  // stream, to an aligned slot of this stream's own.
  const float *ws = weight_scale, *is = inp_scale;
  if (align_log2(ws) < 4 || align_log2(is) < 4) {
    auto it = scale_slots_.find(stream);
    if (it == scale_slots_.end()) it = scale_slots_.emplace(stream, DeviceMemory(2 * kScaleSlotBytes)).first;
    auto* slots = static_cast<char*>(it->second.get());
    if (align_log2(ws) < 4) {
      MEGASCOPE_CUDA_CHECK(cudaMemcpyAsync(slots, ws, sizeof(float), cudaMemcpyDeviceToDevice, stream));
      ws = reinterpret_cast<const float*>(slots);
    }
    if (align_log2(is) < 4) {
      MEGASCOPE_CUDA_CHECK(
          cudaMemcpyAsync(slots + kScaleSlotBytes, is, sizeof(float), cudaMemcpyDeviceToDevice, stream));
      is = reinterpret_cast<const float*>(slots + kScaleSlotBytes);
    }
  }
  run(p, weight, inp, out, out, 0.0f, bias, ws, is, stream);
}

#define MEGASCOPE_INSTANTIATE(T)                                                                                      \
  template void Gemm::forward<T>(T*, const T*, const T*, const T*, std::int64_t, std::int64_t, std::int64_t,         \
                                 cudaStream_t);                                                                       \
  template void Gemm::backward_input<T>(T*, const T*, const T*, std::int64_t, std::int64_t, std::int64_t,            \
                                        cudaStream_t);                                                                \
  template void Gemm::backward_weight<T>(float*, float*, const T*, const T*, std::int64_t, std::int64_t, std::int64_t, \
                                         cudaStream_t);
MEGASCOPE_INSTANTIATE(float)
MEGASCOPE_INSTANTIATE(bf16)
#undef MEGASCOPE_INSTANTIATE

}  // namespace megascope::exec::cuda
