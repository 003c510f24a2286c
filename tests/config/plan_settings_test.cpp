#include "config/plan_settings.hpp"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

using namespace megascope;

namespace {

Error inline_error(std::string_view text) {
  auto r = parse_inline_plan(text);
  REQUIRE_FALSE(r.has_value());
  return r.error();
}

Error setting_error(std::string_view key, std::string_view value) {
  PlanSpec p;
  auto r = apply_plan_setting(p, key, value);
  REQUIRE_FALSE(r.has_value());
  return r.error();
}

}  // namespace

TEST_CASE("The example inline plan sets tp, pp, vpp, dp, mbs, sp, recompute, distopt and the schedule",
          "[config]") {
  auto r = parse_inline_plan("tp=8,pp=8,vpp=3,dp=16,mbs=1,sp=on,recompute=selective,distopt=on,schedule=interleaved");
  REQUIRE(r.has_value());
  const PlanSpec& p = *r;
  CHECK(p.tp == 8);
  CHECK(p.pp == 8);
  CHECK(p.vpp == 3);
  CHECK(p.dp == 16);
  CHECK(p.micro_batch_size == 1);
  CHECK(p.sequence_parallel);
  CHECK(p.recompute.granularity == RecomputeGranularity::selective);
  CHECK_FALSE(p.recompute.method.has_value());
  CHECK_FALSE(p.recompute.num_layers.has_value());
  CHECK(p.distributed_optimizer);
  CHECK(p.schedule == Schedule::interleaved);
  // Everything else keeps PlanSpec's defaults.
  CHECK(p.cp == 1);
  CHECK(p.ep == 1);
  CHECK_FALSE(p.etp.has_value());
  CHECK_FALSE(p.first_stage_layers.has_value());
  CHECK_FALSE(p.last_stage_layers.has_value());
  CHECK_FALSE(p.overlap_grad_reduce);
  CHECK_FALSE(p.overlap_param_gather);
  CHECK_FALSE(p.tp_comm_overlap);
  CHECK(p.attention == AttentionKernel::flash);
  CHECK(p.cp_comm == CpCommType::p2p);
}

TEST_CASE("Every remaining plan key sets its field", "[config]") {
  auto r = parse_inline_plan(
      "cp=2,ep=4,etp=1,recompute=full,recompute_method=block,recompute_layers=3,overlap_grad_reduce=true,"
      "overlap_param_gather=1,tp_comm_overlap=on,attention=unfused,cp_comm=all-gather,first_stage_layers=5,"
      "last_stage_layers=6,schedule=zb-v");
  REQUIRE(r.has_value());
  CHECK(r->cp == 2);
  CHECK(r->ep == 4);
  CHECK(r->etp == 1);
  CHECK(r->recompute.granularity == RecomputeGranularity::full);
  CHECK(r->recompute.method == RecomputeMethod::block);
  CHECK(r->recompute.num_layers == 3);
  CHECK(r->overlap_grad_reduce);
  CHECK(r->overlap_param_gather);
  CHECK(r->tp_comm_overlap);
  CHECK(r->attention == AttentionKernel::unfused);
  CHECK(r->cp_comm == CpCommType::all_gather);
  CHECK(r->first_stage_layers == 5);
  CHECK(r->last_stage_layers == 6);
  CHECK(r->schedule == Schedule::zb_v);
}

TEST_CASE("recompute_modules: '+'-separated module names that format back, and an unknown one is an error naming them", "[config]") {
  auto r = parse_inline_plan("recompute=selective,recompute_modules=moe_act+core_attn+layernorm");
  REQUIRE(r);
  REQUIRE(r->recompute.modules);
  CHECK(*r->recompute.modules == (kRecomputeCoreAttn | kRecomputeLayernorm | kRecomputeMoeAct));
  CHECK(recompute_modules(r->recompute) == *r->recompute.modules);
  CHECK(format_inline_plan(*r) == "recompute=selective,recompute_modules=core_attn+layernorm+moe_act");
  CHECK(*parse_inline_plan(format_inline_plan(*r)) == *r);
  // Selective alone recomputes the attention core (Megatron-LM's default); other granularities nothing.
  CHECK(recompute_modules(parse_inline_plan("recompute=selective")->recompute) == kRecomputeCoreAttn);
  CHECK(recompute_modules(parse_inline_plan("recompute=none")->recompute) == 0u);
  // Megatron-Core's checkpointed submodules, in the enum's order.
  auto sub = parse_inline_plan("recompute=selective,recompute_modules=shared_experts+moe+mlp");
  REQUIRE(sub);
  CHECK(*sub->recompute.modules == (kRecomputeMlp | kRecomputeMoe | kRecomputeSharedExperts));
  CHECK(format_inline_plan(*sub) == "recompute=selective,recompute_modules=mlp+moe+shared_experts");
  for (const char* bad : {"recompute_modules=moe_layer", "recompute_modules=core_attn+", "recompute_modules="}) {
    INFO(bad);
    auto e = parse_inline_plan(bad);
    REQUIRE_FALSE(e);
    CHECK(e.error().field == "plan.recompute_modules");
    CHECK_THAT(e.error().message, Catch::Contains("core_attn, layernorm, mla_up_proj, moe_act, mlp, moe, shared_experts"));
  }
}

