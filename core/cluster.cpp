#include "core/cluster.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <tuple>

namespace megascope {

namespace {
Result<void> positive(const std::string& field, double v) {
  if (!(v > 0) || !std::isfinite(v)) return fail("cluster." + field, fmt::format("must be positive and finite, found {}", v));
  return {};
}
}  // namespace

Result<ClusterSpec> validate_cluster(ClusterSpec c) {
  const DeviceSpec& d = c.device;
  for (auto [field, v] : {std::pair<const char*, double>{"device.peak_bf16_tflops", d.peak_bf16_flops},
                          {"device.peak_fp32_tflops", d.peak_fp32_flops},
                          {"device.memory_GiB", d.memory_bytes},
                          {"device.memory_bandwidth_TBps", d.memory_bandwidth_Bps},
                          {"node.devices", static_cast<double>(c.node.devices_per_node)},
                          {"num_nodes", static_cast<double>(c.num_nodes)}}) {
    if (auto r = positive(field, v); !r) return tl::unexpected(r.error());
  }
  if (static_cast<std::int64_t>(c.num_nodes) * c.node.devices_per_node > kMaxDevices)
    return fail("cluster.num_nodes", fmt::format("{} nodes of {} devices is more than the {} devices a cluster may have",
                                                 c.num_nodes, c.node.devices_per_node, kMaxDevices));
  if (d.peak_fp8_flops && !(*d.peak_fp8_flops > 0 && std::isfinite(*d.peak_fp8_flops)))
    return fail("cluster.device.peak_fp8_tflops", "must be positive when given (omit it when the device has no FP8)");
  // Floors below any real device, so that no time is priced from a rate of
  // 5e-324 (an infinite step, MFU of NaN): 1 GFLOP/s, 1 MB/s, 1 MiB.
  for (auto [field, v, floor, what] :
       {std::tuple<const char*, double, double, const char*>{"device.peak_bf16_tflops", d.peak_bf16_flops, 1e9, "1e-3 TFLOP/s"},
        {"device.peak_fp32_tflops", d.peak_fp32_flops, 1e9, "1e-3 TFLOP/s"},
        {"device.peak_fp8_tflops", d.peak_fp8_flops.value_or(1e9), 1e9, "1e-3 TFLOP/s"},
        {"device.memory_bandwidth_TBps", d.memory_bandwidth_Bps, 1e6, "1e-6 TB/s"},
        {"device.memory_GiB", d.memory_bytes, 1048576.0, "1 MiB"}})
    if (v < floor)
      return fail(std::string("cluster.") + field, fmt::format("must be at least {} (no device is slower or smaller)", what));
  if (c.node.devices_per_node > 1 && c.node.scale_up != ScaleUpKind::none &&
      !(c.node.scale_up_bandwidth_Bps > 0))
    return fail("cluster.node.scale_up_bandwidth_GBps",
                "must be positive for a node with more than one device");
  if (c.scale_up_domain == 0) c.scale_up_domain = c.node.devices_per_node;
  if (c.scale_up_domain < c.node.devices_per_node || c.scale_up_domain % c.node.devices_per_node != 0)
    return fail("cluster.scale_up_domain",
                fmt::format("must be a whole number of nodes ({} devices each), found {}",
                            c.node.devices_per_node, c.scale_up_domain));
  if (c.scale_up_domain_used != 0) {
    const int whole = std::max(c.scale_up_domain, c.scale_up_domain_size);
    if (c.scale_up_domain_used < c.node.devices_per_node || c.scale_up_domain_used % c.node.devices_per_node != 0 ||
        c.scale_up_domain_used > whole)
      return fail("cluster.scale_up_domain_used",
                  fmt::format("must be a whole number of nodes ({} devices each) and at most scale_up_domain ({}), found {}",
                              c.node.devices_per_node, whole, c.scale_up_domain_used));
    c.scale_up_domain_size = whole;
    c.scale_up_domain = c.scale_up_domain_used;
  } else {
    c.scale_up_domain_size = c.scale_up_domain;
  }
  if (c.node.nics_per_node < 0)
    return fail("cluster.node.nics", fmt::format("must be >= 0, found {}", c.node.nics_per_node));
  if (c.node.nics_per_node > 0 && !(c.node.nic_bandwidth_Bps > 0))
    return fail("cluster.node.nic_bandwidth_Gbps", "must be positive when the node has NICs");
  if (c.total_devices() > c.scale_up_domain && c.node.nics_per_node == 0)
    return fail("cluster.node.nics",
                fmt::format("{} devices span more than one scale-up domain of {} but the nodes have no NICs",
                            c.total_devices(), c.scale_up_domain));
  if (c.scale_out.tiers < 1 || c.scale_out.tiers > 4)
    return fail("cluster.scale_out.tiers", fmt::format("must be 1 to 4, found {}", c.scale_out.tiers));
  if (!(c.scale_out.oversubscription >= 1.0))
    return fail("cluster.scale_out.oversubscription",
                fmt::format("is a down:up ratio and must be >= 1, found {}", c.scale_out.oversubscription));
  if (!(c.scale_out.p2p_efficiency >= 1e-6 && c.scale_out.p2p_efficiency <= 1))
    return fail("cluster.scale_out.p2p_efficiency",
                fmt::format("is a share of the collectives' rate and must be in [1e-6, 1], found {}",
                            c.scale_out.p2p_efficiency));
  // Latencies between 0 and one second; link rates, where given, finite and
  // at least 1 MB/s (a NIC of 1e-300 Gb/s priced a step at 6e296 s).
  for (auto [field, v] : {std::pair<const char*, double>{"node.scale_up_latency_us", c.node.scale_up_latency_s},
                          {"scale_out.latency_us", c.scale_out.latency_s}})
    if (!(v >= 0 && v <= 1.0))
      return fail(std::string("cluster.") + field, fmt::format("must be between 0 and 1e6 us, found {} us", v * 1e6));
  for (auto [field, v] : {std::pair<const char*, double>{"node.scale_up_bandwidth_GBps", c.node.scale_up_bandwidth_Bps},
                          {"node.pcie_bandwidth_GBps", c.node.pcie_bandwidth_Bps},
                          {"node.nic_bandwidth_Gbps", c.node.nic_bandwidth_Bps}})
    if (v != 0 && !(v >= 1e6 && std::isfinite(v)))
      return fail(std::string("cluster.") + field,
                  fmt::format("must be 0 (none) or a finite rate of at least 1 MB/s, found {} B/s", v));
  if (c.scale_out.switch_radix < 2)
    return fail("cluster.scale_out.switch_radix", fmt::format("must be >= 2, found {}", c.scale_out.switch_radix));
  return c;
}

Result<ClusterSpec> with_device_count(ClusterSpec c, int devices) {
  if (devices < 1) return fail("gpus", fmt::format("must be >= 1, found {}", devices));
  const int per = c.node.devices_per_node;
  if (per <= 0) return fail("cluster.node.devices", "must be positive");
  c.num_nodes = (devices + per - 1) / per;
  return c;
}

const char* to_string(DeviceKind k) { return k == DeviceKind::gpu ? "gpu" : "cpu"; }
const char* to_string(ScaleUpKind k) {
  switch (k) {
    case ScaleUpKind::nvswitch: return "nvswitch";
    case ScaleUpKind::nvlink_mesh: return "nvlink-mesh";
    case ScaleUpKind::pcie: return "pcie";
    case ScaleUpKind::none: return "none";
  }
  return "?";
}
const char* to_string(Fabric f) {
  switch (f) {
    case Fabric::infiniband: return "infiniband";
    case Fabric::roce: return "roce";
    case Fabric::ethernet: return "ethernet";
    case Fabric::none: return "none";
  }
  return "?";
}

const char* to_string(Routing r) { return r == Routing::adaptive ? "adaptive" : "ecmp"; }

}  // namespace megascope
