// Network: max-min fair sharing, event by event, on hand-computed cases.
//
// The test fabric: 4 devices on one NVSwitch, every link 100 bytes/s and no
// latency, so flows can be given any load on any link and the finish times
// worked out on paper.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "sim/network.hpp"

using namespace megascope;
using namespace megascope::sim;

namespace {

Topology fabric(double capacity = 100) {
  ClusterSpec c;
  c.name = "test";
  c.device.name = "test-device";
  c.node.devices_per_node = 4;
  c.node.scale_up = ScaleUpKind::nvswitch;
  c.node.scale_up_bandwidth_Bps = capacity;
  c.node.scale_up_latency_s = 0;
  c.scale_up_domain = 4;
  c.num_nodes = 1;
  return Topology::build(c, 4);
}

LinkId link(const Topology& t, const std::string& name) {
  for (std::size_t i = 0; i < t.links().size(); ++i)
    if (t.links()[i].name == name) return static_cast<LinkId>(i);
  FAIL("no link " << name);
  return 0;
}

FlowSpec flow(std::vector<std::pair<LinkId, double>> load, double bytes, double latency = 0) {
  FlowSpec f;
  f.load = std::move(load);
  f.payload_bytes = bytes;
  f.latency_s = latency;
  return f;
}

struct Finish {
  double t;
  std::vector<FlowId> ids;
};

// Runs the network until idle; every event with the flows it finished.
std::vector<Finish> run(Network& net) {
  std::vector<Finish> out;
  double last = 0;
  while (auto t = net.next_event_time()) {
    REQUIRE(*t >= last);
    last = *t;
    auto done = net.advance_to(*t);
    if (!done.empty()) out.push_back({*t, done});
  }
  return out;
}

}  // namespace

TEST_CASE("Two flows sharing one link get half of it each and finish together", "[sim]") {
  const Topology t = fabric();
  Network net(t);
  const LinkId x = link(t, "gpu0->nvswitch0");
  const FlowId a = net.start(flow({{x, 1}}, 100), 0);
  const FlowId b = net.start(flow({{x, 1}}, 100), 0);
  CHECK(net.active() == 2);
  const auto ev = run(net);
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].t == Approx(2.0));  // 100 bytes at 50 bytes/s
  CHECK(ev[0].ids == std::vector<FlowId>{a, b});
  CHECK(net.active() == 0);
  CHECK_FALSE(net.next_event_time());
}

TEST_CASE("A flow alone gets its most constrained link and the load factor scales its use", "[sim]") {
  const Topology t = fabric();
  Network net(t);
  // 2 bytes on x per payload byte: x allows 50 payload bytes/s; y allows 100.
  net.start(flow({{link(t, "gpu0->nvswitch0"), 2}, {link(t, "nvswitch0->gpu1"), 1}}, 100), 0);
  const auto ev = run(net);
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].t == Approx(2.0));
  CHECK(isolated_time(t, flow({{link(t, "gpu0->nvswitch0"), 2}}, 100, 0.5)) == Approx(2.5));
}

TEST_CASE("A flow bottlenecked elsewhere leaves its unused share to the other flow", "[sim]") {
  const Topology t = fabric();
  Network net(t);
  const LinkId x = link(t, "gpu0->nvswitch0");
  const LinkId y = link(t, "gpu2->nvswitch0");
  // A crosses x and puts 5 bytes per payload byte on y: A <= 20. B gets 80 of x.
  // A: 100 bytes at 20 -> t = 5. B: 480 bytes, 400 by t = 5, then 80 at 100 -> 5.8.
  const FlowId a = net.start(flow({{x, 1}, {y, 5}}, 100), 0);
  const FlowId b = net.start(flow({{x, 1}}, 480), 0);
  const auto ev = run(net);
  REQUIRE(ev.size() == 2);
  CHECK(ev[0].t == Approx(5.0));
  CHECK(ev[0].ids == std::vector<FlowId>{a});
  CHECK(ev[1].t == Approx(5.8));
  CHECK(ev[1].ids == std::vector<FlowId>{b});
}

TEST_CASE("A flow waits its latency without bandwidth and then shares the link", "[sim]") {
  const Topology t = fabric();
  Network net(t);
  const LinkId x = link(t, "gpu0->nvswitch0");
  // A: latency 1.5, 100 bytes. B: no latency, 200 bytes.
  // 0-1.5: B alone at 100 (150 sent). 1.5-2.5: both at 50, B done at 2.5.
  // A has 50 left at 2.5, alone at 100: done at 3.0.
  const FlowId a = net.start(flow({{x, 1}}, 100, 1.5), 0);
  const FlowId b = net.start(flow({{x, 1}}, 200), 0);
  REQUIRE(net.next_event_time());
  CHECK(*net.next_event_time() == Approx(0.0));  // B begins its transfer
  CHECK(net.advance_to(0).empty());
  CHECK(*net.next_event_time() == Approx(1.5));  // A begins its transfer
  CHECK(net.advance_to(1.5).empty());
  CHECK(*net.next_event_time() == Approx(2.5));
  CHECK(net.advance_to(*net.next_event_time()) == std::vector<FlowId>{b});
  CHECK(*net.next_event_time() == Approx(3.0));
  CHECK(net.advance_to(*net.next_event_time()) == std::vector<FlowId>{a});
  CHECK_FALSE(net.next_event_time());
}

