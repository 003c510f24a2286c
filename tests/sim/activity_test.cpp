// A traced rank's activity (sim/activity.hpp): spans that start inside the
// last interval of their list extend it; any other span is appended, so the
// union the report takes is the spans' union.
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

TEST_CASE("Back-to-back and overlapping spans extend the last interval, others are appended", "[sim]") {
  Intervals v;
  add_interval(v, 0.0, 1.0);
  add_interval(v, 1.0, 2.0);   // touching: one interval
  add_interval(v, 1.5, 1.8);   // inside
  REQUIRE(v.size() == 1);
  CHECK(v[0] == std::pair(0.0, 2.0));
  add_interval(v, 5.0, 6.0);   // after a gap
  add_interval(v, 4.0, 5.5);   // starts before the last interval: appended as is
  add_interval(v, 5.5, 7.0);   // starts inside the last one
  REQUIRE(v.size() == 3);
  CHECK(v[1] == std::pair(5.0, 6.0));
  CHECK(v[2] == std::pair(4.0, 7.0));
}

TEST_CASE("A list built span by span has the union of its spans", "[sim]") {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int trial = 0; trial < 200; ++trial) {
    Intervals all, built;
    double t = 0;
    for (int k = 0; k < 50; ++k) {
      // Mostly in order, back to back or with gaps; sometimes a span that
      // started earlier (a region's exit ending after its inner ops).
      const double start = u(rng) < 0.2 ? t - u(rng) : t + (u(rng) < 0.5 ? 0.0 : u(rng));
      const double end = start + u(rng);
      all.emplace_back(start, end);
      add_interval(built, start, end);
      t = std::max(t, end);
    }
    CHECK(built.size() <= all.size());
    CHECK(union_length(built) == union_length(all));
  }
}
