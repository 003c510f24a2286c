// NCCL communicators (exec/cuda/nccl_comm.hpp).
#include "exec/cuda/nccl_comm.hpp"

#include <algorithm>
#include <cmath>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/result.hpp"
#include "exec/cuda/watchdog.hpp"
#include "kernels/check.hpp"

namespace megascope::exec::cuda {

int mpi_local_rank() {
  MPI_Comm local = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
  int r = 0;
  MPI_Comm_rank(local, &r);
  MPI_Comm_free(&local);
  return r;
}

std::string nccl_version() {
  int v = 0;
  MEGASCOPE_NCCL_CHECK(ncclGetVersion(&v));
  // NCCL >= 2.9: major * 10000 + minor * 100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

namespace {

// The process's live communicators, for the watchdog: a timed-out wait
// aborts all of them (a rank's streams wait on each other through events,
// so the stuck operation may be another group's), and they are not
// destroyed again afterwards.
struct Registry {
  std::mutex mutex;
  std::vector<ncclComm_t> live;
  std::vector<ncclComm_t> aborted;
  double timeout_s = 120;
};
Registry& registry() {
  static Registry r;
  return r;
}

void abort_all() {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  for (ncclComm_t c : r.live) {
    (void)ncclCommAbort(c);
    r.aborted.push_back(c);
  }
  r.live.clear();
}

// The first asynchronous error of a live communicator (a peer aborted, a
// network failure), as NCCL words it.
std::optional<std::string> async_error() {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  for (ncclComm_t c : r.live) {
    ncclResult_t e = ncclSuccess;
    if (ncclCommGetAsyncError(c, &e) == ncclSuccess && e != ncclSuccess && e != ncclInProgress)
      return std::string("NCCL reports ") + ncclGetErrorString(e) + " on a communicator of this rank";
  }
  return std::nullopt;
}

int world_rank() {
  int initialized = 0, r = 0;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

std::size_t count(std::int64_t n) {
  MEGASCOPE_KERNEL_REQUIRE(n >= 0);
  return static_cast<std::size_t>(n);
}
std::size_t type_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    default: return 8;
  }
}
}  // namespace

void set_watchdog_timeout(double seconds) {
  if (!(seconds > 0) || !std::isfinite(seconds))
    throw std::invalid_argument("the NCCL watchdog's timeout must be a finite number of seconds > 0");
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  r.timeout_s = seconds;
}

void wait_stream(cudaStream_t stream, const std::string& what) {
  double timeout = 0;
  {
    Registry& r = registry();
    const std::lock_guard<std::mutex> lock(r.mutex);
    timeout = r.timeout_s;
  }
  wait_until(
      [&] {
        const cudaError_t e = cudaStreamQuery(stream);
        if (e == cudaErrorNotReady) return false;
        MEGASCOPE_CUDA_CHECK(e);
        return true;
      },
      async_error, timeout, what, abort_all);
}

NcclCommunicator::NcclCommunicator(ncclComm_t comm, cudaStream_t stream, bool blocking, std::string label)
    : comm_(comm), stream_(stream), blocking_(blocking), label_(std::move(label)) {
  MEGASCOPE_NCCL_CHECK(ncclCommCount(comm_, &size_));
  MEGASCOPE_NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  r.live.push_back(comm_);
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::over_mpi(MPI_Comm mpi, cudaStream_t stream, bool blocking,
                                                             const std::string& label) {
  require_device();
  int size = 0, rank = 0;
  MPI_Comm_size(mpi, &size);
  MPI_Comm_rank(mpi, &rank);
  ncclUniqueId id{};
  if (rank == 0) MEGASCOPE_NCCL_CHECK(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, mpi);
  ncclComm_t comm = nullptr;
  MEGASCOPE_NCCL_CHECK(ncclCommInitRank(&comm, size, id, rank));
  return std::make_unique<NcclCommunicator>(comm, stream, blocking, label);
}

NcclCommunicator::~NcclCommunicator() {
  if (!comm_) return;
  {
    Registry& r = registry();
    const std::lock_guard<std::mutex> lock(r.mutex);
    if (std::find(r.aborted.begin(), r.aborted.end(), comm_) != r.aborted.end()) return;   // the watchdog's
    r.live.erase(std::remove(r.live.begin(), r.live.end(), comm_), r.live.end());
  }
  // While an exception unwinds, abort: ncclCommDestroy waits for the
  // communicator's operations, which may wait for a peer that is itself
  // waiting for this rank; ncclCommAbort stops them.
  if (std::uncaught_exceptions() > 0) (void)ncclCommAbort(comm_);
  else (void)ncclCommDestroy(comm_);
}

void NcclCommunicator::wait(cudaStream_t s, const char* op) const {
  wait_stream(s, "rank " + std::to_string(world_rank()) + ": " + op + " of the " + label_ + " group (" +
                     std::to_string(size_) + " ranks)");
}

void NcclCommunicator::done(cudaStream_t s) const {
  if (blocking_) wait(s, "an operation");
}

void NcclCommunicator::all_reduce(void* data, std::int64_t n, ncclDataType_t type, ReduceOp op) {
  MEGASCOPE_NCCL_CHECK(
      ncclAllReduce(data, data, count(n), type, op == ReduceOp::sum ? ncclSum : ncclMax, comm_, stream_));
  done(stream_);
}

void NcclCommunicator::reduce_scatter(void* out, const void* in, std::int64_t n, ncclDataType_t type) {
  MEGASCOPE_NCCL_CHECK(ncclReduceScatter(in, out, count(n), type, ncclSum, comm_, stream_));
  done(stream_);
}

void NcclCommunicator::all_gather(void* out, const void* in, std::int64_t n, ncclDataType_t type) {
  MEGASCOPE_NCCL_CHECK(ncclAllGather(in, out, count(n), type, comm_, stream_));
  done(stream_);
}

void NcclCommunicator::all_to_all(void* out, const void* in, std::int64_t n, ncclDataType_t type) {
  const std::size_t block = count(n) * type_bytes(type);
  MEGASCOPE_NCCL_CHECK(ncclGroupStart());
  for (int j = 0; j < size_; ++j) {
    const std::size_t off = static_cast<std::size_t>(j) * block;
    MEGASCOPE_NCCL_CHECK(ncclSend(static_cast<const char*>(in) + off, count(n), type, j, comm_, stream_));
    MEGASCOPE_NCCL_CHECK(ncclRecv(static_cast<char*>(out) + off, count(n), type, j, comm_, stream_));
  }
  MEGASCOPE_NCCL_CHECK(ncclGroupEnd());
  done(stream_);
}

void NcclCommunicator::all_reduce(float* data, std::int64_t n, ReduceOp op) { all_reduce(data, n, ncclFloat32, op); }
void NcclCommunicator::reduce_scatter(float* out, const float* in, std::int64_t n) {
  reduce_scatter(out, in, n, ncclFloat32);
}
void NcclCommunicator::all_gather(float* out, const float* in, std::int64_t n) { all_gather(out, in, n, ncclFloat32); }
void NcclCommunicator::all_to_all(float* out, const float* in, std::int64_t n) { all_to_all(out, in, n, ncclFloat32); }

void NcclCommunicator::barrier() {
  // A one-element all-reduce on a scratch buffer, waited for: every member has reached it.
  MEGASCOPE_CUDA_CHECK(cudaMemsetAsync(scratch_.get(), 0, sizeof(float), stream_));
  MEGASCOPE_NCCL_CHECK(ncclAllReduce(scratch_.get(), scratch_.get(), 1, ncclFloat32, ncclSum, comm_, stream_));
  wait(stream_, "a barrier");
}

void NcclCommunicator::send(const void* data, std::int64_t n, ncclDataType_t type, int peer, cudaStream_t stream) {
  exchange({{true, const_cast<void*>(data), n, type, peer, stream}});
}

void NcclCommunicator::recv(void* data, std::int64_t n, ncclDataType_t type, int peer, cudaStream_t stream) {
  exchange({{false, data, n, type, peer, stream}});
}

void NcclCommunicator::exchange(const std::vector<Transfer>& transfers) {
  for (const Transfer& t : transfers)
    if (t.peer < 0 || t.peer >= size_)
      throw std::invalid_argument("NcclCommunicator: peer " + std::to_string(t.peer) + " outside a group of " +
                                  std::to_string(size_));
  MEGASCOPE_NCCL_CHECK(ncclGroupStart());
  for (const Transfer& t : transfers) {
    cudaStream_t s = t.stream ? t.stream : stream_;
    if (t.send)
      MEGASCOPE_NCCL_CHECK(ncclSend(t.data, count(t.n), t.type, t.peer, comm_, s));
    else
      MEGASCOPE_NCCL_CHECK(ncclRecv(t.data, count(t.n), t.type, t.peer, comm_, s));
  }
  MEGASCOPE_NCCL_CHECK(ncclGroupEnd());
  for (const Transfer& t : transfers) done(t.stream ? t.stream : stream_);
}

void NcclCommunicator::synchronize() const { wait(stream_, "the operations"); }

NcclGroups::NcclGroups(const RankGrid& grid, const MpiGroups& mpi, const StreamSet& streams, bool blocking) {
  require_device();
  const int me = mpi.world_rank();
  for (int g = 0; g < kCommGroupCount; ++g) {
    const auto kind = static_cast<CommGroup>(g);
    Communicator* c = mpi.get(kind);
    if (c == nullptr) continue;
    // Same members and same stream as an earlier kind: share its communicator
    // (the test gives the same answer on every member of the group).
    const std::vector<int> members = grid.group(me, kind);
    bool shared = false;
    for (int h = 0; h < g && !shared; ++h) {
      const auto earlier = static_cast<CommGroup>(h);
      if (groups_[static_cast<std::size_t>(h)] && stream_of(earlier) == stream_of(kind) &&
          grid.group(me, earlier) == members) {
        groups_[static_cast<std::size_t>(g)] = groups_[static_cast<std::size_t>(h)];
        shared = true;
      }
    }
    if (shared) continue;
    auto* m = dynamic_cast<MpiCommunicator*>(c);
    MEGASCOPE_CHECK(m != nullptr, "NcclGroups: MpiGroups holds a communicator that is not an MPI one");
    groups_[static_cast<std::size_t>(g)] =
        NcclCommunicator::over_mpi(m->handle(), streams.get(stream_of(kind)), blocking, to_string(kind));
  }
}

}  // namespace megascope::exec::cuda
