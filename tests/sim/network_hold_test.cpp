// Network::hold: a flow started on idle links is held outside the network
// and ends by lone_terms(), unless a flow comes onto one of its links first;
// then it is admitted as the flow it would have been. Random flows over
// groups of links (as in network_seal_test.cpp), started at random times
// through the engine's protocol (hold if the links are idle, else start and
// take the admitted flows' ids), must finish when the same flows, all
// started in the network, finish (to the network's 1e-12 event tolerance).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <queue>
#include <random>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "fabric.hpp"
#include "sim/network.hpp"

using namespace megascope;
using namespace megascope::sim;

namespace {

using test::fabric;

struct Counts {
  int held = 0, ended_held = 0, admitted = 0;
};

// Finish time of each flow k started at starts[k] (ascending). With `hold`,
// flows go through Network::hold first, as the engine does.
std::vector<double> finish_times(const Topology& t, const std::vector<FlowSpec>& specs, const std::vector<double>& starts,
                                 bool hold, Counts& counts) {
  Network net(t);
  std::vector<Network::Prepared> prepared;
  for (const FlowSpec& f : specs) prepared.push_back(net.prepare(f));
  net.seal();
  constexpr double inf = std::numeric_limits<double>::infinity();
  std::vector<double> finish(specs.size(), -1);
  std::map<FlowId, std::size_t> flow_of;              // network flow -> k
  std::map<Network::Held, std::size_t> held_of;       // held handle -> k (until released)
  using Entry = std::tuple<double, std::size_t, Network::Held>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> ends;   // held flows' ends
  std::size_t next = 0;
  for (;;) {
    const double t_start = next < starts.size() ? starts[next] : inf;
    const double t_held = ends.empty() ? inf : std::get<0>(ends.top());
    const std::optional<double> tn = net.next_event_time();
    const double t_net = tn ? *tn : inf;
    if (t_start == inf && t_held == inf && t_net == inf) break;
    if (t_held <= t_net && t_held <= t_start) {
      const auto [at, k, h] = ends.top();
      ends.pop();
      held_of.erase(h);
      if (net.release(h)) {   // ended alone; else admitted, and the network ends it
        finish[k] = at;
        ++counts.ended_held;
      }
    } else if (t_net <= t_start) {
      for (const FlowId id : net.advance_to(t_net)) finish[flow_of.at(id)] = t_net;
    } else {
      const std::size_t k = next++;
      if (hold)
        if (const auto h = net.hold(prepared[k], t_start)) {
          const Network::LoneTerms lt = net.lone_terms(prepared[k]);
          ends.emplace((t_start + lt.latency) + lt.transfer, k, *h);
          held_of[*h] = k;
          ++counts.held;
          continue;
        }
      flow_of[net.start(prepared[k], t_start)] = k;
      for (const auto& [h, id] : net.admitted()) {
        flow_of[id] = held_of.at(h);
        ++counts.admitted;
      }
    }
  }
  return finish;
}

}  // namespace

TEST_CASE("Held flows finish when the same flows started in the network finish", "[sim]") {
  const Topology t = fabric(8, 100);   // 16 links of 100 bytes/s
  const std::vector<std::vector<LinkId>> groups = {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13}, {14}, {15}};
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> group(0, static_cast<int>(groups.size()) - 1), count(1, 2), step(1, 4);
  std::uniform_real_distribution<double> gap(0.0, 3.0);
  Counts total;
  for (int round = 0; round < 60; ++round) {
    std::vector<FlowSpec> specs(30);
    std::vector<double> starts(specs.size());
    double at = 0;
    for (std::size_t k = 0; k < specs.size(); ++k) {
      for (int g = count(rng); g > 0; --g) {
        const double w = 0.5 * step(rng);
        for (LinkId l : groups[static_cast<std::size_t>(group(rng))]) specs[k].load.emplace_back(l, w);
      }
      specs[k].payload_bytes = 50.0 * step(rng);
      specs[k].latency_s = 0.25 * (step(rng) - 1);   // none for a quarter of them: admitted while transferring
      at += gap(rng);
      starts[k] = at;
    }
    Counts none, counts;
    const auto expected = finish_times(t, specs, starts, false, none);
    const auto got = finish_times(t, specs, starts, true, counts);
    INFO("round " << round);
    REQUIRE(none.held == 0);
    for (std::size_t k = 0; k < specs.size(); ++k) {
      INFO("flow " << k);
      REQUIRE(expected[k] >= starts[k]);
      CHECK(got[k] == Approx(expected[k]).epsilon(1e-12));
    }
    total.held += counts.held;
    total.ended_held += counts.ended_held;
    total.admitted += counts.admitted;
  }
  // Both paths taken often: held flows that ended alone, and admitted ones.
  INFO(total.held << " held, " << total.ended_held << " ended alone, " << total.admitted << " admitted");
  CHECK(total.ended_held > 200);
  CHECK(total.admitted > 100);
  CHECK(total.held == total.ended_held + total.admitted);
}

TEST_CASE("A flow is held only on idle links, and a handle is reused only once released", "[sim]") {
  const Topology t = fabric(4, 100);
  Network net(t);
  FlowSpec a, b;
  a.load = {{0, 1.0}};
  a.payload_bytes = 100;
  b.load = {{0, 1.0}, {1, 1.0}};
  b.payload_bytes = 100;
  const Network::Prepared pa = net.prepare(a), pb = net.prepare(b);
  net.seal();
  const auto h = net.hold(pa, 0.0);
  REQUIRE(h);
  CHECK_FALSE(net.hold(pb, 0.5));   // link 0 carries the held flow
  // b starts on link 0: a enters the network first, transferring since 0 at
  // 100 B/s, and the two share link 0 once b's (zero) latency has passed.
  const FlowId fb = net.start(pb, 0.5);
  REQUIRE(net.admitted().size() == 1);
  CHECK(net.admitted()[0].first == *h);
  const FlowId fa = net.admitted()[0].second;
  CHECK(fa < fb);   // admitted before the flow that admits it starts
  // a: 50 bytes left at 0.5, then 50 B/s: ends at 1.5; b: 50 bytes by 1.5, then alone: ends at 2.0.
  auto e = net.next_event_time();
  REQUIRE(e);
  CHECK(*e == Approx(0.5));
  net.advance_to(*e);
  e = net.next_event_time();
  REQUIRE(e);
  CHECK(*e == Approx(1.5));
  CHECK(net.advance_to(*e) == std::vector<FlowId>{fa});
  e = net.next_event_time();
  REQUIRE(e);
  CHECK(*e == Approx(2.0));
  CHECK(net.advance_to(*e) == std::vector<FlowId>{fb});
  CHECK_FALSE(net.release(*h));     // it was admitted
  const auto again = net.hold(pa, 3.0);   // links idle again; the handle is free
  REQUIRE(again);
  CHECK(*again == *h);
  CHECK(net.release(*again));       // ended alone
  CHECK_THROWS_AS(net.release(99), std::out_of_range);
}
