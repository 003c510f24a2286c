// Error handling of the GPU runtime's library calls: a failed cuBLASLt or
// NCCL call throws std::runtime_error naming file:line, the call and the
// library's status name (CUBLAS_STATUS_NOT_SUPPORTED, ncclInvalidUsage, ...)
// with its message. CUDA runtime calls use MEGASCOPE_CUDA_CHECK from
// kernels/cuda/check.hpp. `NoCudaDevice` is the one expected failure of a
// machine without a GPU (or without a driver): callers turn it into a clean
// "no CUDA device" error.
#pragma once

#include <cublasLt.h>
#include <nccl.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/check.hpp"

namespace megascope::exec::cuda {

class NoCudaDevice : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws NoCudaDevice ("no CUDA device (<CUDA's reason>)") unless a device can be used.
void require_device();

// The message of a failed call, e.g.
// "exec/cuda/gemm.cpp:120: cublasLtMatmul(...): CUBLAS_STATUS_NOT_SUPPORTED: the functionality requested is not supported".
std::string cublas_error_message(cublasStatus_t status, const char* what, const char* file, int line);
std::string nccl_error_message(ncclResult_t result, const char* what, const char* file, int line);

inline void check_cublas(cublasStatus_t status, const char* what, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(cublas_error_message(status, what, file, line));
}
inline void check_nccl(ncclResult_t result, const char* what, const char* file, int line) {
  if (result != ncclSuccess) throw std::runtime_error(nccl_error_message(result, what, file, line));
}

}  // namespace megascope::exec::cuda

#define MEGASCOPE_CUBLAS_CHECK(expr) ::megascope::exec::cuda::check_cublas((expr), #expr, __FILE__, __LINE__)
#define MEGASCOPE_NCCL_CHECK(expr) ::megascope::exec::cuda::check_nccl((expr), #expr, __FILE__, __LINE__)
