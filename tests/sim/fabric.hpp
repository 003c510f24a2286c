// A one-node NVSwitch fabric of `devices` devices with `capacity` bytes/s per
// device link: the smallest topology on which flows share links.
#pragma once

#include "core/cluster.hpp"
#include "sim/network.hpp"

namespace megascope::test {

inline sim::Topology fabric(int devices, double capacity) {
  ClusterSpec c;
  c.name = "test";
  c.device.name = "test-device";
  c.node.devices_per_node = devices;
  c.node.scale_up = ScaleUpKind::nvswitch;
  c.node.scale_up_bandwidth_Bps = capacity;
  c.scale_up_domain = devices;
  c.num_nodes = 1;
  return sim::Topology::build(c, devices);
}

}  // namespace megascope::test
