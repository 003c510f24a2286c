// collective_flow: latency-bound small messages, the algorithm choice by size
// and span, point-to-point and all-to-all loads, collectives sharing the
// network, determinism and cost on a large cluster.
#include <catch2/catch.hpp>
#include <chrono>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "config/library.hpp"
#include "core/cluster.hpp"
#include "sim/network.hpp"

using namespace megascope;
using namespace megascope::sim;

namespace {

constexpr double KiB = 1024.0, MiB = 1024.0 * KiB, GiB = 1024.0 * MiB;

Topology topology(const std::string& cluster, int devices) {
  auto c = resolve_cluster(cluster);
  REQUIRE(c);
  auto sized = with_device_count(*c, devices);
  REQUIRE(sized);
  return Topology::build(*sized, devices);
}

std::vector<int> iota(int n, int first = 0, int stride = 1) {
  std::vector<int> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = first + i * stride;
  return v;
}

double seconds(const Topology& t, Collective c, const std::vector<int>& d, double bytes,
               Algorithm a = Algorithm::automatic) {
  return isolated_time(t, collective_flow(t, c, d, bytes, a));
}

}  // namespace

TEST_CASE("A 1 KiB all-reduce over 8 GPUs takes microseconds of latency and not zero", "[sim]") {
  for (const char* cluster : {"dgx-a100", "dgx-h100"}) {
    const Topology t = topology(cluster, 8);
    const FlowSpec f = collective_flow(t, Collective::all_reduce, iota(8), 1 * KiB);
    const double s = isolated_time(t, f);
    INFO(cluster << ": " << s * 1e6 << " us");
    CHECK(s > 5e-6);
    CHECK(s < 50e-6);
    CHECK(f.latency_s > 0.9 * s);  // latency-bound: the volume term is small
    CHECK(bus_bandwidth(Collective::all_reduce, 8, 1 * KiB, s) < 1e9);
  }
}

TEST_CASE("Across nodes the tree carries small all-reduces and the ring large ones", "[sim]") {
  const Topology t = topology("dgx-a100", 128);  // 16 nodes
  const auto all = iota(128);
  CHECK(collective_flow(t, Collective::all_reduce, all, 64 * KiB).algorithm == Algorithm::tree);
  CHECK(collective_flow(t, Collective::all_reduce, all, 8 * GiB).algorithm == Algorithm::ring);
  // One rank per node (a data-parallel group with TP = 8): 16 ranks, all on rail 0.
  const auto dp = iota(16, 0, 8);
  CHECK(collective_flow(t, Collective::all_reduce, dp, 64 * KiB).algorithm == Algorithm::tree);
  const double small_tree = seconds(t, Collective::all_reduce, dp, 1 * KiB, Algorithm::tree);
  const double small_ring = seconds(t, Collective::all_reduce, dp, 1 * KiB, Algorithm::ring);
  CHECK(small_tree < small_ring);
  // Large: the ring's bus bandwidth is the NIC's, 0.92 x 25 GB/s.
  const double big = seconds(t, Collective::all_reduce, dp, 4 * GiB);
  CHECK(bus_bandwidth(Collective::all_reduce, 16, 4 * GiB, big) / 1e9 == Approx(23).epsilon(0.05));
}

TEST_CASE("Reduce-scatter and all-gather move half the bytes of an all-reduce", "[sim]") {
  const Topology t = topology("dgx-h100", 32);
  for (const auto& group : {iota(8), iota(32), iota(4, 0, 8)}) {
    const double ar = seconds(t, Collective::all_reduce, group, 1 * GiB, Algorithm::ring);
    const double rs = seconds(t, Collective::reduce_scatter, group, 1 * GiB);
    const double ag = seconds(t, Collective::all_gather, group, 1 * GiB);
    CHECK(rs == Approx(ag));
    CHECK(rs == Approx(ar / 2).epsilon(0.05));
  }
}

TEST_CASE("A send over NVLink beats the same send across nodes", "[sim]") {
  const Topology t = topology("dgx-h100", 16);
  const double intra = seconds(t, Collective::send_recv, {0, 1}, 64 * MiB);
  const double inter = seconds(t, Collective::send_recv, {0, 8}, 64 * MiB);
  CHECK(intra < inter);
  // Across nodes, rail 0 to rail 0: 64 MiB at ~0.92 x 50 GB/s plus tens of microseconds.
  CHECK(inter == Approx(64 * MiB / (0.92 * 50e9)).epsilon(0.1));
  const FlowSpec f = collective_flow(t, Collective::send_recv, std::vector<int>{3, 11}, 1 * MiB);
  CHECK(f.algorithm == Algorithm::direct);
  CHECK(f.load.size() == 4);  // gpu3->nic3->leaf3->nic11->gpu11
  CHECK(collective_flow(t, Collective::send_recv, std::vector<int>{5, 5}, 1 * MiB).load.empty());
  CHECK_THROWS(collective_flow(t, Collective::send_recv, std::vector<int>{1, 2, 3}, 1 * MiB));
}

