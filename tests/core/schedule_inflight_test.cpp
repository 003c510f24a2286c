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

#include "core/accounting/activations.hpp"
#include "core/accounting/inflight.hpp"
#include "core/accounting/memory.hpp"
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

TEST_CASE("inflight_candidates: maximal per-chunk counts along each rank's order, whose largest total is the closed "
          "form's", "[core]") {
  for (const Case& c : cases()) {
    if (schedule_chunks(c.s, c.vpp) < 2) continue;
    INFO(label(c));
    const Setup s = setup_for(c);
    const auto closed = inflight_microbatches(s);
    const auto order = make_schedule(c.s, c.pp, c.vpp, c.m, c.group);
    for (int r = 0; r < c.pp; ++r) {
      const auto cands = inflight_candidates(c.s, c.pp, c.vpp, c.m, r, c.group);
      // Every step of the order (after each pass) is covered by some candidate,
      // and every candidate is a step of the order.
      std::vector<int> now(static_cast<std::size_t>(schedule_chunks(c.s, c.vpp)), 0);
      std::vector<std::vector<int>> steps;
      for (const ScheduleStep& st : order[static_cast<std::size_t>(r)]) {
        now[static_cast<std::size_t>(st.chunk)] += st.pass == Pass::F ? 1 : st.pass == Pass::B ? -1 : 0;
        steps.push_back(now);
      }
      for (const auto& x : steps) {
        bool covered = false;
        for (const auto& k : cands) {
          bool all = true;
          for (std::size_t i = 0; i < k.size(); ++i) all = all && k[i] >= x[i];
          covered = covered || all;
        }
        CHECK(covered);
      }
      for (const auto& k : cands) CHECK(std::find(steps.begin(), steps.end(), k) != steps.end());
      REQUIRE_FALSE(cands.empty());
      int most = 0, want = 0;
      for (const auto& v : cands) {
        int total = 0;
        for (int x : v) total += x;
        most = std::max(most, total);
      }
      for (const ChunkInflight& in : closed[static_cast<std::size_t>(r)]) want += in.full;
      CHECK(most == want);
      // None covers another.
      for (std::size_t i = 0; i < cands.size(); ++i)
        for (std::size_t j = 0; j < cands.size(); ++j) {
          if (i == j) continue;
          bool below = true;
          for (std::size_t k = 0; k < cands[i].size(); ++k) below = below && cands[i][k] <= cands[j][k];
          CHECK_FALSE(below);
        }
    }
  }
}

TEST_CASE("A rank whose chunks keep different bytes is charged at the heaviest step of its order", "[core]") {
  // pp 2, vpp 2, m 6, micro-batch group 3: rank 0 runs F of micro-batches
  // 0-2 on chunk 0, then 0-2 on chunk 1, then 3-5 on chunk 0 before the
  // backwards of chunk 0 return, so chunk 0 alone holds more than the closed
  // form's split at times. With chunk 0 four times as heavy as chunk 1 that
  // step is the peak.
  const ModelSpec m = gpt(10, 1024, 16);
  const Setup s =
      make_setup(m, "dgx-a100", "pp=2,schedule=interleaved,microbatch_group=3,layout=Etttt|tttt|t|tL", 6, 2);
  const MemoryReport rep = memory_report(s);
  const double layer = layer_activations(s, 0).stored;
  const EdgeActivations edges = edge_activations(s);
  // Walk rank 0's order: chunk 0 holds 4 layers and the embedding's inputs, chunk 1 one layer.
  const std::vector<double> per_mb = {4 * layer + edges.embedding_bytes(), layer};
  const auto order = make_schedule(Schedule::interleaved, 2, 2, 6, 3);
  std::vector<int> now(2, 0);
  double heaviest = 0;
  for (const ScheduleStep& st : order[0]) {
    if (st.pass == Pass::F) ++now[static_cast<std::size_t>(st.chunk)];
    if (st.pass == Pass::B) --now[static_cast<std::size_t>(st.chunk)];
    heaviest = std::max(heaviest, now[0] * per_mb[0] + now[1] * per_mb[1]);
  }
  const auto closed = inflight_microbatches(s);
  const double closed_bytes = closed[0][0].full * per_mb[0] + closed[0][1].full * per_mb[1];
  CHECK(heaviest > closed_bytes);
  CHECK(rep.stages[0].activations_bytes == Approx(heaviest).epsilon(1e-12));
}
