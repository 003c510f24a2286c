// Direct transfers: all-to-all (every ordered pair of the group exchanges
// bytes / n over its own path, as NCCL's grouped send/recv does) and
// send/recv (one path, source to destination). A send/recv between scale-up
// domains loads its links 1 / scale_out.p2p_efficiency times as much as a
// collective's transfer would (NCCL's maintainers: send/recv is "mostly
// optimized for alltoall", a lone pair "might not achieve peak bandwidth",
// NVIDIA/nccl#464); the default 1 charges it the collectives' rate.
//
// Latency: a send/recv is one step on its path; an all-to-all posts one
// transfer per peer and is charged n-1 steps at the slowest pair's path
// latency (assumption: NCCL issues the peers' transfers in turn per channel).
#include "sim/collective_internal.hpp"

namespace megascope::sim::detail {

std::optional<Shape> direct_shape(const Topology& topo, Collective c, const Group& g) {
  Shape s;
  s.algorithm = Algorithm::direct;
  const int n = g.size();
  double lat = 0;
  auto cls = [&](int a, int b) {
    return topo.domain_of(a) == topo.domain_of(b) ? LinkClass::scale_up : LinkClass::network;
  };
  if (c == Collective::send_recv) {
    // Between domains at the cluster's p2p_efficiency of the protocol's network rate.
    const int a = g.devices[0], b = g.devices[1];
    const LinkClass k = cls(a, b);
    lat = s.add_path(topo, a, b, k == LinkClass::network ? 1.0 / topo.cluster().scale_out.p2p_efficiency : 1.0, k);
    s.phases = {Phase{1, lat}};
    return s;
  }
  if (c == Collective::all_to_all_rails || c == Collective::all_to_all_domain) {
    // The DeepEP dispatcher's hops (CommSpan): a member sends the bytes in
    // all, evenly, to the member at its own position in every other domain
    // (rails) or to the other members of its domain (domain); one step per peer.
    const int D = g.ndomains();
    std::size_t per = g.domains.front().size();
    for (const auto& d : g.domains) per = std::min(per, d.size());
    if (c == Collective::all_to_all_rails) {
      if (D < 2) return std::nullopt;
      for (std::size_t i = 0; i < per; ++i)
        for (int x = 0; x < D; ++x)
          for (int y = 0; y < D; ++y)
            if (x != y)
              lat = std::max(lat, s.add_path(topo, g.domains[static_cast<std::size_t>(x)][i],
                                             g.domains[static_cast<std::size_t>(y)][i], 1.0 / (D - 1),
                                             LinkClass::network));
      s.phases = {Phase{D - 1, lat}};
    } else {
      if (per < 2) return std::nullopt;
      for (const auto& d : g.domains)
        for (int b : d)
          for (int a : d)
            if (a != b) lat = std::max(lat, s.add_path(topo, a, b, 1.0 / static_cast<double>(d.size() - 1), LinkClass::scale_up));
      s.phases = {Phase{static_cast<int>(per) - 1, lat}};
    }
    return s;
  }
  if (c != Collective::all_to_all) return std::nullopt;
  // Destination-major, so that consecutive path queries share a destination.
  for (int b : g.devices)
    for (int a : g.devices)
      if (a != b) lat = std::max(lat, s.add_path(topo, a, b, 1.0 / n, cls(a, b)));
  s.phases = {Phase{n - 1, lat}};
  return s;
}

}  // namespace megascope::sim::detail
