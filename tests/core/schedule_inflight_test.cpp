// The schedules' own in-flight counts against the closed forms the memory
// accounting uses (core/accounting/inflight.hpp), and their chunk placement
// against the layer layout of validate_setup.
//
// inflight_microbatches gives, per rank and chunk, the micro-batches whose
// activations the chunk holds at the rank's peak (plus, for ZB-H1, those past
// B waiting for W). Walking a rank's order (+1 at F, -1 at B, and W pending
// from B to W), the peak of the rank's total must equal the sum over its
// chunks, and some step of the walk must reach exactly that per-chunk split
// with that many W pending. Several splits can reach the peak (ZB-V alternates
// between 2p-r, r and 2p-r-1, r+1); inflight_microbatches names one of them.
#include <catch2/catch.hpp>

#include <algorithm>
#include <fmt/format.h>
#include <string>
#include <vector>

#include "core/accounting/inflight.hpp"
#include "core/schedule/schedule.hpp"
#include "models.hpp"
#include "support.hpp"

using namespace megascope;
using namespace megascope::test;

namespace {

struct Case {
  Schedule s;
  int pp, vpp, m;
  int group = 0;   // interleaved: the micro-batch group (0: pp)
};

// 288 layers split evenly over every pp x chunks used below.
const ModelSpec& model() {
  static const ModelSpec m = gpt(288, 1024, 16);
  return m;
}

Setup setup_for(const Case& c) {
  std::string plan = fmt::format("pp={},schedule={}", c.pp, to_string(c.s));
  if (c.s == Schedule::interleaved) plan += fmt::format(",vpp={}", c.vpp);
  if (c.group > 0) plan += fmt::format(",microbatch_group={}", c.group);
  return make_setup(model(), "dgx-a100", plan, c.m, c.pp);   // tp = dp = 1, mbs = 1: m micro-batches
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (Schedule s : {Schedule::gpipe, Schedule::one_f_one_b, Schedule::zb_h1, Schedule::zb_h2})
    for (int pp : {1, 2, 3, 4, 6, 8}) {
      if ((s == Schedule::zb_h1 || s == Schedule::zb_h2) && pp < 2) continue;
      for (int m = 1; m <= 3 * pp; ++m) out.push_back({s, pp, 1, m});
    }
  for (int pp : {2, 3, 4, 6, 8})
    for (int vpp : {2, 3, 4})
      for (int k = 1; k <= 4; ++k) out.push_back({Schedule::interleaved, pp, vpp, k * pp});
  // Micro-batch groups other than pp (Megatron-Core's microbatch_group_size_per_vp_stage).
  for (int pp : {2, 3, 4})
    for (int vpp : {2, 3})
      for (int g = pp + 1; g <= 2 * pp + 1; ++g)
        for (int m = g; m <= 3 * g; ++m)
          if (m % g == 0 || m % g >= pp) out.push_back({Schedule::interleaved, pp, vpp, m, g});
  for (int pp : {2, 3, 4, 6, 8}) {
    for (int m = 1; m <= 3 * pp; ++m) out.push_back({Schedule::zb_v, pp, 2, m});
    for (int m = 2 * pp; m <= 4 * pp; ++m) out.push_back({Schedule::dualpipev, pp, 2, m});
  }
  for (int pp : {2, 4, 6, 8})
    for (int m = 2 * pp; m <= 4 * pp; m += 2) out.push_back({Schedule::dualpipe, pp, 1, m});
  return out;
}

std::string label(const Case& c) {
  return fmt::format("{} pp={} vpp={} m={} group={}", to_string(c.s), c.pp, c.vpp, c.m, c.group);
}

}  // namespace

TEST_CASE("Each chunk of make_schedule sits on the virtual stage where validate_setup puts its layers", "[core]") {
  for (const Case& c : cases()) {
    INFO(label(c));
    const Setup s = setup_for(c);
    for (int r = 0; r < c.pp; ++r) {
      const auto& chunks = s.chunks[static_cast<std::size_t>(r)];
      REQUIRE(static_cast<int>(chunks.size()) == schedule_chunks(c.s, s.vpp));
      for (int k = 0; k < static_cast<int>(chunks.size()); ++k)
        CHECK(chunks[static_cast<std::size_t>(k)].virtual_stage == virtual_stage(c.s, c.pp, r, k));
    }
  }
}

