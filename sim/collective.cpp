// Collective decomposition: the NCCL protocol constants, the group split by
// scale-up domain, and the choice among algorithms and protocols (the one with
// the least time on an idle network, as NCCL's tuner picks by its model).
// The algorithms themselves are in collective_ring.cpp, collective_tree.cpp,
// collective_nvls.cpp and collective_direct.cpp.
//
// Calibration (nccl_busbw_measurements.csv, all_reduce, 1 MiB to 8 GiB per
// rank; the fit and its errors are printed by tests/sim/collective_nccl_test.cpp):
//   AZ_A100 (8x A100, ring)  1 MiB 36.2 .. 8 GiB 231.6 GB/s busbw
//   AZ_H200 (8x H200, NVLS)  1 MiB 53.0 .. 8 GiB 480.0
//   AZ_GB200 (4x GB200, ring) 1 MiB 80.5 .. 8 GiB 679.6
//   NCCL_212 H100 ring 370, NVLS 480; NCCL_812 DGX-A100 multi-node 192;
//   NCCL_290 NDR 46-48 GB/s per 400 Gb/s NIC; USER_100 HGX A100 4 NICs 91.
// The per-step costs add to the path latencies from the cluster file (1 us an
// NVLink step, 5 us a network step for the shipped clusters).
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "sim/collective_internal.hpp"

