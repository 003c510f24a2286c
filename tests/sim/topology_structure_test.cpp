// Topology::build: the graph's shape for shipped clusters, and the paths
// between devices.
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <map>
#include <string>

#include "config/library.hpp"
#include "core/cluster.hpp"
#include "sim/network.hpp"

using namespace megascope;
using namespace megascope::sim;

namespace {

ClusterSpec cluster_with(const std::string& name, int devices) {
  auto c = resolve_cluster(name);
  REQUIRE(c);
  auto sized = with_device_count(*c, devices);
  REQUIRE(sized);
  return *sized;
}

// "gpu3->nvswitch0" -> "gpu->nvswitch": the kinds of both ends.
std::string kinds(const std::string& link) {
  std::string out;
  for (char ch : link)
    if (!std::isdigit(static_cast<unsigned char>(ch))) out += ch;
  return out;
}

std::map<std::string, int> count_by_kind(const Topology& t) {
  std::map<std::string, int> n;
  for (const auto& l : t.links()) ++n[kinds(l.name)];
  return n;
}

std::vector<std::string> path_names(const Topology& t, int a, int b) {
  std::vector<std::string> out;
  for (LinkId l : t.path(a, b)) out.push_back(t.links()[l].name);
  return out;
}

bool crosses(const std::vector<std::string>& names, const std::string& what) {
  for (const auto& n : names)
    if (n.find(what) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("A 16-device DGX H100 routed by ECMP has two NVSwitch domains, 16 NICs, 8 rail leaves and 32 spines", "[sim]") {
  auto c = cluster_with("dgx-h100", 16);
  c.scale_out.routing = Routing::ecmp;
  const Topology t = Topology::build(c, 16);
  CHECK(t.devices() == 16);
  // Cables (two directed links each): 16 GPU-NVSwitch, 16 GPU-NIC, 16 NIC-leaf,
  // and each of the 8 leaves (one per rail; 2 nodes fit one leaf of radix/2 = 32
  // ports) cabled to the 32 spines of its single group (so no core level).
  const auto n = count_by_kind(t);
  CHECK(n.at("gpu->nvswitch") == 16);
  CHECK(n.at("nvswitch->gpu") == 16);
  CHECK(n.at("gpu->nic") == 16);
  CHECK(n.at("nic->leaf") == 16);
  CHECK(n.at("leaf->spine") == 8 * 32);
  CHECK(n.at("spine->leaf") == 8 * 32);
  CHECK(n.count("spine->core") == 0);
  CHECK(t.links().size() == 2 * (16 + 16 + 16 + 8 * 32));
  CHECK(t.node_of(11) == 1);
  CHECK(t.domain_of(7) == 0);
  CHECK(t.domain_of(8) == 1);
}

TEST_CASE("Links carry the cluster file's rates and latencies", "[sim]") {
  const ClusterSpec c = cluster_with("dgx-h100", 16);
  const Topology t = Topology::build(c, 16);
  for (const auto& l : t.links()) {
    INFO(l.name);
    const std::string k = kinds(l.name);
    if (k == "gpu->nvswitch" || k == "nvswitch->gpu") {
      CHECK(l.capacity_Bps == Approx(450e9));
      CHECK(l.latency_s == Approx(0.5e-6));
    } else if (k == "nic->leaf" || k == "leaf->nic") {
      CHECK(l.capacity_Bps == Approx(50e9));
      CHECK(l.latency_s == Approx(2.5e-6));
    } else if (k == "gpu->nic" || k == "nic->gpu") {
      CHECK(l.capacity_Bps == Approx(64e9));
    } else if (k == "leaf->spine" || k == "spine->leaf") {
      CHECK(l.capacity_Bps == Approx(50e9));
    }
  }
}

TEST_CASE("Devices beyond the requested count are not built", "[sim]") {
  const Topology t = Topology::build(cluster_with("dgx-h100", 16), 12);
  CHECK(t.devices() == 12);
  const auto n = count_by_kind(t);
  CHECK(n.at("gpu->nvswitch") == 12);
  CHECK(n.at("gpu->nic") == 12);
  CHECK_THROWS(t.path(0, 12));
  // One node alone needs no scale-out network.
  const Topology one = Topology::build(cluster_with("dgx-h100", 8), 8);
  CHECK(count_by_kind(one).count("gpu->nic") == 0);
  CHECK(one.links().size() == 16);
}

TEST_CASE("Device 3 of node 0 reaches device 3 of node 1 through leaf 3 alone on a rail-optimized fabric", "[sim]") {
  const Topology t = Topology::build(cluster_with("dgx-h100", 16), 16);
  const auto p = path_names(t, 3, 11);
  REQUIRE(p.size() == 4);
  CHECK(p[0] == "gpu3->nic3");
  CHECK(p[1] == "nic3->leaf3");
  CHECK(p[2] == "leaf3->nic11");
  CHECK(p[3] == "nic11->gpu11");
  CHECK_FALSE(crosses(p, "spine"));
  CHECK(t.links()[t.path(3, 11)[1]].latency_s + t.links()[t.path(3, 11)[2]].latency_s == Approx(5e-6));
}

TEST_CASE("Devices on different rails of different nodes go through a spine", "[sim]") {
  const Topology t = Topology::build(cluster_with("dgx-h100", 16), 16);
  const auto p = path_names(t, 0, 11);
  REQUIRE(p.size() == 6);
  CHECK(p[0] == "gpu0->nic0");
  CHECK(p[1] == "nic0->leaf0");
  CHECK(p[2].rfind("leaf0->spine", 0) == 0);
  CHECK(p[3].find("->leaf3") != std::string::npos);
  CHECK(p[5] == "nic11->gpu11");
}

TEST_CASE("Devices of one node talk through the NVSwitch even when they share a NIC", "[sim]") {
  auto c = cluster_with("dgx-a100", 16);
  c.node.nics_per_node = 4;  // HGX A100 with 4 NICs: GPUs 0 and 1 share NIC 0
  const Topology t = Topology::build(c, 16);
  const auto p = path_names(t, 0, 1);
  REQUIRE(p.size() == 2);
  CHECK(p[0] == "gpu0->nvswitch0");
  CHECK(p[1] == "nvswitch0->gpu1");
  CHECK(path_names(t, 1, 9).front() == "gpu1->nic0");
}

TEST_CASE("GB200 NVL72 devices in different trays of one rack talk over NVLink only", "[sim]") {
  // A job uses 64 GPUs of each rack (the shipped cluster's scale_up_domain_used).
  const Topology t = Topology::build(cluster_with("gb200-nvl72", 128), 128);  // two racks
  REQUIRE(t.node_of(1) != t.node_of(62));
  REQUIRE(t.domain_of(1) == t.domain_of(62));
  REQUIRE(t.domain_of(63) != t.domain_of(64));
  const auto p = path_names(t, 1, 62);
  REQUIRE(p.size() == 2);
  CHECK(p[0] == "gpu1->nvswitch0");
  CHECK(p[1] == "nvswitch0->gpu62");
  // Across racks: over the NICs.
  const auto q = path_names(t, 1, 65);
  CHECK(crosses(q, "nic"));
  CHECK_FALSE(crosses(q, "nvswitch"));
}

TEST_CASE("With adaptive routing a leaf's spines are one trunk of their cables' summed rate", "[sim]") {
  auto c = cluster_with("dgx-h100", 16);
  REQUIRE(c.scale_out.routing == Routing::adaptive);   // InfiniBand's default
  const Topology t = Topology::build(c, 16);
  // The 8 rail leaves each cabled once to one vertex standing for the 32
  // spines of their group, at 32 x 400 Gb/s.
  const auto n = count_by_kind(t);
  CHECK(n.at("nic->leaf") == 16);
  CHECK(n.at("leaf->spines") == 8);
  CHECK(n.at("spines->leaf") == 8);
  CHECK(t.links().size() == 2 * (16 + 16 + 16 + 8));
  for (const auto& l : t.links())
    if (kinds(l.name) == "leaf->spines") CHECK(l.capacity_Bps == Approx(32 * 400e9 / 8));
  // Rails 0 and 3 of different nodes: up one trunk and down another, 6 links as with ECMP.
  const auto p = path_names(t, 0, 11);
  CHECK(p.size() == 6);
  CHECK(crosses(p, "spines0"));
}

TEST_CASE("Two rings whose ECMP paths collide on a spine run at full rate with adaptive routing", "[sim]") {
  // Two data-parallel groups of 48 nodes each, one GPU per node on rail 0
  // (tp 8 fills each node), as the two pipeline stages of tp 8, pp 2, dp 48
  // on 768 H100s place them: nodes 0-47 and 48-95, leaves of 32 nodes, so
  // both rings cross leaves. A reduce-scatter of 400 MB on each at once.
  for (const Routing r : {Routing::ecmp, Routing::adaptive}) {
    auto c = cluster_with("dgx-h100", 768);
    c.scale_out.routing = r;
    const Topology t = Topology::build(c, 768);
    std::vector<int> a, b;
    for (int i = 0; i < 48; ++i) {
      a.push_back(8 * i);
      b.push_back(384 + 8 * i);
    }
    const FlowSpec fa = collective_flow(t, Collective::reduce_scatter, a, 400e6);
    const FlowSpec fb = collective_flow(t, Collective::reduce_scatter, b, 400e6);
    const double alone = isolated_time(t, fa);
    CHECK(isolated_time(t, fb) == Approx(alone));
    Network net(t);
    net.start(fa, 0.0);
    net.start(fb, 0.0);
    double last = 0;
    while (auto e = net.next_event_time()) {
      net.advance_to(*e);
      last = *e;
    }
    INFO(to_string(r) << ": together " << last << " s, alone " << alone << " s");
    if (r == Routing::adaptive)
      CHECK(last == Approx(alone).epsilon(1e-9));
    else
      CHECK(last > 1.5 * alone);   // two ring hops share one spine cable: half the rate
  }
}

TEST_CASE("An oversubscription of 2 halves the leaf uplinks", "[sim]") {
  auto c = cluster_with("dgx-h100", 16);
  c.scale_out.routing = Routing::ecmp;
  const Topology full = Topology::build(c, 16);
  c.scale_out.oversubscription = 2.0;
  const Topology half = Topology::build(c, 16);
  REQUIRE(full.links().size() == half.links().size());
  int uplinks = 0;
  for (std::size_t i = 0; i < full.links().size(); ++i) {
    if (kinds(full.links()[i].name) != "leaf->spine") continue;
    ++uplinks;
    CHECK(half.links()[i].capacity_Bps == Approx(full.links()[i].capacity_Bps / 2));
  }
  CHECK(uplinks == 256);
}

TEST_CASE("A large non-rail cluster builds leaf spine and core levels and routes across pods", "[sim]") {
  auto c = cluster_with("dgx-h100", 2048);
  c.scale_out.rail_optimized = false;
  c.scale_out.tiers = 3;
  c.scale_out.routing = Routing::ecmp;
  // 256 nodes, 4 per leaf (32 down ports / 8 NICs): 64 leaves in 2 pods of 32,
  // each pod with 32 spines, every spine cabled to the 32 cores.
  const Topology t = Topology::build(c, 2048);
  const auto n = count_by_kind(t);
  CHECK(n.at("nic->leaf") == 2048);
  CHECK(n.at("leaf->spine") == 64 * 32);
  CHECK(n.at("spine->core") == 64 * 32);
  const auto p = path_names(t, 0, 2047);
  CHECK(crosses(p, "core"));
  CHECK(p.size() == 8);
  // Within a leaf (same node group) no spine.
  CHECK_FALSE(crosses(path_names(t, 0, 8), "spine"));
  // Adaptive: each pod's 32 spines one trunk, the 32 cores one, the same hops.
  c.scale_out.routing = Routing::adaptive;
  const Topology ta = Topology::build(c, 2048);
  const auto na = count_by_kind(ta);
  CHECK(na.at("leaf->spines") == 64);
  CHECK(na.at("spines->cores") == 2);
  for (const auto& l : ta.links())
    if (kinds(l.name) == "spines->cores") CHECK(l.capacity_Bps == Approx(32 * 32 * 400e9 / 8));
  CHECK(path_names(ta, 0, 2047).size() == 8);
}

TEST_CASE("Paths over PCIe and NVLink-mesh nodes use the host switch or direct links", "[sim]") {
  const Topology pcie = Topology::build(cluster_with("pcie-8gpu", 8), 8);
  CHECK(path_names(pcie, 2, 5) == std::vector<std::string>{"gpu2->pcie0", "pcie0->gpu5"});
  auto c = cluster_with("dgx-a100", 8);
  c.node.scale_up = ScaleUpKind::nvlink_mesh;
  const Topology mesh = Topology::build(c, 8);
  CHECK(path_names(mesh, 2, 5) == std::vector<std::string>{"gpu2->gpu5"});
  CHECK(mesh.links()[mesh.path(2, 5)[0]].capacity_Bps == Approx(300e9 / 7));
}

TEST_CASE("Paths are deterministic across builds and spread over spines by source and destination", "[sim]") {
  auto c = cluster_with("pcie-8gpu", 64);  // not rail-optimized: cross-leaf traffic uses spines
  c.scale_out.switch_radix = 8;            // 4 down ports a leaf: 2 nodes of 2 NICs, 4 leaves, 4 spines
  c.scale_out.routing = Routing::ecmp;
  const Topology a = Topology::build(c, 64);
  const Topology b = Topology::build(c, 64);
  std::map<std::string, int> spine_use;
  for (int src = 0; src < 64; src += 8)
    for (int dst = 0; dst < 64; dst += 8) {
      if (src == dst) continue;
      CHECK(a.path(src, dst) == b.path(src, dst));
      for (const auto& name : path_names(a, src, dst))
        if (name.rfind("leaf", 0) == 0 && name.find("->spine") != std::string::npos)
          ++spine_use[name.substr(name.find("->") + 2)];
    }
  CHECK(spine_use.size() > 1);
}

namespace {

// Shortest hop count from a to b on the graph named by the links, with the
// routing rules (devices are endpoints; a NIC does not turn back into its
// own node's devices other than the destination): an independent reference.
int reference_hops(const Topology& t, int a, int b) {
  std::map<std::string, std::vector<std::string>> next;
  for (const auto& l : t.links()) {
    const auto arrow = l.name.find("->");
    next[l.name.substr(0, arrow)].push_back(l.name.substr(arrow + 2));
  }
  const std::string from = fmt::format("gpu{}", a), to = fmt::format("gpu{}", b);
  std::map<std::string, int> dist{{from, 0}};
  std::vector<std::string> queue{from};
  for (std::size_t head = 0; head < queue.size(); ++head) {
    const std::string u = queue[head];
    if (u == to) return dist[u];
    if (u != from && u.rfind("gpu", 0) == 0) continue;   // endpoints only
    for (const auto& v : next[u])
      if (dist.emplace(v, dist[u] + 1).second) queue.push_back(v);
  }
  return -1;
}

}  // namespace

TEST_CASE("Paths between domains are chains from source to destination, as short as the fabric allows", "[sim]") {
  // Three tiers, not rail-optimized, radix 16: leaves, spines and cores; and
  // a rail-optimized two-tier fabric with several leaves per rail.
  auto three = cluster_with("dgx-h100", 512);
  three.scale_out.rail_optimized = false;
  three.scale_out.tiers = 3;
  three.scale_out.switch_radix = 16;
  auto rails = cluster_with("dgx-a100", 2520);
  for (const ClusterSpec& c : {three, rails}) {
    const int n = c.num_nodes * c.node.devices_per_node;
    const Topology t = Topology::build(c, n);
    for (int k = 0; k < 60; ++k) {
      const int a = (k * 7919) % n, b = (k * 104729 + 13) % n;
      if (t.domain_of(a) == t.domain_of(b)) continue;
      INFO(a << " -> " << b);
      const auto names = path_names(t, a, b);
      REQUIRE(!names.empty());
      CHECK(names.front().rfind(fmt::format("gpu{}->", a), 0) == 0);
      CHECK(names.back().substr(names.back().find("->") + 2) == fmt::format("gpu{}", b));
      for (std::size_t i = 1; i < names.size(); ++i)
        CHECK(names[i].substr(0, names[i].find("->")) == names[i - 1].substr(names[i - 1].find("->") + 2));
      CHECK(static_cast<int>(names.size()) == reference_hops(t, a, b));
      CHECK(t.path(a, b).size() == t.path(b, a).size());
    }
  }
}

TEST_CASE("A two-server DGX-2H has two 16-GPU NVSwitch domains and one EDR NIC per two GPUs", "[sim]") {
  const ClusterSpec c = cluster_with("dgx-2h", 32);
  CHECK(c.node.devices_per_node == 16);
  const Topology t = Topology::build(c, 32);
  CHECK(t.devices() == 32);
  CHECK(t.domain_of(15) == 0);
  CHECK(t.domain_of(16) == 1);
  const auto n = count_by_kind(t);
  CHECK(n.at("gpu->nvswitch") == 32);
  CHECK(n.at("nic->leaf") == 16);   // 8 NICs a server
  // GPUs 0 and 1 share NIC 0; GPU 2 has NIC 1; each reaches its peer on the other server over its rail.
  CHECK(path_names(t, 0, 16).front() == "gpu0->nic0");
  CHECK(path_names(t, 1, 17).front() == "gpu1->nic0");
  CHECK(path_names(t, 2, 18).front() == "gpu2->nic1");
  for (const auto& l : t.links()) {
    INFO(l.name);
    const std::string k = kinds(l.name);
    if (k == "gpu->nvswitch") CHECK(l.capacity_Bps == Approx(150e9));
    if (k == "nic->leaf") CHECK(l.capacity_Bps == Approx(12.5e9));
  }
}