TEST_CASE("Spaces around inline plan items, keys and values are ignored", "[config]") {
  auto r = parse_inline_plan("  tp = 4 , pp=2,  sp =off ,schedule= 1f1b ");
  REQUIRE(r.has_value());
  CHECK(r->tp == 4);
  CHECK(r->pp == 2);
  CHECK_FALSE(r->sequence_parallel);
  CHECK(r->schedule == Schedule::one_f_one_b);
}

TEST_CASE("Booleans accept on, off, true, false, 1 and 0", "[config]") {
  for (auto [text, expected] : {std::pair<const char*, bool>{"on", true}, {"true", true}, {"1", true},
                                {"off", false}, {"false", false}, {"0", false}}) {
    PlanSpec p;
    p.sequence_parallel = !expected;
    REQUIRE(apply_plan_setting(p, "sp", text).has_value());
    CHECK(p.sequence_parallel == expected);
  }
}

TEST_CASE("cp_comm a2a is parsed and printed", "[config]") {
  PlanSpec p;
  REQUIRE(apply_plan_setting(p, "cp_comm", "a2a").has_value());
  CHECK(p.cp_comm == CpCommType::a2a);
  CHECK(std::string(to_string(p.cp_comm)) == "a2a");
  CHECK(parse_cp_comm("a2a") == CpCommType::a2a);
}

TEST_CASE("Megatron's all_gather spelling is accepted for cp_comm", "[config]") {
  PlanSpec p;
  REQUIRE(apply_plan_setting(p, "cp_comm", "all_gather").has_value());
  CHECK(p.cp_comm == CpCommType::all_gather);
}

TEST_CASE("An empty inline plan is an error", "[config]") {
  for (const char* text : {"", "   "}) {
    const Error e = inline_error(text);
    CHECK(e.field == "plan");
    REQUIRE_THAT(e.message, Catch::Contains("empty"));
  }
}

TEST_CASE("An inline plan item without '=' is an error that quotes the item", "[config]") {
  const Error e = inline_error("tp=8,pp8");
  CHECK(e.field == "plan");
  REQUIRE_THAT(e.message, Catch::Contains("expected key=value"));
  REQUIRE_THAT(e.message, Catch::Contains("'pp8'"));
}

TEST_CASE("An empty item between commas is an error", "[config]") {
  for (const char* text : {"tp=8,,pp=2", "tp=8,"}) {
    const Error e = inline_error(text);
    CHECK(e.field == "plan");
    REQUIRE_THAT(e.message, Catch::Contains("empty item"));
  }
}

TEST_CASE("An item with nothing before '=' is an error", "[config]") {
  const Error e = inline_error("tp=8,=2");
  CHECK(e.field == "plan");
  REQUIRE_THAT(e.message, Catch::Contains("missing key"));
}

TEST_CASE("A key given twice in an inline plan is an error naming the key", "[config]") {
  const Error e = inline_error("tp=8,pp=2,tp=4");
  CHECK(e.field == "plan.tp");
  REQUIRE_THAT(e.message, Catch::Contains("given twice"));
}

TEST_CASE("An unknown plan key is an error that lists the known keys", "[config]") {
  const Error e = inline_error("tp=8,tensor_parallel=2");
  CHECK(e.field == "plan.tensor_parallel");
  REQUIRE_THAT(e.message, Catch::Contains("unknown plan key 'tensor_parallel'"));
  REQUIRE_THAT(e.message, Catch::Contains("tp, pp, vpp, microbatch_group, dp, cp, ep, etp, mbs"));
  REQUIRE_THAT(e.message, Catch::Contains("last_stage_layers"));
}

