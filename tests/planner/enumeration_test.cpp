// The search space against validate_setup(), exhaustively on small cases:
// every plan enumerate() emits is legal, and every legal plan of the brute-
// force cross product (restricted to the forms the planner enumerates) is
// emitted exactly once.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <map>
#include <set>
#include <tuple>

#include "config/plan_settings.hpp"
#include "core/models.hpp"
#include "planner/space.hpp"
#include "small_models.hpp"
#include "support.hpp"

using namespace megascope;
using namespace megascope::planner;

namespace {

using test::small_gpt;
using test::small_moe;

SearchInputs inputs(const ModelSpec& m, int gpus, std::int64_t batch) {
  SearchInputs in;
  in.model = m;
  in.cluster = *with_device_count(test::shipped_cluster("dgx-h100"), gpus);
  in.training.global_batch_size = batch;
  in.gpu_counts = {gpus};
  in.constraints.tp_in_scale_up = false;
  in.constraints.max_mbs = 4;
  in.constraints.schedules = {Schedule::gpipe, Schedule::one_f_one_b, Schedule::interleaved, Schedule::zb_h1,
                              Schedule::zb_v,  Schedule::dualpipe,     Schedule::dualpipev};
  return in;
}

// 16 GPUs, batch 16, every layer split of `mode` with these schedules and
// the other dimensions fixed (tp = cp = mbs = 1, no recomputation, no
// distributed optimizer or gradient overlap), for the split tests.
SearchInputs split_inputs(const ModelSpec& m, UnevenStages mode, std::vector<Schedule> schedules) {
  SearchInputs in = inputs(m, 16, 16);
  in.constraints.uneven = mode;
  in.constraints.tp = {{1}, {}, {}};
  in.constraints.cp = {{1}, {}, {}};
  in.constraints.mbs = {{1}, {}, {}};
  in.constraints.recompute = {RecomputeGranularity::none};
  in.constraints.distopt = false;
  in.constraints.overlap_grad_reduce = false;
  in.constraints.schedules = std::move(schedules);
  return in;
}

std::set<std::string> enumerated(const SearchInputs& in, Rejections& rej) {
  std::set<std::string> out;
  enumerate(in, rej, [&](const Candidate& c) {
    const std::string key = format_inline_plan(to_plan(c));
    INFO(key);
    REQUIRE(out.insert(key).second);   // emitted once
  });
  return out;
}

// What the planner enumerates for recomputation of a chunk of `chunk_layers`
// of a dense model without MLA: selective with the default core_attn and
// with layernorm.
std::vector<Recompute> recompute_forms(int chunk_layers) {
  std::vector<Recompute> r = {{RecomputeGranularity::none, {}, {}}, {RecomputeGranularity::selective, {}, {}},
                              {RecomputeGranularity::selective, {}, {}, kRecomputeLayernorm},
                              {RecomputeGranularity::full, RecomputeMethod::uniform, 1}};
  for (int k = 1; k < chunk_layers; ++k) r.push_back({RecomputeGranularity::full, RecomputeMethod::block, k});
  return r;
}

// The brute force's legal plans (in the planner's forms) against the enumerated ones, naming each difference.
void check_same(const std::set<std::string>& legal, const std::set<std::string>& got) {
  for (const std::string& k : legal) {
    INFO("legal but not enumerated: " << k);
    CHECK(got.count(k) == 1);
  }
  for (const std::string& k : got) {
    INFO("enumerated but not legal in the planner's forms: " << k);
    CHECK(legal.count(k) == 1);
  }
  CHECK(got.size() == legal.size());
}

}  // namespace

