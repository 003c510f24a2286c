// The GPU runtime's building blocks on a machine without a usable CUDA
// device (this repository's CI: nvcc, no GPU, no driver): every entry point
// fails with one clear NoCudaDevice error instead of crashing. On a machine with a GPU the no-device cases pass vacuously (the
// exec_gpu tests cover that side); the error-message tests run everywhere.
#include <catch2/catch.hpp>

#include <sstream>
#include <string>

#include "exec/cuda/check.hpp"
#include "exec/cuda/device.hpp"
#include "exec/cuda/gemm.hpp"
#include "exec/cuda/timer.hpp"

namespace xc = megascope::exec::cuda;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

namespace {

// Runs `f`, expecting NoCudaDevice whose message starts with "no CUDA device (".
template <class F>
void expect_no_device(F&& f) {
  try {
    f();
    FAIL("no exception: expected NoCudaDevice");
  } catch (const xc::NoCudaDevice& e) {
    CHECK_THAT(e.what(), StartsWith("no CUDA device ("));
  }
}

}  // namespace

TEST_CASE("cuBLAS and NCCL failures name file:line, the call and the status", "[exec][cuda]") {
  const std::string c = xc::cublas_error_message(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmul(...)", "gemm.cpp", 42);
  CHECK_THAT(c, StartsWith("gemm.cpp:42: cublasLtMatmul(...): CUBLAS_STATUS_NOT_SUPPORTED: "));
  const std::string n = xc::nccl_error_message(ncclInvalidUsage, "ncclAllReduce(...)", "nccl_comm.cpp", 7);
  CHECK_THAT(n, StartsWith("nccl_comm.cpp:7: ncclAllReduce(...): ncclInvalidUsage: "));
  CHECK_THROWS_WITH(MEGASCOPE_CUBLAS_CHECK(CUBLAS_STATUS_INVALID_VALUE), Contains("CUBLAS_STATUS_INVALID_VALUE"));
  CHECK_THROWS_WITH(MEGASCOPE_NCCL_CHECK(ncclInvalidArgument), Contains("ncclInvalidArgument"));
  CHECK_NOTHROW(MEGASCOPE_NCCL_CHECK(ncclSuccess));
}

TEST_CASE("The groups' streams are the Program's: tp and etp on tp, gradients on dp", "[exec][cuda]") {
  using megascope::CommGroup;
  using megascope::Stream;
  CHECK(xc::stream_of(CommGroup::tp) == Stream::tp);
  CHECK(xc::stream_of(CommGroup::etp) == Stream::tp);
  CHECK(xc::stream_of(CommGroup::cp) == Stream::cp);
  CHECK(xc::stream_of(CommGroup::ep) == Stream::ep);
  for (CommGroup g : {CommGroup::dp, CommGroup::dp_cp, CommGroup::edp, CommGroup::embedding})
    CHECK(xc::stream_of(g) == Stream::dp);
  CHECK(xc::stream_of(CommGroup::pp) == Stream::pp_send);
}

TEST_CASE("OpTimer refuses an op begun before the step or ended twice, without touching the device", "[exec][cuda]") {
  xc::OpTimer t(3);
  CHECK_THROWS_AS(t.begin(0, nullptr), std::logic_error);
  CHECK_THROWS_AS(t.end(0, nullptr), std::logic_error);
  CHECK(t.collect().empty());
}

TEST_CASE("Without a CUDA device every entry point throws NoCudaDevice", "[exec][cuda]") {
  if (xc::device_available()) {
    WARN("a CUDA device is present: the no-device paths are not exercised here");
    return;
  }
  expect_no_device([] { xc::require_device(); });
  expect_no_device([] { (void)xc::device_info(); });
  expect_no_device([] { (void)xc::select_device(0); });
  expect_no_device([] { xc::DeviceMemory m(1024); });
  expect_no_device([] { xc::DeviceBuffer<float> b(16); });
  expect_no_device([] { xc::StreamSet s; });
  expect_no_device([] { xc::Gemm g; });
  expect_no_device([] { xc::Event e; });
  expect_no_device([] {
    xc::OpTimer t(0);
    t.start_step(nullptr);
  });
}
