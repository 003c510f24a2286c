// Helpers for the GPU tests: device buffers, float <-> bf16 / fp16 on the host, and
// the per-dtype tolerances of a CUDA kernel against its CPU twin (normwise
// relative error, see tests/kernels/kernel_test_support.hpp).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "../kernels/kernel_test_support.hpp"
#include "kernels/cuda/check.hpp"

namespace megascope::kernels::gpu_test {

using bf16 = __nv_bfloat16;
using fp16 = __half;
using test::rel_error;
using test::uniform;

template <typename T>
T from_float(float x);
template <>
inline float from_float<float>(float x) {
  return x;
}
template <>
inline bf16 from_float<bf16>(float x) {
  return __float2bfloat16(x);
}
template <>
inline fp16 from_float<fp16>(float x) {
  return __float2half_rn(x);
}
inline float to_float(float x) { return x; }
inline float to_float(bf16 x) { return __bfloat162float(x); }
inline float to_float(fp16 x) { return __half2float(x); }

// The values a T tensor actually holds: rounded to T, back in float. The CPU
// twin runs on these so that only the kernel's own error is measured.
template <typename T>
std::vector<float> rounded(std::vector<float> v) {
  for (auto& x : v) x = to_float(from_float<T>(x));
  return v;
}

// Normwise tolerance against the CPU float twin: fp32 accumulation-order
// differences, or one bf16 (2^-8 relative) or fp16 (2^-11) rounding of every
// output, with the same margin over the rounding for both.
template <typename T>
double tolerance();
template <>
inline double tolerance<float>() {
  return 1e-5;
}
template <>
inline double tolerance<bf16>() {
  return 2e-2;
}
template <>
inline double tolerance<fp16>() {
  return 3e-3;
}

// An owning device array of n elements of E.
template <typename E>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t n) : n_(n) {
    MEGASCOPE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr_), std::max<std::size_t>(n, 1) * sizeof(E)));
  }
  explicit DeviceBuffer(const std::vector<E>& host) : DeviceBuffer(host.size()) { upload(host); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { (void)cudaFree(ptr_); }

  void upload(const std::vector<E>& host) {
    MEGASCOPE_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), host.size() * sizeof(E), cudaMemcpyHostToDevice));
  }
  [[nodiscard]] std::vector<E> download() const {
    std::vector<E> host(n_);
    MEGASCOPE_CUDA_CHECK(cudaDeviceSynchronize());
    MEGASCOPE_CUDA_CHECK(cudaMemcpy(host.data(), ptr_, n_ * sizeof(E), cudaMemcpyDeviceToHost));
    return host;
  }
  [[nodiscard]] E* get() const { return ptr_; }
  [[nodiscard]] std::size_t size() const { return n_; }

 private:
  std::size_t n_ = 0;
  E* ptr_ = nullptr;
};

// A T tensor on the device holding `values` (rounded to T).
template <typename T>
DeviceBuffer<T> to_device(const std::vector<float>& values) {
  std::vector<T> host(values.size());
  std::transform(values.begin(), values.end(), host.begin(), [](float x) { return from_float<T>(x); });
  return DeviceBuffer<T>(host);
}

// A device T tensor read back as floats.
template <typename T>
std::vector<float> to_host(const DeviceBuffer<T>& buf) {
  const auto host = buf.download();
  std::vector<float> out(host.size());
  std::transform(host.begin(), host.end(), out.begin(), [](T x) { return to_float(x); });
  return out;
}

// n random floats in [lo, hi), already rounded to T.
template <typename T>
std::vector<float> random(std::size_t n, std::uint64_t seed, double lo = -1.0, double hi = 1.0) {
  return rounded<T>(uniform<float>(n, seed, lo, hi));
}

}  // namespace megascope::kernels::gpu_test