TEST_CASE("Every structural plan of a small dense model: enumerated exactly when validate_setup accepts it") {
  SearchInputs in = inputs(small_gpt(), 16, 16);
  // Options fixed so that the brute force stays small; the next test opens them.
  in.constraints.distopt = false;
  in.constraints.overlap_grad_reduce = false;
  in.constraints.overlap_param_gather = false;
  in.constraints.tp_comm_overlap = false;
  Rejections rej;
  const std::set<std::string> got = enumerated(in, rej);
  REQUIRE(!got.empty());

  std::set<std::string> legal;
  const ClusterSpec& cl = in.cluster;
  for (int tp = 1; tp <= 16; ++tp)
    for (int cp = 1; tp * cp <= 16; ++cp)
      for (int pp = 1; tp * cp * pp <= 16; ++pp)
        for (int vpp = 1; vpp <= 8; ++vpp)
          for (int mbs = 1; mbs <= 4; ++mbs)
            for (Schedule s : in.constraints.schedules)
              for (int sp = 0; sp < 2; ++sp)
                for (const Recompute& rc : recompute_forms(8)) {
                  PlanSpec p;
                  p.tp = tp;
                  p.cp = cp;
                  p.pp = pp;
                  p.vpp = vpp;
                  p.micro_batch_size = mbs;
                  p.schedule = s;
                  p.sequence_parallel = sp != 0;
                  p.recompute = rc;
                  auto setup = validate_setup(in.model, cl, in.training, p, 16);
                  if (!setup) continue;
                  // The planner's canonical forms: sp only with tp > 1, gpipe only with pp > 1,
                  // block recomputation below the chunk size.
                  if (sp && tp == 1) continue;
                  if (s == Schedule::gpipe && pp == 1) continue;
                  const int chunk = setup->chunks[0][0].count;
                  if (rc.granularity == RecomputeGranularity::full && rc.method == RecomputeMethod::block &&
                      *rc.num_layers >= chunk)
                    continue;
                  PlanSpec canon = p;
                  canon.dp = setup->dp;
                  if (canon.vpp == default_vpp(s) && s != Schedule::interleaved) canon.vpp.reset();
                  canon.overlap_p2p_warmup_flush = s == Schedule::interleaved;
                  legal.insert(format_inline_plan(canon));
                }
  check_same(legal, got);
  CHECK(rej.structural == rej.divisibility + rej.constraint +
                              (rej.structural - rej.divisibility - rej.constraint));   // counted, not guessed
  CHECK(rej.divisibility > 0);
}

TEST_CASE("Selective recomputation: core_attn, and every non-empty set of the other modules the model has, once, and with the option off core_attn only") {
  const auto module_sets = [](const ModelSpec& m, bool modules) {
    SearchInputs in = inputs(m, 8, 8);
    in.constraints.tp = {{1}, {}, {}};
    in.constraints.pp = {{1}, {}, {}};
    in.constraints.cp = {{1}, {}, {}};
    in.constraints.mbs = {{1}, {}, {}};
    in.constraints.recompute = {RecomputeGranularity::selective};
    in.constraints.recompute_modules = modules;
    Rejections rej;
    std::map<std::string, std::set<unsigned>> by_split;   // the rest of the plan -> its module sets
    enumerate(in, rej, [&](const Candidate& c) {
      const PlanSpec p = to_plan(c);
      REQUIRE(validate_setup(in.model, in.cluster, in.training, p, c.gpus));
      // The plan carries the set back: from_plan(to_plan(c)) is c's set.
      const std::optional<Candidate> back = from_plan(p, c.gpus, c.dp);
      REQUIRE(back);
      CHECK(back->recompute_modules == c.recompute_modules);
      PlanSpec rest = p;
      rest.recompute.modules.reset();
      const unsigned set = recompute_modules(p.recompute);
      REQUIRE(by_split[format_inline_plan(rest)].insert(set).second);   // each set once per plan
      // The default is written without the key, as Megatron-LM's default is.
      CHECK(p.recompute.modules.has_value() == (set != kRecomputeCoreAttn));
    });
    REQUIRE(!by_split.empty());
    std::set<unsigned> sets = by_split.begin()->second;
    for (const auto& [rest, s] : by_split) CHECK(s == sets);
    return sets;
  };
  // Dense: core_attn (the default) or layernorm.
  CHECK(module_sets(small_gpt(), true) == std::set<unsigned>{kRecomputeCoreAttn, kRecomputeLayernorm});
  CHECK(module_sets(small_gpt(), false) == std::set<unsigned>{kRecomputeCoreAttn});
  // MoE: moe_act or the whole MoE block (moe, which contains moe_act) join,
  // mla_up_proj does not (no MLA), core_attn only alone.
  CHECK(module_sets(small_moe(), true) ==
        std::set<unsigned>{kRecomputeCoreAttn, kRecomputeLayernorm, kRecomputeMoeAct, kRecomputeLayernorm | kRecomputeMoeAct,
                           kRecomputeMoe, kRecomputeLayernorm | kRecomputeMoe});
  // MLA and MoE (DeepSeek-V3): core_attn and the 11 sets of layernorm,
  // mla_up_proj and one of moe_act and moe.
  std::set<unsigned> mla = {kRecomputeCoreAttn};
  for (unsigned set = 1; set <= (kRecomputeLayernorm | kRecomputeMlaUpProj | kRecomputeMoeAct | kRecomputeMoe); ++set)
    if ((set & (kRecomputeCoreAttn | kRecomputeMlp)) == 0 &&
        (set & (kRecomputeMoeAct | kRecomputeMoe)) != (kRecomputeMoeAct | kRecomputeMoe))
      mla.insert(set);
  CHECK(mla.size() == 12);
  CHECK(module_sets(test::shipped_model("deepseek-v3"), true) == mla);
}

