// `megascope plan`, run in-process: the ranked table in its three formats,
// determinism, the Megatron-LM arguments of the winner, --explain, and one
// clear error for bad constraints.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "apps/cli.hpp"
#include "cli_runner.hpp"
#include "config/library.hpp"
#include "config/megatron_args.hpp"
#include "config/plan_settings.hpp"


namespace {

using megascope::test::Run;
using megascope::test::run;

const std::vector<std::string> kSmall = {"plan", "--model", "gpt-7.5b", "--cluster", "dgx-a100", "--gpus", "64",
                                         "--global-batch", "128", "--top", "6", "--no-progress"};

std::vector<std::string> with(std::vector<std::string> a, std::initializer_list<std::string> more) {
  a.insert(a.end(), more);
  return a;
}

}  // namespace

TEST_CASE("plan --json ranks simulated plans fastest first, all fitting, with counts that add up", "[apps]") {
  const Run r = run(with(kSmall, {"--json"}));
  INFO(r.err);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  const auto& ranked = j.at("ranked");
  REQUIRE(ranked.size() == 6);
  double prev = 0;
  for (const auto& p : ranked) {
    const double step = p.at("step_time_s").get<double>();
    CHECK(step >= prev);
    prev = step;
    CHECK(p.at("headroom_bytes").get<double>() >= 2.0 * 1024 * 1024 * 1024);
    CHECK(p.at("mfu").get<double>() > 0.1);
    CHECK(p.at("mfu").get<double>() < 1.0);
    CHECK(p.at("tokens_per_s").get<double>() == Approx(128.0 * 2048 / step));
    CHECK(p.at("gpus").get<int>() == 64);
  }
  const auto& c = j.at("considered");
  CHECK(c.at("evaluated").get<std::uint64_t>() ==
        c.at("rejected_memory").get<std::uint64_t>() + c.at("fitting").get<std::uint64_t>());
  CHECK(c.at("structural").get<std::uint64_t>() >=
        c.at("rejected_divisibility").get<std::uint64_t>() + c.at("rejected_constraint").get<std::uint64_t>());
  CHECK(c.at("rejected_divisibility").get<std::uint64_t>() > 0);
  CHECK(c.at("rejected_constraint").get<std::uint64_t>() > 0);   // tp = 16, 32, 64 leave the 8-GPU NVLink domain
  CHECK_FALSE(j.at("bounded_by").empty());

  // The winner's Megatron-LM arguments import back to the winner's plan.
  const std::string args = j.at("megatron_args").get<std::string>();
  REQUIRE_FALSE(args.empty());
  auto imported = megascope::import_megatron_args(args);
  REQUIRE(imported);
  CHECK(imported->plan.tp == megascope::parse_inline_plan(ranked[0].at("plan").get<std::string>())->tp);
  CHECK(imported->training.global_batch_size == 128);
}

TEST_CASE("plan output is deterministic, whatever the number of threads", "[apps]") {
  const Run a = run(with(kSmall, {"--csv", "--threads", "1"}));
  const Run b = run(with(kSmall, {"--csv", "--threads", "2"}));
  const Run c = run(with(kSmall, {"--csv", "--threads", "3"}));   // stage 1 deals its tuples three ways
  REQUIRE(a.code == 0);
  CHECK(a.out == b.out);
  CHECK(a.out == c.out);
  CHECK(std::count(a.out.begin(), a.out.end(), '\n') == 7);   // header + 6 rows
  CHECK(a.out.rfind("rank,plan,gpus,tokens_per_s", 0) == 0);
}

