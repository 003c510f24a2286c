// The engine on sharded data parallelism: ZeRO-3's gathers hide behind the
// compute only as far as they are prefetched, its traffic costs more than
// ZeRO-1's where the network is the bottleneck, and hybrid sharding's
// Programs simulate in full and reduced mode alike.
#include <catch2/catch.hpp>

#include "core/program/builder.hpp"
#include "sim/engine.hpp"
#include "sim/network.hpp"
#include "support.hpp"

using namespace megascope;
using namespace megascope::sim;
using megascope::test::make_setup;
using megascope::test::shipped_model;

namespace {

double step_time(const Setup& s, Mode mode = Mode::reduced) {
  auto p = build_program(s);
  REQUIRE(p);
  auto cost = CostModel::for_device(s.cluster.device);
  REQUIRE(cost);
  auto r = simulate(*p, Topology::build(s.cluster, s.world), *cost, {mode, false, {}});
  REQUIRE(r);
  return r->step_time_s;
}

}  // namespace

TEST_CASE("ZeRO-3's layer gathers hide behind the compute when prefetched and cost more than ZeRO-1's", "[sim][zero]") {
  ModelSpec m = shipped_model("llama3-8b");
  m.num_layers = 8;
  // 32 H100s over 4 nodes, DP 32: every layer gathered over InfiniBand.
  const auto at = [&](const std::string& plan) { return step_time(make_setup(m, "dgx-h100", plan, 64, 32, 4096)); };
  const double z1 = at("tp=1,distopt=on,overlap_grad_reduce=on,overlap_param_gather=on");
  const double none = at("tp=1,zero=3,overlap_grad_reduce=on,fsdp_prefetch=0");
  const double one = at("tp=1,zero=3,overlap_grad_reduce=on,fsdp_prefetch=1");
  const double two = at("tp=1,zero=3,overlap_grad_reduce=on,fsdp_prefetch=2");
  INFO("zero 1 " << z1 << " s; zero 3 prefetch 0/1/2: " << none << ", " << one << ", " << two << " s");
  CHECK(one < none);          // the next layer's gather runs beside this layer's compute
  CHECK(two <= one * 1.001);  // a deeper prefetch never waits longer
  CHECK(z1 < one);            // two gathers and a reduce-scatter per micro-batch against one of each per step
}

TEST_CASE("Hybrid sharding simulates the same in full and reduced mode", "[sim][zero]") {
  ModelSpec m = shipped_model("llama3-8b");
  m.num_layers = 4;
  for (const char* plan : {"tp=2,sp=on,zero=3,dp_replicas=2,overlap_grad_reduce=on",
                           "tp=1,distopt=on,dp_replicas=4,overlap_grad_reduce=on,overlap_param_gather=on"}) {
    INFO(plan);
    const Setup s = make_setup(m, "dgx-h100", plan, 32, 16, 2048);
    CHECK(step_time(s, Mode::full) == Approx(step_time(s, Mode::reduced)).epsilon(1e-9));
  }
}