TEST_CASE("Integer keys reject anything but a plain positive decimal integer", "[config]") {
  for (const char* bad : {"8x", "", "-1", "1.5", "0", "+4", " 4", "0x10", "1e3"}) {
    INFO("value: '" << bad << "'");
    const Error e = setting_error("tp", bad);
    CHECK(e.field == "plan.tp");
    REQUIRE_THAT(e.message, Catch::Contains("tp must be a positive integer"));
    REQUIRE_THAT(e.message, Catch::Contains(std::string("'") + bad + "'"));
  }
  const Error big = setting_error("mbs", "99999999999");
  CHECK(big.field == "plan.mbs");
  REQUIRE_THAT(big.message, Catch::Contains("no larger than"));
  for (const char* key : {"pp", "vpp", "dp", "cp", "ep", "etp", "mbs", "recompute_layers", "first_stage_layers",
                          "last_stage_layers"}) {
    const Error e = setting_error(key, "8x");
    CHECK(e.field == std::string("plan.") + key);
    REQUIRE_THAT(e.message, Catch::Contains("'8x'"));
  }
}

TEST_CASE("Boolean keys reject other words and list the accepted ones", "[config]") {
  for (const char* key : {"sp", "distopt", "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap"}) {
    const Error e = setting_error(key, "yes");
    CHECK(e.field == std::string("plan.") + key);
    REQUIRE_THAT(e.message, Catch::Contains("on, off, true, false, 1, 0"));
    REQUIRE_THAT(e.message, Catch::Contains("'yes'"));
  }
}

TEST_CASE("Enumerated keys reject unknown values and list the accepted ones", "[config]") {
  const Error s = setting_error("schedule", "pipedream");
  CHECK(s.field == "plan.schedule");
  REQUIRE_THAT(s.message, Catch::Contains(schedule_names()));
  REQUIRE_THAT(s.message, Catch::Contains("'pipedream'"));

  const Error r = setting_error("recompute", "partial");
  CHECK(r.field == "plan.recompute");
  REQUIRE_THAT(r.message, Catch::Contains("none, selective, full"));

  const Error m = setting_error("recompute_method", "random");
  CHECK(m.field == "plan.recompute_method");
  REQUIRE_THAT(m.message, Catch::Contains("uniform, block"));

  const Error a = setting_error("attention", "sdpa");
  CHECK(a.field == "plan.attention");
  REQUIRE_THAT(a.message, Catch::Contains("flash, unfused"));

  const Error c = setting_error("cp_comm", "ulysses");
  CHECK(c.field == "plan.cp_comm");
  REQUIRE_THAT(c.message, Catch::Contains("p2p, all-gather, a2a"));
}

TEST_CASE("plan_keys lists the 42 documented keys and every one of them is accepted", "[config]") {
  const std::vector<std::string> expected = {
      "tp", "pp", "vpp", "microbatch_group", "dp", "cp", "ep", "etp", "mbs", "sp", "recompute", "recompute_method",
      "recompute_layers", "recompute_modules", "distopt", "zero", "reshard_after_forward", "fsdp_prefetch",
      "fp8_param_gather", "grad_bucket", "dp_replicas", "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap",
      "tp_grad_overlap", "grad_accum_fusion", "pp_scatter_gather", "overlap_p2p_comm", "overlap_p2p_warmup_flush",
      "moe_shared_expert_overlap", "moe_ep_overlap", "schedule", "attention", "cp_comm", "moe_dispatcher", "first_stage_layers", "last_stage_layers",
      "embedding_in_split", "loss_in_split", "layout", "post_validation", "dynamic_cp"};
  CHECK(plan_keys() == expected);
  PlanSpec p;
  for (const std::string& key : expected) {
    INFO(key);
    std::string value = "2";
    if (key == "sp" || key == "distopt" || key == "overlap_grad_reduce" || key == "overlap_param_gather" ||
        key == "tp_comm_overlap" || key == "pp_scatter_gather" || key == "overlap_p2p_comm" || key == "overlap_p2p_warmup_flush" ||
        key == "moe_shared_expert_overlap" || key == "moe_ep_overlap" || key == "embedding_in_split" || key == "loss_in_split" || key == "post_validation" ||
        key == "fp8_param_gather" || key == "dynamic_cp")
      value = "on";
    if (key == "layout") value = "Et|tL";
    if (key == "tp_grad_overlap" || key == "grad_accum_fusion" || key == "reshard_after_forward") value = "off";
    if (key == "grad_bucket") value = "500000000";
    if (key == "recompute") value = "full";
    if (key == "recompute_method") value = "uniform";
    if (key == "schedule") value = "1f1b";
    if (key == "attention") value = "flash";
    if (key == "cp_comm") value = "p2p";
    if (key == "moe_dispatcher") value = "allgather";
    if (key == "recompute_modules") value = "core_attn";
    CHECK(apply_plan_setting(p, key, value).has_value());
  }
}

