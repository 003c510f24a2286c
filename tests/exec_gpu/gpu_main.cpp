// Entry point of exec_gpu_tests. Without a usable CUDA device it prints
// "skipped: no CUDA device" and exits with 77, which CTest reports as
// skipped (SKIP_RETURN_CODE). Under mpirun each rank takes the GPU of its
// rank on the node (the NCCL tests then also compare with MPI across ranks).
// Listing the tests (what catch_discover_tests does at build time) never
// needs a device.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>

#include "exec/cuda/device.hpp"
#include "exec/cuda/nccl_comm.hpp"
#include "exec/mpi_env.hpp"

int main(int argc, char* argv[]) {
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  const Catch::ConfigData& cfg = session.configData();
  const bool listing = cfg.listTests || cfg.listTestNamesOnly || cfg.listTags || cfg.listReporters || cfg.showHelp;
  if (!listing) {
    try {
      megascope::exec::cuda::require_device();
    } catch (const megascope::exec::cuda::NoCudaDevice& e) {
      std::printf("skipped: %s\n", e.what());
      return 77;
    }
    if (megascope::exec::launched_by_mpi()) {
      megascope::exec::MpiEnv::get();
      megascope::exec::cuda::select_device(megascope::exec::cuda::mpi_local_rank());
    }
  }
  return session.run();
}
