// Pipeline transfers in the Program: one activation and one gradient per
// micro-batch and boundary, synchronous communication points, the
// interleaved schedule's synchronous warm-up and flush, and what each
// transfer carries (split from program_test.cpp).
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <algorithm>
#include <string>
#include <vector>

#include "core/program/builder.hpp"
#include "models.hpp"
#include "program_support.hpp"
#include "support.hpp"

using namespace megascope;
using namespace megascope::test;

TEST_CASE("1F1B sends one activation and one gradient per micro-batch between neighbouring stages", "[core]") {
  const Setup s = make_setup(gpt_no_bias(8, 512, 8), "dgx-a100", "tp=1,pp=4", 6, 4);
  auto p = build_program(s);
  REQUIRE(p);
  CHECK(count(*p, 0, OpKind::send) == 6);   // activations forward
  CHECK(count(*p, 0, OpKind::recv) == 6);   // gradients back
  CHECK(count(*p, 1, OpKind::send) == 12);
  CHECK(count(*p, 3, OpKind::recv) == 6);
  CHECK(count(*p, 3, OpKind::send) == 6);
}

TEST_CASE("Synchronous pipeline communication: each group's compute waits for the last group's sends and its receives",
          "[core]") {
  const ModelSpec m = gpt_no_bias(8, 512, 8);
  // Which ops depend directly on op i.
  const auto users = [](const StageProgram& st, std::size_t i) {
    std::vector<std::size_t> out;
    for (std::size_t j = i + 1; j < st.ops.size(); ++j)
      for (std::uint32_t d = st.ops[j].dep_begin; d < st.ops[j].dep_begin + st.ops[j].dep_count; ++d)
        if (st.deps[d] == i) out.push_back(j);
    return out;
  };
  const auto is_gate = [](const Op& op) { return op.kind == OpKind::compute && op.kernel_count == 0; };
  for (const char* plan : {"tp=1,pp=4", "tp=1,pp=4,schedule=gpipe", "tp=1,pp=2,vpp=2,schedule=interleaved,overlap_p2p_comm=off"}) {
    INFO(plan);
    const bool interleaved = std::string(plan).find("interleaved") != std::string::npos;
    auto p = build_program(make_setup(m, "dgx-a100", plan, 8, interleaved ? 2 : 4));
    REQUIRE(p);
    int deferred = 0;
    for (const StageProgram& st : p->stages) {
      // The last compute op: sends after it have no group after them to gate.
      std::size_t last_compute = 0;
      for (std::size_t i = 0; i < st.ops.size(); ++i)
        if (st.ops[i].kind == OpKind::compute && st.ops[i].phase != Phase::optimizer) last_compute = i;
      bool first_recv = true;
      for (std::size_t i = 0; i < st.ops.size(); ++i) {
        const Op& op = st.ops[i];
        if (op.kind == OpKind::send && i < last_compute) {
          // Posted after a compute op, and a gate of the next group waits for it.
          const auto u = users(st, i);
          CHECK(std::any_of(u.begin(), u.end(), [&](std::size_t j) { return is_gate(st.ops[j]); }));
          REQUIRE(op.dep_count >= 1);
          bool after_backward = false;
          for (std::uint32_t d = op.dep_begin; d < op.dep_begin + op.dep_count; ++d)
            after_backward |= st.ops[st.deps[d]].phase == Phase::backward_input ||
                              st.ops[st.deps[d]].phase == Phase::backward_weight;
          // The interleaved steady state sends a forward's output after the next backward.
          if (op.label == OpLabel::pp_activation && after_backward) ++deferred;
        }
        if (op.kind == OpKind::recv) {
          // Posted at a communication point: after the last group's compute (none before the first).
          if (!first_recv) {
            REQUIRE(op.dep_count == 1);
            CHECK(st.ops[st.deps[op.dep_begin]].kind == OpKind::compute);
          }
          first_recv = false;
          const auto u = users(st, i);
          CHECK(std::any_of(u.begin(), u.end(), [&](std::size_t j) { return is_gate(st.ops[j]); }));
        }
      }
    }
    if (interleaved) CHECK(deferred > 0);
    else CHECK(deferred == 0);
  }
  // Overlapped: sends gate nothing and receives wait for nothing.
  for (const char* plan : {"tp=1,pp=4,overlap_p2p_comm=on", "tp=1,pp=2,vpp=2,schedule=interleaved,overlap_p2p_warmup_flush=on"}) {
    INFO(plan);
    auto p = build_program(make_setup(m, "dgx-a100", plan, 8, std::string(plan).find("vpp") != std::string::npos ? 2 : 4));
    REQUIRE(p);
    for (const StageProgram& st : p->stages)
      for (std::size_t i = 0; i < st.ops.size(); ++i) {
        if (st.ops[i].kind == OpKind::send) CHECK(users(st, i).empty());
        if (st.ops[i].kind == OpKind::recv) CHECK(st.ops[i].dep_count == 0);
      }
  }
}

