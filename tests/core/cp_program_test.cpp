// Context parallelism in the Program builder: each CP rank's attention calls
// and exchanges as Megatron-Core runs them through Transformer Engine
// (--cp-comm-type p2p, all-gather, a2a), and the a2a head rule.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <optional>
#include <string>
#include <vector>

#include "core/program/builder.hpp"
#include "core/program/stage_writer.hpp"
#include "models.hpp"
#include "support.hpp"

using namespace megascope;
using namespace megascope::test;

TEST_CASE("Context parallelism: each rank's attention is the load-balanced causal share, in the calls each CP "
          "communication type makes", "[core]") {
  // 8 heads of 64, 4096 tokens, one sequence per micro-batch, tp 1: causal
  // attention over the sequence is s^2 / 2 query-key pairs a head; a CP rank
  // holding chunks r and 2cp - 1 - r does 1/cp of them whatever the
  // exchange (Megatron-Core through Transformer Engine), not the (2 - 1/cp)
  // times more of queries s/cp at the end of the sequence against all s keys.
  const ModelSpec m = gpt_no_bias(2, 512, 8);
  const double s = 4096, heads = 8, d = 64;
  const double whole = 2.0 * heads * (s * s / 2) * (d + d);   // forward FLOPs of one sequence (QK^T and PV)
  struct Case {
    const char* comm;
    int cp;
    std::size_t calls;
  };
  for (const Case c : {Case{"p2p", 2, 2}, Case{"p2p", 4, 4}, Case{"all-gather", 2, 2}, Case{"all-gather", 4, 2},
                       Case{"a2a", 2, 1}, Case{"a2a", 4, 1}}) {
    INFO(c.comm << " cp " << c.cp);
    const Setup st = make_setup(m, "dgx-h100", fmt::format("tp=1,cp={},cp_comm={}", c.cp, c.comm), c.cp, c.cp,
                                static_cast<std::int64_t>(s));
    auto p = build_program(st);
    REQUIRE(p);
    const StageProgram& sp = p->stages.front();
    // The attention calls of the first layer's first forward, and the CP collectives of each layer pass.
    std::vector<const Kernel*> fwd, bwd;
    int a2a_fwd = 0, a2a_bwd = 0;
    for (const Op& op : sp.ops) {
      if (!(op.layer == 0 && op.microbatch == 0)) continue;
      if (op.kind == OpKind::all_to_all && op.group == CommGroup::cp) ++(op.phase == Phase::forward ? a2a_fwd : a2a_bwd);
      if (op.kind != OpKind::compute) continue;
      for (std::uint32_t k = op.kernel_begin; k < op.kernel_begin + op.kernel_count; ++k) {
        const Kernel& kernel = sp.kernels[k];
        if (kernel.kind == KernelKind::attention_fwd && op.phase == Phase::forward) fwd.push_back(&kernel);
        if (kernel.kind == KernelKind::attention_bwd) bwd.push_back(&kernel);
      }
    }
    CHECK(fwd.size() == c.calls);
    CHECK(bwd.size() == c.calls);
    double f = 0, b = 0;
    for (const Kernel* k : fwd) f += detail::kernel_flops(*k);
    for (const Kernel* k : bwd) b += detail::kernel_flops(*k);
    CHECK(f == Approx(whole / c.cp).epsilon(1e-12));
    CHECK(b == Approx(2.0 * whole / c.cp).epsilon(1e-12));
    const bool a2a = std::string(c.comm) == "a2a";
    // a2a: Q, K and V out and the output back in the forward, the output's
    // gradient out and Q's, K's and V's back in the backward; the head split.
    CHECK(a2a_fwd == (a2a ? 2 : 0));
    CHECK(a2a_bwd == (a2a ? 2 : 0));
    if (a2a) {
      CHECK(fwd.front()->attention.heads == 8 / c.cp);
      CHECK(fwd.front()->attention.seq_q == 4096);
    }
  }
}

TEST_CASE("all-to-all context parallelism needs the heads of every TP rank to split over cp", "[core]") {
  ModelSpec m = gpt_no_bias(2, 512, 8);
  m.num_query_groups = 2;
  CHECK(try_setup(m, "dgx-h100", "tp=1,cp=2,cp_comm=a2a", 2, 2, 4096).has_value());
  const auto e = try_setup(m, "dgx-h100", "tp=1,cp=4,cp_comm=a2a", 4, 4, 4096);
  REQUIRE_FALSE(e.has_value());
  CHECK(e.error().field == "plan.cp_comm");
  REQUIRE_THAT(e.error().message, Catch::Contains("(8 query, 2 key/value) must be divisible by cp (4)"));
}
