// NVLS (NVLink SHARP), for all-reduce on an NVSwitch domain with in-switch
// reduction: each device pushes its buffer into the switch once (the switch
// reduces) and receives the reduced buffer once (the switch multicasts), so
// every device's NVLink carries 1 byte per payload byte each way, against
// 2(n-1)/n for the ring. Two steps.
//
// Across domains (NCCL's NVLS+Tree, the hierarchical scheme): NVLS
// reduce-scatter inside each domain, an all-reduce of each device's 1/m
// share among the devices of the same local rank in the other domains (a ring
// over the NICs: 2(D-1)/D x 1/m bytes per payload byte on each NIC), NVLS
// all-gather inside each domain; pipelined, so the loads add up on the links.
// Needs the same number of devices (>= 2) in every domain.
#include <algorithm>

#include "sim/collective_internal.hpp"

namespace megascope::sim::detail {

std::optional<Shape> nvls_shape(const Topology& topo, Collective c, const Group& g) {
  const NodeSpec& node = topo.cluster().node;
  if (c != Collective::all_reduce || node.scale_up != ScaleUpKind::nvswitch || !node.nvls) return std::nullopt;
  const int D = g.ndomains();
  const int m = g.max_local();
  if (m < 2 || !g.uniform()) return std::nullopt;
  Shape s;
  s.algorithm = Algorithm::nvls;
  s.only = &nvls();
  double intra_lat = 0, inter_lat = 0;
  for (const auto& local : g.domains)
    for (int i = 0; i < m; ++i)  // the cycle's paths cover each device's up- and down-link once
      intra_lat = std::max(intra_lat, s.add_path(topo, local[i], local[(i + 1) % m], 1.0, LinkClass::nvls));
  if (D > 1) {
    const double share = 2.0 * (D - 1) / D / m;
    for (int d = 0; d < D; ++d)
      for (int j = 0; j < m; ++j)
        inter_lat = std::max(inter_lat, s.add_path(topo, g.domains[d][j], g.domains[(d + 1) % D][j], share,
                                                   LinkClass::network));
  }
  s.phases = {Phase{2, intra_lat}, Phase{2 * (D - 1), inter_lat}};
  return s;
}

}  // namespace megascope::sim::detail
