// Communicators for the executor: the ranks' TP, CP, DP, DPxCP, PP, EP and
// embedding groups of a Program's rank grid as MPI communicators, with the
// collectives the Program uses (all-reduce, reduce-scatter, all-gather,
// all-to-all) and non-blocking point-to-point for pipeline transfers.
//
// `Communicator` is the interface the runtime calls; `MpiGroups` builds one
// per group kind from MPI_COMM_WORLD with MPI_Comm_split (colour = the
// group's id in the RankGrid, key = the member's index), so that group
// membership and order are exactly the RankGrid's (Megatron's tp-cp-dp-pp).
// The GPU backend will provide an NCCL implementation of the same interface.
// Collectives and pipeline receives wait at most a timeout (the run's
// --recv-timeout): a member that stops or hangs makes the others name the
// group and abort the job, instead of waiting forever. Does not: fault
// tolerance beyond that (a dead rank aborts the job through the launcher).
#pragma once

#include <mpi.h>

#include <array>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/rank_grid.hpp"

namespace megascope::exec {

enum class ReduceOp : std::uint8_t { sum, max };

class Communicator {
 public:
  virtual ~Communicator() = default;
  [[nodiscard]] virtual int size() const = 0;
  [[nodiscard]] virtual int rank() const = 0;   // index in the group
  // In place over `n` floats.
  virtual void all_reduce(float* data, std::int64_t n, ReduceOp op = ReduceOp::sum) = 0;
  // in (size * n) -> out (n): this member's block of the element-wise sum.
  virtual void reduce_scatter(float* out, const float* in, std::int64_t n) = 0;
  // in (n) -> out (size * n), blocks in member order.
  virtual void all_gather(float* out, const float* in, std::int64_t n) = 0;
  // in (size * n) -> out (size * n): block j goes to member j.
  virtual void all_to_all(float* out, const float* in, std::int64_t n) = 0;
  virtual void barrier() = 0;
};

// MPI's non-blocking collective on `comm`, waited for at most `timeout_s`
// (polling; infinite: no limit).
class MpiCommunicator final : public Communicator {
 public:
  // `what` names the group in a timeout's message ("data-parallel group").
  explicit MpiCommunicator(MPI_Comm comm, std::string what = "group",
                           double timeout_s = std::numeric_limits<double>::infinity());
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;
  [[nodiscard]] int size() const override { return size_; }
  [[nodiscard]] int rank() const override { return rank_; }
  void all_reduce(float* data, std::int64_t n, ReduceOp op = ReduceOp::sum) override;
  void reduce_scatter(float* out, const float* in, std::int64_t n) override;
  void all_gather(float* out, const float* in, std::int64_t n) override;
  void all_to_all(float* out, const float* in, std::int64_t n) override;
  void barrier() override;
  [[nodiscard]] MPI_Comm handle() const { return comm_; }

 private:
  // Waits for the collective `req` (`op` names it); past the timeout, prints
  // which rank, group and collective waited and aborts the job (exit 4).
  void finish(MPI_Request& req, const char* op) const;
  MPI_Comm comm_;
  int size_ = 1, rank_ = 0;
  std::string what_;
  double timeout_s_;
};

// One rank's communicators, one per CommGroup kind (absent where the rank is
// in no such group, e.g. the embedding group on a middle stage).
class GroupSet {
 public:
  virtual ~GroupSet() = default;
  [[nodiscard]] virtual Communicator* get(CommGroup g) const = 0;
  [[nodiscard]] virtual int world_rank() const = 0;
};

class MpiGroups final : public GroupSet {
 public:
  // Collective over MPI_COMM_WORLD: every rank of the world must call it.
  // The world's size must equal grid.world().
  // Each collective waits at most `timeout_s` for the group's other members.
  explicit MpiGroups(const RankGrid& grid, double timeout_s = std::numeric_limits<double>::infinity());
  [[nodiscard]] Communicator* get(CommGroup g) const override { return groups_[static_cast<std::size_t>(g)].get(); }
  [[nodiscard]] int world_rank() const override { return world_rank_; }

 private:
  std::array<std::unique_ptr<MpiCommunicator>, kCommGroupCount> groups_;
  int world_rank_ = 0;
};

// The communicators of `inner` run on host copies of the buffers they are
// given (copied in before, out after): for buffers MPI must not read or
// write in place, such as CUDA managed memory, which the host can read but
// which MPI's single-copy shared-memory transports may not map.
class StagedGroups final : public GroupSet {
 public:
  explicit StagedGroups(const GroupSet& inner);
  ~StagedGroups() override;
  [[nodiscard]] Communicator* get(CommGroup g) const override { return groups_[static_cast<std::size_t>(g)].get(); }
  [[nodiscard]] int world_rank() const override { return world_rank_; }

 private:
  std::array<std::unique_ptr<Communicator>, kCommGroupCount> groups_;
  int world_rank_ = 0;
};

// Pipeline transfers: non-blocking sends and receives of float buffers.
class PointToPoint {
 public:
  struct Request {
    MPI_Request req = MPI_REQUEST_NULL;
  };
  Request send(const float* data, std::int64_t n, int peer, int tag);
  Request recv(float* data, std::int64_t n, int peer, int tag);
  // Waits for `r`; while waiting, checks every `poll_s` seconds and gives up
  // after `timeout_s`, returning false (the caller reports which peer).
  bool wait(Request& r, double timeout_s);
  void wait_all(std::vector<Request>& rs);
};

int mpi_count(std::int64_t n);   // checked narrowing for MPI's int counts

// Waits for `req` at most `timeout_s` (polling, as the timed waits above);
// false when it has not completed by then.
bool wait_for(MPI_Request& req, double timeout_s);

// MPI_Allreduce over MPI_COMM_WORLD (in place when `in` is MPI_IN_PLACE),
// waited for at most `timeout_s`; past it, prints which rank waited for
// `what` and aborts the job (exit 4).
void world_allreduce(const void* in, void* out, int count, MPI_Datatype type, MPI_Op op, double timeout_s,
                     const char* what);

}  // namespace megascope::exec
