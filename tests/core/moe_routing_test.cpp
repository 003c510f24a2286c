// Group-limited routing and the flex (DeepEP) dispatcher: the hit
// probabilities against an exhaustive count, the setup's copies per token,
// and the two-hop exchange in the Program.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/program/builder.hpp"
#include "models.hpp"
#include "support.hpp"

using namespace megascope;
using namespace megascope::test;

namespace {

// The chance that block `block` of `blocks` receives one of a token's
// experts, by walking every (group choice, expert choice) outcome, each
// equally likely.
double exhaustive_hit(const MoeSpec& e, int blocks, int block) {
  const int E = e.num_experts, b = E / blocks;
  const int G = e.num_groups > 0 ? e.num_groups : 1, g = e.num_groups > 0 ? e.group_topk : 1;
  const int size = E / G;
  double hit = 0, total = 0;
  std::vector<int> groups(static_cast<std::size_t>(G), 0);
  std::fill(groups.end() - g, groups.end(), 1);
  do {   // every set of g groups
    std::vector<int> pool;
    for (int x = 0; x < G; ++x)
      if (groups[static_cast<std::size_t>(x)])
        for (int k = 0; k < size; ++k) pool.push_back(x * size + k);
    std::vector<int> pick(pool.size(), 0);
    std::fill(pick.end() - e.top_k, pick.end(), 1);
    double h = 0, n = 0;
    do {   // every set of top_k experts of the pool
      bool in = false;
      for (std::size_t i = 0; i < pool.size(); ++i)
        if (pick[i] && pool[i] / b == block) in = true;
      h += in;
      n += 1;
    } while (std::next_permutation(pick.begin(), pick.end()));
    hit += h / n;
    total += 1;
  } while (std::next_permutation(groups.begin(), groups.end()));
  return hit / total;
}

MoeSpec routing(int experts, int top_k, int groups, int group_topk) {
  MoeSpec e;
  e.num_experts = experts;
  e.top_k = top_k;
  e.num_groups = groups;
  e.group_topk = group_topk;
  return e;
}

}  // namespace

TEST_CASE("Routing hit probabilities equal an exhaustive count, with and without group-limited routing", "[core]") {
  struct Case {
    int experts, top_k, groups, group_topk, blocks;
  };
  for (const Case c : {Case{16, 4, 0, 0, 4}, Case{16, 4, 0, 0, 8}, Case{16, 2, 4, 2, 4}, Case{16, 3, 4, 2, 8},
                       Case{16, 4, 4, 2, 2}, Case{16, 4, 8, 3, 2}, Case{12, 3, 6, 2, 3}, Case{16, 4, 4, 1, 16}}) {
    const MoeSpec e = routing(c.experts, c.top_k, c.groups, c.group_topk);
    INFO(c.experts << " experts top-" << c.top_k << ", " << c.groups << " groups top-" << c.group_topk << ", "
                   << c.blocks << " blocks");
    const auto p = routing_hit_probability(e, c.blocks);
    REQUIRE(p);
    for (int block = 0; block < c.blocks; ++block) CHECK(*p == Approx(exhaustive_hit(e, c.blocks, block)).epsilon(1e-12));
  }
  // Blocks that straddle groups are not priced: blocks of 6 experts over groups of 4.
  CHECK(routing_hit_probability(routing(24, 2, 4, 2), 4).has_value());
  CHECK_FALSE(routing_hit_probability(routing(24, 2, 6, 2), 4).has_value());
  // DeepSeek-V3 over 8 domains of EP 64: 4 of 8 groups, then 8 of their 128 experts.
  const MoeSpec ds = routing(256, 8, 8, 4);
  double miss = 1;
  for (int i = 0; i < 8; ++i) miss *= (96.0 - i) / (128.0 - i);
  CHECK(*routing_hit_probability(ds, 8) == Approx(0.5 * (1 - miss)).epsilon(1e-12));
}

TEST_CASE("Group-limited routing keys are checked: both set, groups dividing the experts, enough experts", "[core]") {
  const auto error_of = [](int groups, int group_topk) {
    ModelSpec m = shipped_model("deepseek-v3");
    m.moe->num_groups = groups;
    m.moe->group_topk = group_topk;
    auto r = validate_model(m);
    return r ? std::string() : r.error().field + ": " + r.error().message;
  };
  CHECK(error_of(8, 4).empty());
  CHECK_THAT(error_of(8, 0), Catch::Contains("model.moe.group_topk") && Catch::Contains("both"));
  CHECK_THAT(error_of(0, 4), Catch::Contains("model.moe.num_groups") && Catch::Contains("both"));
  CHECK_THAT(error_of(7, 4), Catch::Contains("model.moe.num_groups") && Catch::Contains("divide"));
  CHECK_THAT(error_of(8, 9), Catch::Contains("model.moe.group_topk") && Catch::Contains("at most"));
  CHECK_THAT(error_of(64, 1), Catch::Contains("model.moe.group_topk") && Catch::Contains("top_k = 8"));
}

