// Topology: the cluster as a Boost.Graph of devices, scale-up switches, NICs
// and fat-tree switches; every cable is two directed links.
//
// Vertices 0..devices-1 are the devices, so a device id is its vertex.
// Scale-up: one NVSwitch vertex per domain (nvswitch), a full mesh of direct
// links (nvlink-mesh, each pair gets bandwidth / (domain - 1)), or one host
// PCIe switch per node (pcie, and none with several devices per node).
// Scale-out (only when the devices span more than one domain): the NICs of
// each node (device i uses NIC i * nics / devices_per_node, over a PCIe link),
// leaves (rail-optimized: NIC j of every node on a leaf of rail j, nodes
// grouped by radix/2; otherwise whole nodes grouped under leaves by radix/2),
// then spine (and core, ...) levels: each level groups radix/2 switches of the
// level below and gives each group radix/2 upper switches, every lower switch
// cabled to every upper one of its group; the top level takes one group. The
// leaf uplinks run at the NIC rate / oversubscription, higher cables at the
// NIC rate. With adaptive routing (ScaleOutSpec::routing) the radix/2 upper
// switches of a group are one vertex and the cables between two vertices one
// link of their summed rate: traffic spread evenly over equal-cost paths
// loads them as it would that link. With ecmp every switch and cable is its
// own. The fabric's end-to-end latency is split over the two NIC-leaf
// cables of a path; switch-to-switch cables add none.
//
// Paths: breadth-first search from the destination (resumed, not restarted,
// for the next source with the same destination), then a walk from the
// source along shortest-path edges. A path between scale-up domains is
// always device -> NIC -> leaf ... leaf -> NIC -> device (a NIC hangs off one
// leaf, and devices are endpoints), and the part between the leaves runs
// over switches only; so it is walked on the switch graph with distances to
// the destination's leaf, read from the fat tree's nesting (Impl::Reach: up
// to the lowest switch above both, then down) in a few steps, with no search
// per leaf. The walk picks exactly what the walk from the device would (the
// same candidates in the same order, the same ECMP hash and hop numbers:
// distances differ by a constant two). Among equal-cost next hops (the spines of
// a fat tree routed by ecmp) the walk picks one by a fixed hash of (source, destination):
// deterministic ECMP. Devices are endpoints only, and a NIC is not a shortcut
// between two devices of its node.
#include <atomic>
#include <boost/graph/adjacency_list.hpp>
#include <cstdint>
#include <fmt/format.h>
#include <limits>
#include <memory>
#include <stdexcept>

#include "sim/network.hpp"

namespace megascope::sim {

namespace {

enum class VertexKind : std::uint8_t { device, scale_up_switch, host, nic, fabric_switch };

struct EdgeProps {
  LinkId link = 0;
};
using Graph = boost::adjacency_list<boost::vecS, boost::vecS, boost::directedS, boost::no_property, EdgeProps>;
using Vertex = Graph::vertex_descriptor;

std::atomic<std::uint64_t> next_serial{1};

std::uint64_t mix(std::uint64_t x) {  // splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

const char* level_name(int level) {
  switch (level) {
    case 1: return "leaf";
    case 2: return "spine";
    case 3: return "core";
    default: return "super";
  }
}

}  // namespace

struct Topology::Impl {
  ClusterSpec cluster;
  int devices = 0;
  Graph graph;
  std::vector<VertexKind> kind;
  std::vector<int> nic_of_device;  // NIC vertex per device, -1 without scale-out
  std::vector<int> leaf_of_device; // the leaf of its NIC, -1 without scale-out
  std::vector<LinkId> into_device; // the link NIC -> device, per device
  std::vector<LinkId> into_nic;    // the link leaf -> NIC, per device
  std::vector<LinkId> out_of_device;  // the link device -> NIC, per device
  std::vector<LinkId> out_of_nic;     // the link NIC -> leaf, per device
  // Switch graph: index of each fabric switch vertex (-1 for other
  // vertices). The fat tree nests: a switch at height h (leaves 0) reaches
  // down to a consecutive range of leaves [lo, hi) in leaf order, every
  // upper switch of its group reaches a range holding it, and a leaf is
  // found from a switch by going up to the lowest switch whose range holds
  // it, then down: the distance is the steps up plus that switch's height.
  std::vector<int> switch_index;
  int switch_count = 0;
  struct Reach {
    int height = 0;
    int lo = 0, hi = 0;   // leaves below, by position in leaf order
    int up = -1;          // switch index of one upper neighbour (all of its group reach the same leaves); -1 at the top
  };
  std::vector<Reach> reach;        // by switch index
  std::vector<int> leaf_position;  // by switch index: a leaf's position in leaf order, -1 above the leaves
  // Switch hops from switch vertex v to leaf vertex `leaf`; max if none.
  [[nodiscard]] std::uint16_t distance(Vertex v, int leaf) const;
  std::vector<LinkInfo> links;
  std::uint64_t serial = 0;

