// Pipeline schedules as data (core/schedule): every schedule covers its
// passes exactly once, respects the dependencies (run_ideal never deadlocks
// and its timeline keeps every rule), and tiny cases match orders written out
// by hand from Megatron-LM, the zero-bubble reference and DualPipe.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "core/result.hpp"
#include "core/schedule/schedule.hpp"
#include "core/schedule/timeline.hpp"

using namespace megascope;

namespace {

struct Config {
  Schedule s;
  int pp, vpp, m;
};

std::string name(const Config& c) {
  return std::string(to_string(c.s)) + " pp=" + std::to_string(c.pp) + " vpp=" + std::to_string(c.vpp) +
         " m=" + std::to_string(c.m);
}

// Small cases of every schedule, each within its preconditions.
std::vector<Config> grid() {
  std::vector<Config> out;
  for (Schedule s : {Schedule::gpipe, Schedule::one_f_one_b, Schedule::zb_h1, Schedule::zb_h2})
    for (int pp = 1; pp <= 6; ++pp)
      for (int m = 1; m <= 2 * pp + 3; ++m) out.push_back({s, pp, 1, m});
  for (int pp = 2; pp <= 5; ++pp)
    for (int vpp = 2; vpp <= 4; ++vpp)
      for (int k = 1; k <= 3; ++k) out.push_back({Schedule::interleaved, pp, vpp, k * pp});
  for (int pp = 1; pp <= 5; ++pp)
    for (int m = 1; m <= 3 * pp + 1; ++m) out.push_back({Schedule::zb_v, pp, 2, m});
  for (int pp = 1; pp <= 5; ++pp)
    for (int m = 2 * pp; m <= 3 * pp + 2; ++m) out.push_back({Schedule::dualpipev, pp, 2, m});
  for (int pp = 2; pp <= 8; pp += 2)
    for (int m = 2 * pp; m <= 3 * pp + 2; m += 2) out.push_back({Schedule::dualpipe, pp, 1, m});
  return out;
}

// Compact notation for golden orders: "F0.1" is F of micro-batch 0 on chunk
// 1, a leading '&' marks a paired step, so "B2.0 &W2.0" is an unsplit
// backward and "F3.0 &B1.1" an overlapped F&B.
RankSchedule parse(const std::string& text) {
  RankSchedule out;
  std::size_t i = 0;
  while (i < text.size()) {
    if (text[i] == ' ') {
      ++i;
      continue;
    }
    ScheduleStep st;
    if (text[i] == '&') {
      st.paired = true;
      ++i;
    }
    st.pass = text[i] == 'F' ? Pass::F : text[i] == 'B' ? Pass::B : Pass::W;
    std::size_t used = 0;
    st.microbatch = std::stoi(text.substr(i + 1), &used);
    i += 1 + used + 1;   // the '.'
    st.chunk = std::stoi(text.substr(i), &used);
    i += used;
    out.push_back(st);
  }
  return out;
}

std::string show(const RankSchedule& rs) {
  std::string out;
  for (const ScheduleStep& st : rs) {
    if (!out.empty()) out += ' ';
    if (st.paired) out += '&';
    out += st.pass == Pass::F ? 'F' : st.pass == Pass::B ? 'B' : 'W';
    out += std::to_string(st.microbatch) + "." + std::to_string(st.chunk);
  }
  return out;
}

void check_golden(Schedule s, int pp, int vpp, int m, const std::vector<std::string>& expected, int group = 0) {
  const auto got = make_schedule(s, pp, vpp, m, group);
  REQUIRE(got.size() == expected.size());
  for (std::size_t r = 0; r < got.size(); ++r) {
    INFO("rank " << r);
    CHECK(show(got[r]) == show(parse(expected[r])));
  }
}

}  // namespace

