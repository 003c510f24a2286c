// ClusterSpec: the hardware a plan runs on. One device type, identical
// nodes, a scale-up domain (NVLink/NVSwitch, possibly larger than a node as in
// GB200 NVL72) and a scale-out network (NICs into a fat tree).
//
// All rates are per direction. A node of gpus_per_node devices; the cluster
// has num_nodes of them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/result.hpp"

namespace megascope {

enum class DeviceKind { gpu, cpu };
enum class ScaleUpKind { nvswitch, nvlink_mesh, pcie, none };
enum class Fabric { infiniband, roce, ethernet, none };
// How the fabric spreads traffic between leaves over its equal-cost paths.
// adaptive: evenly over all of them (InfiniBand's fat-tree routing engines,
// built for congestion-free shift patterns such as rings, and its adaptive
// routing): the switches above a leaf act as one trunk of their cables'
// summed capacity. ecmp: each flow on one path, picked by a fixed hash of
// its endpoints (Ethernet ECMP), so flows can collide on one uplink.
enum class Routing { adaptive, ecmp };

struct DeviceSpec {
  std::string name;                        // "H100-SXM5-80GB"
  DeviceKind kind = DeviceKind::gpu;
  double peak_bf16_flops = 0;              // dense, no sparsity (FLOP/s)
  std::optional<double> peak_fp8_flops;    // absent: the device has no FP8 tensor cores
  double peak_fp32_flops = 0;              // plain FP32 (non-tensor) FLOP/s
  double memory_bytes = 0;                 // usable device memory
  double memory_bandwidth_Bps = 0;         // HBM (or DRAM) bandwidth
  std::optional<int> sms;                  // streaming multiprocessors (GPU) or cores (CPU)
  // Tensor cores that take the OCP microscaling (MX) formats, scaled per
  // 32-element block in hardware: what the mxfp8 recipe needs (Blackwell).
  bool mx_formats = false;
};

struct NodeSpec {
  int devices_per_node = 0;
  ScaleUpKind scale_up = ScaleUpKind::nvswitch;
  double scale_up_bandwidth_Bps = 0;       // per device per direction, line rate (NVLink/PCIe)
  double scale_up_latency_s = 0;           // one hop through the scale-up fabric
  bool nvls = false;                       // NVLink SHARP (in-switch reduction) available
  double pcie_bandwidth_Bps = 0;           // device <-> host/NIC per direction
  int nics_per_node = 0;                   // compute NICs (storage NICs excluded)
  double nic_bandwidth_Bps = 0;            // per NIC per direction, line rate
};

struct ScaleOutSpec {
  Fabric fabric = Fabric::infiniband;
  double latency_s = 0;                    // end-to-end small-message latency across the fabric
  int tiers = 2;                           // fat-tree levels (leaf/spine = 2, + core = 3)
  bool rail_optimized = true;              // NIC i of every node on leaf (rail) i
  double oversubscription = 1.0;           // down:up ratio at the leaves (1 = full bisection)
  int switch_radix = 64;                   // ports per switch
  Routing routing = Routing::adaptive;     // default: ecmp on roce and ethernet fabrics
  // The share of a collective's rate on the same NIC that a lone send/recv
  // between scale-up domains reaches (pipeline transfers). 1: the same rate.
  double p2p_efficiency = 1.0;
};

struct ClusterSpec {
  std::string name;
  DeviceSpec device;
  NodeSpec node;
  int scale_up_domain = 0;                 // devices sharing one NVLink domain (>= devices_per_node) that a job
                                           // uses: after validation the used part of a larger domain
  // A job uses this many devices of each scale-up domain (0: all of them):
  // NVIDIA's GB200 NVL72 runs take 64 of a rack's 72 GPUs, 16 of its 18 trays,
  // so that EP groups of 64 stay inside one rack. Validation makes it the
  // job's scale_up_domain and keeps the whole domain's size in
  // scale_up_domain_size.
  int scale_up_domain_used = 0;
  int scale_up_domain_size = 0;            // devices of a whole domain (validation sets it)
  ScaleOutSpec scale_out;
  int num_nodes = 0;

  [[nodiscard]] int total_devices() const { return num_nodes * node.devices_per_node; }
};

// The most devices a cluster may have: full-mode simulation holds every
// rank's ops, and some of its work grows faster than the rank count.
inline constexpr std::int64_t kMaxDevices = std::int64_t{1} << 18;

// Positive sizes, scale-up domain a multiple of the node, NICs present when
// there is more than one scale-up domain.
Result<ClusterSpec> validate_cluster(ClusterSpec c);

// Sets the node count from a device count (rounded up to whole nodes).
// Fails if `devices` < 1.
Result<ClusterSpec> with_device_count(ClusterSpec c, int devices);

const char* to_string(DeviceKind k);
const char* to_string(ScaleUpKind k);
const char* to_string(Fabric f);
const char* to_string(Routing r);

}  // namespace megascope
