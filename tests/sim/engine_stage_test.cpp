// The engine's packing of a stage (sim/engine_stage.hpp): each op's
// predecessors and successors, kept in its record when they are few and
// close, spilled to the stage's arrays when they are many or far, must be
// the program's, in the order the engine relies on.
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <vector>

#include "core/program/stage_writer.hpp"
#include "engine_support.hpp"
#include "sim/network.hpp"
#include "support.hpp"
#include "sim/engine_stage.hpp"

using namespace megascope;
using namespace megascope::sim;
using megascope::test::unit_cost;

namespace {

// One op of the hand-built stage: its stream and its deps.
struct Spec {
  Stream stream;
  std::vector<std::uint32_t> deps;
};

StageProgram stage_of(const std::vector<Spec>& specs) {
  StageProgram s;
  for (const Spec& sp : specs) {
    Op op;
    op.stream = sp.stream;
    op.kind = sp.stream == Stream::compute ? OpKind::compute
              : sp.stream == Stream::pp_send ? OpKind::send
                                             : OpKind::all_reduce;
    if (op.kind == OpKind::send) {
      op.peer_stage = 1;
      op.tag = s.ops.size();
    }
    op.bytes = 1e6;
    op.dep_begin = static_cast<std::uint32_t>(s.deps.size());
    op.dep_count = static_cast<std::uint32_t>(sp.deps.size());
    s.deps.insert(s.deps.end(), sp.deps.begin(), sp.deps.end());
    s.ops.push_back(op);
  }
  return s;
}

// The lists as the program states them: the op before on its ordered stream
// first, then its deps in order; successors: the op after on its stream
// first, then every op that names it, in program order (twice if named twice).
struct Lists {
  std::vector<std::vector<std::uint32_t>> preds, succs;
};

Lists expected(const std::vector<Spec>& specs) {
  const std::size_t n = specs.size();
  Lists l;
  l.preds.resize(n);
  std::vector<std::uint32_t> next(n, sim::detail::kNone);
  std::vector<std::vector<std::uint32_t>> dependents(n);
  std::vector<std::uint32_t> last(kStreamCount, sim::detail::kNone);
  for (std::uint32_t i = 0; i < n; ++i) {
    const auto k = static_cast<std::size_t>(specs[i].stream);
    if (!sim::detail::is_async(specs[i].stream)) {
      if (last[k] != sim::detail::kNone) {
        l.preds[i].push_back(last[k]);
        next[last[k]] = i;
      }
      last[k] = i;
    }
    for (const std::uint32_t d : specs[i].deps) {
      l.preds[i].push_back(d);
      dependents[d].push_back(i);
    }
  }
  l.succs.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (next[i] != sim::detail::kNone) l.succs[i].push_back(next[i]);
    l.succs[i].insert(l.succs[i].end(), dependents[i].begin(), dependents[i].end());
  }
  return l;
}

Lists packed(const sim::detail::StageInfo& info) {
  Lists l;
  l.preds.resize(info.ops.size());
  l.succs.resize(info.ops.size());
  for (std::uint32_t i = 0; i < info.ops.size(); ++i) {
    info.all_preds(i, [&](std::uint32_t p) {
      l.preds[i].push_back(p);
      return true;
    });
    info.each_succ(i, [&](std::uint32_t s) { l.succs[i].push_back(s); });
  }
  return l;
}

}  // namespace

