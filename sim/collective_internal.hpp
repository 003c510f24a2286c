// Internal to the collective models (sim/collective*.cpp): the NCCL protocol
// constants, a group split by scale-up domain, and the link-load "shape" each
// algorithm produces before a protocol is applied.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "sim/network.hpp"

namespace megascope::sim::detail {

// Which efficiency applies to a link: NVLink/PCIe scale-up, NVLink with
// in-switch reduction (NVLS), or the network (GPU-NIC PCIe, NIC, fabric).
enum class LinkClass : std::uint8_t { scale_up, nvls, network };

// A protocol's cost: time = base + steps x (hop latency + per_step) + bytes on
// the busiest link / (line rate x efficiency of that link's class).
struct ProtocolParams {
  const char* name;
  double base_s;
  double per_step_s;
  double efficiency[3];  // by LinkClass
};
// NCCL's LL, LL128 and Simple protocols, and NVLS (Simple over multicast).
const ProtocolParams& ll();
const ProtocolParams& ll128();
const ProtocolParams& simple();
const ProtocolParams& nvls();
// MPI (CPU devices): no protocol constants, per-step link latency, full link rate.
const ProtocolParams& mpi();
// The protocols collective_flow() chooses from on this topology's devices:
// NCCL's LL, LL128 and Simple on GPUs, MPI on CPUs.
std::span<const ProtocolParams* const> protocols_of(const Topology& topo);

// The devices of a group by scale-up domain (domains in order of first
// appearance, devices in rank order), and per domain one device per distinct
// NIC (the channels NCCL opens across domains, one per rail).
struct Group {
  std::vector<int> devices;
  std::vector<std::vector<int>> domains;
  std::vector<std::vector<int>> nic_reps;
  int channels = 1;  // min over domains of nic_reps size (>= 1)
  [[nodiscard]] int size() const { return static_cast<int>(devices.size()); }
  [[nodiscard]] int ndomains() const { return static_cast<int>(domains.size()); }
  [[nodiscard]] int max_local() const;
  [[nodiscard]] bool uniform() const;  // every domain has the same number of devices
};
Group make_group(const Topology& topo, std::span<const int> devices);

// One phase of an algorithm's latency: `steps` synchronised steps whose hop
// costs `hop_latency_s` (the slowest path used in that phase).
struct Phase {
  int steps = 0;
  double hop_latency_s = 0;
};

// An algorithm's link loads (bytes per payload byte before protocol
// efficiency) and latency structure.
struct Shape {
  Algorithm algorithm = Algorithm::ring;
  std::vector<std::pair<LinkId, double>> load[3];  // by LinkClass
  std::vector<Phase> phases;
  const ProtocolParams* only = nullptr;  // a fixed protocol (NVLS); else LL, LL128 and Simple

  // Adds `weight` to every link of the path a -> b; returns the path latency.
  double add_path(const Topology& topo, int a, int b, double weight, LinkClass cls);
};

// The algorithms. Each returns nothing when it does not apply.
std::optional<Shape> ring_shape(const Topology& topo, Collective c, const Group& g);
std::optional<Shape> tree_shape(const Topology& topo, Collective c, const Group& g);
std::optional<Shape> nvls_shape(const Topology& topo, Collective c, const Group& g);
std::optional<Shape> direct_shape(const Topology& topo, Collective c, const Group& g);

}  // namespace megascope::sim::detail