TEST_CASE("The flex dispatcher sends a token once per other domain and once per other EP rank its experts are on",
          "[core]") {
  const ModelSpec m = shipped_model("deepseek-v3");   // 256 experts top-8, 8 groups top-4
  const auto bytes_of = [](const Program& p, CommSpan span) {
    std::vector<double> b;
    for (const Op& op : p.stages[1].ops)
      if (op.kind == OpKind::all_to_all && op.span == span && op.phase == Phase::forward && op.microbatch == 0 &&
          op.layer == 5)
        b.push_back(op.bytes);
    return b;
  };
  // EP 64 over 8 nodes: 7 other domains, 56 other ranks.
  const std::string plan = "tp=1,pp=16,ep=64,first_stage_layers=4,last_stage_layers=1,moe_dispatcher=flex";
  const Setup s = make_setup(m, "dgx-h100", plan, 1024, 1024);
  REQUIRE(s.warnings.empty());
  CHECK(s.flex_rail_copies == Approx(7 * *routing_hit_probability(*m.moe, 8)).epsilon(1e-12));
  CHECK(s.flex_domain_copies == Approx(56 * *routing_hit_probability(*m.moe, 64)).epsilon(1e-12));
  CHECK(s.flex_rail_copies < 7 * 0.5);    // at most 4 of the 8 groups (= domains) per token
  auto p = build_program(s);
  REQUIRE(p);
  const double token = 2.0 * 4096 * 7168;   // one micro-batch's routed tokens x h x 2 bytes
  // Dispatch and combine: a rails hop and a domain hop each.
  const std::vector<double> rails = bytes_of(*p, CommSpan::rails), domain = bytes_of(*p, CommSpan::domain);
  REQUIRE(rails.size() == 2);
  REQUIRE(domain.size() == 2);
  for (double b : rails) CHECK(b == Approx(token * s.flex_rail_copies).epsilon(1e-12));
  for (double b : domain) CHECK(b == Approx(token * s.flex_domain_copies).epsilon(1e-12));
  CHECK(bytes_of(*p, CommSpan::whole).empty());
  // Inside one node (EP 8): no rails hop; one copy per other rank holding experts.
  const Setup one = make_setup(m, "dgx-h100", "tp=1,pp=16,ep=8,first_stage_layers=4,last_stage_layers=1,moe_dispatcher=flex",
                               1024, 1024);
  CHECK(one.flex_rail_copies == 0);
  CHECK(one.flex_domain_copies == Approx(7 * *routing_hit_probability(*m.moe, 8)).epsilon(1e-12));
  auto q = build_program(one);
  REQUIRE(q);
  CHECK(bytes_of(*q, CommSpan::rails).empty());
  CHECK(bytes_of(*q, CommSpan::domain).size() == 2);
  // The load scales both hops as it scales the alltoall's copies.
  ModelSpec busy = m;
  busy.moe->load_imbalance = 1.5;
  const Setup b = make_setup(busy, "dgx-h100", plan, 1024, 1024);
  auto pb = build_program(b);
  REQUIRE(pb);
  CHECK(bytes_of(*pb, CommSpan::rails)[0] == Approx(1.5 * rails[0]).epsilon(1e-12));
}

TEST_CASE("The flex dispatcher needs EP groups that fill scale-up domains alike, and an MoE model", "[core]") {
  ClusterSpec c = shipped_cluster("dgx-h100");
  c.node.devices_per_node = 6;   // EP 8 would put 6 ranks on one node and 2 on the next
  c.scale_up_domain = 6;
  c.node.nics_per_node = 6;
  auto cluster = with_device_count(c, 48);
  REQUIRE(cluster);
  auto plan = parse_inline_plan("ep=8,moe_dispatcher=flex");
  REQUIRE(plan);
  TrainingSpec t;
  t.global_batch_size = 48;
  auto s = validate_setup(shipped_model("mixtral-8x7b"), *cluster, t, *plan, 48);
  REQUIRE_FALSE(s);
  CHECK(s.error().field == "plan.moe_dispatcher");
  CHECK_THAT(s.error().message, Catch::Contains("fill its scale-up domains"));
  auto dense = try_setup(gpt(8, 512, 8), "dgx-h100", "moe_dispatcher=flex", 8, 8);
  REQUIRE_FALSE(dense);
  CHECK(dense.error().field == "plan.moe_dispatcher");
  const Setup no_ep = make_setup(shipped_model("mixtral-8x7b"), "dgx-h100", "moe_dispatcher=flex", 8, 8);
  REQUIRE(no_ep.warnings.size() == 1);
  CHECK_THAT(no_ep.warnings[0], Catch::Contains("no effect without expert parallelism"));
}

