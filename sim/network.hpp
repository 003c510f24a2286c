// The cluster as a graph, and communication over it.
//
// Topology: devices, the scale-up fabric (one NVSwitch plane per scale-up
// domain, a full NVLink mesh, or PCIe through the host), NICs, and a fat tree
// of leaf/spine/core switches (rail-optimized or not, oversubscribed or not),
// built with Boost.Graph from a ClusterSpec. Every link is directional and
// has a capacity (bytes/s) and a latency.
//
// Collectives are modelled the way NCCL runs them: ring, tree or NVLS, chosen
// by size and span (least time on an idle network over NCCL's LL, LL128 and
// Simple protocols). Across scale-up domains the ring is NCCL's flat ring, one
// per NIC rail; the tree is a chain in each domain under a double binary tree
// of domains; NVLS runs hierarchically (intra-domain NVLS reduce-scatter,
// inter-domain ring over the NICs, intra-domain NVLS all-gather).
// A collective or a point-to-point transfer becomes one Flow: a latency term
// plus a volume that loads a set of links (bytes crossing each link per byte
// of payload). Concurrent flows share links with max-min fairness.
//
// Resource contract (SimGrid): next_event_time() and advance_to(t).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/cluster.hpp"

namespace megascope::sim {

// all_to_all_rails and all_to_all_domain: the two hops of CommSpan (core/program/program.hpp).
enum class Collective : std::uint8_t {
  all_reduce, reduce_scatter, all_gather, all_to_all, send_recv, broadcast, all_to_all_rails, all_to_all_domain
};
enum class Algorithm : std::uint8_t { automatic, ring, tree, nvls, direct };

using LinkId = std::uint32_t;
using FlowId = std::uint64_t;

struct LinkInfo {
  std::string name;            // "gpu3->nvswitch0", "nic5->leaf5", "leaf0->spine2", ...
  double capacity_Bps = 0;
  double latency_s = 0;
};

class Topology {
 public:
  // `devices`: how many devices of the cluster are used (ranks 0..devices-1
  // are placed on devices in order: node-major, so consecutive ranks share a node).
  static Topology build(const ClusterSpec& cluster, int devices);

  [[nodiscard]] int devices() const;
  [[nodiscard]] int node_of(int device) const;
  [[nodiscard]] int domain_of(int device) const;        // scale-up domain
  [[nodiscard]] const std::vector<LinkInfo>& links() const;
  // Directed links from device a to device b, in order.
  [[nodiscard]] std::vector<LinkId> path(int a, int b) const;
  [[nodiscard]] const ClusterSpec& cluster() const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

// One transfer's demand on the network.
struct FlowSpec {
  std::vector<std::pair<LinkId, double>> load;   // (link, bytes on it per payload byte)
  double payload_bytes = 0;                      // what the rate applies to
  double latency_s = 0;                          // fixed cost before/around the volume
  Algorithm algorithm = Algorithm::automatic;    // the algorithm chosen
};

// How a collective over `devices` (device ids, in rank order of the group)
// with `bytes` per rank (the buffer size, as nccl-tests' "size") loads the
// network. A requested algorithm that does not apply (NVLS without NVLink
// SHARP, tree for other than all-reduce) falls back to the automatic choice;
// all_to_all and send_recv (devices = {source, destination}) are direct.
FlowSpec collective_flow(const Topology& topo, Collective c, std::span<const int> devices, double bytes,
                         Algorithm algo = Algorithm::automatic);

// Time of one collective alone on an idle network.
double isolated_time(const Topology& topo, const FlowSpec& f);

// The same as a function of the size, for estimates that cost many sizes of
// one group: the least, over the algorithms and protocols collective_flow()
// considers, of latency + bytes x seconds per byte. For bytes > 0,
// at(bytes) == isolated_time(topo, collective_flow(topo, c, devices, bytes)).
struct CollectiveCurve {
  std::vector<std::pair<double, double>> lines;   // (latency_s, seconds per payload byte)
  [[nodiscard]] double at(double bytes) const;
};
CollectiveCurve collective_curve(const Topology& topo, Collective c, std::span<const int> devices);

// Bus bandwidth as nccl-tests defines it, for a collective of `bytes` over n
// ranks taking `seconds`: all_reduce algbw * 2(n-1)/n; reduce_scatter and
// all_gather algbw * (n-1)/n; others algbw.
double bus_bandwidth(Collective c, int n, double bytes, double seconds);

// Flows in progress, sharing link capacity max-min fairly. Deterministic:
// ties are broken by flow id. Flow ids are 1, 2, 3, ... in start order.
class Network {
 public:
  // A FlowSpec checked and normalised once (links merged and sorted, its solo
  // rate worked out), for flows that repeat: start(prepare(f), now) behaves
  // exactly as start(f, now).
  using Prepared = std::uint32_t;

  explicit Network(const Topology& topo);
  FlowId start(const FlowSpec& f, double now);
  [[nodiscard]] Prepared prepare(const FlowSpec& f);
  FlowId start(Prepared f, double now);
  // Optional, once, after the last prepare() and before the first start():
  // links that every prepared flow loads alike (same capacity, same load from
  // each flow) are tracked as one, which changes no result (bit for bit) but
  // makes each event cheaper (a ring over 8 NVLink ports loads 16 links
  // alike). Afterwards prepare() and start(FlowSpec) throw std::logic_error.
  void seal();
  // The links a prepared flow loads (before seal(): every link, merged or not).
  [[nodiscard]] std::span<const std::pair<LinkId, double>> links_of(Prepared f) const;
  // When a flow of `f` started at time t ends if no other flow shares any of
  // its links while it runs: (t + latency) + transfer, its latency, then its
  // payload at its solo rate, in the same arithmetic as start() (so the same
  // time up to the 1e-12 relative tolerance within which this network
  // reports events together).
  struct LoneTerms {
    double latency = 0, transfer = 0;
  };
  [[nodiscard]] LoneTerms lone_terms(Prepared f) const;

  // Idle flows. A prepared flow that starts at `now` while no live or held
  // flow loads any of its links can be held outside the network: nothing
  // else then shares its links, so it ends when lone_terms() says, which
  // the caller schedules itself. hold() returns a handle, or nullopt (a link
  // is in use: start() it instead). Until that end, the first start() of a
  // flow that loads one of its links admits it first, as the flow it would
  // have been had it been started at `now` (the same latency event, or the
  // same transfer at its solo rate from the end of its latency); admitted()
  // then lists it with its FlowId, and it ends as any flow, in advance_to().
  // release(h): the caller reached the end of held flow h, or learned of its
  // admission; true if it was still held (it ended, its links are idle
  // again), false if it was admitted. Every handle is released once, and
  // only then reused.
  using Held = std::uint32_t;
  [[nodiscard]] std::optional<Held> hold(Prepared f, double now);
  bool release(Held h);
  // The held flows the last start() admitted, as (handle, flow id).
  [[nodiscard]] std::span<const std::pair<Held, FlowId>> admitted() const;
  [[nodiscard]] std::optional<double> next_event_time() const;
  // Advances to t (<= next_event_time()) and returns the flows that finished at t.
  std::vector<FlowId> advance_to(double t);
  // The same, into `done` (cleared first), so that a caller can reuse it.
  void advance_to(double t, std::vector<FlowId>& done);
  [[nodiscard]] std::size_t active() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace megascope::sim
