#include "exec/mpi_env.hpp"

#include <mpi.h>

#include <cstdlib>

#include "core/result.hpp"

namespace megascope::exec {

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS", "SLURM_PROCID"})
    if (std::getenv(v)) return true;
  return false;
}

namespace {
void finalize_mpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}
}  // namespace

MpiEnv::MpiEnv() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    std::atexit(finalize_mpi);
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

MpiEnv& MpiEnv::get() {
  static MpiEnv env;
  return env;
}

std::vector<std::string> MpiEnv::gather(const std::string& mine, int root) const {
  const int len = static_cast<int>(mine.size());
  std::vector<int> lens(static_cast<std::size_t>(size_));
  MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, root, MPI_COMM_WORLD);
  std::vector<int> displs(static_cast<std::size_t>(size_), 0);
  std::string all;
  if (rank_ == root) {
    long total = 0;
    for (int r = 0; r < size_; ++r) {
      displs[static_cast<std::size_t>(r)] = static_cast<int>(total);
      total += lens[static_cast<std::size_t>(r)];
    }
    MEGASCOPE_CHECK(total < (1L << 31), "gathered results exceed 2 GiB");
    all.resize(static_cast<std::size_t>(total));
  }
  MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, root, MPI_COMM_WORLD);
  std::vector<std::string> out;
  if (rank_ == root)
    for (int r = 0; r < size_; ++r)
      out.push_back(all.substr(static_cast<std::size_t>(displs[static_cast<std::size_t>(r)]),
                               static_cast<std::size_t>(lens[static_cast<std::size_t>(r)])));
  return out;
}

std::string MpiEnv::broadcast(const std::string& value, int root) const {
  int len = static_cast<int>(value.size());
  MPI_Bcast(&len, 1, MPI_INT, root, MPI_COMM_WORLD);
  std::string out = rank_ == root ? value : std::string(static_cast<std::size_t>(len), '\0');
  MPI_Bcast(out.data(), len, MPI_CHAR, root, MPI_COMM_WORLD);
  return out;
}

void MpiEnv::barrier() const { MPI_Barrier(MPI_COMM_WORLD); }

void MpiEnv::abort(int code) const {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();
}

}  // namespace megascope::exec
