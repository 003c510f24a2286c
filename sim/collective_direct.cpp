// Direct transfers: all-to-all (every ordered pair of the group exchanges
// bytes / n over its own path, as NCCL's grouped send/recv does) and
// send/recv (one path, source to destination).
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
    const int a = g.devices[0], b = g.devices[1];
    lat = s.add_path(topo, a, b, 1.0, cls(a, b));
    s.phases = {Phase{1, lat}};
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