  Vertex add_vertex(VertexKind k) {
    kind.push_back(k);
    return boost::add_vertex(graph);
  }
  void cable(Vertex a, Vertex b, const std::string& na, const std::string& nb, double capacity, double latency) {
    for (auto [u, v, nu, nv] : {std::tuple{a, b, &na, &nb}, std::tuple{b, a, &nb, &na}}) {
      const auto id = static_cast<LinkId>(links.size());
      links.push_back(LinkInfo{fmt::format("{}->{}", *nu, *nv), capacity, latency});
      boost::add_edge(u, v, EdgeProps{id}, graph);
    }
  }
  [[nodiscard]] std::vector<LinkId> path(int a, int b) const;
  [[nodiscard]] std::vector<LinkId> fabric_path(int a, int b) const;
  template <class Nearer>
  std::pair<Vertex, LinkId> next_hop(Vertex u, int a, int b, std::uint64_t hop, Nearer nearer) const;
};

namespace {

// Resumable breadth-first search towards one destination, kept per thread.
struct BfsCache {
  std::uint64_t serial = 0;
  int target = -1;
  std::uint32_t epoch = 0;
  std::vector<std::uint32_t> stamp;  // dist[v] is valid iff stamp[v] == epoch
  std::vector<int> dist;
  std::vector<Vertex> queue;
  std::size_t head = 0;
};
// A few destinations per thread: collectives ask for a -> b then b -> a.
struct BfsCaches {
  BfsCache entry[4];
  std::uint64_t used[4] = {0, 0, 0, 0};
  std::uint64_t clock = 0;
  BfsCache& get(std::uint64_t serial, int target) {
    std::size_t pick = 0;
    for (std::size_t i = 0; i < 4; ++i) {
      if (entry[i].serial == serial && entry[i].target == target) {
        pick = i;
        break;
      }
      if (used[i] < used[pick]) pick = i;
    }
    used[pick] = ++clock;
    return entry[pick];
  }
};
thread_local BfsCaches bfs_caches;

}  // namespace

std::vector<LinkId> Topology::Impl::path(int a, int b) const {
  if (a < 0 || b < 0 || a >= devices || b >= devices)
    throw std::out_of_range(fmt::format("Topology::path: device {} or {} outside 0..{}", a, b, devices - 1));
  if (a == b) return {};
  // (Devices that share a NIC stay with the search: only a domain that is not
  // a whole number of nodes, which cluster validation rejects, splits them.)
  if (!leaf_of_device.empty() && a / cluster.scale_up_domain != b / cluster.scale_up_domain &&
      nic_of_device[static_cast<std::size_t>(a)] != nic_of_device[static_cast<std::size_t>(b)])
    return fabric_path(a, b);
  const int target = b;
  BfsCache& c = bfs_caches.get(serial, target);
  const std::size_t nv = boost::num_vertices(graph);
  if (c.serial != serial || c.target != target) {
    if (c.stamp.size() < nv) {
      c.stamp.assign(nv, 0);
      c.dist.resize(nv);
      c.epoch = 0;
    }
    if (++c.epoch == 0) {  // wrapped: clear the stamps once
      std::fill(c.stamp.begin(), c.stamp.end(), 0);
      c.epoch = 1;
    }
    c.serial = serial;
    c.target = target;
    c.queue.clear();
    c.head = 0;
    c.stamp[static_cast<std::size_t>(target)] = c.epoch;
    c.dist[static_cast<std::size_t>(target)] = 0;
    c.queue.push_back(static_cast<Vertex>(target));
  }
  const auto known = [&](Vertex v) { return c.stamp[v] == c.epoch; };
  const int own_nic = nic_of_device[static_cast<std::size_t>(b)];
  // Expand until the source is discovered; then every vertex nearer to the
  // target than the source has its final distance, which is all the walk
  // below needs.
  while (!known(static_cast<Vertex>(a)) && c.head < c.queue.size()) {
    const Vertex u = c.queue[c.head++];
    if (kind[u] == VertexKind::device && static_cast<int>(u) != target) continue;  // endpoints only
    for (auto [e, end] = boost::out_edges(u, graph); e != end; ++e) {
      const Vertex v = boost::target(*e, graph);
      if (known(v)) continue;
      // b's own NIC leads only to the fabric: a neighbour device reaches b over scale-up.
      if (static_cast<int>(u) == own_nic && kind[v] == VertexKind::device) continue;
      c.stamp[v] = c.epoch;
      c.dist[v] = c.dist[u] + 1;
      c.queue.push_back(v);
    }
  }
  if (!known(static_cast<Vertex>(a)))
    throw std::logic_error(fmt::format("Topology::path: no route from device {} to device {}", a, b));

  std::vector<LinkId> out;
  out.reserve(static_cast<std::size_t>(c.dist[static_cast<std::size_t>(a)]));
  Vertex u = static_cast<Vertex>(a);
  std::uint64_t hop = 0;
  while (static_cast<int>(u) != target) {
    // Next hops one step nearer to b.
    const auto [pick, link] = next_hop(u, a, b, hop, [&](Vertex v) {
      if (!known(v) || c.dist[v] != c.dist[u] - 1) return false;
      if (kind[v] == VertexKind::device && static_cast<int>(v) != target) return false;
      return !(static_cast<int>(v) == own_nic && kind[u] == VertexKind::device);   // NIC loopback
    });
    out.push_back(link);
    u = pick;
    ++hop;
  }
  return out;
}

template <class Nearer>
std::pair<Vertex, LinkId> Topology::Impl::next_hop(Vertex u, int a, int b, std::uint64_t hop, Nearer nearer) const {
  // Among the next hops `nearer` accepts, in the graph's (insertion) order,
  // the one a fixed hash of (a, b, hop) picks: deterministic ECMP.
  const std::uint64_t h = mix((static_cast<std::uint64_t>(a) << 32) ^ static_cast<std::uint64_t>(b) ^ (hop << 56));
  std::uint64_t count = 0;
  for (auto [e, end] = boost::out_edges(u, graph); e != end; ++e) count += nearer(boost::target(*e, graph));
  if (count > 0) {
    std::uint64_t i = 0;
    const std::uint64_t want = h % count;
    for (auto [e, end] = boost::out_edges(u, graph); e != end; ++e) {
      if (!nearer(boost::target(*e, graph))) continue;
      if (i++ == want) return {boost::target(*e, graph), graph[*e].link};
    }
  }
  throw std::logic_error(fmt::format("Topology::path: stuck routing {} to {}", a, b));
}

std::uint16_t Topology::Impl::distance(Vertex v, int leaf) const {
  const int p = leaf_position[static_cast<std::size_t>(switch_index[static_cast<std::size_t>(leaf)])];
  int s = switch_index[v], up = 0;
  while (s >= 0 && !(reach[static_cast<std::size_t>(s)].lo <= p && p < reach[static_cast<std::size_t>(s)].hi)) {
    s = reach[static_cast<std::size_t>(s)].up;
    ++up;
  }
  if (s < 0) return std::numeric_limits<std::uint16_t>::max();
  return static_cast<std::uint16_t>(up + reach[static_cast<std::size_t>(s)].height);
}

// Between scale-up domains: a -> NIC -> leaf, the switch walk, leaf -> NIC -> b.
std::vector<LinkId> Topology::Impl::fabric_path(int a, int b) const {
  const auto ua = static_cast<std::size_t>(a), ub = static_cast<std::size_t>(b);
  const int from = leaf_of_device[ua], to = leaf_of_device[ub];
  const auto d = [&](Vertex v) { return distance(v, to); };
  if (d(static_cast<Vertex>(from)) == std::numeric_limits<std::uint16_t>::max())
    throw std::logic_error(fmt::format("Topology::path: no route from device {} to device {}", a, b));
  std::vector<LinkId> out;
  out.reserve(static_cast<std::size_t>(d(static_cast<Vertex>(from))) + 4);
  out.push_back(out_of_device[ua]);
  out.push_back(out_of_nic[ua]);
  auto u = static_cast<Vertex>(from);
  std::uint64_t hop = 2;   // the walk from a: a and its NIC had one choice each
  while (static_cast<int>(u) != to) {
    // Switches one step nearer to b's leaf.
    const std::uint16_t want_dist = static_cast<std::uint16_t>(d(u) - 1);
    const auto [pick, link] = next_hop(u, a, b, hop, [&](Vertex v) { return switch_index[v] >= 0 && d(v) == want_dist; });
    out.push_back(link);
    u = pick;
    ++hop;
  }
  out.push_back(into_nic[ub]);
  out.push_back(into_device[ub]);
  return out;
}

Topology Topology::build(const ClusterSpec& cluster, int devices) {
  const NodeSpec& node = cluster.node;
  if (devices < 1) throw std::invalid_argument(fmt::format("Topology::build: {} devices", devices));
  if (node.devices_per_node < 1) throw std::invalid_argument("Topology::build: devices_per_node < 1");
  auto impl = std::make_shared<Impl>();
  impl->cluster = cluster;
  if (impl->cluster.scale_up_domain < node.devices_per_node) impl->cluster.scale_up_domain = node.devices_per_node;
  impl->devices = devices;
  impl->serial = next_serial.fetch_add(1);
  Impl& t = *impl;
  const int per_node = node.devices_per_node;
  const int domain = t.cluster.scale_up_domain;
  const int nodes = (devices + per_node - 1) / per_node;
  const int domains = (devices + domain - 1) / domain;
  const char* dev_prefix = cluster.device.kind == DeviceKind::cpu ? "cpu" : "gpu";
  auto dev_name = [&](int d) { return fmt::format("{}{}", dev_prefix, d); };

  for (int d = 0; d < devices; ++d) t.add_vertex(VertexKind::device);
  t.nic_of_device.assign(static_cast<std::size_t>(devices), -1);

  // Scale-up fabric.
  const double up_bw = node.scale_up_bandwidth_Bps > 0 ? node.scale_up_bandwidth_Bps : node.pcie_bandwidth_Bps;
  const double up_lat = node.scale_up_latency_s;
  if (node.scale_up == ScaleUpKind::nvswitch) {
    for (int dom = 0; dom < domains; ++dom) {
      const int first = dom * domain, last = std::min(devices, first + domain);
      if (last - first < 2) continue;
      const Vertex sw = t.add_vertex(VertexKind::scale_up_switch);
      const std::string sw_name = fmt::format("nvswitch{}", dom);
      for (int d = first; d < last; ++d) t.cable(static_cast<Vertex>(d), sw, dev_name(d), sw_name, up_bw, up_lat / 2);
    }
  } else if (node.scale_up == ScaleUpKind::nvlink_mesh) {
    const double pair_bw = up_bw / std::max(1, domain - 1);
    for (int dom = 0; dom < domains; ++dom) {
      const int first = dom * domain, last = std::min(devices, first + domain);
      for (int i = first; i < last; ++i)
        for (int j = i + 1; j < last; ++j)
          t.cable(static_cast<Vertex>(i), static_cast<Vertex>(j), dev_name(i), dev_name(j), pair_bw, up_lat);
    }
  } else {  // pcie, or none: devices of a node talk through the host
    const double host_bw = node.scale_up == ScaleUpKind::pcie ? up_bw : node.pcie_bandwidth_Bps;
    for (int n = 0; n < nodes; ++n) {
      const int first = n * per_node, last = std::min(devices, first + per_node);
      if (last - first < 2) continue;
      const Vertex host = t.add_vertex(VertexKind::host);
      const std::string host_name = fmt::format("pcie{}", n);
      for (int d = first; d < last; ++d) t.cable(static_cast<Vertex>(d), host, dev_name(d), host_name, host_bw, up_lat / 2);
    }
  }

  Topology topo;
  topo.impl_ = impl;
  if (domains <= 1) return topo;

  // Scale-out: NICs, leaves, upper levels.
  const ScaleOutSpec& so = cluster.scale_out;
  const int nics = node.nics_per_node;
  if (nics < 1 || !(node.nic_bandwidth_Bps > 0))
    throw std::invalid_argument(fmt::format("Topology::build: {} devices span {} scale-up domains but the nodes have no NICs",
                                            devices, domains));
  const double nic_bw = node.nic_bandwidth_Bps;
  const double pcie_bw = node.pcie_bandwidth_Bps > 0 ? node.pcie_bandwidth_Bps : nic_bw;
  const int half = std::max(1, so.switch_radix / 2);
  const bool rails = so.rail_optimized && so.tiers > 1;
  const int nodes_per_leaf = rails ? half : std::max(1, half / nics);
  const int blocks = (nodes + nodes_per_leaf - 1) / nodes_per_leaf;
  const int leaf_slots = so.tiers <= 1 ? 1 : rails ? blocks * nics : blocks;
  std::vector<long> leaf_vertex(static_cast<std::size_t>(leaf_slots), -1);  // block-major: leaf = block * nics + rail
  t.leaf_of_device.assign(static_cast<std::size_t>(devices), -1);
  t.into_nic.assign(static_cast<std::size_t>(devices), 0);
  t.into_device.assign(static_cast<std::size_t>(devices), 0);
  t.out_of_device.assign(static_cast<std::size_t>(devices), 0);
  t.out_of_nic.assign(static_cast<std::size_t>(devices), 0);
  for (int n = 0; n < nodes; ++n) {
    const int first = n * per_node, last = std::min(devices, first + per_node);
    std::vector<long> nic_vertex(static_cast<std::size_t>(nics), -1);
    std::vector<std::pair<int, LinkId>> leaf_of_nic(static_cast<std::size_t>(nics), {-1, 0});   // leaf, link leaf -> NIC
    std::vector<LinkId> up_of_nic(static_cast<std::size_t>(nics), 0);                           // link NIC -> leaf
    for (int d = first; d < last; ++d) {
      const int j = (d - first) * nics / per_node;
      const int global_nic = n * nics + j;
      if (nic_vertex[static_cast<std::size_t>(j)] < 0) {
        const Vertex nv = t.add_vertex(VertexKind::nic);
        nic_vertex[static_cast<std::size_t>(j)] = static_cast<long>(nv);
        const int slot = so.tiers <= 1 ? 0 : rails ? (n / nodes_per_leaf) * nics + j : n / nodes_per_leaf;
        auto& lv = leaf_vertex[static_cast<std::size_t>(slot)];
        if (lv < 0) lv = static_cast<long>(t.add_vertex(VertexKind::fabric_switch));
        t.cable(nv, static_cast<Vertex>(lv), fmt::format("nic{}", global_nic), fmt::format("leaf{}", slot), nic_bw,
                so.latency_s / 2);
        leaf_of_nic[static_cast<std::size_t>(j)] = {static_cast<int>(lv), static_cast<LinkId>(t.links.size() - 1)};
        up_of_nic[static_cast<std::size_t>(j)] = static_cast<LinkId>(t.links.size() - 2);
      }
      const auto nv = static_cast<Vertex>(nic_vertex[static_cast<std::size_t>(j)]);
      t.nic_of_device[static_cast<std::size_t>(d)] = static_cast<int>(nv);
      t.cable(static_cast<Vertex>(d), nv, dev_name(d), fmt::format("nic{}", global_nic), pcie_bw, 0.0);
      t.leaf_of_device[static_cast<std::size_t>(d)] = leaf_of_nic[static_cast<std::size_t>(j)].first;
      t.into_nic[static_cast<std::size_t>(d)] = leaf_of_nic[static_cast<std::size_t>(j)].second;
      t.into_device[static_cast<std::size_t>(d)] = static_cast<LinkId>(t.links.size() - 1);
      t.out_of_device[static_cast<std::size_t>(d)] = static_cast<LinkId>(t.links.size() - 2);
      t.out_of_nic[static_cast<std::size_t>(d)] = up_of_nic[static_cast<std::size_t>(j)];
    }
  }
  // Switches of the current level, in order, each standing for `count`
  // switches of the fat tree: one with ecmp routing; with adaptive routing
  // the upper switches of a group are one vertex, since traffic spreads evenly
  // over them, cabled to each lower one by the summed capacity of the cables.
  struct Level {
    Vertex v;
    std::string name;
    int count;
    int height = 0, lo = 0, hi = 0, up = -1;   // Impl::Reach, by vertex until switch indices exist
  };
  const bool adaptive = so.routing == Routing::adaptive;
  std::vector<Level> level;
  for (int s = 0; s < leaf_slots; ++s)
    if (leaf_vertex[static_cast<std::size_t>(s)] >= 0) {
      const int at = static_cast<int>(level.size());
      level.push_back({static_cast<Vertex>(leaf_vertex[static_cast<std::size_t>(s)]), fmt::format("leaf{}", s), 1, 0, at,
                       at + 1});
    }
  std::vector<Level> placed;   // every switch with its reach, the upper neighbour as a vertex
  int up_count = 0;
  for (int lvl = 1; lvl < so.tiers && level.size() > 1; ++lvl) {
    const bool top = lvl + 1 == so.tiers || static_cast<int>(level.size()) <= half;
    const std::size_t group = top ? level.size() : static_cast<std::size_t>(half);
    const double bw = lvl == 1 ? nic_bw / std::max(1.0, so.oversubscription) : nic_bw;
    std::vector<Level> next;
    for (std::size_t g0 = 0; g0 < level.size(); g0 += group) {
      const std::size_t first_up = next.size();
      const std::size_t g1 = std::min(level.size(), g0 + group);
      const int lo = level[g0].lo, hi = level[g1 - 1].hi;
      if (adaptive)
        next.push_back({t.add_vertex(VertexKind::fabric_switch), fmt::format("{}s{}", level_name(lvl + 1), up_count++), half,
                        lvl, lo, hi});
      else
        for (int k = 0; k < half; ++k)
          next.push_back({t.add_vertex(VertexKind::fabric_switch), fmt::format("{}{}", level_name(lvl + 1), up_count++), 1,
                          lvl, lo, hi});
      for (std::size_t i = g0; i < g1; ++i) {
        level[i].up = static_cast<int>(next[first_up].v);
        for (std::size_t k = first_up; k < next.size(); ++k)
          t.cable(level[i].v, next[k].v, level[i].name, next[k].name, bw * level[i].count * next[k].count, 0.0);
      }
    }
    placed.insert(placed.end(), level.begin(), level.end());
    level = std::move(next);
    up_count = 0;
    if (top) break;
  }
  placed.insert(placed.end(), level.begin(), level.end());
  t.switch_index.assign(boost::num_vertices(t.graph), -1);
  for (std::size_t v = 0; v < t.kind.size(); ++v)
    if (t.kind[v] == VertexKind::fabric_switch) t.switch_index[v] = t.switch_count++;
  t.reach.assign(static_cast<std::size_t>(t.switch_count), {});
  t.leaf_position.assign(static_cast<std::size_t>(t.switch_count), -1);
  for (const Level& l : placed) {
    const int s = t.switch_index[l.v];
    t.reach[static_cast<std::size_t>(s)] = {l.height, l.lo, l.hi, l.up < 0 ? -1 : t.switch_index[static_cast<std::size_t>(l.up)]};
    if (l.height == 0) t.leaf_position[static_cast<std::size_t>(s)] = l.lo;
  }
  return topo;
}

int Topology::devices() const { return impl_->devices; }
int Topology::node_of(int device) const { return device / impl_->cluster.node.devices_per_node; }
int Topology::domain_of(int device) const { return device / impl_->cluster.scale_up_domain; }
const std::vector<LinkInfo>& Topology::links() const { return impl_->links; }
std::vector<LinkId> Topology::path(int a, int b) const { return impl_->path(a, b); }
const ClusterSpec& Topology::cluster() const { return impl_->cluster; }

}  // namespace megascope::sim
