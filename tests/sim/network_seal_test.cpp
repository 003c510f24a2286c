// Network::seal merges links that every prepared flow loads alike; it must
// change no result. Random flows over groups of links (a group is loaded as
// a whole, as a ring loads all ports of a switch), with loads and sizes drawn
// from a few round values so that levels tie and re-queue often: a sealed
// network with prepared flows and an unsealed one started from the specs
// must finish the same flows at the same times, bit for bit.
#include <algorithm>
#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "fabric.hpp"
#include "sim/network.hpp"

using namespace megascope;
using namespace megascope::sim;

namespace {

using test::fabric;

struct Finish {
  double t;
  std::vector<FlowId> ids;
  bool operator==(const Finish&) const = default;
};

// Starts flow k (of `specs`, in order) at starts[k]; returns every event.
template <class Start>
std::vector<Finish> run(Network& net, const std::vector<double>& starts, Start start) {
  std::vector<Finish> out;
  std::size_t next = 0;
  for (;;) {
    const auto e = net.next_event_time();
    if (next < starts.size() && (!e || starts[next] <= *e)) {
      auto done = net.advance_to(starts[next]);
      if (!done.empty()) out.push_back({starts[next], done});
      start(next, starts[next]);
      ++next;
      continue;
    }
    if (!e) break;
    auto done = net.advance_to(*e);
    if (!done.empty()) out.push_back({*e, done});
  }
  return out;
}

}  // namespace

TEST_CASE("Sealing a network (merging links all flows load alike) changes no finish time", "[sim]") {
  const Topology t = fabric(8, 100);  // 16 links of 100 bytes/s
  REQUIRE(t.links().size() == 16);
  // Groups: {0..3}, {4..7}, {8..11}, {12, 13}, and 14, 15 alone.
  const std::vector<std::vector<LinkId>> groups = {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13}, {14}, {15}};
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> group(0, static_cast<int>(groups.size()) - 1), count(1, 3), step(1, 4);
  int events = 0;
  for (int round = 0; round < 40; ++round) {
    std::vector<FlowSpec> specs(40);
    std::vector<double> starts(specs.size());
    for (std::size_t k = 0; k < specs.size(); ++k) {
      for (int g = count(rng); g > 0; --g) {
        const double w = 0.5 * step(rng);   // 0.5 .. 2: ties are common
        for (LinkId l : groups[static_cast<std::size_t>(group(rng))]) specs[k].load.emplace_back(l, w);
      }
      specs[k].payload_bytes = 50.0 * step(rng);
      specs[k].latency_s = 0.25 * (step(rng) - 1);
      starts[k] = 0.5 * static_cast<double>(k / 4);   // four flows start together
    }
    Network plain(t);
    const auto expected = run(plain, starts, [&](std::size_t k, double at) { plain.start(specs[k], at); });

    Network sealed(t);
    std::vector<Network::Prepared> prepared;
    for (const FlowSpec& f : specs) prepared.push_back(sealed.prepare(f));
    sealed.seal();
    const auto got = run(sealed, starts, [&](std::size_t k, double at) { sealed.start(prepared[k], at); });
    INFO("round " << round);
    REQUIRE(got.size() == expected.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      INFO("event " << i);
      CHECK(got[i].t == expected[i].t);   // exact, not approximate
      CHECK(got[i].ids == expected[i].ids);
    }
    events += static_cast<int>(got.size());
  }
  CHECK(events > 400);
}

TEST_CASE("A sealed network refuses flows it was not prepared for", "[sim]") {
  const Topology t = fabric(4, 100);
  Network net(t);
  FlowSpec f;
  f.load = {{0, 1.0}, {1, 1.0}};
  f.payload_bytes = 100;
  const Network::Prepared p = net.prepare(f);
  net.seal();
  CHECK_THROWS_AS(net.prepare(f), std::logic_error);
  CHECK_THROWS_AS(net.start(f, 0.0), std::logic_error);
  CHECK_THROWS_AS(net.seal(), std::logic_error);
  net.start(p, 0.0);
  CHECK(net.active() == 1);
}