TEST_CASE("Only selective plans carry a module set") {
  SearchInputs in = inputs(small_moe(), 8, 8);
  in.constraints.mbs = {{1}, {}, {}};
  Rejections rej;
  int selective = 0;
  enumerate(in, rej, [&](const Candidate& c) {
    if (c.recompute != RecomputeGranularity::selective) {
      CHECK(c.recompute_modules == 0);
    } else {
      ++selective;
    }
  });
  CHECK(selective > 0);
}

TEST_CASE("Uneven first/last stages: every split within the depth, and only legal ones") {
  // small_gpt has 8 layers. Brute force: every (first, last) that validate_setup accepts, kept
  // when it is the planner's form (both set, the middle stages equal and holding at least as
  // many layers as the first and last, at most `depth` more) and not the even split.
  for (UnevenStages mode : {UnevenStages::automatic, UnevenStages::on}) {
    for (int depth : {1, 2, 4}) {
      SearchInputs in = split_inputs(small_gpt(), mode,
                                     {Schedule::one_f_one_b, Schedule::interleaved, Schedule::zb_h1, Schedule::zb_v});
      in.constraints.uneven_depth = depth;
      Rejections rej;
      std::set<std::string> got;
      enumerate(in, rej, [&](const Candidate& c) {
        if (c.first_layers > 0) REQUIRE(got.insert(format_inline_plan(to_plan(c))).second);
      });
      std::set<std::string> legal;
      const int L = 8;
      for (int pp : {2, 4, 8, 16})
        for (int first = 1; first <= L; ++first)
          for (int last = 1; last <= L; ++last)
            for (Schedule s : in.constraints.schedules)
              for (int vpp = 1; vpp <= 8; ++vpp) {
                PlanSpec p;
                p.pp = pp;
                p.first_stage_layers = first;
                p.last_stage_layers = last;
                p.schedule = s;
                p.vpp = vpp;
                auto setup = validate_setup(in.model, in.cluster, in.training, p, 16);
                if (!setup) continue;
                // zb-v's uneven keys name virtual stages; the planner balances V
                // splits by counting the embedding and loss instead (next test).
                if (s == Schedule::zb_v) continue;
                if (mode == UnevenStages::automatic && L % pp == 0) continue;
                if (L % pp == 0 && first == L / pp && last == L / pp) continue;
                const int mid = pp > 2 ? (L - first - last) / (pp - 2) : std::max(first, last);
                if (pp > 2 && (first > mid || last > mid || mid - first > depth || mid - last > depth)) continue;
                if (pp == 2 && std::abs(first - last) > depth) continue;
                PlanSpec canon = p;
                canon.dp = setup->dp;
                if (canon.vpp == default_vpp(s) && s != Schedule::interleaved) canon.vpp.reset();
                  canon.overlap_p2p_warmup_flush = s == Schedule::interleaved;
                legal.insert(format_inline_plan(canon));
              }
      INFO("mode " << to_string(mode) << ", depth " << depth);
      check_same(legal, got);
      // 8 layers divide every pp here: auto adds none; on adds some from depth 2 (pp = 2: 3 + 5).
      CHECK(got.empty() == (mode == UnevenStages::automatic || depth < 2));
    }
  }
  // 6 layers on pp = 4 split only unevenly: auto enumerates it.
  ModelSpec six = small_gpt();
  six.num_layers = 6;
  six = *validate_model(six);
  SearchInputs in = inputs(six, 4, 16);
  in.constraints.pp = {{4}, {}, {}};
  in.constraints.schedules = {Schedule::one_f_one_b};
  using SplitKey = std::tuple<int, int, bool, bool>;   // first, last, embedding and loss in the split
  std::set<SplitKey> splits;
  Rejections rej;
  const auto visit = [&](const Candidate& c) {
    splits.insert({c.first_layers, c.last_layers, c.embedding_in_split, c.loss_in_split});
  };
  enumerate(in, rej, visit);
  // 6 = f + l + 2 mid with f, l <= mid <= f + 4: mid 2 (1, 1); mid 3 none (f + l = 0).
  // 6 + 2 = 8 with the embedding and loss counted: 2 a rank (1 + 2 + 2 + 1).
  CHECK(splits == std::set<SplitKey>{{1, 1, false, false}, {0, 0, true, true}});
  in.constraints.uneven = UnevenStages::off;
  splits.clear();
  enumerate(in, rej, visit);
  CHECK(splits.empty());
}

