// The MPI process environment: initialised once per process (on first use),
// finalised at exit. Commands that can run either alone or under
// `mpirun -np K` ask launched_by_mpi() first, so that a plain run never
// touches MPI.
#pragma once

#include <string>
#include <vector>

namespace megascope::exec {

// True when the process was started by an MPI launcher (mpirun, mpiexec,
// srun with PMI): the launcher's environment variables are present.
bool launched_by_mpi();

class MpiEnv {
 public:
  // Initialises MPI (MPI_THREAD_FUNNELED) the first time; later calls
  // return the same object. Finalised by an atexit handler.
  static MpiEnv& get();
  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return size_; }

  // Every rank's string, in rank order, on `root` (empty on the others).
  [[nodiscard]] std::vector<std::string> gather(const std::string& mine, int root = 0) const;
  // `root`'s string on every rank.
  [[nodiscard]] std::string broadcast(const std::string& value, int root = 0) const;
  void barrier() const;
  // Ends every rank of the job with `code` (after a fatal error on one rank).
  [[noreturn]] void abort(int code) const;

 private:
  MpiEnv();
  int rank_ = 0, size_ = 1;
};

}  // namespace megascope::exec