TEST_CASE("plan --explain places a given plan among the simulated ones and says why it is slower", "[apps]") {
  const Run r = run(with(kSmall, {"--explain", "tp=4,pp=2,mbs=1,recompute=full,recompute_method=uniform,recompute_layers=1"}));
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("explain tp=4,pp=2") && Catch::Contains("among the 7 simulated plans") &&
                        Catch::Contains("slower than the best plan") && Catch::Contains("compute on the busiest stage"));
  CHECK_THAT(r.out, Catch::Contains("Megatron-LM arguments:") && Catch::Contains("--tensor-model-parallel-size"));
  // Its split does better with the rest of the plan open: named, with that plan and its time.
  CHECK_THAT(r.out, Catch::Contains("its split (tp 4, pp 2, dp 8) does better with other settings:") &&
                        Catch::Contains("    tp=4,pp=2,"));
  const Run j = run(with(kSmall, {"--json", "--explain", "tp=4,pp=2,mbs=1,recompute=full,recompute_method=uniform,recompute_layers=1"}));
  REQUIRE(j.code == 0);
  const auto e = nlohmann::json::parse(j.out).at("explain");
  REQUIRE(e.contains("split_best"));
  CHECK_THAT(e.at("split_best").at("plan").get<std::string>(), Catch::StartsWith("tp=4,pp=2,"));
  CHECK(e.at("split_best").at("step_time_s").get<double>() < e.at("result").at("step_time_s").get<double>());
  // The winner is the best of its split: no such line.
  const auto ranked = nlohmann::json::parse(run(with(kSmall, {"--json"})).out).at("ranked");
  const Run best = run(with(kSmall, {"--explain", ranked.at(0).at("plan").get<std::string>()}));
  REQUIRE(best.code == 0);
  CHECK_THAT(best.out, Catch::Contains("as fast as the search's best plan") && !Catch::Contains("its split"));

  // An uneven plan that sets only the last stage (36 layers: 5 on each of the first 7, 1 on the last)
  // is the enumerated split (5, 1): it gets a stage-1 rank too.
  const Run one = run(with(kSmall, {"--explain", "tp=8,pp=8,last_stage_layers=1"}));
  REQUIRE(one.code == 0);
  CHECK_THAT(one.out, Catch::Contains("explain tp=8,pp=8,last_stage_layers=1") &&
                          Catch::Contains("fitting plans by the stage-1 estimate"));

  const Run bad = run(with(kSmall, {"--explain", "tp=3"}));
  REQUIRE(bad.code == 0);
  CHECK_THAT(bad.out, Catch::Contains("not a legal plan") && Catch::Contains("divisible by tp"));
}

TEST_CASE("plan constraints are honoured and bad ones are one clear error", "[apps]") {
  const Run r = run(with(kSmall, {"--json", "--tp", "2", "--pp", "1-2", "--schedules", "1f1b", "--recompute", "selective"}));
  REQUIRE(r.code == 0);
  for (const auto& p : nlohmann::json::parse(r.out).at("ranked")) {
    const std::string plan = p.at("plan").get<std::string>();
    CHECK_THAT(plan, Catch::Contains("tp=2") && Catch::Contains("recompute=selective"));
    CHECK_THAT(plan, !Catch::Contains("interleaved") && !Catch::Contains("pp=4"));
  }
  for (auto [args, words] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--tp", "0"}, "--tp"},
           {{"--schedules", "2f2b"}, "--schedules"},
           {{"--sp", "maybe"}, "--sp"},
           {{"--headroom", "-1"}, "--headroom"},
           {{"--headroom", "nan"}, "--headroom"},
           {{"--headroom", "1e308"}, "--headroom: must be a number of GiB from 0 to 1048576"},   // inf bytes before
           {{"--uneven-stages", "some"}, "--uneven-stages"},
           {{"--uneven-depth", "-1"}, "--uneven-depth"},
           {{"--uneven-depth", "100000"}, "--uneven-depth"},
           {{"--max-gpus", "2147483647"}, "--max-gpus"},
           {{"--gpus", "0"}, "--gpus"}}) {
    std::vector<std::string> a = kSmall;
    // --gpus is in kSmall already: replace it rather than repeat it.
    if (args.front() == "--gpus") a[6] = args[1];
    else if (args.front() == "--max-gpus") a[5] = args[0], a[6] = args[1];   // it excludes --gpus
    else a.insert(a.end(), args.begin(), args.end());
    const Run e = run(a);
    INFO(e.err);
    CHECK(e.code == 1);
    CHECK(e.out.empty());
    CHECK_THAT(e.err, Catch::Contains("megascope plan: error:") && Catch::Contains(words));
  }
}

TEST_CASE("plan --uneven-stages: a pipeline that does not divide the layers gets lighter first/last stages", "[apps]") {
  // gpt-7.5b has 36 layers: pp = 8 splits only unevenly (36 = f + 6 x mid + l).
  const std::vector<std::string> a = {"plan", "--model", "gpt-7.5b", "--cluster", "dgx-a100", "--gpus", "64",
                                      "--global-batch", "128", "--top", "4", "--no-progress", "--json",
                                      "--pp", "8", "--tp", "8", "--schedules", "1f1b"};
  const Run r = run(a);
  INFO(r.err);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  REQUIRE_FALSE(j.at("ranked").empty());
  for (const auto& p : j.at("ranked")) {
    auto plan = megascope::parse_inline_plan(p.at("plan").get<std::string>());
    REQUIRE(plan);
    REQUIRE(plan->first_stage_layers);
    REQUIRE(plan->last_stage_layers);
    const int middle = (36 - *plan->first_stage_layers - *plan->last_stage_layers) / 6;
    CHECK(*plan->first_stage_layers + *plan->last_stage_layers + 6 * middle == 36);
    CHECK(*plan->first_stage_layers <= middle);
    CHECK(*plan->last_stage_layers <= middle);
  }
  std::vector<std::string> off = a;
  off.insert(off.end(), {"--uneven-stages", "off"});
  const Run none = run(off);
  REQUIRE(none.code == 4);
  CHECK(nlohmann::json::parse(none.out).at("ranked").empty());   // no even split of 36 layers over 8 ranks
}