TEST_CASE("Embedding and loss counted in the split: every legal split, with interleaving and zb-v, and only those") {
  ModelSpec ten = test::small_gpt();
  ten.num_layers = 10;
  ten = *validate_model(ten);
  for (UnevenStages mode : {UnevenStages::automatic, UnevenStages::on, UnevenStages::off}) {
    const SearchInputs in =
        split_inputs(ten, mode, {Schedule::one_f_one_b, Schedule::interleaved, Schedule::zb_v, Schedule::dualpipe});
    Rejections rej;
    std::set<std::string> got;
    enumerate(in, rej, [&](const Candidate& c) {
      if (c.embedding_in_split || c.loss_in_split) REQUIRE(got.insert(format_inline_plan(to_plan(c))).second);
    });
    std::set<std::string> legal;
    for (int pp : {2, 4, 8, 16})
      for (int e = 0; e < 2; ++e)
        for (int l = 0; l < 2; ++l)
          for (Schedule s : in.constraints.schedules)
            for (int vpp = 1; vpp <= 8; ++vpp) {
              if (!e && !l) continue;
              PlanSpec p;
              p.pp = pp;
              p.embedding_in_split = e != 0;
              p.loss_in_split = l != 0;
              p.schedule = s;
              p.vpp = vpp;
              auto setup = validate_setup(in.model, in.cluster, in.training, p, 16);
              if (!setup) continue;
              if (mode == UnevenStages::off || (mode == UnevenStages::automatic && 10 % pp == 0)) continue;
              PlanSpec canon = p;
              canon.dp = setup->dp;
              if (canon.vpp == default_vpp(s) && s != Schedule::interleaved) canon.vpp.reset();
                  canon.overlap_p2p_warmup_flush = s == Schedule::interleaved;
              legal.insert(format_inline_plan(canon));
            }
    INFO("mode " << to_string(mode));
    check_same(legal, got);
    // 10 + 2 = 12 over pp 4: 3 a rank, interleaved with vpp 3; auto takes it (4 does not divide 10).
    CHECK(got.count("pp=4,vpp=3,dp=4,overlap_p2p_warmup_flush=on,schedule=interleaved,embedding_in_split=on,loss_in_split=on") ==
          (mode == UnevenStages::off ? 0u : 1u));
    CHECK(got.empty() == (mode == UnevenStages::off));
  }
}