TEST_CASE("scale_out.p2p_efficiency slows sends between nodes only: not NVLink sends, all-to-alls or collectives", "[sim]") {
  auto c = resolve_cluster("dgx-a100");
  REQUIRE(c);
  auto base = with_device_count(*c, 16);
  REQUIRE(base);
  ClusterSpec slow = *base;
  slow.scale_out.p2p_efficiency = 0.5;
  const Topology a = Topology::build(*base, 16), b = Topology::build(slow, 16);
  const double bytes = 64 * MiB;
  // Across nodes: the same latency, the payload at half the rate.
  const FlowSpec fa = collective_flow(a, Collective::send_recv, std::vector<int>{0, 8}, bytes);
  const FlowSpec fb = collective_flow(b, Collective::send_recv, std::vector<int>{0, 8}, bytes);
  CHECK(fb.latency_s == fa.latency_s);
  const double ta = isolated_time(a, fa), tb = isolated_time(b, fb);
  CHECK(tb - fb.latency_s == Approx(2 * (ta - fa.latency_s)).epsilon(1e-9));
  CHECK(bus_bandwidth(Collective::send_recv, 2, bytes, ta - fa.latency_s) / 1e9 == Approx(0.92 * 25).epsilon(1e-6));
  // Unchanged: a send inside a node, an all-to-all across nodes, a ring across nodes.
  CHECK(seconds(b, Collective::send_recv, {0, 1}, bytes) == seconds(a, Collective::send_recv, {0, 1}, bytes));
  CHECK(seconds(b, Collective::all_to_all, iota(16), bytes) == seconds(a, Collective::all_to_all, iota(16), bytes));
  CHECK(seconds(b, Collective::all_reduce, iota(2, 0, 8), bytes) == seconds(a, Collective::all_reduce, iota(2, 0, 8), bytes));
}

TEST_CASE("An all-to-all loads every device's links with the bytes it sends to its peers", "[sim]") {
  const Topology t = topology("dgx-h100", 16);
  const FlowSpec one = collective_flow(t, Collective::all_to_all, iota(8), 1 * GiB);
  // Each device sends 7/8 of its buffer over its NVLink uplink.
  double max_load = 0;
  for (const auto& [l, w] : one.load) max_load = std::max(max_load, w);
  CHECK(max_load * 0.8 == Approx(7.0 / 8.0));  // divided by the Simple NVLink efficiency
  // Across two nodes half of each buffer crosses the NICs: slower.
  CHECK(seconds(t, Collective::all_to_all, iota(16), 1 * GiB) > 2 * isolated_time(t, one));
}

TEST_CASE("Two all-reduces on the same GPUs share NVLink and take twice as long as one", "[sim]") {
  const Topology t = topology("dgx-a100", 16);
  const FlowSpec node0 = collective_flow(t, Collective::all_reduce, iota(8), 1 * GiB);
  const FlowSpec node1 = collective_flow(t, Collective::all_reduce, iota(8, 8), 1 * GiB);
  const double alone = isolated_time(t, node0);
  const double volume = alone - node0.latency_s;

  Network shared(t);
  shared.start(node0, 0);
  shared.start(node0, 0);
  double end = 0;
  while (auto e = shared.next_event_time()) {
    end = *e;
    shared.advance_to(*e);
  }
  CHECK(end == Approx(node0.latency_s + 2 * volume));

  Network disjoint(t);
  disjoint.start(node0, 0);
  disjoint.start(node1, 0);
  end = 0;
  while (auto e = disjoint.next_event_time()) {
    end = *e;
    disjoint.advance_to(*e);
  }
  CHECK(end == Approx(alone));
}

TEST_CASE("The same collective on the same inputs gives the same flow", "[sim]") {
  const Topology a = topology("dgx-a100", 64);
  const Topology b = topology("dgx-a100", 64);
  for (Collective c : {Collective::all_reduce, Collective::reduce_scatter, Collective::all_gather,
                       Collective::all_to_all, Collective::broadcast}) {
    for (double bytes : {4 * KiB, 16 * MiB, 2 * GiB}) {
      const FlowSpec x = collective_flow(a, c, iota(64), bytes);
      const FlowSpec y = collective_flow(b, c, iota(64), bytes);
      const FlowSpec z = collective_flow(a, c, iota(64), bytes);
      CHECK(x.load == y.load);
      CHECK(x.load == z.load);
      CHECK(x.latency_s == y.latency_s);
      CHECK(x.algorithm == y.algorithm);
    }
  }
}