TEST_CASE("A stage's packed predecessors and successors are the program's, near, many or far", "[sim]") {
  // Over 65,536 ops, so that some deps are further than a record keeps near:
  // three ordered streams and an unordered one; most ops depend on a few
  // recent ones, some on many, some on ops 65,536 or more before them, some
  // name one op twice, and the op after a stream's last keeps its place.
  constexpr std::uint32_t n = 70'000;
  std::mt19937 gen(7);
  const auto rng = [&] { return static_cast<std::uint32_t>(gen()); };
  std::vector<Spec> specs(n);
  const Stream streams[] = {Stream::compute, Stream::compute, Stream::tp, Stream::dp, Stream::pp_send};
  for (std::uint32_t i = 0; i < n; ++i) {
    Spec& s = specs[i];
    s.stream = streams[rng() % 5];
    if (i == 0) continue;
    const std::uint32_t shape = rng() % 100;
    if (shape < 60) {   // a few recent ones
      for (std::uint32_t k = rng() % 3; k > 0; --k) s.deps.push_back(i - 1 - rng() % std::min<std::uint32_t>(i, 16));
    } else if (shape < 70) {   // many: spilled however close
      for (std::uint32_t k = 5 + rng() % 4; k > 0; --k) s.deps.push_back(i - 1 - rng() % std::min<std::uint32_t>(i, 64));
    } else if (shape < 72 && i > 65'536) {   // one far, after near ones: the list spills part-way
      s.deps.push_back(i - 1);
      s.deps.push_back(i - 65'536 - rng() % (i - 65'535));
    } else if (shape < 74 && i > 65'536) {   // as far as a record keeps (65,535), and one further
      s.deps.push_back(i - 65'535 - rng() % 2);
    } else if (shape < 76) {   // the same op twice
      const std::uint32_t d = i - 1 - rng() % std::min<std::uint32_t>(i, 8);
      s.deps.push_back(d);
      s.deps.push_back(d);
    }
  }
  // Op 1 is named by 40 ops: a spilled successor list of a near op.
  for (std::uint32_t i = 2; i < 42; ++i) specs[i].deps.push_back(1);
  const StageProgram stage = stage_of(specs);
  const sim::detail::StageInfo info = sim::detail::analyse(stage, unit_cost());
  REQUIRE(info.ops.size() == n);
  const Lists want = expected(specs);
  const Lists got = packed(info);
  std::size_t spilled_preds = 0, spilled_succs = 0, far = 0;
  for (std::uint32_t i = 0; i < n; ++i) {
    INFO("op " << i);
    REQUIRE(got.preds[i] == want.preds[i]);
    REQUIRE(got.succs[i] == want.succs[i]);
    REQUIRE(info.ops[i].has_succs() == !want.succs[i].empty());
    spilled_preds += info.ops[i].pred_n == sim::detail::Adjacency::kSpilled;
    spilled_succs += info.ops[i].succ_n == sim::detail::Adjacency::kSpilled;
    for (const std::uint32_t p : want.preds[i]) far += i - p > sim::detail::Adjacency::kFar;
  }
  // Every path was taken: lists kept near, lists spilled for their length
  // and for their distance.
  CHECK(spilled_preds > 1000);
  CHECK(spilled_preds < n / 2);
  CHECK(spilled_succs > 100);
  CHECK(far > 50);
  CHECK(info.preds.size() > 0);
  CHECK(info.succs.size() > 0);
}

TEST_CASE("An op that waits for a receive 70,000 ops before it starts when the transfer ends", "[sim]") {
  // Stage 1 computes 5 s, then sends. Stage 0 posts the receive first, then
  // runs 70,000 short ops (0.07 s), then an op that depends on the receive
  // and on the first short op: its list (the op before it, then those two)
  // spills part-way for the receive's distance. It starts when the
  // transfer ends, with regions on and off.
  Program p = megascope::test::two_stages();
  megascope::detail::OpContext ctx;
  megascope::detail::StageWriter w0(p.stages[0]), w1(p.stages[1]);
  const auto c1 = w1.compute(OpLabel::mlp, ctx, {megascope::test::seconds(5.0)});
  w1.p2p(OpKind::send, OpLabel::pp_activation, ctx, 0, 3, 64e6, {c1});
  const auto recv = w0.p2p(OpKind::recv, OpLabel::pp_activation, ctx, 1, 3, 64e6);
  const auto short0 = w0.compute(OpLabel::mlp, ctx, {megascope::test::seconds(1e-6)});
  for (int k = 1; k < 70'000; ++k) w0.compute(OpLabel::mlp, ctx, {megascope::test::seconds(1e-6)});
  const auto last = w0.compute(OpLabel::mlp, ctx, {megascope::test::seconds(2.0)}, {short0, recv});
  REQUIRE(last - recv > sim::detail::Adjacency::kFar);
  REQUIRE(validate_program(p));
  const Topology topo = Topology::build(megascope::test::shipped_cluster("dgx-h100"), 2);
  const std::vector<int> pair = {1, 0};
  const double x = isolated_time(topo, collective_flow(topo, Collective::send_recv, pair, 64e6));
  for (const bool regions : {true, false}) {
    SimOptions o{Mode::full, true, {}};
    o.regions = regions;
    auto r = simulate(p, topo, unit_cost(), o);
    REQUIRE(r);
    CHECK(megascope::test::span_of(*r, 0, recv).end == Approx(5.0 + x));
    CHECK(megascope::test::span_of(*r, 0, last - 1).end == Approx(70'000 * 1e-6));
    CHECK(megascope::test::span_of(*r, 0, last).start == Approx(5.0 + x));
    CHECK(r->step_time_s == Approx(7.0 + x));
  }
}