TEST_CASE("Interleaved without overlap_p2p_warmup_flush: the warm-up's and the flush's transfers are waited for, the "
          "steady state's overlapped", "[core]") {
  // Megatron-Core's default: after each warm-up forward the output is sent
  // and the next input received, both waited for; likewise after each flush
  // backward; the steady state between them overlaps.
  const ModelSpec m = gpt_no_bias(8, 512, 8);
  const auto gated = [](const StageProgram& st, std::size_t i) {
    for (std::size_t j = i + 1; j < st.ops.size(); ++j)
      for (std::uint32_t d = st.ops[j].dep_begin; d < st.ops[j].dep_begin + st.ops[j].dep_count; ++d)
        if (st.deps[d] == i && st.ops[j].kind == OpKind::compute && st.ops[j].kernel_count == 0) return true;
    return false;
  };
  const int pp = 4, vpp = 2, micro = 8;
  for (const bool flush : {false, true}) {
    INFO("overlap_p2p_warmup_flush " << flush);
    const Setup s = make_setup(m, "dgx-a100", fmt::format("tp=1,pp={},vpp={},schedule=interleaved,overlap_p2p_warmup_flush={}",
                                                          pp, vpp, flush ? "on" : "off"), micro, pp);
    auto p = build_program(s);
    REQUIRE(p);
    for (int r = 0; r < pp; ++r) {
      INFO("rank " << r);
      const StageProgram& st = p->stages[static_cast<std::size_t>(r)];
      // Forward sends in order: the first `warmup` belong to warm-up forwards.
      const int warmup = interleaved_warmup(pp, vpp, micro, r);
      int forward_sends = 0, gated_warmup = 0, gated_steady = 0, warmup_sends = 0, steady_sends = 0;
      for (std::size_t i = 0; i < st.ops.size(); ++i) {
        const Op& op = st.ops[i];
        if (op.kind != OpKind::send || op.label != OpLabel::pp_activation) continue;
        const bool in_warmup = forward_sends < warmup;
        ++forward_sends;
        (in_warmup ? warmup_sends : steady_sends) += 1;
        if (gated(st, i)) (in_warmup ? gated_warmup : gated_steady) += 1;
      }
      CHECK(gated_steady == 0);
      if (flush) CHECK(gated_warmup == 0);
      else CHECK(gated_warmup == warmup_sends);
      // Backward sends after the last forward (the flush) are waited for likewise.
      std::size_t last_forward = 0;
      for (std::size_t i = 0; i < st.ops.size(); ++i)
        if (st.ops[i].kind == OpKind::compute && st.ops[i].phase == Phase::forward) last_forward = i;
      int flush_sends = 0, flush_gated = 0;
      for (std::size_t i = last_forward; i < st.ops.size(); ++i)
        if (st.ops[i].kind == OpKind::send && st.ops[i].label == OpLabel::pp_gradient) {
          ++flush_sends;
          flush_gated += gated(st, i);
        }
      if (r > 0) CHECK(flush_sends > 0);
      // The last send has no step after it to gate; the others do without the flag.
      if (flush) CHECK(flush_gated == 0);
      else CHECK(flush_gated >= flush_sends - 1);
    }
  }
  expect_error(try_setup(m, "dgx-a100", "tp=1,pp=2,overlap_p2p_warmup_flush=on", 8, 2), "plan.overlap_p2p_warmup_flush",
               "interleaved");
  expect_error(try_setup(m, "dgx-a100", "tp=1,pp=2,vpp=2,schedule=interleaved,overlap_p2p_comm=off,overlap_p2p_warmup_flush=on",
                         8, 2),
               "plan.overlap_p2p_warmup_flush", "overlap_p2p_comm");
}

TEST_CASE("Pipeline transfers carry the SP shard, Megatron-Core's whole activation, or a scattered slice gathered over TP",
          "[core]") {
  // 4 layers, h 1024, s 2048, mbs 1, tp 2, pp 2: the activation is 2 x 2048 x 1024 bytes.
  const ModelSpec m = gpt(4, 1024, 16);
  const double whole = 2.0 * 2048 * 1024;
  struct Case {
    const char* plan;
    double p2p_bytes;
    bool gathered;
  };
  for (const Case& c : {Case{"tp=2,pp=2,sp=on", whole / 2, false}, Case{"tp=2,pp=2", whole, false},
                        Case{"tp=2,pp=2,pp_scatter_gather=on", whole / 2, true},
                        Case{"tp=2,pp=2,sp=on,pp_scatter_gather=on", whole / 2, false},
                        Case{"tp=1,pp=2,pp_scatter_gather=on", whole, false}}) {
    INFO(c.plan);
    const int tp = std::string(c.plan).rfind("tp=2", 0) == 0 ? 2 : 1;
    const Setup setup = make_setup(m, "dgx-a100", c.plan, 4, 2 * tp);   // dp 1: four micro-batches
    auto p = build_program(setup);
    REQUIRE(p);
    for (const StageProgram& st : p->stages) {
      int recvs = 0, gathers = 0;
      for (std::size_t i = 0; i < st.ops.size(); ++i) {
        const Op& op = st.ops[i];
        if (op.kind == OpKind::send || op.kind == OpKind::recv) CHECK(op.bytes == Approx(c.p2p_bytes));
        if (op.kind == OpKind::recv) ++recvs;
        // The gather: a TP all-gather of the whole activation, right after its receive, labelled as it.
        if (op.kind == OpKind::all_gather && (op.label == OpLabel::pp_activation || op.label == OpLabel::pp_gradient)) {
          ++gathers;
          CHECK(op.group == CommGroup::tp);
          CHECK(op.bytes == Approx(whole));
          REQUIRE(op.dep_count == 1);
          const Op& recv = st.ops[st.deps[op.dep_begin]];
          CHECK(recv.kind == OpKind::recv);
          CHECK(recv.label == op.label);
        }
      }
      CHECK(recvs == 4);   // four micro-batches: activations into stage 1, gradients into stage 0
      CHECK(gathers == (c.gathered ? recvs : 0));
    }
  }
}