TEST_CASE("The canonical inline form writes only non-default keys in plan_keys order", "[config]") {
  auto p = parse_inline_plan("schedule=interleaved,distopt=on,recompute=selective,sp=on,mbs=1,dp=16,vpp=3,pp=8,tp=8");
  REQUIRE(p.has_value());
  CHECK(format_inline_plan(*p) == "tp=8,pp=8,vpp=3,dp=16,sp=on,recompute=selective,distopt=on,schedule=interleaved");

  PlanSpec q;
  q.recompute.granularity = RecomputeGranularity::full;
  q.recompute.method = RecomputeMethod::uniform;
  q.recompute.num_layers = 1;
  q.cp_comm = CpCommType::all_gather;
  q.attention = AttentionKernel::unfused;
  q.etp = 1;
  CHECK(format_inline_plan(q) ==
        "etp=1,recompute=full,recompute_method=uniform,recompute_layers=1,attention=unfused,cp_comm=all-gather");
}

TEST_CASE("The all-default plan formats as tp=1 so that it parses back", "[config]") {
  CHECK(format_inline_plan(PlanSpec{}) == "tp=1");
  auto r = parse_inline_plan(format_inline_plan(PlanSpec{}));
  REQUIRE(r.has_value());
  CHECK(*r == PlanSpec{});
}

TEST_CASE("Parsing the canonical inline form gives back the same plan", "[config]") {
  std::vector<PlanSpec> plans;
  plans.emplace_back();
  {
    PlanSpec p;
    p.tp = 8;
    p.pp = 8;
    p.vpp = 3;
    p.microbatch_group = 12;
    p.dp = 16;
    p.sequence_parallel = true;
    p.recompute.granularity = RecomputeGranularity::selective;
    p.distributed_optimizer = true;
    p.schedule = Schedule::interleaved;
    plans.push_back(p);
  }
  {
    PlanSpec p;
    p.tp = 2;
    p.pp = 16;
    p.first_stage_layers = 3;
    p.last_stage_layers = 2;
    p.cp = 4;
    p.ep = 64;
    p.etp = 1;
    p.micro_batch_size = 2;
    p.recompute = Recompute{RecomputeGranularity::full, RecomputeMethod::block, 4};
    p.overlap_grad_reduce = true;
    p.overlap_param_gather = true;
    p.tp_comm_overlap = true;
    p.schedule = Schedule::dualpipev;
    p.vpp = 2;
    p.attention = AttentionKernel::unfused;
    p.cp_comm = CpCommType::all_gather;
    plans.push_back(p);
  }
  {
    PlanSpec p;  // options set without the granularity that uses them
    p.recompute.method = RecomputeMethod::uniform;
    p.recompute.num_layers = 1;
    p.schedule = Schedule::gpipe;
    plans.push_back(p);
  }
  {
    PlanSpec p;
    p.schedule = Schedule::zb_h1;
    p.dp = 1;
    p.pp = 4;
    plans.push_back(p);
  }
  {
    PlanSpec p;
    p.pp = 8;
    p.vpp = 8;
    p.schedule = Schedule::interleaved;
    p.embedding_in_split = true;
    p.loss_in_split = true;
    plans.push_back(p);
    p.schedule = Schedule::zb_h2;
    p.vpp.reset();
    p.post_validation = true;
    plans.push_back(p);
  }
  {
    PlanSpec p;   // a layout with Megatron-Core's cosmetic commas, between other keys
    p.pp = 16;
    p.layout = "Et*3|(tt|)*29,m|L";
    p.micro_batch_size = 2;
    plans.push_back(p);
  }
  for (const PlanSpec& p : plans) {
    const std::string text = format_inline_plan(p);
    INFO(text);
    auto back = parse_inline_plan(text);
    REQUIRE(back.has_value());
    CHECK(*back == p);
  }
}

