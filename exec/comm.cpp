#include "exec/comm.hpp"

#include <chrono>
#include <limits>
#include <thread>

#include "core/result.hpp"

namespace megascope::exec {

int mpi_count(std::int64_t n) {
  MEGASCOPE_CHECK(n >= 0 && n <= std::numeric_limits<int>::max(), "message larger than MPI's int count");
  return static_cast<int>(n);
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm) : comm_(comm) {
  MPI_Comm_size(comm_, &size_);
  MPI_Comm_rank(comm_, &rank_);
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiCommunicator::all_reduce(float* data, std::int64_t n, ReduceOp op) {
  MPI_Allreduce(MPI_IN_PLACE, data, mpi_count(n), MPI_FLOAT, op == ReduceOp::sum ? MPI_SUM : MPI_MAX, comm_);
}

void MpiCommunicator::reduce_scatter(float* out, const float* in, std::int64_t n) {
  MPI_Reduce_scatter_block(in, out, mpi_count(n), MPI_FLOAT, MPI_SUM, comm_);
}

void MpiCommunicator::all_gather(float* out, const float* in, std::int64_t n) {
  MPI_Allgather(in, mpi_count(n), MPI_FLOAT, out, mpi_count(n), MPI_FLOAT, comm_);
}

void MpiCommunicator::all_to_all(float* out, const float* in, std::int64_t n) {
  MPI_Alltoall(in, mpi_count(n), MPI_FLOAT, out, mpi_count(n), MPI_FLOAT, comm_);
}

void MpiCommunicator::barrier() { MPI_Barrier(comm_); }

MpiGroups::MpiGroups(const RankGrid& grid) {
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
    if (comm != MPI_COMM_NULL) groups_[static_cast<std::size_t>(g)] = std::make_unique<MpiCommunicator>(comm);
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

bool PointToPoint::wait(Request& r, double timeout_s) {
  const auto t0 = std::chrono::steady_clock::now();
  int done = 0;
  long spins = 0;
  while (true) {
    MPI_Test(&r.req, &done, MPI_STATUS_IGNORE);
    if (done) return true;
    if (++spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s) return false;
  }
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
