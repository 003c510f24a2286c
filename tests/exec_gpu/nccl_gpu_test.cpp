// NCCL communicators (exec/cuda/nccl_comm.hpp): on a group of one every
// collective is a copy; launched under mpirun with two or more GPUs, each
// collective over the world equals MpiCommunicator's result on the same
// inputs (exactly for gather/scatter/all-to-all, within fp32 summation-order
// error for the sums; NCCL needs one GPU per rank); NcclGroups shares a communicator between group kinds
// with the same members and stream.
#include <catch2/catch.hpp>

#include <mpi.h>

#include <numeric>
#include <vector>

#include "exec/comm.hpp"
#include "exec/cuda/nccl_comm.hpp"
#include "exec/mpi_env.hpp"
#include "kernels_gpu/gpu_support.hpp"

namespace xc = megascope::exec::cuda;
namespace ex = megascope::exec;
using megascope::kernels::gpu_test::rel_error;
using megascope::kernels::gpu_test::uniform;

namespace {

std::vector<float> download(const xc::DeviceBuffer<float>& b) { return b.download(); }

}  // namespace

TEST_CASE("NCCL on a group of one: every collective and a send to oneself copy the data", "[exec][gpu]") {
  ex::MpiEnv::get();
  xc::StreamSet streams;
  auto comm = xc::NcclCommunicator::over_mpi(MPI_COMM_SELF, streams.get(megascope::Stream::dp), /*blocking=*/true);
  REQUIRE(comm->size() == 1);
  REQUIRE(comm->rank() == 0);
  const std::int64_t n = 1000;
  const auto x = uniform<float>(n, 7);
  xc::DeviceBuffer<float> a(x), b(static_cast<std::size_t>(n));
  comm->all_reduce(a.get(), n);
  CHECK(download(a) == x);
  comm->all_reduce(a.get(), n, ex::ReduceOp::max);
  CHECK(download(a) == x);
  comm->reduce_scatter(b.get(), a.get(), n);
  CHECK(download(b) == x);
  b.upload(std::vector<float>(static_cast<std::size_t>(n), 0.0f));
  comm->all_gather(b.get(), a.get(), n);
  CHECK(download(b) == x);
  b.upload(std::vector<float>(static_cast<std::size_t>(n), 0.0f));
  comm->all_to_all(b.get(), a.get(), n);
  CHECK(download(b) == x);
  b.upload(std::vector<float>(static_cast<std::size_t>(n), 0.0f));
  comm->exchange({{true, a.get(), n, ncclFloat32, 0, nullptr}, {false, b.get(), n, ncclFloat32, 0, nullptr}});
  CHECK(download(b) == x);
  comm->barrier();
  CHECK_THROWS_AS(comm->send(a.get(), n, ncclFloat32, 1), std::invalid_argument);
}