TEST_CASE("plan says whether no plan is legal or no legal plan fits in memory", "[apps]") {
  // 4096 GPUs for 8 sequences without CP: dp = 4096 / (tp x pp) >= 16 for every split of 36 layers.
  std::vector<std::string> none = with(kSmall, {"--cp", "1"});
  none[6] = "4096";
  none[8] = "8";
  const Run illegal = run(none);
  REQUIRE(illegal.code == 4);
  CHECK_THAT(illegal.out, Catch::Contains("no legal plan") && !Catch::Contains("fits in memory"));
  CHECK_THAT(illegal.out, Catch::Contains(" 0 plans with every"));
  // A 175B model on one node fits nowhere.
  const Run big = run({"plan", "--model", "gpt3-175b", "--cluster", "dgx-a100", "--gpus", "8", "--global-batch", "8",
                       "--no-progress"});
  REQUIRE(big.code == 4);
  CHECK_THAT(big.out, Catch::Contains("no plan fits in memory") && Catch::Contains("best plan rejected for memory"));
}

TEST_CASE("plan --training takes the number formats and the precision-aware optimizer from a [training] table", "[apps]") {
  const std::string file = "megascope-plan-training.toml";
  std::ofstream(file) << "[training]\nglobal_batch_size = 128\nprecision_aware_optimizer = true\nexp_avg_dtype = \"bf16\"\n"
                         "exp_avg_sq_dtype = \"bf16\"\n";
  const std::vector<std::string> base = {"plan", "--model", "gpt-7.5b", "--cluster", "dgx-a100", "--gpus", "64",
                                         "--top", "6", "--no-progress"};
  const Run r = run(with(base, {"--training", file, "--json"}));
  INFO(r.err);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j.at("global_batch").get<int>() == 128);
  CHECK(j.at("training").at("precision_aware_optimizer").get<bool>());
  CHECK(j.at("training").at("exp_avg_dtype").get<std::string>() == "bf16");
  REQUIRE_FALSE(j.at("ranked").empty());
  for (const auto& p : j.at("ranked")) CHECK_THAT(p.at("plan").get<std::string>(), Catch::Contains("distopt=on"));
  const std::string args = j.at("megatron_args").get<std::string>();
  CHECK_THAT(args, Catch::Contains("--use-precision-aware-optimizer") && Catch::Contains("--exp-avg-dtype bf16"));
  // --global-batch overrides the file's; the text report names the optimizer.
  const Run t = run(with(base, {"--training", file, "--global-batch", "64"}));
  REQUIRE(t.code == 0);
  CHECK_THAT(t.out, Catch::Contains("global batch 64 x 2048") &&
                        Catch::Contains("training: precision-aware optimizer (moments bf16/bf16, master weights fp32 as remainders)"));
  // Neither a batch nor a file: one error naming --global-batch; a bad file names its field.
  const Run none = run(base);
  CHECK(none.code != 0);
  CHECK_THAT(none.err, Catch::Contains("--global-batch"));
  std::ofstream(file) << "[training]\nglobal_batch_size = 128\nexp_avg_dtype = \"bf16\"\n";
  const Run bad = run(with(base, {"--training", file}));
  CHECK(bad.code == 1);
  CHECK_THAT(bad.err, Catch::Contains("megascope-plan-training.toml") && Catch::Contains("training.exp_avg_dtype"));
  // A file without a batch takes --global-batch's; --distopt off against the optimizer is one clear error;
  // a rule the file breaks against the model names the file.
  std::ofstream(file) << "[training]\nprecision_aware_optimizer = true\n";
  const Run nobatch = run(with(base, {"--training", file, "--global-batch", "32", "--json"}));
  INFO(nobatch.err);
  REQUIRE(nobatch.code == 0);
  CHECK(nlohmann::json::parse(nobatch.out).at("global_batch").get<int>() == 32);
  const Run nodist = run(with(base, {"--training", file, "--global-batch", "32", "--distopt", "off"}));
  CHECK(nodist.code == 1);
  CHECK_THAT(nodist.err, Catch::Contains("--distopt") && Catch::Contains("precision-aware optimizer"));
  std::ofstream(file) << "[training]\nglobal_batch_size = 32\nseq_length = 4096\n";
  const Run longer = run(with(base, {"--training", file}));
  CHECK(longer.code == 1);
  CHECK_THAT(longer.err, Catch::Contains("training.seq_length") && Catch::Contains("(training from megascope-plan-training.toml)"));
  std::remove(file.c_str());
}