TEST_CASE("Plans that differ in any one field compare unequal", "[config]") {
  const PlanSpec base;
  std::vector<PlanSpec> variants(32, base);
  variants[0].tp = 2;
  variants[1].pp = 2;
  variants[2].vpp = 1;
  variants[3].first_stage_layers = 1;
  variants[4].last_stage_layers = 1;
  variants[5].dp = 1;
  variants[6].cp = 2;
  variants[7].ep = 2;
  variants[8].etp = 1;
  variants[9].micro_batch_size = 2;
  variants[10].sequence_parallel = true;
  variants[11].recompute.num_layers = 1;
  variants[12].distributed_optimizer = true;
  variants[13].overlap_grad_reduce = true;
  variants[14].overlap_param_gather = true;
  variants[15].tp_comm_overlap = true;
  variants[16].schedule = Schedule::gpipe;
  variants[17].attention = AttentionKernel::unfused;
  variants[18].cp_comm = CpCommType::all_gather;
  variants[19].tp_grad_overlap = false;
  variants[20].grad_accum_fusion = false;
  variants[21].pp_scatter_gather = true;
  variants[22].overlap_p2p_comm = false;
  variants[23].overlap_p2p_comm = true;
  variants[24].moe_shared_expert_overlap = true;
  variants[25].moe_dispatcher = MoeDispatcher::allgather;
  variants[26].embedding_in_split = true;
  variants[27].loss_in_split = true;
  variants[28].layout = "EtL";
  variants[29].post_validation = true;
  variants[30].microbatch_group = 4;
  variants[31].moe_ep_overlap = true;
  CHECK(base == PlanSpec{});
  for (std::size_t i = 0; i < variants.size(); ++i) {
    INFO("variant " << i);
    CHECK_FALSE(variants[i] == base);
  }
  CHECK_FALSE(Recompute{RecomputeGranularity::full, std::nullopt, std::nullopt} == Recompute{});
  CHECK_FALSE(Recompute{RecomputeGranularity::none, RecomputeMethod::block, std::nullopt} == Recompute{});
}

TEST_CASE("layout: kept as written, commas and all, and a syntax error names plan.layout", "[config]") {
  auto p = parse_inline_plan("pp=16,layout=Et*3|(tt|)*29,m|L,mbs=2");
  REQUIRE(p);
  CHECK(p->layout == "Et*3|(tt|)*29,m|L");
  CHECK(p->micro_batch_size == 2);
  // An empty item after a layout is still an empty item.
  CHECK_FALSE(parse_inline_plan("layout=EtL,,pp=2"));
  CHECK_FALSE(parse_inline_plan("pp=2,layout=EtL,"));
  auto bad = parse_inline_plan("pp=4,layout=Et|tx|L");
  REQUIRE_FALSE(bad);
  CHECK(bad.error().field == "plan.layout");
  CHECK_THAT(bad.error().message, Catch::Contains("unknown layer character 'x'"));
}

TEST_CASE("ZeRO keys round-trip through the inline form and zero turns the distributed optimizer on", "[config][zero]") {
  auto p = parse_inline_plan("zero=3,fsdp_prefetch=0,reshard_after_forward=off,grad_bucket=500000000,fp8_param_gather=on");
  REQUIRE(p);
  CHECK(p->zero == 3);
  CHECK(p->distributed_optimizer);
  CHECK(zero_stage(*p) == 3);
  CHECK(format_inline_plan(*p) ==
        "distopt=on,zero=3,reshard_after_forward=off,fsdp_prefetch=0,fp8_param_gather=on,grad_bucket=500000000");
  CHECK(*parse_inline_plan(format_inline_plan(*p)) == *p);
  CHECK(zero_stage(*parse_inline_plan("distopt=on")) == 1);
  for (const char* bad : {"zero=4", "zero=-1", "zero=two", "fsdp_prefetch=x", "grad_bucket=0"}) {
    INFO(bad);
    const auto e = parse_inline_plan(bad);
    REQUIRE_FALSE(e);
    CHECK(e.error().field == "plan." + std::string(bad).substr(0, std::string(bad).find('=')));
  }
}