TEST_CASE("NCCL collectives over the MPI world equal MPI's (under mpirun with 2+ GPUs)", "[exec][gpu][mpi]") {
  ex::MpiEnv& env = ex::MpiEnv::get();
  if (env.size() < 2) {
    WARN("one rank: run under mpirun -np 2 (or more, one GPU each) to compare NCCL with MPI");
    return;
  }
  MPI_Comm dup_nccl = MPI_COMM_NULL, dup_mpi = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup_nccl);
  MPI_Comm_dup(MPI_COMM_WORLD, &dup_mpi);
  xc::StreamSet streams;
  auto nccl = xc::NcclCommunicator::over_mpi(dup_nccl, streams.get(megascope::Stream::tp), /*blocking=*/true);
  ex::MpiCommunicator mpi(dup_mpi);   // owns dup_mpi
  const int P = env.size(), me = env.rank();
  REQUIRE(nccl->size() == P);
  REQUIRE(nccl->rank() == me);
  const std::int64_t n = 4099;   // odd: not a multiple of anything
  const auto x = uniform<float>(static_cast<std::size_t>(n * P), 100 + static_cast<std::uint64_t>(me));
  const auto block = std::vector<float>(x.begin(), x.begin() + n);
  xc::DeviceBuffer<float> a(x), out(static_cast<std::size_t>(n * P));

  SECTION("all-reduce sum and max") {
    for (const ex::ReduceOp op : {ex::ReduceOp::sum, ex::ReduceOp::max}) {
      a.upload(x);
      nccl->all_reduce(a.get(), n * P, op);
      std::vector<float> expected = x;
      mpi.all_reduce(expected.data(), n * P, op);
      CHECK(rel_error(download(a), expected) <= 1e-6);
    }
  }
  SECTION("reduce-scatter") {
    nccl->reduce_scatter(out.get(), a.get(), n);
    std::vector<float> expected(static_cast<std::size_t>(n));
    mpi.reduce_scatter(expected.data(), x.data(), n);
    auto got = download(out);
    got.resize(static_cast<std::size_t>(n));
    CHECK(rel_error(got, expected) <= 1e-6);
  }
  SECTION("all-gather") {
    nccl->all_gather(out.get(), a.get(), n);
    std::vector<float> expected(static_cast<std::size_t>(n * P));
    mpi.all_gather(expected.data(), block.data(), n);
    CHECK(download(out) == expected);
  }
  SECTION("all-to-all") {
    nccl->all_to_all(out.get(), a.get(), n);
    std::vector<float> expected(static_cast<std::size_t>(n * P));
    mpi.all_to_all(expected.data(), x.data(), n);
    CHECK(download(out) == expected);
  }
  SECTION("pipeline send and receive around a ring, as one exchange") {
    const int next = (me + 1) % P, prev = (me + P - 1) % P;
    nccl->exchange({{true, a.get(), n, ncclFloat32, next, streams.get(megascope::Stream::pp_send)},
                    {false, out.get(), n, ncclFloat32, prev, streams.get(megascope::Stream::pp_recv)}});
    const auto theirs = uniform<float>(static_cast<std::size_t>(n * P), 100 + static_cast<std::uint64_t>(prev));
    auto got = download(out);
    got.resize(static_cast<std::size_t>(n));
    CHECK(got == std::vector<float>(theirs.begin(), theirs.begin() + n));
  }
  nccl->barrier();
  nccl.reset();
  MPI_Comm_free(&dup_nccl);
}

TEST_CASE("NcclGroups: one communicator per group, shared by kinds with the same members and stream", "[exec][gpu]") {
  ex::MpiEnv& env = ex::MpiEnv::get();
  megascope::RankGrid grid;
  grid.tp = env.size();   // every rank in one TP group; every other group is the rank alone
  ex::MpiGroups mpi(grid);
  xc::StreamSet streams;
  xc::NcclGroups groups(grid, mpi, streams, /*blocking=*/true);
  using megascope::CommGroup;
  REQUIRE(groups.get(CommGroup::tp) != nullptr);
  CHECK(groups.get(CommGroup::tp)->size() == env.size());
  CHECK(groups.get(CommGroup::tp)->stream() == streams.get(megascope::Stream::tp));
  CHECK(groups.get(CommGroup::dp)->size() == 1);
  CHECK(groups.get(CommGroup::dp)->stream() == streams.get(megascope::Stream::dp));
  CHECK(groups.get(CommGroup::dp_cp) == groups.get(CommGroup::dp));       // same members, same stream
  CHECK((groups.get(CommGroup::etp) != groups.get(CommGroup::tp) || env.size() == 1));
  CHECK(groups.get(CommGroup::cp) != groups.get(CommGroup::dp));          // same members, other stream
  const std::int64_t n = 64;
  xc::DeviceBuffer<float> a(std::vector<float>(n, 1.0f));
  groups.get(CommGroup::tp)->all_reduce(a.get(), n);
  for (float v : a.download()) CHECK(v == static_cast<float>(env.size()));
}
