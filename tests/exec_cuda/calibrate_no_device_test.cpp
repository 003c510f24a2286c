// `megascope calibrate --backend cuda` on a machine without a usable CUDA
// device (this repository's CI): the measuring functions throw NoCudaDevice,
// and the command exits with status 1 and one line saying "no CUDA device",
// whether its entry is called directly or through the CLI. On a machine with
// a GPU these pass vacuously (scripts/gpu-check.sh runs the calibration there).
#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

#include "apps/calibrate_cuda.hpp"
#include "apps/cli_runner.hpp"
#include "exec/cuda/calibrate_cuda.hpp"

namespace xc = megascope::exec::cuda;
using Catch::Matchers::StartsWith;

namespace {

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

TEST_CASE("Without a CUDA device the GPU calibration's measurements throw NoCudaDevice", "[exec][cuda]") {
  if (xc::device_available()) {
    WARN("a CUDA device is present: the no-device paths are not exercised here");
    return;
  }
  const megascope::exec::CalibrationSettings s;
  const megascope::exec::Progress none;
  expect_no_device([&] { (void)xc::time_gemms({}, s, none); });
  expect_no_device([&] { (void)xc::time_memory({}, s, none); });
  expect_no_device([&] { (void)xc::time_attention({}, s, none); });
  expect_no_device([&] { (void)xc::time_comms({}, s, none); });
  expect_no_device([&] { (void)xc::time_empty_op(s); });
  expect_no_device([&] { (void)xc::time_copy(1024, s); });
  expect_no_device([] { (void)xc::describe_gpu(); });
}

TEST_CASE("calibrate --backend cuda without a device: status 1 and one line saying no CUDA device", "[exec][cuda]") {
  if (xc::device_available()) {
    WARN("a CUDA device is present: not testing the no-device error");
    return;
  }
  megascope::cli::CalibrateOptions o;
  o.backend = "cuda";
  o.output = "never-written.toml";
  std::ostringstream out, err;
  CHECK(megascope::cli::run_calibrate_cuda(o, out, err) == 1);
  CHECK(out.str().empty());
  CHECK_THAT(err.str(), StartsWith("megascope calibrate: error: --backend cuda: no CUDA device ("));
  const std::string e = err.str();
  CHECK(std::count(e.begin(), e.end(), '\n') == 1);
}

TEST_CASE("megascope calibrate --backend cuda without a device: status 1, no CUDA device, nothing written",
          "[exec][cuda]") {
  if (xc::device_available()) {
    WARN("a CUDA device is present: not testing the no-device error");
    return;
  }
  const std::string path = "calibrate-no-device-never-written.toml";
  const auto r = megascope::test::run({"calibrate", "--backend", "cuda", "-o", path});
  CHECK(r.code == 1);
  CHECK(r.out.empty());
  CHECK_THAT(r.err, StartsWith("megascope calibrate: error: --backend cuda: no CUDA device ("));
  std::ifstream f(path);
  CHECK_FALSE(f.good());
}