TEST_CASE("The optimizer and overlap options: every legal combination once, none that changes nothing") {
  SearchInputs in = inputs(small_gpt(), 8, 16);
  in.constraints.tp = {{2}, {}, {}};
  in.constraints.pp = {{2}, {}, {}};
  in.constraints.mbs = {{1}, {}, {}};
  in.constraints.schedules = {Schedule::one_f_one_b};
  in.constraints.recompute = {RecomputeGranularity::none};
  Rejections rej;
  const std::set<std::string> got = enumerated(in, rej);
  std::set<std::string> legal;
  for (int cp : {1, 2})
    for (int bits = 0; bits < 32; ++bits) {
      PlanSpec p;
      p.tp = 2;
      p.pp = 2;
      p.cp = cp;
      p.sequence_parallel = bits & 1;
      p.distributed_optimizer = bits & 2;
      p.overlap_grad_reduce = bits & 4;
      p.overlap_param_gather = bits & 8;
      p.tp_comm_overlap = bits & 16;
      auto s = validate_setup(in.model, in.cluster, in.training, p, 8);
      if (!s) continue;
      p.dp = s->dp;
      legal.insert(format_inline_plan(p));
    }
  CHECK(got == legal);
  // dp x cp = 2 in both cases: every flag matters, so 2 x (sp: 2 tp_comm_overlap forms + 1) x 5 optimizer forms.
  CHECK(got.size() == 2 * 3 * 5);
}

TEST_CASE("With the precision-aware optimizer every plan has the distributed optimizer, at dp = 1 too, and only legal ones") {
  SearchInputs in = inputs(small_gpt(), 8, 16);
  in.training.optimizer_precision.enabled = true;
  in.training.optimizer_precision.exp_avg = Dtype::bf16;
  in.constraints.mbs = {{1}, {}, {}};
  in.constraints.schedules = {Schedule::one_f_one_b};
  in.constraints.recompute = {RecomputeGranularity::none};
  Rejections rej;
  int at_dp1 = 0;
  std::size_t n = 0;
  enumerate(in, rej, [&](const Candidate& c) {
    const PlanSpec p = to_plan(c);
    INFO(format_inline_plan(p));
    CHECK(p.distributed_optimizer);
    CHECK(validate_setup(in.model, in.cluster, in.training, p, c.gpus));
    at_dp1 += c.dp * c.cp == 1;
    ++n;
  });
  CHECK(n > 0);
  CHECK(at_dp1 > 0);
  in.constraints.distopt = false;   // the user's constraint against the optimizer's rule: nothing left
  Rejections none;
  enumerate(in, none, [&](const Candidate& c) { FAIL(format_inline_plan(to_plan(c))); });
}

TEST_CASE("MoE: every legal ep x etp split of the stage is enumerated, and only those") {
  SearchInputs in = inputs(small_moe(), 8, 8);
  in.constraints.schedules = {Schedule::one_f_one_b};
  in.constraints.recompute = {RecomputeGranularity::none};
  in.constraints.distopt = false;
  in.constraints.overlap_grad_reduce = false;
  in.constraints.tp_comm_overlap = false;
  in.constraints.mbs = {{1}, {}, {}};
  Rejections rej;
  const std::set<std::string> got = enumerated(in, rej);
  std::set<std::string> legal;
  for (int tp = 1; tp <= 8; ++tp)
    for (int pp = 1; pp <= 8; ++pp)
      for (int cp = 1; cp <= 8; ++cp)
        for (int ep = 1; ep <= 8; ++ep)
          for (int etp = 1; etp <= 8; ++etp)
            for (int sp = 0; sp < 2; ++sp) {
              if (tp * pp * cp > 8 || (sp && tp == 1)) continue;
              PlanSpec p;
              p.tp = tp;
              p.pp = pp;
              p.cp = cp;
              p.ep = ep;
              p.etp = etp;
              p.sequence_parallel = sp != 0;
              auto s = validate_setup(in.model, in.cluster, in.training, p, 8);
              if (!s) continue;
              p.dp = s->dp;
              if (etp == tp) p.etp.reset();
              legal.insert(format_inline_plan(p));
            }
  CHECK(got == legal);
  bool some_ep = false;
  for (const auto& k : got) some_ep = some_ep || k.find("ep=") != std::string::npos;
  CHECK(some_ep);
}