TEST_CASE("Every schedule runs each F, B and W of every micro-batch on each of its chunks exactly once per rank",
          "[core]") {
  for (const Config& c : grid()) {
    INFO(name(c));
    const auto sched = make_schedule(c.s, c.pp, c.vpp, c.m);
    REQUIRE(static_cast<int>(sched.size()) == c.pp);
    const int chunks = schedule_chunks(c.s, c.vpp);
    for (int r = 0; r < c.pp; ++r) {
      INFO("rank " << r);
      std::map<std::tuple<int, int, int>, int> seen;   // (pass, mb, chunk) -> position
      for (std::size_t k = 0; k < sched[static_cast<std::size_t>(r)].size(); ++k) {
        const ScheduleStep& st = sched[static_cast<std::size_t>(r)][k];
        REQUIRE(st.microbatch >= 0);
        REQUIRE(st.microbatch < c.m);
        REQUIRE(st.chunk >= 0);
        REQUIRE(st.chunk < chunks);
        // DualPipe: micro-batches [0, m/2) run on chunk 0 (direction 0), the rest on chunk 1.
        if (c.s == Schedule::dualpipe) CHECK(st.chunk == (st.microbatch >= c.m / 2 ? 1 : 0));
        const bool fresh = seen.emplace(std::tuple{static_cast<int>(st.pass), st.microbatch, st.chunk},
                                        static_cast<int>(k)).second;
        CHECK(fresh);
      }
      const int per_mb_chunks = c.s == Schedule::dualpipe ? 1 : chunks;
      CHECK(static_cast<int>(seen.size()) == 3 * c.m * per_mb_chunks);
      // On its own rank a micro-batch-chunk runs F, then B, then W.
      for (const auto& [key, pos] : seen) {
        const auto [pass, mb, chunk] = key;
        if (pass == static_cast<int>(Pass::B)) CHECK(seen.at({static_cast<int>(Pass::F), mb, chunk}) < pos);
        if (pass == static_cast<int>(Pass::W)) CHECK(seen.at({static_cast<int>(Pass::B), mb, chunk}) < pos);
      }
    }
  }
}

TEST_CASE("Paired steps are only unsplit backwards (a W with its own B) and DualPipe's overlapped F and B", "[core]") {
  for (const Config& c : grid()) {
    INFO(name(c));
    const auto sched = make_schedule(c.s, c.pp, c.vpp, c.m);
    const bool dual = c.s == Schedule::dualpipe || c.s == Schedule::dualpipev;
    for (const RankSchedule& rs : sched) {
      for (std::size_t k = 0; k < rs.size(); ++k) {
        if (!rs[k].paired) continue;
        REQUIRE(k > 0);
        const ScheduleStep& prev = rs[k - 1];
        const bool unsplit = rs[k].pass == Pass::W && prev.pass == Pass::B && prev.microbatch == rs[k].microbatch &&
                             prev.chunk == rs[k].chunk;
        const bool f_and_b = dual && rs[k].pass == Pass::B && prev.pass == Pass::F;
        CHECK((unsplit || f_and_b));
      }
    }
    // The zero-bubble schedules split every backward except where their
    // reference runs it unsplit (DualPipe's non-zb backwards).
    if (c.s == Schedule::zb_h1 || c.s == Schedule::zb_h2 || c.s == Schedule::zb_v)
      for (const RankSchedule& rs : sched)
        for (const ScheduleStep& st : rs) CHECK_FALSE(st.paired);
    if (c.s == Schedule::gpipe || c.s == Schedule::one_f_one_b || c.s == Schedule::interleaved)
      for (const RankSchedule& rs : sched)
        for (const ScheduleStep& st : rs) CHECK(st.paired == (st.pass == Pass::W));
  }
}

