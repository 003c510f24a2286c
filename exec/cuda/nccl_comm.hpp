// NCCL communicators for the GPU runtime: exec::Communicator (exec/comm.hpp)
// on device pointers, one NCCL communicator per group of the RankGrid,
// bootstrapped over the group's MPI communicator (MpiGroups): the group's
// first member creates the ncclUniqueId, MPI_Bcast gives it to the others,
// every member calls ncclCommInitRank with its index in the group, so NCCL
// ranks are exactly the RankGrid's group order (Megatron's tp-cp-dp-pp).
//
// Streams (exec/cuda/device.hpp): each group's collectives are enqueued on
// the stream the Program gives them: tp and etp on `tp`, cp on `cp`, ep on
// `ep`, dp, dp_cp, edp and embedding on `dp`; pipeline transfers on
// `pp_send` / `pp_recv`. Two group kinds with the same members and the same
// stream (dp and dp_cp when cp = 1, tp and etp when they coincide) share one
// NCCL communicator.
//
// Semantics: the Communicator calls take device pointers and return once the
// operation is enqueued (asynchronous), unless the communicator was made
// `blocking` (then each call waits for its stream: the CPU executor's
// semantics, for tests and calibration). The runtime orders a collective
// after the compute that produced its input with events (Event::record on
// compute, wait on the group's stream) and back. barrier() always waits.
//
// Ordering rules the runtime must keep (NCCL's, not ours): on every member,
// a communicator's operations are issued in the same order; operations of
// one communicator run in issue order whatever stream they are on; a send
// and the receive that must overlap with it (1F1B's send-forward /
// recv-backward pairs) go in one exchange() (one NCCL group), as Megatron's
// batch_isend_irecv does, otherwise two stages that both send first wait on
// each other forever.
//
// Timeouts: every host wait on a communicator's work (blocking mode,
// barrier(), synchronize(), wait_stream()) goes through the watchdog
// (exec/cuda/watchdog.hpp): past set_watchdog_timeout()'s limit (run's
// --recv-timeout, 120 s by default) every live communicator of the process
// is aborted and the wait throws, naming the rank, the group and the time;
// an asynchronous NCCL error (a peer's abort) ends the wait at once.
//
// Does not: recovery after a failure (the run ends), user buffer
// registration, NVLS/SHARP settings (NCCL's defaults and environment
// variables apply).
#pragma once

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/rank_grid.hpp"
#include "exec/comm.hpp"
#include "exec/cuda/device.hpp"

namespace megascope::exec::cuda {

// A process's index among the processes of its node (MPI_COMM_TYPE_SHARED),
// for select_device(). Collective over MPI_COMM_WORLD.
int mpi_local_rank();

// NCCL's version as "2.28.9".
std::string nccl_version();

// The watchdog's limit for host waits on NCCL work, in seconds (> 0).
void set_watchdog_timeout(double seconds);
// Waits for `stream` under the watchdog; `what` names the wait in errors
// ("rank 3: the step's dp all-reduce").
void wait_stream(cudaStream_t stream, const std::string& what);

class NcclCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm`; operations are enqueued on `stream`; `label`
  // names the group in errors ("dp", "pp route").
  NcclCommunicator(ncclComm_t comm, cudaStream_t stream, bool blocking, std::string label = "nccl");
  // Collective over `mpi` (every member calls it): the communicator of the
  // MPI group, same size and ranks.
  static std::unique_ptr<NcclCommunicator> over_mpi(MPI_Comm mpi, cudaStream_t stream, bool blocking = false,
                                                    const std::string& label = "nccl");
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  [[nodiscard]] int size() const override { return size_; }
  [[nodiscard]] int rank() const override { return rank_; }
  // exec::Communicator on float device buffers.
  void all_reduce(float* data, std::int64_t n, ReduceOp op = ReduceOp::sum) override;
  void reduce_scatter(float* out, const float* in, std::int64_t n) override;
  void all_gather(float* out, const float* in, std::int64_t n) override;
  void all_to_all(float* out, const float* in, std::int64_t n) override;   // grouped send/recv
  void barrier() override;

  // The same on any NCCL type (ncclBfloat16 for bf16 activations); n in elements.
  void all_reduce(void* data, std::int64_t n, ncclDataType_t type, ReduceOp op);
  void reduce_scatter(void* out, const void* in, std::int64_t n, ncclDataType_t type);
  void all_gather(void* out, const void* in, std::int64_t n, ncclDataType_t type);
  void all_to_all(void* out, const void* in, std::int64_t n, ncclDataType_t type);

  // Point-to-point with a group member (pipeline transfers on the pp group:
  // peer = pipeline stage). `stream` defaults to the communicator's.
  struct Transfer {
    bool send = true;
    void* data = nullptr;          // send: read, receive: written
    std::int64_t n = 0;
    ncclDataType_t type = ncclFloat32;
    int peer = 0;
    cudaStream_t stream = nullptr; // nullptr: the communicator's stream
  };
  void send(const void* data, std::int64_t n, ncclDataType_t type, int peer, cudaStream_t stream = nullptr);
  void recv(void* data, std::int64_t n, ncclDataType_t type, int peer, cudaStream_t stream = nullptr);
  // All of `transfers` as one NCCL group: they progress together.
  void exchange(const std::vector<Transfer>& transfers);

  void synchronize() const;        // waits for the communicator's stream
  [[nodiscard]] cudaStream_t stream() const { return stream_; }
  [[nodiscard]] ncclComm_t handle() const { return comm_; }

 private:
  void done(cudaStream_t s) const;  // blocking mode: wait for s
  void wait(cudaStream_t s, const char* op) const;   // under the watchdog, naming this group
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool blocking_ = false;
  std::string label_;
  int size_ = 1, rank_ = 0;
  DeviceBuffer<float> scratch_{1};   // barrier()'s one element
};

// One rank's NCCL communicators, one per group kind it belongs to.
class NcclGroups {
 public:
  // Collective over MPI_COMM_WORLD: every rank calls it, after selecting its
  // device. `streams` must outlive this object.
  NcclGroups(const RankGrid& grid, const MpiGroups& mpi, const StreamSet& streams, bool blocking = false);
  [[nodiscard]] NcclCommunicator* get(CommGroup g) const { return groups_[static_cast<std::size_t>(g)].get(); }

 private:
  std::array<std::shared_ptr<NcclCommunicator>, kCommGroupCount> groups_;
};

}  // namespace megascope::exec::cuda