TEST_CASE("Constraints bound the space and are counted as such") {
  SearchInputs in = inputs(small_gpt(), 16, 16);
  Rejections all_rej;
  const std::size_t all = enumerated(in, all_rej).size();
  in.constraints.tp = *parse_int_set("2-4", "--tp");
  in.constraints.min_dp = 2;
  Rejections rej;
  const std::set<std::string> some = enumerated(in, rej);
  CHECK(some.size() < all);
  CHECK(rej.constraint > all_rej.constraint);
  for (const std::string& k : some) {
    auto p = parse_inline_plan(k);
    REQUIRE(p);
    CHECK(p->tp >= 2);
    CHECK(p->tp <= 4);
    CHECK(*p->dp >= 2);
  }
  // TP inside the scale-up domain by default: an 8-GPU NVLink domain admits tp <= 8 only.
  SearchInputs d = inputs(small_gpt(), 16, 16);
  d.constraints.tp_in_scale_up = true;
  Rejections drej;
  for (const std::string& k : enumerated(d, drej)) CHECK(parse_inline_plan(k)->tp <= 8);
}

TEST_CASE("A micro-batch bound past the batch walks no further than the batch allows") {
  // --mbs 2147483647 once walked every micro-batch size up to it (and past INT_MAX).
  SearchInputs in = inputs(small_gpt(), 16, 16);
  Rejections base_rej;
  const std::set<std::string> base = enumerated(in, base_rej);
  for (const char* bound : {"1-2147483647", "<=2147483647"}) {
    INFO(bound);
    SearchInputs wide = in;
    wide.constraints.mbs = *parse_int_set(bound, "--mbs");
    Rejections rej;
    const std::set<std::string> got = enumerated(wide, rej);
    CHECK(got.size() >= base.size());   // the default caps mbs at 16; this bound only at the batch's share
    for (const std::string& k : got) CHECK(parse_inline_plan(k)->micro_batch_size * *parse_inline_plan(k)->dp <= 16);
    CHECK(rej.structural < 100000);
  }
  SearchInputs huge = in;
  huge.constraints.mbs = *parse_int_set("2147483647", "--mbs");
  Rejections hrej;
  CHECK(enumerated(huge, hrej).empty());
}

TEST_CASE("Value sets parse N, A-B, <=N, >=N and lists, and name the option when they do not") {
  CHECK(parse_int_set("8", "--tp")->contains(8));
  CHECK_FALSE(parse_int_set("8", "--tp")->contains(4));
  CHECK(parse_int_set("2-8", "--tp")->contains(5));
  CHECK_FALSE(parse_int_set("2-8", "--tp")->contains(9));
  CHECK(parse_int_set("<=4", "--pp")->contains(1));
  CHECK_FALSE(parse_int_set(">=4", "--pp")->contains(2));
  CHECK(parse_int_set("1,2,4", "--mbs")->contains(4));
  for (const char* bad : {"", "0", "a", "8-2", "1,,2", "-3", "2-"}) {
    auto r = parse_int_set(bad, "--tp");
    INFO(bad);
    REQUIRE_FALSE(r);
    CHECK(r.error().field == "--tp");
  }
  const auto counts = counts_up_to(test::shipped_cluster("dgx-a100"), 20);
  CHECK(counts == std::vector<int>{1, 2, 4, 8, 16});
}

