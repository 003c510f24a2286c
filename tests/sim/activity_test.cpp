// A traced rank's activity (sim/activity.hpp): spans that start inside the
// open (last) interval of their list extend it; any other span closes it and
// opens the next, so the union the report takes is the spans' union.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>

#include "sim/activity.hpp"

using namespace megascope;
using namespace megascope::sim;

namespace {

// Total length of the union of intervals, by brute force over sorted copies.
double union_length(Intervals v) {
  std::sort(v.begin(), v.end());
  double t = 0, s = 0, e = -1;
  bool open = false;
  for (const auto& [a, b] : v) {
    if (open && a <= e) {
      e = std::max(e, b);
      continue;
    }
    if (open) t += e - s;
    s = a;
    e = b;
    open = true;
  }
  if (open) t += e - s;
  return t;
}

}  // namespace

constexpr std::uint8_t kCompute = kActivityCompute | static_cast<std::uint8_t>(OpLabel::mlp);
constexpr auto kTp = static_cast<std::uint8_t>(CommKind::tp);

TEST_CASE("Back-to-back and overlapping spans extend the open interval, others close it", "[sim]") {
  RankActivity a;
  a.add(kCompute, 0.0, 1.0);
  a.add(kCompute, 1.0, 2.0);   // touching: one interval
  a.add(kCompute, 1.5, 1.8);   // inside
  a.add(kTp, 2.0, 3.0);        // another list
  a.add(kActivityIgnored, 0.0, 9.0);
  CHECK(a.compute.empty());    // still open
  a.add(kCompute, 5.0, 6.0);   // after a gap: [0, 2] closes
  a.add(kCompute, 4.0, 5.5);   // starts before the open interval: closes it
  a.add(kCompute, 5.5, 7.0);   // starts inside the open one
  a.flush();
  REQUIRE(a.compute.size() == 3);
  CHECK(a.compute[0] == std::pair(0.0, 2.0));
  CHECK(a.compute[1] == std::pair(5.0, 6.0));
  CHECK(a.compute[2] == std::pair(4.0, 7.0));
  REQUIRE(a.comm[static_cast<std::size_t>(CommKind::tp)].size() == 1);
  CHECK(a.comm[static_cast<std::size_t>(CommKind::tp)][0] == std::pair(2.0, 3.0));
  CHECK(a.by_label[static_cast<std::size_t>(OpLabel::mlp)] == Approx(1.0 + 1.0 + 0.3 + 1.0 + 1.5 + 1.5));
  CHECK(a.any);
}

TEST_CASE("A list built span by span has the union of its spans", "[sim]") {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int trial = 0; trial < 200; ++trial) {
    Intervals all;
    RankActivity a;
    double t = 0;
    for (int k = 0; k < 50; ++k) {
      // Mostly in order, back to back or with gaps; sometimes a span that
      // started earlier (a region's exit ending after its inner ops).
      const double start = u(rng) < 0.2 ? t - u(rng) : t + (u(rng) < 0.5 ? 0.0 : u(rng));
      const double end = start + u(rng);
      all.emplace_back(start, end);
      a.add(kCompute, start, end);
      t = std::max(t, end);
    }
    a.flush();
    CHECK(a.compute.size() <= all.size());
    CHECK(union_length(a.compute) == union_length(all));
  }
}
