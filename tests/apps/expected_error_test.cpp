// Expected error by class of run: the classes, the regimes file (the shipped
// one and broken ones, each refused with its file, line and key), and what
// simulate and plan print and return from it.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "apps/expected_error.hpp"
#include "cli_runner.hpp"
#include "support.hpp"

using namespace megascope;
using namespace megascope::cli;
using namespace megascope::test;

namespace {

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = (std::filesystem::temp_directory_path() / name).string();
  std::ofstream(path) << text;
  return path;
}

const char* kOne =
    "[[regime]]\ngeneration = \"hopper\"\nfp8 = true\nmoe = false\ncontext_parallel = false\nrows = 10\n"
    "mean_abs_error = 0.1\nsigned_mean_error = 0.05\nworst_abs_error = 0.2\nmax_published_mfu = 0.5\n"
    "tables = \"t\"\n";

}  // namespace

TEST_CASE("A run's class: the GPU generation of its device, FP8 or 16-bit GEMMs, dense or MoE, CP or not", "[apps]") {
  const Setup a100 = make_setup(shipped_model("gpt3-175b"), "dgx-a100", "tp=8,pp=8", 64, 64);
  CHECK(regime_of(a100) == Regime{"ampere", false, false, false});
  CHECK(describe(regime_of(a100)) == "Ampere, 16-bit, dense, without CP");
  const Setup h800 = make_setup(shipped_model("llama3-8b"), "dgx-h800", "tp=1,cp=2", 8, 8);
  CHECK(regime_of(h800) == Regime{"hopper", false, false, true});
  const Setup gb200 = make_setup(shipped_model("qwen3-30b-a3b"), "gb200-nvl72", "tp=1,ep=8", 8, 8);
  CHECK(regime_of(gb200) == Regime{"blackwell", false, true, false});
  // ZeRO-2/3 is a class of its own (the distributed optimizer, stage 1, is not).
  const Setup fsdp = make_setup(shipped_model("gpt3-175b"), "dgx-a100", "tp=8,zero=3", 64, 64);
  CHECK(regime_of(fsdp) == Regime{"ampere", false, false, false, true});
  CHECK(describe(regime_of(fsdp)) == "Ampere, 16-bit, dense, without CP, ZeRO-2/3");
  const Setup distopt = make_setup(shipped_model("gpt3-175b"), "dgx-a100", "tp=8,distopt=on", 64, 64);
  CHECK_FALSE(regime_of(distopt).sharded);
  const Setup cpu = make_setup(shipped_model("tiny-gpt"), "cpu-host", "tp=1", 2, 2);
  CHECK(regime_of(cpu).generation.empty());
  CHECK(describe(regime_of(cpu)) == "an unvalidated device, 16-bit, dense, without CP");
}

TEST_CASE("The shipped regimes file loads, and states the error of its class or that a class is not validated", "[apps]") {
  auto shipped = load_regimes(regimes_path());
  REQUIRE(shipped.has_value());
  REQUIRE_FALSE(shipped->empty());
  for (const RegimeStats& r : *shipped) {
    INFO(describe(r.regime));
    CHECK(r.rows >= 1);
    CHECK(r.mean_abs_error <= r.worst_abs_error);
  }
  auto regimes = load_regimes(write_file("megascope-regimes-one.toml", kOne));
  REQUIRE(regimes.has_value());
  REQUIRE(regimes->size() == 1);
  const Regime hopper_fp8{"hopper", true, false, false};
  const ExpectedError in = expected_error(hopper_fp8, 0.52, *regimes);
  REQUIRE(in.stats.has_value());
  CHECK_FALSE(in.above_published());
  CHECK(expected_error_text(in) == "throughput within 10.0% on average (10 published runs of this class, Hopper, FP8, "
                                   "dense, without CP: signed mean +5.0%, worst 20.0%; t)");
  const ExpectedError high = expected_error(hopper_fp8, 0.56, *regimes);
  CHECK(high.above_published());
  REQUIRE_THAT(expected_error_text(high), Catch::Contains("MFU 56.0% is above every published run of this class "
                                                          "(highest 50.0%)"));
  const nlohmann::json j = expected_error_json(high);
  CHECK(j["validated"] == true);
  CHECK(j["mfu_above_published"] == true);
  CHECK(j["published_runs"] == 10);
  const ExpectedError moe = expected_error(Regime{"hopper", true, true, false}, 0.3, *regimes);
  CHECK_FALSE(moe.stats.has_value());
  CHECK(expected_error_text(moe) == "not validated: no published run of this class (Hopper, FP8, MoE, without CP) has "
                                    "been predicted, so no error can be stated");
  CHECK(expected_error_json(moe)["validated"] == false);
}

