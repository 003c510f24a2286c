// Tree algorithm (NCCL's tree), for all-reduce: a reduction up the tree and a
// broadcast back down, pipelined.
//
// Inside a scale-up domain NCCL's tree is a chain through the domain's
// devices (so within one domain it never beats the ring); across domains the
// domains' chain heads form a double binary tree (two complementary trees,
// each carrying half the data), one tree per channel (NIC rail), so the
// latency grows with log2(domains) instead of the number of ranks:
//   steps = 2 x ((devices per domain - 1) NVLink hops + ceil(log2 D) network hops)
// (NCCL tuning.cc: 2 * ((nRanks/nNodes-1) * intraLat + log2i(nNodes) * interLat)).
//
// Bandwidth: NCCL's tuning model gives the tree half the network's bus
// bandwidth (tuning.cc: tree algbw = busBw * 0.5), i.e. the busiest NIC moves
// 2 bytes per payload byte each way. A double binary tree over D >= 3
// domains does exactly that (interior in one tree, leaf in the other); with
// two domains it degenerates to one exchange, and we keep NCCL's figure
// rather than the halved physical volume so that, as in NCCL, the ring wins
// for large messages across two nodes (NCCL_812 measures the ring's 192 GB/s).
// NCCL also derates the tree's bus bandwidth to 0.92 of the ring's
// (tuning.cc: busBw * .92): every tree load is divided by that factor.
#include <algorithm>
#include <cmath>

#include "sim/collective_internal.hpp"

namespace megascope::sim::detail {

namespace {
constexpr double tree_efficiency = 0.92;
}  // namespace

std::optional<Shape> tree_shape(const Topology& topo, Collective c, const Group& g) {
  if (c != Collective::all_reduce || g.size() < 2) return std::nullopt;
  const int D = g.ndomains();
  const int R = D > 1 ? g.channels : 1;
  Shape s;
  s.algorithm = Algorithm::tree;
  double intra_lat = 0, inter_lat = 0;
  for (int d = 0; d < D; ++d) {
    const auto& local = g.domains[d];
    const int m = static_cast<int>(local.size());
    if (m < 2) continue;
    for (int r = 0; r < R; ++r) {
      // The chain of channel r starts at the device on rail r (the chain head).
      int start = 0;
      if (D > 1)
        while (local[start] != g.nic_reps[d][r]) ++start;
      for (int i = 0; i + 1 < m; ++i) {
        const int a = local[(start + i) % m], b = local[(start + i + 1) % m];
        const double w = 1.0 / (R * tree_efficiency);
        intra_lat = std::max(intra_lat, s.add_path(topo, a, b, w, LinkClass::scale_up));  // down
        intra_lat = std::max(intra_lat, s.add_path(topo, b, a, w, LinkClass::scale_up));  // up
      }
    }
  }
  if (D > 1) {
    // Tree A: heap order over domain indices; tree B: its mirror image.
    std::vector<std::pair<int, int>> edges;  // (child, parent)
    std::vector<int> degree(static_cast<std::size_t>(D), 0);
    for (int k = 1; k < D; ++k) {
      edges.emplace_back(k, (k - 1) / 2);
      edges.emplace_back(D - 1 - k, D - 1 - (k - 1) / 2);
    }
    for (auto [child, parent] : edges) {
      ++degree[static_cast<std::size_t>(child)];
      ++degree[static_cast<std::size_t>(parent)];
    }
    const int max_degree = *std::max_element(degree.begin(), degree.end());
    // Each edge carries its tree's share up and down; scaled so that the
    // busiest NIC moves 2 bytes per payload byte per channel each way.
    const double w = 2.0 / (static_cast<double>(R) * max_degree * tree_efficiency);
    for (auto [child, parent] : edges)
      for (int r = 0; r < R; ++r) {
        const int a = g.nic_reps[child][r], b = g.nic_reps[parent][r];
        inter_lat = std::max(inter_lat, s.add_path(topo, a, b, w, LinkClass::network));
        inter_lat = std::max(inter_lat, s.add_path(topo, b, a, w, LinkClass::network));
      }
  }
  const int levels = D > 1 ? static_cast<int>(std::ceil(std::log2(static_cast<double>(D)))) : 0;
  s.phases = {Phase{2 * (g.max_local() - 1), intra_lat}, Phase{2 * levels, inter_lat}};
  return s;
}

}  // namespace megascope::sim::detail