TEST_CASE("run_ideal finishes every schedule of the grid and its timeline keeps every dependency and rank order",
          "[core]") {
  const IdealTimes t{1.0, 1.7, 0.6, 2.1};
  for (const Config& c : grid()) {
    INFO(name(c));
    const auto sched = make_schedule(c.s, c.pp, c.vpp, c.m);
    const auto tl = schedule_detail::ideal_timeline(sched, c.s, c.pp, c.vpp, c.m, t);
    // Where each (pass, mb, virtual stage) ran.
    std::map<std::tuple<int, int, int>, schedule_detail::StepTiming> when;
    for (int r = 0; r < c.pp; ++r)
      for (std::size_t k = 0; k < sched[static_cast<std::size_t>(r)].size(); ++k) {
        const ScheduleStep& st = sched[static_cast<std::size_t>(r)][k];
        when[{static_cast<int>(st.pass), st.microbatch, virtual_stage(c.s, c.pp, r, st.chunk)}] =
            tl.steps[static_cast<std::size_t>(r)][k];
      }
    const int stages = c.s == Schedule::dualpipe ? c.pp : c.pp * schedule_chunks(c.s, c.vpp);
    double makespan = 0;
    for (int r = 0; r < c.pp; ++r) {
      const RankSchedule& rs = sched[static_cast<std::size_t>(r)];
      const auto& times = tl.steps[static_cast<std::size_t>(r)];
      for (std::size_t k = 0; k < rs.size(); ++k) {
        const ScheduleStep& st = rs[k];
        const int vs = virtual_stage(c.s, c.pp, r, st.chunk);
        const double start = times[k].start;
        CHECK(times[k].end > start);
        if (k > 0) {
          if (st.paired) {   // one unit with the previous step
            CHECK(start == times[k - 1].start);
            CHECK(times[k].end == times[k - 1].end);
          } else {
            CHECK(start >= times[k - 1].end);
          }
        }
        auto after = [&](Pass p, int stage) {
          const auto& dep = when.at({static_cast<int>(p), st.microbatch, stage});
          const bool same_unit = st.paired && p == Pass::B && st.pass == Pass::W;
          CHECK((same_unit || start >= dep.end));
        };
        if (st.pass == Pass::F && vs > 0) after(Pass::F, vs - 1);
        if (st.pass == Pass::B && vs < stages - 1) after(Pass::B, vs + 1);
        if (st.pass == Pass::B) after(Pass::F, vs);
        if (st.pass == Pass::W) after(Pass::B, vs);
        makespan = std::max(makespan, times[k].end);
      }
    }
    CHECK(tl.result.makespan == makespan);
    for (double busy : tl.result.busy) CHECK(busy <= makespan);
    CHECK(tl.result.bubble_fraction >= 0);
  }
}

TEST_CASE("Paired F and B take the overlapped time and the rank's busy time counts the pair once", "[core]") {
  for (Schedule s : {Schedule::dualpipe, Schedule::dualpipev}) {
    const int pp = 4, m = 12;
    const auto sched = make_schedule(s, pp, 2, m);
    const IdealTimes t{1.0, 2.0, 0.5, 2.25};
    const IdealResult res = run_ideal(sched, s, pp, 2, m, t);
    for (int r = 0; r < pp; ++r) {
      const RankSchedule& rs = sched[static_cast<std::size_t>(r)];
      double expected = 0;
      int pairs = 0;
      for (std::size_t k = 0; k < rs.size(); ++k) {
        expected += rs[k].pass == Pass::F ? t.f : rs[k].pass == Pass::B ? t.b : t.w;
        if (rs[k].paired && rs[k].pass == Pass::B) ++pairs;
      }
      CHECK(pairs > 0);
      CHECK(res.busy[static_cast<std::size_t>(r)] == Approx(expected - pairs * (t.f + t.b - t.fb_overlapped)));
    }
  }
}

TEST_CASE("1F1B with pp 2 and 3 micro-batches is F0 F1 B0 F2 B1 B2 on rank 0 and F B F B F B on rank 1", "[core]") {
  check_golden(Schedule::one_f_one_b, 2, 1, 3,
               {"F0.0 F1.0 B0.0 &W0.0 F2.0 B1.0 &W1.0 B2.0 &W2.0",
                "F0.0 B0.0 &W0.0 F1.0 B1.0 &W1.0 F2.0 B2.0 &W2.0"});
}

