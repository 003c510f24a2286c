// Device helpers (exec/cuda/device.hpp) and the error messages of check.hpp.
#include "exec/cuda/device.hpp"

#include <exception>
#include <utility>

#include "exec/cuda/cublaslt.hpp"

namespace megascope::exec::cuda {

// ---- check.hpp -------------------------------------------------------------

void require_device() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    throw NoCudaDevice(std::string("no CUDA device (") + cudaGetErrorName(err) + ": " + cudaGetErrorString(err) + ")");
  }
  if (n == 0) throw NoCudaDevice("no CUDA device (the driver reports 0 devices)");
}

std::string cublas_error_message(cublasStatus_t status, const char* what, const char* file, int line) {
  std::string name;
  try {   // the names come from the library, which may be the thing that failed to load
    name = std::string(lt().cublasLtGetStatusName(status)) + ": " + lt().cublasLtGetStatusString(status);
  } catch (const std::exception&) {
    name = "cublasStatus_t " + std::to_string(static_cast<int>(status));
  }
  return std::string(file) + ":" + std::to_string(line) + ": " + what + ": " + name;
}

namespace {
const char* nccl_result_name(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    default: return "ncclResult?";
  }
}
}  // namespace

std::string nccl_error_message(ncclResult_t result, const char* what, const char* file, int line) {
  return std::string(file) + ":" + std::to_string(line) + ": " + what + ": " + nccl_result_name(result) + ": " +
         ncclGetErrorString(result);
}

// ---- device ----------------------------------------------------------------

DeviceInfo device_info() {
  require_device();
  DeviceInfo d;
  MEGASCOPE_CUDA_CHECK(cudaGetDevice(&d.index));
  cudaDeviceProp p{};
  MEGASCOPE_CUDA_CHECK(cudaGetDeviceProperties(&p, d.index));
  d.name = p.name;
  d.cc_major = p.major;
  d.cc_minor = p.minor;
  d.sms = p.multiProcessorCount;
  d.memory_bytes = static_cast<double>(p.totalGlobalMem);
  int clock_khz = 0, bus_bits = 0;
  // CUDA 13 dropped memoryClockRate from cudaDeviceProp; the attribute remains.
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, d.index) == cudaSuccess &&
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, d.index) == cudaSuccess)
    d.memory_bandwidth_Bps = 2.0 * clock_khz * 1e3 * bus_bits / 8.0;
  else
    (void)cudaGetLastError();
  MEGASCOPE_CUDA_CHECK(cudaDriverGetVersion(&d.driver_version));
  MEGASCOPE_CUDA_CHECK(cudaRuntimeGetVersion(&d.runtime_version));
  return d;
}

int select_device(int local_rank) {
  require_device();
  int n = 0;
  MEGASCOPE_CUDA_CHECK(cudaGetDeviceCount(&n));
  const int device = ((local_rank % n) + n) % n;
  MEGASCOPE_CUDA_CHECK(cudaSetDevice(device));
  return device;
}

DeviceMemory::DeviceMemory(std::size_t bytes) : bytes_(bytes) {
  require_device();
  MEGASCOPE_CUDA_CHECK(cudaMalloc(&ptr_, std::max<std::size_t>(bytes, 1)));
}

DeviceMemory& DeviceMemory::operator=(DeviceMemory&& o) noexcept {
  if (this != &o) {
    if (ptr_) (void)cudaFree(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

DeviceMemory::~DeviceMemory() {
  // While an exception unwinds (a failing rank on its way to abort the job),
  // the memory is left to the process's end: cudaFree synchronises the
  // device, and a kernel waiting for another rank (an NCCL receive) would
  // never let it return.
  if (ptr_ && std::uncaught_exceptions() == 0) (void)cudaFree(ptr_);
}

Event::Event() {
  require_device();
  MEGASCOPE_CUDA_CHECK(cudaEventCreate(&ev_));
}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    if (ev_) (void)cudaEventDestroy(ev_);
    ev_ = std::exchange(o.ev_, nullptr);
  }
  return *this;
}

Event::~Event() {
  if (ev_) (void)cudaEventDestroy(ev_);
}

void Event::record(cudaStream_t s) { MEGASCOPE_CUDA_CHECK(cudaEventRecord(ev_, s)); }
void Event::wait(cudaStream_t s) const { MEGASCOPE_CUDA_CHECK(cudaStreamWaitEvent(s, ev_, 0)); }
void Event::synchronize() const { MEGASCOPE_CUDA_CHECK(cudaEventSynchronize(ev_)); }

double Event::seconds_since(const Event& earlier) const {
  float ms = 0;
  MEGASCOPE_CUDA_CHECK(cudaEventElapsedTime(&ms, earlier.ev_, ev_));
  return static_cast<double>(ms) * 1e-3;
}

StreamSet::StreamSet() {
  require_device();
  int least = 0, greatest = 0;   // numerically: greatest priority is the lowest number
  MEGASCOPE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  for (int i = 0; i < kStreamCount; ++i) {
    const bool comm = static_cast<Stream>(i) != Stream::compute;
    MEGASCOPE_CUDA_CHECK(cudaStreamCreateWithPriority(&streams_[static_cast<std::size_t>(i)], cudaStreamNonBlocking,
                                                      comm ? greatest : least));
  }
}

StreamSet::~StreamSet() {
  for (cudaStream_t s : streams_)
    if (s) (void)cudaStreamDestroy(s);
}

void StreamSet::synchronize() const {
  for (cudaStream_t s : streams_) MEGASCOPE_CUDA_CHECK(cudaStreamSynchronize(s));
}

}  // namespace megascope::exec::cuda
