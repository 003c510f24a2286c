// cuBLASLt loaded with dlopen (exec/cuda/cublaslt.hpp).
#include "exec/cuda/cublaslt.hpp"

#include <dlfcn.h>

#include <mutex>
#include <stdexcept>
#include <string>

namespace megascope::exec::cuda {

namespace {

#define MEGASCOPE_STR2(x) #x
#define MEGASCOPE_STR(x) MEGASCOPE_STR2(x)

void* open_library() {
  const std::string soname = "libcublasLt.so." MEGASCOPE_STR(CUBLAS_VER_MAJOR);
  std::string errors;
  for (const std::string& name : {soname,
#ifdef MEGASCOPE_CUBLASLT_PATH
                                  std::string(MEGASCOPE_CUBLASLT_PATH),
#endif
                                  std::string("libcublasLt.so")}) {
    if (void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
    const char* e = dlerror();
    errors += std::string("; ") + (e ? e : name);
  }
  throw std::runtime_error("cannot load cuBLASLt (" + soname + ")" + errors);
}

CublasLt load() {
  void* h = open_library();
  CublasLt t;
  auto get = [h](auto& fn, const char* name) {
    void* p = dlsym(h, name);
    if (!p) throw std::runtime_error(std::string("cuBLASLt has no ") + name);
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
  };
#define MEGASCOPE_CUBLASLT_GET(name) get(t.name, #name);
  MEGASCOPE_CUBLASLT_GET(cublasLtCreate)
  MEGASCOPE_CUBLASLT_GET(cublasLtDestroy)
  MEGASCOPE_CUBLASLT_GET(cublasLtGetVersion)
  MEGASCOPE_CUBLASLT_GET(cublasLtGetStatusName)
  MEGASCOPE_CUBLASLT_GET(cublasLtGetStatusString)
  MEGASCOPE_CUBLASLT_GET(cublasLtMatmul)
  MEGASCOPE_CUBLASLT_GET(cublasLtMatmulAlgoGetHeuristic)
  MEGASCOPE_CUBLASLT_GET(cublasLtMatmulDescCreate)
  MEGASCOPE_CUBLASLT_GET(cublasLtMatmulDescDestroy)
  MEGASCOPE_CUBLASLT_GET(cublasLtMatmulDescSetAttribute)
  MEGASCOPE_CUBLASLT_GET(cublasLtMatmulPreferenceCreate)
  MEGASCOPE_CUBLASLT_GET(cublasLtMatmulPreferenceDestroy)
  MEGASCOPE_CUBLASLT_GET(cublasLtMatmulPreferenceSetAttribute)
  MEGASCOPE_CUBLASLT_GET(cublasLtMatrixLayoutCreate)
  MEGASCOPE_CUBLASLT_GET(cublasLtMatrixLayoutDestroy)
#undef MEGASCOPE_CUBLASLT_GET
  return t;
}

}  // namespace

const CublasLt& lt() {
  static const CublasLt table = load();   // thread-safe; a failed load throws and is retried next call
  return table;
}

}  // namespace megascope::exec::cuda