TEST_CASE("GPipe runs every forward then the backwards in reverse micro-batch order", "[core]") {
  check_golden(Schedule::gpipe, 2, 1, 3,
               {"F0.0 F1.0 F2.0 B2.0 &W2.0 B1.0 &W1.0 B0.0 &W0.0",
                "F0.0 F1.0 F2.0 B2.0 &W2.0 B1.0 &W1.0 B0.0 &W0.0"});
}

TEST_CASE("Interleaved 1F1B with pp 2, vpp 2 and 4 micro-batches follows Megatron's chunk order and warm-up", "[core]") {
  // Forward k: chunk (k / 2) % 2, micro-batch (k / 4) * 2 + k % 2; backward k:
  // the same with the chunk reversed. Warm-up 2 (pp - r - 1) + (vpp - 1) pp:
  // 4 on rank 0, 2 on rank 1.
  check_golden(Schedule::interleaved, 2, 2, 4,
               {"F0.0 F1.0 F0.1 F1.1 "
                "F2.0 B0.1 &W0.1 F3.0 B1.1 &W1.1 F2.1 B0.0 &W0.0 F3.1 B1.0 &W1.0 "
                "B2.1 &W2.1 B3.1 &W3.1 B2.0 &W2.0 B3.0 &W3.0",
                "F0.0 F1.0 "
                "F0.1 B0.1 &W0.1 F1.1 B1.1 &W1.1 F2.0 B0.0 &W0.0 F3.0 B1.0 &W1.0 F2.1 B2.1 &W2.1 F3.1 B3.1 &W3.1 "
                "B2.0 &W2.0 B3.0 &W3.0"});
}

TEST_CASE("Interleaved 1F1B with a micro-batch group of 3 (pp 2, vpp 2, 6 micro-batches) follows Megatron-Core's "
          "schedule table", "[core]") {
  // get_schedule_table(6, 2, 3): micro-batches 0-2 on chunk 0, the same on
  // chunk 1, then 3-5 on chunk 0 and chunk 1. Warm-up 2 (pp - r - 1) +
  // (vpp - 1) g: 5 on rank 0, 3 on rank 1.
  check_golden(Schedule::interleaved, 2, 2, 6,
               {"F0.0 F1.0 F2.0 F0.1 F1.1 "
                "F2.1 B0.1 &W0.1 F3.0 B1.1 &W1.1 F4.0 B2.1 &W2.1 F5.0 B0.0 &W0.0 F3.1 B1.0 &W1.0 F4.1 B2.0 &W2.0 "
                "F5.1 B3.1 &W3.1 "
                "B4.1 &W4.1 B5.1 &W5.1 B3.0 &W3.0 B4.0 &W4.0 B5.0 &W5.0",
                "F0.0 F1.0 F2.0 "
                "F0.1 B0.1 &W0.1 F1.1 B1.1 &W1.1 F2.1 B2.1 &W2.1 F3.0 B0.0 &W0.0 F4.0 B1.0 &W1.0 F5.0 B2.0 &W2.0 "
                "F3.1 B3.1 &W3.1 F4.1 B4.1 &W4.1 F5.1 B5.1 &W5.1 "
                "B3.0 &W3.0 B4.0 &W4.0 B5.0 &W5.0"},
               3);
  // The default group is pp: the same order as naming it.
  CHECK(make_schedule(Schedule::interleaved, 4, 3, 12) == make_schedule(Schedule::interleaved, 4, 3, 12, 4));
}

TEST_CASE("ZB-H1 with pp 3 and 4 micro-batches defers rank r's first r weight passes to the end", "[core]") {
  check_golden(Schedule::zb_h1, 3, 1, 4,
               {"F0.0 F1.0 F2.0 B0.0 W0.0 F3.0 B1.0 W1.0 B2.0 W2.0 B3.0 W3.0",
                "F0.0 F1.0 B0.0 F2.0 B1.0 W0.0 F3.0 B2.0 W1.0 B3.0 W2.0 W3.0",
                "F0.0 B0.0 F1.0 B1.0 F2.0 B2.0 W0.0 F3.0 B3.0 W1.0 W2.0 W3.0"});
}