TEST_CASE("run_ideal's peak in-flight micro-batch-chunks per rank equal inflight_microbatches summed over chunks "
          "for every schedule", "[core]") {
  for (const Case& c : cases()) {
    INFO(label(c));
    const Setup s = setup_for(c);
    const auto closed = inflight_microbatches(s);
    const auto sched = make_schedule(c.s, c.pp, s.vpp, c.m, s.microbatch_group);
    const IdealResult res = run_ideal(sched, c.s, c.pp, s.vpp, c.m);
    for (int r = 0; r < c.pp; ++r) {
      INFO("rank " << r);
      int full = 0;
      for (const ChunkInflight& ci : closed[static_cast<std::size_t>(r)]) full += ci.full;
      CHECK(res.peak_inflight[static_cast<std::size_t>(r)] == full);
    }
  }
}

TEST_CASE("Some step of every schedule reaches exactly inflight_microbatches' per-chunk split and pending weight "
          "passes at the rank's peak", "[core]") {
  for (const Case& c : cases()) {
    INFO(label(c));
    const Setup s = setup_for(c);
    const auto closed = inflight_microbatches(s);
    const auto sched = make_schedule(c.s, c.pp, s.vpp, c.m, s.microbatch_group);
    const int chunks = schedule_chunks(c.s, s.vpp);
    for (int r = 0; r < c.pp; ++r) {
      INFO("rank " << r);
      const auto& want = closed[static_cast<std::size_t>(r)];
      int want_w = 0;
      for (const ChunkInflight& ci : want) want_w += ci.weight_grad_only;
      std::vector<int> full(static_cast<std::size_t>(chunks), 0);
      int pending_w = 0;
      bool reached = false;
      for (const ScheduleStep& st : sched[static_cast<std::size_t>(r)]) {
        const auto k = static_cast<std::size_t>(st.chunk);
        if (st.pass == Pass::F) ++full[k];
        if (st.pass == Pass::B) {
          --full[k];
          ++pending_w;
        }
        if (st.pass == Pass::W) --pending_w;
        bool same = pending_w == want_w;
        for (std::size_t j = 0; j < full.size(); ++j) same = same && full[j] == want[j].full;
        reached = reached || same;
      }
      CHECK(reached);
    }
  }
}

TEST_CASE("ZB-V's chunk 0 alone holds 2p - r micro-batches at times, one more than inflight_microbatches' split, "
          "while the rank total stays 2p", "[core]") {
  // The two chunks peak at different steps (after F of chunk 0 the split is
  // 2p-r, r; after F of chunk 1 it is 2p-r-1, r+1); the memory accounting
  // uses the second. Pinned so that a change to either side shows.
  for (int p : {2, 3, 4, 6, 8}) {
    const int m = 3 * p;
    const auto sched = make_schedule(Schedule::zb_v, p, 2, m);
    const auto closed = inflight_microbatches(setup_for({Schedule::zb_v, p, 2, m}));
    for (int r = 0; r < p; ++r) {
      INFO("p=" << p << " rank " << r);
      int now[2] = {0, 0}, peak[2] = {0, 0};
      for (const ScheduleStep& st : sched[static_cast<std::size_t>(r)]) {
        if (st.pass == Pass::F) peak[st.chunk] = std::max(peak[st.chunk], ++now[st.chunk]);
        if (st.pass == Pass::B) --now[st.chunk];
      }
      CHECK(peak[0] == 2 * p - r);
      CHECK(peak[1] == r + 1);
      CHECK(closed[static_cast<std::size_t>(r)][0].full == 2 * p - r - 1);
      CHECK(closed[static_cast<std::size_t>(r)][1].full == r + 1);
    }
  }
}
