// Ring algorithm (NCCL's ring), for all-reduce, reduce-scatter, all-gather
// and broadcast.
//
// In one scale-up domain: a ring through the group's devices; every ring edge
// carries 2(n-1)/n bytes per payload byte for all-reduce, (n-1)/n for
// reduce-scatter / all-gather, 1 for a (pipelined, open-chain) broadcast. On
// an NVLink mesh NCCL runs one ring per neighbour offset so that every direct
// link is used: n-1 rings, each with 1/(n-1) of the data.
//
// Across domains NCCL's ring is one flat ring over all ranks, domain by
// domain, with one ring per NIC ("channel"). A ring enters and leaves each
// domain through the same rail (PXN: the last device hands the data over
// NVLink to the device next to the NIC), so each domain's devices form an
// NVLink cycle carrying the full per-rank volume, and between consecutive
// domains rail r carries volume / channels. This reproduces NCCL's
// multi-node ring bus bandwidth = NICs x NIC rate (NCCL_812: 8 HDR NICs, 192
// GB/s; USER_100: 4 NICs, 91 GB/s), independent of the number of nodes.
//
// Steps: 2(n-1) for all-reduce, n-1 otherwise; of these 2(D-1) (resp. D-1)
// cross the network (NCCL tuning.cc's nInterSteps), the rest cost an NVLink hop.
#include <algorithm>

#include "sim/collective_internal.hpp"

namespace megascope::sim::detail {

std::optional<Shape> ring_shape(const Topology& topo, Collective c, const Group& g) {
  const int n = g.size(), D = g.ndomains();
  double volume = 0;
  int steps = 0, inter_steps = 0;
  switch (c) {
    case Collective::all_reduce:
      volume = 2.0 * (n - 1) / n;
      steps = 2 * (n - 1);
      inter_steps = 2 * (D - 1);
      break;
    case Collective::reduce_scatter:
    case Collective::all_gather:
      volume = static_cast<double>(n - 1) / n;
      steps = n - 1;
      inter_steps = D - 1;
      break;
    case Collective::broadcast:
      volume = 1.0;
      steps = n - 1;
      inter_steps = D - 1;
      break;
    default: return std::nullopt;
  }
  const bool chain = c == Collective::broadcast;
  const bool mesh = topo.cluster().node.scale_up == ScaleUpKind::nvlink_mesh;
  Shape s;
  s.algorithm = Algorithm::ring;
  double intra_lat = 0, inter_lat = 0;
  for (const auto& local : g.domains) {
    const int m = static_cast<int>(local.size());
    if (m < 2) continue;
    if (mesh && D == 1) {
      for (int k = 1; k < m; ++k)
        for (int i = 0; i < m; ++i) {
          if (chain && i + k >= m) continue;
          const double lat = s.add_path(topo, local[i], local[(i + k) % m], volume / (m - 1), LinkClass::scale_up);
          intra_lat = std::max(intra_lat, lat);
        }
      continue;
    }
    for (int i = 0; i < m; ++i) {
      if (chain && D == 1 && i == m - 1) break;  // an open chain: the last device sends nothing
      const double lat = s.add_path(topo, local[i], local[(i + 1) % m], volume, LinkClass::scale_up);
      intra_lat = std::max(intra_lat, lat);
    }
  }
  if (D > 1) {
    const int R = g.channels;
    for (int d = 0; d < D; ++d) {
      if (chain && d == D - 1) break;
      const auto& here = g.nic_reps[d];
      const auto& next = g.nic_reps[(d + 1) % D];
      for (int r = 0; r < R; ++r) {
        const double lat = s.add_path(topo, here[r], next[r], volume / R, LinkClass::network);
        inter_lat = std::max(inter_lat, lat);
      }
    }
  }
  s.phases = {Phase{steps - inter_steps, intra_lat}, Phase{inter_steps, inter_lat}};
  return s;
}

}  // namespace megascope::sim::detail