TEST_CASE("ZB-H2 with pp 3 and 5 micro-batches: 2(p - r) - 1 warm-up forwards, then B before F before W, at most "
          "2r + 1 weight passes pending", "[core]") {
  // Worked by hand from the rule in core/schedule/zb_h2.cpp: rank 0 holds
  // 5 forwards and then runs each W right after its B; rank 2 (the last)
  // defers every W to the tail.
  check_golden(Schedule::zb_h2, 3, 1, 5,
               {"F0.0 F1.0 F2.0 F3.0 F4.0 B0.0 W0.0 B1.0 W1.0 B2.0 W2.0 B3.0 W3.0 B4.0 W4.0",
                "F0.0 F1.0 F2.0 B0.0 F3.0 B1.0 F4.0 B2.0 W0.0 B3.0 W1.0 B4.0 W2.0 W3.0 W4.0",
                "F0.0 B0.0 F1.0 B1.0 F2.0 B2.0 F3.0 B3.0 F4.0 B4.0 W0.0 W1.0 W2.0 W3.0 W4.0"});
}

TEST_CASE("ZB-V with pp 2 and 4 micro-batches follows the handcrafted V order of the zero-bubble reference", "[core]") {
  // Rank r: 2(pp - r) - 1 F of chunk 0; r x (F chunk 1, F chunk 0); pp - r x
  // (F, B, W of chunk 1); steady (F B W chunk 0, F B W chunk 1); cool-down
  // r x (B chunk 0, B chunk 1) with W deferred, pp - r x (B chunk 0, oldest W
  // chunk 0), then the deferred W of chunk 1 and of chunk 0.
  check_golden(Schedule::zb_v, 2, 2, 4,
               {"F0.0 F1.0 F2.0 F0.1 B0.1 W0.1 F1.1 B1.1 W1.1 "
                "F3.0 B0.0 W0.0 F2.1 B2.1 W2.1 B1.0 W1.0 F3.1 B3.1 W3.1 "
                "B2.0 W2.0 B3.0 W3.0",
                "F0.0 F0.1 F1.0 F1.1 B0.1 W0.1 "
                "F2.0 B0.0 W0.0 F2.1 B1.1 W1.1 F3.0 B1.0 W1.0 F3.1 B2.1 W2.1 "
                "B2.0 B3.1 B3.0 W2.0 W3.1 W3.0"});
}

TEST_CASE("DualPipeV with pp 2 and 4 micro-batches runs DeepSeek's eight-part program with overlapped F and B",
          "[core]") {
  // Rank 0 (i = 0 of N = 2): 2 F0; (F0, F1); (B1 zb, W, F1); 1 x (F0&B1,
  // F1&B0); (B1, F1&B0); (B1, B0 zb); (W, B0 zb); W. Rank 1 (innermost): no
  // part 1; 2 x (F0, F1); 2 x main with the first F0, B1 not overlapped;
  // (B1, B0), (B1 zb, B0 zb); 2 W.
  check_golden(Schedule::dualpipev, 2, 2, 4,
               {"F0.0 F1.0 F2.0 F0.1 B0.1 W0.1 F1.1 "
                "F3.0 &B1.1 &W1.1 F2.1 &B0.0 &W0.0 "
                "B2.1 &W2.1 F3.1 &B1.0 &W1.0 "
                "B3.1 &W3.1 B2.0 W2.0 B3.0 W3.0",
                "F0.0 F0.1 F1.0 F1.1 "
                "F2.0 B0.1 &W0.1 F2.1 &B0.0 &W0.0 F3.0 &B1.1 &W1.1 F3.1 &B1.0 &W1.0 "
                "B2.1 &W2.1 B2.0 &W2.0 B3.1 B3.0 W3.1 W3.0"});
}