namespace megascope::sim {

namespace detail {

// LL: 8-byte stores with an 8-byte flag, lowest latency; its bandwidth in
// NCCL is capped per channel well below line rate: 0.25 of NVLink line rate
// reproduces the 1 MiB rows (AZ_A100 36.2, AZ_GB200 80.5 GB/s busbw).
const ProtocolParams& ll() {
  static const ProtocolParams p{"LL", 2e-6, 0.5e-6, {0.25, 0.25, 0.25}};
  return p;
}
// LL128: 120 of every 128 bytes are data; 0.70 of NVLink line rate and ~7 us
// a step fit the 16-64 MiB rows (AZ_A100 109.2/166.6, AZ_GB200 331.1/550.7).
// On the network: 0.80 (assumption: 120/128 x the IB efficiency below).
const ProtocolParams& ll128() {
  static const ProtocolParams p{"LL128", 0.0, 6e-6, {0.70, 0.70, 0.80}};
  return p;
}
// Simple: 0.80 of NVLink line rate ("450 GB/s line rate minus ~20% protocol
// overhead" => 370, NCCL_212; A100 230 of 300, NCCL_149) and 0.92 of an IB
// NIC (NDR: 46-48 of 50 GB/s, NCCL_290; DGX-A100 192 of 200, NCCL_812). The
// 13 us a step is the pipeline ramp of large messages (a chunk in flight per
// step): AZ_A100 reaches 213.9 at 256 MiB and 228.1 at 1 GiB against 231.6 at
// 8 GiB (14 steps), AZ_GB200 593.5 at 256 MiB (6 steps); NCCL's own tuning
// model charges 14 us a network step for Simple.
const ProtocolParams& simple() {
  static const ProtocolParams p{"Simple", 20e-6, 13e-6, {0.80, 0.80, 0.92}};
  return p;
}
// NVLS (NVLink SHARP): each device sends its buffer into the switch once and
// receives the result once. 0.60 of NVLink line rate gives algbw 270 GB/s on
// H100/H200, busbw 473 (NCCL_212 480 / 275 algbw; AZ_H200 480.0 at 8 GiB);
// 55 us base fits AZ_H200 432.2 at 256 MiB and 368.1 at 64 MiB.
const ProtocolParams& nvls() {
  static const ProtocolParams p{"NVLS", 55e-6, 2.5e-6, {0.80, 0.60, 0.92}};
  return p;
}

// MPI over shared memory or a host network (the CPU executor's collectives):
// no protocol constants, every step pays its hops' latency, and the links'
// rates are what the data moves at (Hockney's model per step). The cluster
// file's scale-up rate and latency are then the MPI library's, as
// `megascope calibrate --backend cpu` fits them.
const ProtocolParams& mpi() {
  static const ProtocolParams p{"MPI", 0.0, 0.0, {1.0, 1.0, 1.0}};
  return p;
}

// The protocols a device's collective library chooses from.
std::span<const ProtocolParams* const> protocols_of(const Topology& topo) {
  static const ProtocolParams* const nccl[] = {&ll(), &ll128(), &simple()};
  static const ProtocolParams* const host[] = {&mpi()};
  if (topo.cluster().device.kind == DeviceKind::cpu) return host;
  return nccl;
}

int Group::max_local() const {
  std::size_t m = 0;
  for (const auto& d : domains) m = std::max(m, d.size());
  return static_cast<int>(m);
}

bool Group::uniform() const {
  return std::all_of(domains.begin(), domains.end(), [&](const auto& d) { return d.size() == domains.front().size(); });
}

Group make_group(const Topology& topo, std::span<const int> devices) {
  Group g;
  g.devices.assign(devices.begin(), devices.end());
  const NodeSpec& node = topo.cluster().node;
  std::vector<int> domain_ids;
  std::vector<std::vector<int>> nic_keys;
  for (int d : devices) {
    if (d < 0 || d >= topo.devices())
      throw std::out_of_range("collective_flow: device " + std::to_string(d) + " is not in the topology");
    const int dom = topo.domain_of(d);
    auto it = std::find(domain_ids.begin(), domain_ids.end(), dom);
    const auto idx = static_cast<std::size_t>(it - domain_ids.begin());
    if (it == domain_ids.end()) {
      domain_ids.push_back(dom);
      g.domains.emplace_back();
      g.nic_reps.emplace_back();
      nic_keys.emplace_back();
    }
    g.domains[idx].push_back(d);
    const int per = node.devices_per_node, nics = std::max(1, node.nics_per_node);
    const int key = topo.node_of(d) * nics + (d % per) * nics / per;
    if (std::find(nic_keys[idx].begin(), nic_keys[idx].end(), key) == nic_keys[idx].end()) {
      nic_keys[idx].push_back(key);
      g.nic_reps[idx].push_back(d);
    }
  }
  std::size_t channels = std::numeric_limits<std::size_t>::max();
  for (const auto& r : g.nic_reps) channels = std::min(channels, r.size());
  g.channels = g.nic_reps.empty() ? 1 : static_cast<int>(std::max<std::size_t>(1, channels));
  return g;
}

double Shape::add_path(const Topology& topo, int a, int b, double weight, LinkClass cls) {
  double latency = 0;
  const auto& links = topo.links();
  auto& out = load[static_cast<int>(cls)];
  for (LinkId l : topo.path(a, b)) {
    out.emplace_back(l, weight);
    latency += links[l].latency_s;
  }
  return latency;
}

namespace {

void merge(std::vector<std::pair<LinkId, double>>& v) {
  std::sort(v.begin(), v.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  std::size_t w = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (w > 0 && v[w - 1].first == v[i].first) {
      v[w - 1].second += v[i].second;
    } else {
      v[w++] = v[i];
    }
  }
  v.resize(w);
  std::erase_if(v, [](const auto& e) { return !(e.second > 0); });
}

FlowSpec to_flow(const Shape& s, const ProtocolParams& p, double bytes) {
  FlowSpec f;
  f.payload_bytes = bytes;
  f.algorithm = s.algorithm;
  f.latency_s = p.base_s;
  for (const Phase& ph : s.phases)
    if (ph.steps > 0) f.latency_s += ph.steps * (ph.hop_latency_s + p.per_step_s);
  // Each class's load is sorted by link with no link twice (candidate_shapes
  // merged it): the three runs merge in one pass (a link in more than one
  // class sums, as merge() would), with no sort.
  const auto& load = s.load;
  f.load.reserve(load[0].size() + load[1].size() + load[2].size());
  std::size_t at[3] = {0, 0, 0};
  for (;;) {
    int next = -1;
    for (int cls = 0; cls < 3; ++cls)
      if (at[cls] < load[cls].size() && (next < 0 || load[cls][at[cls]].first < load[next][at[next]].first)) next = cls;
    if (next < 0) break;
    const auto& [l, w] = load[next][at[next]++];
    if (!f.load.empty() && f.load.back().first == l) f.load.back().second += w / p.efficiency[next];
    else f.load.emplace_back(l, w / p.efficiency[next]);
  }
  std::erase_if(f.load, [](const auto& e) { return !(e.second > 0); });
  return f;
}

// Point-to-point transfers, whatever the size: every all-to-all (DeepEP's
// hops too) and send/recv take the direct shape (collective_direct.cpp).
bool direct(Collective c) {
  return c == Collective::all_to_all || c == Collective::send_recv || c == Collective::all_to_all_rails ||
         c == Collective::all_to_all_domain;
}

// The algorithms' link-load shapes NCCL would choose from (a requested
// algorithm that does not apply falls back to NCCL's own choice).
std::vector<Shape> candidate_shapes(const Topology& topo, Collective c, const Group& g, Algorithm algo) {
  std::vector<Shape> shapes;
  auto consider = [&](std::optional<Shape> s) {
    if (!s) return;
    for (auto& l : s->load) merge(l);
    shapes.push_back(std::move(*s));
  };
  if (direct(c)) {
    consider(direct_shape(topo, c, g));
    return shapes;
  }
  if (algo == Algorithm::automatic || algo == Algorithm::ring) consider(ring_shape(topo, c, g));
  if (algo == Algorithm::automatic || algo == Algorithm::tree) consider(tree_shape(topo, c, g));
  if (algo == Algorithm::automatic || algo == Algorithm::nvls) consider(nvls_shape(topo, c, g));
  if (shapes.empty()) {
    consider(ring_shape(topo, c, g));
    consider(tree_shape(topo, c, g));
    consider(nvls_shape(topo, c, g));
  }
  return shapes;
}

}  // namespace
}  // namespace detail

FlowSpec collective_flow(const Topology& topo, Collective c, std::span<const int> devices, double bytes,
                         Algorithm algo) {
  using namespace detail;
  const bool point = direct(c);
  if (c == Collective::send_recv && devices.size() != 2)
    throw std::invalid_argument("collective_flow: send_recv takes two devices (source, destination)");
  const Group g = make_group(topo, devices);
  FlowSpec none;
  none.payload_bytes = bytes;
  none.algorithm = point ? Algorithm::direct : Algorithm::ring;
  if (g.size() < 2 || (c == Collective::send_recv && devices[0] == devices[1]) || !(bytes > 0)) return none;

  const std::vector<Shape> shapes = candidate_shapes(topo, c, g, algo);
  if (shapes.empty() && (c == Collective::all_to_all_rails || c == Collective::all_to_all_domain))
    throw std::invalid_argument("collective_flow: a rails hop needs two scale-up domains, a domain hop two members in "
                                "each (the flex dispatcher's setup omits hops that have none)");
  FlowSpec best = none;
  double best_time = std::numeric_limits<double>::infinity();
  for (const Shape& s : shapes) {
    for (const ProtocolParams* p : protocols_of(topo)) {
      if (s.only) p = s.only;
      FlowSpec f = to_flow(s, *p, bytes);
      const double t = isolated_time(topo, f);
      if (t < best_time) {
        best_time = t;
        best = std::move(f);
      }
      if (s.only) break;
    }
  }
  return best;
}

namespace {
// Seconds per payload byte of a flow alone: its busiest link.
double seconds_per_byte(const Topology& topo, const FlowSpec& f) {
  const auto& links = topo.links();
  double per_byte = 0;
  for (const auto& [l, w] : f.load) {
    const double cap = links.at(l).capacity_Bps;
    per_byte = std::max(per_byte, cap > 0 ? w / cap : std::numeric_limits<double>::infinity());
  }
  return per_byte;
}
}  // namespace

CollectiveCurve collective_curve(const Topology& topo, Collective c, std::span<const int> devices) {
  using namespace detail;
  CollectiveCurve curve;
  if (c == Collective::send_recv && devices.size() != 2)
    throw std::invalid_argument("collective_curve: send_recv takes two devices (source, destination)");
  const Group g = make_group(topo, devices);
  if (g.size() < 2 || (c == Collective::send_recv && devices[0] == devices[1])) return curve;
  for (const Shape& s : candidate_shapes(topo, c, g, Algorithm::automatic)) {
    for (const ProtocolParams* p : protocols_of(topo)) {
      if (s.only) p = s.only;
      const FlowSpec f = to_flow(s, *p, 1.0);
      curve.lines.emplace_back(f.latency_s, seconds_per_byte(topo, f));
      if (s.only) break;
    }
  }
  // A line that another is no worse than in both terms never gives the
  // minimum alone (rounding is monotone, so the other's time is no larger at
  // any size): dropped, which leaves at() unchanged bit for bit.
  std::vector<std::pair<double, double>> kept;
  for (std::size_t i = 0; i < curve.lines.size(); ++i) {
    const auto& [li, pi] = curve.lines[i];
    bool dominated = false;
    for (std::size_t j = 0; j < curve.lines.size() && !dominated; ++j) {
      const auto& [lj, pj] = curve.lines[j];
      // Equal lines: the first is kept.
      dominated = j != i && lj <= li && pj <= pi && (lj < li || pj < pi || j < i);
    }
    if (!dominated) kept.push_back(curve.lines[i]);
  }
  curve.lines = std::move(kept);
  return curve;
}

double CollectiveCurve::at(double bytes) const {
  if (!(bytes > 0) || lines.empty()) return 0;
  double best = std::numeric_limits<double>::infinity();
  for (const auto& [latency, per_byte] : lines) best = std::min(best, latency + bytes * per_byte);
  return best;
}

double isolated_time(const Topology& topo, const FlowSpec& f) {
  return f.latency_s + (f.payload_bytes > 0 ? f.payload_bytes * seconds_per_byte(topo, f) : 0.0);
}

double bus_bandwidth(Collective c, int n, double bytes, double seconds) {
  if (!(seconds > 0) || n < 1) return 0;
  const double algbw = bytes / seconds;
  switch (c) {
    case Collective::all_reduce: return algbw * 2.0 * (n - 1) / n;
    case Collective::reduce_scatter:
    case Collective::all_gather: return algbw * (n - 1) / n;
    default: return algbw;
  }
}

}  // namespace megascope::sim
