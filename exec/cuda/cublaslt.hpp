// cuBLASLt, loaded on first use (dlopen) instead of linked: mapping
// libcublasLt (about 0.5 GB) costs every process that links it about 0.3 s
// at start, and the megascope command starts many times for commands that
// never touch a GPU. Everything in exec/cuda calls cuBLASLt through lt().
// The library is looked up as libcublasLt.so.<major of the headers> (the
// loader's usual search, which includes the executable's RUNPATH), then at
// the path of the toolkit it was built against.
#pragma once

#include <cublasLt.h>

namespace megascope::exec::cuda {

struct CublasLt {
#define MEGASCOPE_CUBLASLT_FN(name) decltype(&::name) name = nullptr;
  MEGASCOPE_CUBLASLT_FN(cublasLtCreate)
  MEGASCOPE_CUBLASLT_FN(cublasLtDestroy)
  MEGASCOPE_CUBLASLT_FN(cublasLtGetVersion)
  MEGASCOPE_CUBLASLT_FN(cublasLtGetStatusName)
  MEGASCOPE_CUBLASLT_FN(cublasLtGetStatusString)
  MEGASCOPE_CUBLASLT_FN(cublasLtMatmul)
  MEGASCOPE_CUBLASLT_FN(cublasLtMatmulAlgoGetHeuristic)
  MEGASCOPE_CUBLASLT_FN(cublasLtMatmulDescCreate)
  MEGASCOPE_CUBLASLT_FN(cublasLtMatmulDescDestroy)
  MEGASCOPE_CUBLASLT_FN(cublasLtMatmulDescSetAttribute)
  MEGASCOPE_CUBLASLT_FN(cublasLtMatmulPreferenceCreate)
  MEGASCOPE_CUBLASLT_FN(cublasLtMatmulPreferenceDestroy)
  MEGASCOPE_CUBLASLT_FN(cublasLtMatmulPreferenceSetAttribute)
  MEGASCOPE_CUBLASLT_FN(cublasLtMatrixLayoutCreate)
  MEGASCOPE_CUBLASLT_FN(cublasLtMatrixLayoutDestroy)
#undef MEGASCOPE_CUBLASLT_FN
};

// The loaded library's entry points (loaded once, never unloaded). Throws
// std::runtime_error naming the library and dlerror() when it cannot be
// loaded or lacks a function.
const CublasLt& lt();

}  // namespace megascope::exec::cuda