TEST_CASE("ZeRO stages: every legal stage the constraints allow once, none where it changes nothing", "[zero]") {
  for (const bool tied : {true, false}) {
    ModelSpec m = small_gpt();
    m.tied_embeddings = tied;
    SearchInputs in = inputs(m, 8, 16);
    in.constraints.tp = {{2}, {}, {}};
    in.constraints.mbs = {{1}, {}, {}};
    in.constraints.cp = {{1}, {}, {}};
    in.constraints.schedules = {Schedule::one_f_one_b};
    in.constraints.recompute = {RecomputeGranularity::none};
    in.constraints.sp = true;
    in.constraints.tp_comm_overlap = false;
    in.constraints.zero = {0, 1, 2, 3};
    Rejections rej;
    const std::set<std::string> got = enumerated(in, rej);
    std::set<std::string> legal;
    for (int pp : {1, 2, 4})
      for (int zero = 0; zero <= 3; ++zero)
        for (int bits = 0; bits < 4; ++bits) {
          PlanSpec p;
          p.tp = 2;
          p.pp = pp;
          p.sequence_parallel = true;
          p.distributed_optimizer = zero >= 1;
          p.zero = zero >= 2 ? zero : 0;
          p.overlap_grad_reduce = bits & 1;
          p.overlap_param_gather = bits & 2;
          auto s = validate_setup(in.model, in.cluster, in.training, p, 8);
          // Options that change nothing without DP are enumerated once (off).
          if (!s || (s->dp == 1 && (zero > 0 || bits != 0))) continue;
          p.dp = s->dp;
          legal.insert(format_inline_plan(p));
        }
    INFO("tied " << tied);
    CHECK(got == legal);
    // ZeRO-3 appears exactly where validate_setup takes it: without pipelining when the embeddings are tied.
    std::size_t zero3 = 0, zero3_piped = 0;
    for (const std::string& plan : got)
      if (plan.find("zero=3") != std::string::npos) {
        ++zero3;
        zero3_piped += plan.find("pp=") != std::string::npos;
      }
    CHECK(zero3 > 0);
    CHECK((zero3_piped > 0) == !tied);
  }
}

TEST_CASE("Hybrid sharding: one replica per scale-up domain, where that is a proper divisor of DP x CP, stages 1-3 only",
          "[zero]") {
  SearchInputs in = inputs(small_gpt(), 32, 32);
  in.constraints.mbs = {{1}, {}, {}};
  in.constraints.schedules = {Schedule::one_f_one_b};
  in.constraints.recompute = {RecomputeGranularity::none};
  in.constraints.tp_comm_overlap = false;
  const int domain = in.cluster.scale_up_domain > 0 ? in.cluster.scale_up_domain : in.cluster.node.devices_per_node;
  REQUIRE(domain < 32);
  Rejections rej;
  std::size_t hybrid = 0, eligible = 0;
  std::set<std::string> with, without;   // plans with dp_replicas > 1, and their full-DP twins
  enumerate(in, rej, [&](const Candidate& c) {
    const PlanSpec p = to_plan(c);
    auto s = validate_setup(in.model, in.cluster, in.training, p, c.gpus);
    INFO(format_inline_plan(p));
    REQUIRE(s);
    const int members = c.dp * c.cp, shard = domain % c.tp == 0 ? domain / c.tp : 0;
    const bool proper = c.zero >= 1 && shard >= 2 && shard < members && members % shard == 0;
    if (c.dp_replicas > 1) {
      ++hybrid;
      CHECK(proper);
      CHECK(s->dp_shard == shard);   // a replica is the DP x CP members of one domain
      PlanSpec twin = p;
      twin.dp_replicas = 1;
      with.insert(format_inline_plan(twin));
    } else if (proper) {
      ++eligible;
      without.insert(format_inline_plan(p));
    }
  });
  CHECK(hybrid > 0);
  CHECK(hybrid == eligible);
  CHECK(with == without);   // every eligible plan also once with hybrid sharding
  // --hsdp off: none.
  in.constraints.hsdp = false;
  std::size_t off = 0;
  enumerate(in, rej, [&](const Candidate& c) { off += c.dp_replicas > 1; });
  CHECK(off == 0);
}
