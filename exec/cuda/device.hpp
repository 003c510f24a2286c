// Device helpers of the GPU runtime: owning device memory, CUDA events, the
// set of streams a rank's Program runs on, and which GPU a process uses.
//
// Streams: one per Program stream (core/program/program.hpp), so that the
// Program's "ops on one stream run in list order" holds by construction:
//   compute            GEMMs and kernels
//   tp                 collectives of the tp and etp groups
//   cp                 collectives of the cp group (ring-attention KV gathers)
//   ep                 the ep group's all-to-alls
//   dp                 the dp, dp_cp, edp and embedding groups (gradients, parameters)
//   pp_send, pp_recv   pipeline transfers
// Communication streams are created with the device's highest priority (as
// Transformer Engine does for its overlapped collectives) so that a
// collective's kernel is not queued behind a long run of compute kernels;
// compute gets the default priority. All streams are non-blocking (no
// implicit synchronisation with the legacy default stream). Cross-stream
// dependencies (the Program's `deps`) are the runtime's to express with
// events: `Event::record` on the producer's stream, `wait` on the consumer's.
//
// Does not: pool allocations (cudaMalloc per buffer; the runtime should
// allocate once per run), manage more than one device per process.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/program/program.hpp"
#include "exec/replay.hpp"
#include "exec/cuda/check.hpp"

namespace megascope::exec::cuda {

using kernels::cuda::device_available;

struct DeviceInfo {
  int index = 0;
  std::string name;                 // "NVIDIA H100 80GB HBM3"
  int cc_major = 0, cc_minor = 0;   // compute capability
  int sms = 0;
  double memory_bytes = 0;          // total device memory
  double memory_bandwidth_Bps = 0;  // nominal (memory clock x bus width x 2), 0 when the driver does not say
  int driver_version = 0, runtime_version = 0;
  [[nodiscard]] bool fp8() const { return cc_major * 10 + cc_minor >= 89; }   // E4M3 tensor cores (Ada, Hopper, later)
};

// The current device's properties; throws NoCudaDevice without one.
DeviceInfo device_info();

// Picks the device of a process among `local_size` processes on its node
// (local_rank % device count), makes it current and returns its index.
// Throws NoCudaDevice without a device.
int select_device(int local_rank);

// An owning, untyped block of device memory (cudaMalloc'd, so 256-byte aligned).
class DeviceMemory {
 public:
  DeviceMemory() = default;
  explicit DeviceMemory(std::size_t bytes);
  DeviceMemory(DeviceMemory&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  DeviceMemory& operator=(DeviceMemory&& o) noexcept;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory();
  [[nodiscard]] void* get() const { return ptr_; }
  [[nodiscard]] std::size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

// n elements of E on the device.
template <typename E>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t n) : mem_(n * sizeof(E)), n_(n) {}
  explicit DeviceBuffer(const std::vector<E>& host) : DeviceBuffer(host.size()) { upload(host); }
  [[nodiscard]] E* get() const { return static_cast<E*>(mem_.get()); }
  [[nodiscard]] std::size_t size() const { return n_; }
  [[nodiscard]] std::size_t bytes() const { return n_ * sizeof(E); }
  // Synchronous copies (they wait for the whole device first).
  void upload(const std::vector<E>& host) {
    MEGASCOPE_CUDA_CHECK(cudaDeviceSynchronize());
    MEGASCOPE_CUDA_CHECK(cudaMemcpy(get(), host.data(), std::min(host.size(), n_) * sizeof(E), cudaMemcpyHostToDevice));
  }
  [[nodiscard]] std::vector<E> download() const {
    std::vector<E> host(n_);
    MEGASCOPE_CUDA_CHECK(cudaDeviceSynchronize());
    MEGASCOPE_CUDA_CHECK(cudaMemcpy(host.data(), get(), n_ * sizeof(E), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  DeviceMemory mem_;
  std::size_t n_ = 0;
};

// A CUDA event with timing enabled.
class Event {
 public:
  Event();
  Event(Event&& o) noexcept : ev_(o.ev_) { o.ev_ = nullptr; }
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();
  void record(cudaStream_t s);
  void wait(cudaStream_t s) const;        // s waits for the work recorded before this event
  void synchronize() const;
  [[nodiscard]] cudaEvent_t get() const { return ev_; }
  // Seconds from `earlier` to this event (both recorded and complete).
  [[nodiscard]] double seconds_since(const Event& earlier) const;

 private:
  cudaEvent_t ev_ = nullptr;
};

// The streams of one rank, indexed by the Program's Stream.
class StreamSet {
 public:
  StreamSet();   // throws NoCudaDevice without a device
  StreamSet(const StreamSet&) = delete;
  StreamSet& operator=(const StreamSet&) = delete;
  ~StreamSet();
  [[nodiscard]] cudaStream_t get(Stream s) const { return streams_[static_cast<std::size_t>(s)]; }
  [[nodiscard]] cudaStream_t compute() const { return get(Stream::compute); }
  void synchronize() const;   // every stream

 private:
  std::array<cudaStream_t, kStreamCount> streams_{};
};

// The stream a group's collectives run on (see the table at the top): exec/replay.hpp.
using exec::stream_of;

}  // namespace megascope::exec::cuda
