// Error handling of the CUDA launchers (host code, C++17): a CUDA error
// throws std::runtime_error naming file:line, the call and CUDA's message.
// Launchers call MEGASCOPE_CUDA_CHECK(cudaGetLastError()) after each launch;
// errors raised while a kernel runs surface at the next synchronising call.
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace megascope::kernels::cuda {

inline void check_cuda(cudaError_t err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return;
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + what + ": " + cudaGetErrorName(err) +
                           ": " + cudaGetErrorString(err));
}

// Whether a CUDA device can be used (false without a GPU or a driver).
inline bool device_available() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // clear the error so that later calls do not report it
    return false;
  }
  return n > 0;
}

}  // namespace megascope::kernels::cuda

#define MEGASCOPE_CUDA_CHECK(expr) ::megascope::kernels::cuda::check_cuda((expr), #expr, __FILE__, __LINE__)
