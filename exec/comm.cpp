#include "exec/comm.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <thread>
#include <utility>

#include "core/result.hpp"

namespace megascope::exec {

int mpi_count(std::int64_t n) {
  MEGASCOPE_CHECK(n >= 0 && n <= std::numeric_limits<int>::max(), "message larger than MPI's int count");
  return static_cast<int>(n);
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string what, double timeout_s)
    : comm_(comm), what_(std::move(what)), timeout_s_(timeout_s) {
  MPI_Comm_size(comm_, &size_);
  MPI_Comm_rank(comm_, &rank_);
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiCommunicator::finish(MPI_Request& req, const char* op) const {
  if (wait_for(req, timeout_s_)) return;
  int world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world);
  std::fprintf(stderr,
               "megascope run: rank %d: %s of the %s (%d ranks) still waiting for the other members after %.0f s; "
               "a member has stopped or hangs. Aborting the job.\n",
               world, op, what_.c_str(), size_, timeout_s_);
  MPI_Abort(MPI_COMM_WORLD, 4);
  std::_Exit(4);
}

void MpiCommunicator::all_reduce(float* data, std::int64_t n, ReduceOp op) {
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Iallreduce(MPI_IN_PLACE, data, mpi_count(n), MPI_FLOAT, op == ReduceOp::sum ? MPI_SUM : MPI_MAX, comm_, &req);
  finish(req, "an all-reduce");
}

void MpiCommunicator::reduce_scatter(float* out, const float* in, std::int64_t n) {
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Ireduce_scatter_block(in, out, mpi_count(n), MPI_FLOAT, MPI_SUM, comm_, &req);
  finish(req, "a reduce-scatter");
}

void MpiCommunicator::all_gather(float* out, const float* in, std::int64_t n) {
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Iallgather(in, mpi_count(n), MPI_FLOAT, out, mpi_count(n), MPI_FLOAT, comm_, &req);
  finish(req, "an all-gather");
}

void MpiCommunicator::all_to_all(float* out, const float* in, std::int64_t n) {
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Ialltoall(in, mpi_count(n), MPI_FLOAT, out, mpi_count(n), MPI_FLOAT, comm_, &req);
  finish(req, "an all-to-all");
}

void MpiCommunicator::barrier() {
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Ibarrier(comm_, &req);
  finish(req, "a barrier");
}

MpiGroups::MpiGroups(const RankGrid& grid, double timeout_s) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
  MEGASCOPE_CHECK(world == grid.world(), "MpiGroups: the MPI world does not match the plan's rank grid");
  for (int g = 0; g < kCommGroupCount; ++g) {
    const auto kind = static_cast<CommGroup>(g);
    const std::vector<int> members = grid.group(world_rank_, kind);
    int colour = MPI_UNDEFINED, key = 0;
    for (std::size_t i = 0; i < members.size(); ++i)
      if (members[i] == world_rank_) {
        // Group ids are 64-bit; colours are int: the smallest member is an
        // equally unique colour within one kind.
        colour = members.front();
        key = static_cast<int>(i);
      }
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, colour, key, &comm);
    if (comm != MPI_COMM_NULL)
      groups_[static_cast<std::size_t>(g)] =
          std::make_unique<MpiCommunicator>(comm, std::string(to_string(kind)) + " group", timeout_s);
  }
}

PointToPoint::Request PointToPoint::send(const float* data, std::int64_t n, int peer, int tag) {
  Request r;
  MPI_Isend(data, mpi_count(n), MPI_FLOAT, peer, tag, MPI_COMM_WORLD, &r.req);
  return r;
}

PointToPoint::Request PointToPoint::recv(float* data, std::int64_t n, int peer, int tag) {
  Request r;
  MPI_Irecv(data, mpi_count(n), MPI_FLOAT, peer, tag, MPI_COMM_WORLD, &r.req);
  return r;
}

bool wait_for(MPI_Request& req, double timeout_s) {
  const auto t0 = std::chrono::steady_clock::now();
  int done = 0;
  long spins = 0;
  while (true) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) return true;
    if (++spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s) return false;
  }
}

bool PointToPoint::wait(Request& r, double timeout_s) { return wait_for(r.req, timeout_s); }

void world_allreduce(const void* in, void* out, int count, MPI_Datatype type, MPI_Op op, double timeout_s,
                     const char* what) {
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Iallreduce(in, out, count, type, op, MPI_COMM_WORLD, &req);
  if (wait_for(req, timeout_s)) return;
  int world = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::fprintf(stderr,
               "megascope run: rank %d: the all-reduce of %s over all %d ranks still waiting after %.0f s; "
               "a rank has stopped or hangs. Aborting the job.\n",
               world, what, size, timeout_s);
  MPI_Abort(MPI_COMM_WORLD, 4);
  std::_Exit(4);
}

void PointToPoint::wait_all(std::vector<Request>& rs) {
  for (Request& r : rs) MPI_Wait(&r.req, MPI_STATUS_IGNORE);
  rs.clear();
}

namespace {

class StagedCommunicator final : public Communicator {
 public:
  explicit StagedCommunicator(Communicator& inner) : inner_(inner) {}
  [[nodiscard]] int size() const override { return inner_.size(); }
  [[nodiscard]] int rank() const override { return inner_.rank(); }
  void all_reduce(float* data, std::int64_t n, ReduceOp op) override {
    std::vector<float> h(data, data + n);
    inner_.all_reduce(h.data(), n, op);
    std::copy(h.begin(), h.end(), data);
  }
  void reduce_scatter(float* out, const float* in, std::int64_t n) override {
    std::vector<float> hin(in, in + n * size()), hout(static_cast<std::size_t>(n));
    inner_.reduce_scatter(hout.data(), hin.data(), n);
    std::copy(hout.begin(), hout.end(), out);
  }
  void all_gather(float* out, const float* in, std::int64_t n) override {
    std::vector<float> hin(in, in + n), hout(static_cast<std::size_t>(n * size()));
    inner_.all_gather(hout.data(), hin.data(), n);
    std::copy(hout.begin(), hout.end(), out);
  }
  void all_to_all(float* out, const float* in, std::int64_t n) override {
    std::vector<float> hin(in, in + n * size()), hout(static_cast<std::size_t>(n * size()));
    inner_.all_to_all(hout.data(), hin.data(), n);
    std::copy(hout.begin(), hout.end(), out);
  }
  void barrier() override { inner_.barrier(); }

 private:
  Communicator& inner_;
};

}  // namespace

StagedGroups::StagedGroups(const GroupSet& inner) : world_rank_(inner.world_rank()) {
  for (int g = 0; g < kCommGroupCount; ++g)
    if (Communicator* c = inner.get(static_cast<CommGroup>(g)))
      groups_[static_cast<std::size_t>(g)] = std::make_unique<StagedCommunicator>(*c);
}

StagedGroups::~StagedGroups() = default;

}  // namespace megascope::exec