TEST_CASE("Three flows over two links are water-filled level by level", "[sim]") {
  const Topology t = fabric();
  Network net(t);
  const LinkId x = link(t, "gpu0->nvswitch0");
  const LinkId y = link(t, "gpu1->nvswitch0");
  // x carries flows 1 and 2 at 90 bytes/s (load 100/90 per byte on a 100 link),
  // y carries flows 2 and 3 at 100. x saturates first at 45 each; flow 3 takes
  // the rest of y, 55. Flow 1 (45 bytes) ends at 1.0; then y is shared 50/50:
  // flow 2 has 45 left -> 1.9, flow 3 has 55 - 45 = 10 left at 1.9, alone -> 2.0.
  const double xf = 100.0 / 90.0;
  const FlowId f1 = net.start(flow({{x, xf}}, 45), 0);
  const FlowId f2 = net.start(flow({{x, xf}, {y, 1}}, 90), 0);
  const FlowId f3 = net.start(flow({{y, 1}}, 110), 0);
  const auto ev = run(net);
  REQUIRE(ev.size() == 3);
  CHECK(ev[0].t == Approx(1.0));
  CHECK(ev[0].ids == std::vector<FlowId>{f1});
  CHECK(ev[1].t == Approx(1.9));
  CHECK(ev[1].ids == std::vector<FlowId>{f2});
  CHECK(ev[2].t == Approx(2.0));
  CHECK(ev[2].ids == std::vector<FlowId>{f3});
}

TEST_CASE("A flow started later slows the running ones from its start on", "[sim]") {
  const Topology t = fabric();
  Network net(t);
  const LinkId x = link(t, "gpu0->nvswitch0");
  const FlowId a = net.start(flow({{x, 1}}, 100), 0);
  net.advance_to(0);
  CHECK(*net.next_event_time() == Approx(1.0));
  // At 0.5, A has 50 left; B joins: both at 50: A ends at 1.5, B (100) has 50
  // left then, alone: 2.0.
  net.advance_to(0.5);
  const FlowId b = net.start(flow({{x, 1}}, 100), 0.5);
  const auto ev = run(net);
  REQUIRE(ev.size() == 2);
  CHECK(ev[0].t == Approx(1.5));
  CHECK(ev[0].ids == std::vector<FlowId>{a});
  CHECK(ev[1].t == Approx(2.0));
  CHECK(ev[1].ids == std::vector<FlowId>{b});
}

TEST_CASE("Flows on disjoint links do not slow each other", "[sim]") {
  const Topology t = fabric();
  Network net(t);
  net.start(flow({{link(t, "gpu0->nvswitch0"), 1}}, 100), 0);
  net.start(flow({{link(t, "gpu1->nvswitch0"), 1}}, 200), 0);
  const auto ev = run(net);
  REQUIRE(ev.size() == 2);
  CHECK(ev[0].t == Approx(1.0));
  CHECK(ev[1].t == Approx(2.0));
}

TEST_CASE("A flow with no links or no bytes finishes when its latency ends", "[sim]") {
  const Topology t = fabric();
  Network net(t);
  const FlowId a = net.start(flow({}, 1e9, 0.25), 1.0);
  const FlowId b = net.start(flow({{link(t, "gpu0->nvswitch0"), 1}}, 0, 0.5), 1.0);
  const auto ev = run(net);
  REQUIRE(ev.size() == 2);
  CHECK(ev[0].t == Approx(1.25));
  CHECK(ev[0].ids == std::vector<FlowId>{a});
  CHECK(ev[1].t == Approx(1.5));
  CHECK(ev[1].ids == std::vector<FlowId>{b});
}

TEST_CASE("Event times never go back before the network clock", "[sim]") {
  const Topology t = fabric();
  Network net(t);
  net.advance_to(10.0);
  net.start(flow({{link(t, "gpu0->nvswitch0"), 1}}, 100), 3.0);  // started "in the past": runs from 10
  REQUIRE(net.next_event_time());
  CHECK(*net.next_event_time() >= 10.0);
  const auto ev = run(net);
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].t == Approx(11.0));
  CHECK(net.advance_to(5.0).empty());
  CHECK_FALSE(net.next_event_time());
}

TEST_CASE("The same flows started twice give the same events in the same order", "[sim]") {
  auto once = [] {
    const Topology t = fabric();
    Network net(t);
    std::vector<std::pair<double, FlowId>> log;
    for (int i = 0; i < 40; ++i) {
      const LinkId l1 = static_cast<LinkId>(i % 8), l2 = static_cast<LinkId>((i * 3 + 1) % 8);
      net.start(flow({{l1, 1}, {l2, 0.5 + (i % 3)}}, 10.0 + i, 0.01 * (i % 5)), 0.0);
    }
    while (auto t2 = net.next_event_time())
      for (FlowId id : net.advance_to(*t2)) log.emplace_back(*t2, id);
    return log;
  };
  const auto a = once(), b = once();
  REQUIRE(a.size() == 40);
  CHECK(a == b);
}
