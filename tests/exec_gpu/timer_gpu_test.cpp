// CUDA-event op timing (exec/cuda/timer.hpp): spans are in seconds from the
// step's start, ordered as the streams' dependencies order them, and the
// event pool is reused from step to step.
#include <catch2/catch.hpp>

#include "exec/cuda/device.hpp"
#include "exec/cuda/device_kernels.hpp"
#include "exec/cuda/timer.hpp"

namespace xc = megascope::exec::cuda;
using megascope::Stream;

TEST_CASE("OpTimer: spans from the step start, a dependent op on another stream starts after its producer ends",
          "[exec][gpu]") {
  xc::StreamSet streams;
  xc::OpTimer timer(5);
  const std::size_t bytes = 256u << 20;
  xc::DeviceMemory src(bytes), dst(bytes);
  MEGASCOPE_CUDA_CHECK(cudaMemset(src.get(), 1, bytes));
  std::size_t pooled = 0;
  for (int step = 0; step < 2; ++step) {
    const cudaStream_t compute = streams.compute(), tp = streams.get(Stream::tp);
    timer.start_step(compute);
    timer.begin(0, compute);
    MEGASCOPE_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, compute));
    timer.end(0, compute);
    xc::Event produced;
    produced.record(compute);
    produced.wait(tp);   // op 1 depends on op 0
    timer.begin(1, tp);
    MEGASCOPE_CUDA_CHECK(cudaMemcpyAsync(src.get(), dst.get(), bytes, cudaMemcpyDeviceToDevice, tp));
    timer.end(1, tp);
    const auto spans = timer.collect();
    REQUIRE(spans.size() == 2);
    CHECK(spans[0].rank == 5);
    CHECK(spans[0].op == 0);
    CHECK(spans[1].op == 1);
    CHECK(spans[0].start >= 0.0);
    CHECK(spans[0].end > spans[0].start);   // a 256 MiB copy takes well over the 0.5 us resolution
    CHECK(spans[1].start >= spans[0].end - 1e-6);
    CHECK(spans[1].end > spans[1].start);
    if (step == 0) pooled = timer.pooled_events();
    else CHECK(timer.pooled_events() == pooled);
  }
  CHECK(pooled == 5);   // the step's origin and two per op
}

TEST_CASE("OpTimer::collect refuses an op begun and never ended", "[exec][gpu]") {
  xc::StreamSet streams;
  xc::OpTimer timer(0);
  timer.start_step(streams.compute());
  timer.begin(3, streams.compute());
  xc::launch_empty(streams.compute());
  CHECK_THROWS_AS(timer.collect(), std::logic_error);
  timer.end(3, streams.compute());
  CHECK(timer.collect().size() == 1);
}