TEST_CASE("A 384-node data-parallel ring is decomposed and 200 thousand flows are simulated in seconds", "[sim]") {
  const Topology t = topology("dgx-a100", 3072);
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  const FlowSpec dp = collective_flow(t, Collective::all_reduce, iota(384, 0, 8), 512 * MiB);
  const auto t1 = clock::now();
  CHECK(isolated_time(t, dp) > 0);
  // A stream of point-to-point transfers between pipeline neighbours: up to
  // 3072 concurrent flows, each started as an earlier one finishes.
  std::vector<FlowSpec> p2p;
  for (int d = 0; d < 3072; d += 8) p2p.push_back(collective_flow(t, Collective::send_recv, std::vector<int>{d, (d + 8) % 3072}, 8 * MiB));
  Network net(t);
  const std::size_t total = 200000;
  std::size_t started = 0, finished = 0;
  for (; started < 2048; ++started) net.start(p2p[started % p2p.size()], 0);
  while (auto e = net.next_event_time()) {
    for (FlowId id : net.advance_to(*e)) {
      ++finished;
      if (started < total) net.start(p2p[(started++ + id) % p2p.size()], *e);
    }
  }
  const auto t2 = clock::now();
  CHECK(finished == total);
  const double decompose_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  const double simulate_s = std::chrono::duration<double>(t2 - t1).count();
  WARN("384-rank ring decomposition: " << decompose_ms << " ms; " << total << " flows simulated in " << simulate_s
                                       << " s");
  CHECK(simulate_s < 30);
}

TEST_CASE("On CPU ranks collectives follow MPI's latency-bandwidth model, with none of NCCL's protocol constants",
          "[sim]") {
  // cpu-host: two ranks through one host switch at 10 GB/s, 1 us a path
  // (0.5 us a link). A send takes the path latency plus bytes / rate; a
  // two-rank ring all-reduce two steps of latency plus each rank's bytes once
  // over its link (2(n-1)/n = 1) at the full rate.
  const Topology t = topology("cpu-host", 2);
  const double lat = 1e-6, rate = 10e9;
  for (const double bytes : {64.0, 16 * KiB, 8 * MiB}) {
    INFO(bytes << " bytes");
    CHECK(seconds(t, Collective::send_recv, {0, 1}, bytes) == Approx(lat + bytes / rate).epsilon(1e-9));
    CHECK(seconds(t, Collective::all_reduce, {0, 1}, bytes, Algorithm::ring) == Approx(2 * lat + bytes / rate).epsilon(1e-9));
  }
  // The same two devices as GPUs pay NCCL's per-protocol costs: microseconds more at 64 bytes.
  auto gpu = resolve_cluster("cpu-host");
  REQUIRE(gpu);
  gpu->device.kind = DeviceKind::gpu;
  const Topology g = Topology::build(*gpu, 2);
  CHECK(seconds(g, Collective::all_reduce, {0, 1}, 64.0) > seconds(t, Collective::all_reduce, {0, 1}, 64.0) + 1e-6);
}

TEST_CASE("The flex dispatcher's hops: rails cross the network between same-position ranks, domain stays on NVLink") {
  const Topology topo = topology("dgx-h100", 32);   // four nodes of eight
  const std::vector<int> group = iota(32);
  const double bytes = 256 * MiB;
  // Rails: each rank sends its bytes in equal parts to its three rail peers,
  // all through its own NIC, while every other rank does the same on its
  // own rail: as long as one send of the whole buffer.
  const double rails = isolated_time(topo, collective_flow(topo, Collective::all_to_all_rails, group, bytes));
  const double one = isolated_time(topo, collective_flow(topo, Collective::send_recv, std::vector<int>{0, 8}, bytes));
  CHECK(rails == Approx(one).epsilon(0.05));
  // Domain: within each node, each rank sends its bytes in seven equal parts
  // to the other seven, as an all-to-all of one node sends 7/8 of its buffer.
  const double domain = isolated_time(topo, collective_flow(topo, Collective::all_to_all_domain, group, bytes));
  const double node = isolated_time(topo, collective_flow(topo, Collective::all_to_all, iota(8), bytes * 8 / 7));
  CHECK(domain == Approx(node).epsilon(1e-9));
  CHECK(domain < rails);   // NVLink against one NIC per rank
  // A group inside one domain has no rails hop, one rank per domain no domain
  // hop: asking for one is an error (the Program leaves such hops out).
  CHECK_THROWS_AS(collective_flow(topo, Collective::all_to_all_rails, iota(8), bytes), std::invalid_argument);
  CHECK_THROWS_AS(collective_flow(topo, Collective::all_to_all_domain, iota(4, 0, 8), bytes), std::invalid_argument);
}