TEST_CASE("A broken regimes file is refused with its file, line and key", "[apps]") {
  struct Case {
    std::string text, field, words;
  };
  const std::string one = kOne;
  const auto replace = [&](const std::string& from, const std::string& to) {
    std::string s = one;
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  for (const Case& c : {Case{replace("\"hopper\"", "\"kepler\""), "regime[0].generation", "volta, ampere, hopper"},
                        Case{replace("rows = 10", "rows = 0"), "regime[0].rows", "at least 1"},
                        Case{replace("worst_abs_error = 0.2", "worst_abs_error = 0.05"), "regime[0].worst_abs_error",
                             "mean_abs_error <= worst_abs_error"},
                        Case{replace("max_published_mfu = 0.5", "max_published_mfu = 1.5"),
                             "regime[0].max_published_mfu", "(0, 1]"},
                        Case{one + "colour = \"red\"\n", "regime[0].colour", "unknown"},
                        Case{replace("fp8 = true", "fp8 = \"yes\""), "regime[0].fp8", "boolean"},
                        Case{one + "\n" + one, "regime[1].generation", "a second [[regime]]"},
                        Case{"regime = 3\n", "regime", "array"}}) {
    INFO(c.text);
    const std::string path = write_file("megascope-regimes-bad.toml", c.text);
    auto r = load_regimes(path);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().field == c.field);
    REQUIRE(r.error().where.has_value());
    CHECK(r.error().where->file == path);
    REQUIRE_THAT(r.error().str(), Catch::Contains(c.words));
  }
  auto missing = load_regimes("/nonexistent/regimes.toml");
  REQUIRE_FALSE(missing.has_value());
}

TEST_CASE("simulate and plan state the expected error of their class", "[apps]") {
  const Run sim = run({"simulate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--plan", "tp=1",
                       "--global-batch", "16"});
  REQUIRE(printed(sim));
  REQUIRE_THAT(sim.out, Catch::Contains("  expected   throughput within"));
  REQUIRE_THAT(sim.out, Catch::Contains("of this class, Hopper, 16-bit, dense, without CP"));
  const Run moe = run({"simulate", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus", "8", "--plan",
                       "tp=1,ep=8", "--global-batch", "16", "--json"});
  REQUIRE(printed(moe));
  const nlohmann::json j = nlohmann::json::parse(moe.out);
  // Validated by the gpt-oss-120b BF16 rows of the Megatron-Bridge summaries.
  CHECK(j["expected_error"]["validated"] == true);
  CHECK(j["expected_error"]["class"] == "Hopper, 16-bit, MoE, without CP");
  const Run plan = run({"plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "16", "--cp", "1",
                        "--zero", "0,1", "--top", "2"});
  REQUIRE(plan.code == 0);
  REQUIRE_THAT(plan.out, Catch::Contains("  expected: throughput within"));
  // A ZeRO-3 pick states the ZeRO-2/3 class's error (Narayanan's ZeRO-3 rows on A100s), not PTD-P's.
  const Run fsdp = run({"plan", "--model", "gpt3-175b", "--cluster", "dgx-a100", "--gpus", "64", "--global-batch", "64",
                        "--zero", "3", "--top", "2", "--json"});
  REQUIRE(fsdp.code == 0);
  const nlohmann::json f = nlohmann::json::parse(fsdp.out);
  INFO(f.dump().substr(0, 2000));
  REQUIRE(f.contains("expected_error"));
  CHECK(f["expected_error"]["class"] == "Ampere, 16-bit, dense, without CP, ZeRO-2/3");
  CHECK(f["expected_error"]["validated"] == true);
}