TEST_CASE("DualPipe with pp 2 and 4 micro-batches sends micro-batches 0 and 1 down from rank 0 and 2 and 3 up from "
          "rank 1", "[core]") {
  // Both ranks are innermost (N = 1, i = 0). Rank 0: phase 0 = direction 0
  // (chunk 0, micro-batches 0-1); rank 1: phase 0 = direction 1 (chunk 1,
  // micro-batches 2-3).
  check_golden(Schedule::dualpipe, 2, 1, 4,
               {"F0.0 F2.1 F1.0 B2.1 &W2.1 F3.1 &B0.0 &W0.0 B3.1 &W3.1 B1.0 W1.0",
                "F2.1 F0.0 F3.1 B0.0 &W0.0 F1.0 &B2.1 &W2.1 B1.0 &W1.0 B3.1 W3.1"});
}

TEST_CASE("run_ideal throws InternalError naming the waiting steps when a schedule deadlocks", "[core]") {
  // Rank 0 wants B of micro-batch 0 before running its forward.
  std::vector<RankSchedule> bad = {
      {{Pass::B, 0, 0, false}, {Pass::F, 0, 0, false}, {Pass::W, 0, 0, false}},
      {{Pass::F, 0, 0, false}, {Pass::B, 0, 0, false}, {Pass::W, 0, 0, false}}};
  try {
    (void)run_ideal(bad, Schedule::one_f_one_b, 2, 1, 1);
    FAIL("no exception");
  } catch (const InternalError& e) {
    const std::string what = e.what();
    CHECK(what.find("deadlock") != std::string::npos);
    CHECK(what.find("rank 0 step 0 (B mb 0 chunk 0)") != std::string::npos);
  }
}

TEST_CASE("run_ideal rejects a schedule that repeats a pass or leaves out one that another depends on", "[core]") {
  std::vector<RankSchedule> twice = {{{Pass::F, 0, 0, false}, {Pass::F, 0, 0, false}}};
  CHECK_THROWS_AS(run_ideal(twice, Schedule::gpipe, 1, 1, 1), InternalError);
  std::vector<RankSchedule> missing = {{{Pass::F, 0, 0, false}}, {{Pass::B, 0, 0, false}}};
  CHECK_THROWS_AS(run_ideal(missing, Schedule::gpipe, 2, 1, 1), InternalError);
  std::vector<RankSchedule> outside = {{{Pass::F, 3, 0, false}}};
  CHECK_THROWS_AS(run_ideal(outside, Schedule::gpipe, 1, 1, 1), InternalError);
}

TEST_CASE("make_schedule refuses what the schedules cannot run with InternalError", "[core]") {
  CHECK_THROWS_AS(make_schedule(Schedule::interleaved, 4, 2, 6), InternalError);   // m % pp != 0
  CHECK_THROWS_AS(make_schedule(Schedule::interleaved, 4, 2, 8, 3), InternalError);   // group < pp
  CHECK_THROWS_AS(make_schedule(Schedule::interleaved, 4, 2, 8, 9), InternalError);   // group > m
  CHECK_THROWS_AS(make_schedule(Schedule::interleaved, 4, 2, 10, 8), InternalError);  // last group of 2 < pp

  CHECK_THROWS_AS(make_schedule(Schedule::dualpipe, 3, 1, 12), InternalError);     // odd pp
  CHECK_THROWS_AS(make_schedule(Schedule::dualpipe, 4, 1, 9), InternalError);      // odd m
  CHECK_THROWS_AS(make_schedule(Schedule::dualpipe, 4, 1, 6), InternalError);      // m < 2 pp
  CHECK_THROWS_AS(make_schedule(Schedule::dualpipev, 4, 2, 7), InternalError);     // m < 2 pp
  CHECK_THROWS_AS(make_schedule(Schedule::one_f_one_b, 0, 1, 4), InternalError);
  CHECK_THROWS_AS(make_schedule(Schedule::gpipe, 2, 1, 0), InternalError);
}