TEST_CASE("The flex dispatcher checks every EP group, not only the first one's", "[core]") {
  // NVL72 domains used whole (72 GPUs): EP groups of 16 over 144 GPUs. The group of
  // ranks 0-15 sits in one domain; that of ranks 64-79 crosses into the next.
  ClusterSpec whole = shipped_cluster("gb200-nvl72");
  whole.scale_up_domain = whole.scale_up_domain_size;
  whole.scale_up_domain_used = 0;
  auto cluster = with_device_count(whole, 144);
  REQUIRE(cluster);
  REQUIRE(cluster->scale_up_domain == 72);
  auto plan = parse_inline_plan("tp=1,ep=16,moe_dispatcher=flex");
  REQUIRE(plan);
  TrainingSpec t;
  t.global_batch_size = 144;
  auto s = validate_setup(shipped_model("qwen3-30b-a3b"), *cluster, t, *plan, 144);
  REQUIRE_FALSE(s);
  CHECK(s.error().field == "plan.moe_dispatcher");
  CHECK_THAT(s.error().message, Catch::Contains("the group of rank 64"));
}

TEST_CASE("A GB200 NVL72 job uses 64 GPUs of each rack, so EP groups of 16 and 64 stay inside one NVLink domain",
          "[core]") {
  const ClusterSpec c = shipped_cluster("gb200-nvl72");
  CHECK(c.scale_up_domain == 64);
  CHECK(c.scale_up_domain_size == 72);
  CHECK(try_setup(shipped_model("qwen3-30b-a3b"), "gb200-nvl72", "tp=1,ep=16,moe_dispatcher=flex", 128, 128));
  CHECK(try_setup(shipped_model("qwen3-30b-a3b"), "gb200-nvl72", "tp=1,ep=64,moe_dispatcher=flex", 256, 256));
}

TEST_CASE("Cluster rule: the GPUs a job uses of each scale-up domain are whole nodes, at most the domain", "[core]") {
  for (int used : {6, 80}) {
    ClusterSpec c = shipped_cluster("gb200-nvl72");
    c.scale_up_domain = c.scale_up_domain_size;
    c.scale_up_domain_used = used;
    INFO("used " << used);
    const auto r = validate_cluster(c);
    REQUIRE_FALSE(r);
    CHECK(r.error().field == "cluster.scale_up_domain_used");
    CHECK_THAT(r.error().message, Catch::Contains("whole number of nodes (4 devices each) and at most scale_up_domain (72)"));
  }
}

TEST_CASE("EP all-to-all overlap follows Megatron-Core's rules: EP, alltoall or flex, 1F1B or interleaved, no full "
          "recomputation, not with the shared experts' overlap",
          "[core]") {
  const ModelSpec mix = shipped_model("mixtral-8x7b");
  CHECK(try_setup(mix, "dgx-h100", "tp=1,ep=8,moe_ep_overlap=on", 16, 16));
  CHECK(try_setup(mix, "dgx-h100", "tp=1,ep=8,pp=2,vpp=2,schedule=interleaved,moe_ep_overlap=on", 16, 16));
  struct Case {
    const char* plan;
    const char* words;
  };
  const Case cases[] = {
      {"tp=1,moe_ep_overlap=on", "needs expert parallelism"},
      {"tp=1,ep=8,moe_dispatcher=allgather,moe_ep_overlap=on", "alltoall or flex"},
      {"tp=1,ep=8,pp=2,moe_ep_overlap=on", "needs virtual stages"},
      {"tp=1,ep=8,pp=2,schedule=zb-v,moe_ep_overlap=on", "1f1b or interleaved"},
      {"tp=1,ep=8,recompute=full,recompute_method=uniform,recompute_layers=1,moe_ep_overlap=on", "full recomputation"},
  };
  for (const Case& c : cases) {
    INFO(c.plan);
    const auto s = try_setup(mix, "dgx-h100", c.plan, 16, 16);
    REQUIRE_FALSE(s);
    CHECK(s.error().field == "plan.moe_ep_overlap");
    CHECK_THAT(s.error().message, Catch::Contains(c.words));
  }
  const auto dense = try_setup(shipped_model("tiny-gpt"), "dgx-h100", "tp=1,moe_ep_overlap=on", 8, 8);
  REQUIRE_FALSE(dense);
  CHECK(dense.error().field == "plan.moe_ep_overlap");
}
