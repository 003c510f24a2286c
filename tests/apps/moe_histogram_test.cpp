// --moe-histogram on simulate, plan and sweep: a measured per-expert token
// distribution sets the busiest EP rank's load (config/token_histogram.hpp),
// and a malformed file stops the command with its file and line.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "cli_runner.hpp"

using megascope::test::Run;
using megascope::test::run;
using megascope::test::printed;

namespace {

// Qwen3-30B-A3B's 128 experts: the first 16 (EP rank 0's on ep 8) take `hot`
// tokens each, the others 100.
std::string histogram(double hot) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("megascope-qwen-hist-" + std::to_string(hot) + ".txt")).string();
  std::ofstream f(path);
  f << "# one layer\n";
  for (int e = 0; e < 128; ++e) f << (e ? "," : "") << (e < 16 ? hot : 100.0);
  f << "\n";
  return path;
}

double tokens_per_s(const Run& r) {
  REQUIRE(printed(r));
  return nlohmann::json::parse(r.out)["tokens_per_s"].get<double>();
}

}  // namespace

TEST_CASE("simulate --moe-histogram: a measured skew slows the run as the busiest EP rank's load says, a uniform one "
          "changes nothing",
          "[apps]") {
  const std::vector<std::string> base = {"simulate", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus", "8",
                                         "--plan", "tp=1,ep=8", "--global-batch", "16", "--json"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return run(a);
  };
  const double balanced = tokens_per_s(with({}));
  CHECK(tokens_per_s(with({"--moe-histogram", histogram(100)})) == Approx(balanced).epsilon(1e-9));
  // Rank 0's experts take 2x their share: load (16 x 200) / (128 x 100 + 16 x 100) x 8 = 1.78, as --moe-imbalance 1.78.
  const Run hot = with({"--moe-histogram", histogram(200)});
  const double skewed = tokens_per_s(hot);
  CHECK(nlohmann::json::parse(hot.out)["setup"]["expert_load"].get<double>() == Approx(3200.0 / 1800.0));
  CHECK(skewed < 0.95 * balanced);
  CHECK(skewed == Approx(tokens_per_s(with({"--moe-imbalance", std::to_string(16.0 * 200 / (14400.0 / 8))}))).epsilon(1e-6));
}

TEST_CASE("A malformed --moe-histogram stops simulate and plan with the file, the line and the rule", "[apps]") {
  const std::string path = (std::filesystem::temp_directory_path() / "megascope-bad-hist.txt").string();
  std::ofstream(path) << "1,2,3\n";
  const Run sim = run({"simulate", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus", "8", "--plan",
                       "tp=1,ep=8", "--global-batch", "16", "--moe-histogram", path});
  CHECK(sim.code != 0);
  CHECK_THAT(sim.err, Catch::Contains(path) && Catch::Contains("model.moe.token_histogram") &&
                          Catch::Contains("the model has 128 experts"));
  std::ofstream(path) << "1,2\n1,x\n";
  const Run plan = run({"plan", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch",
                        "16", "--moe-histogram", path});
  CHECK(plan.code != 0);
  CHECK_THAT(plan.err, Catch::Contains(path + ":2") && Catch::Contains("count 2 ('x')"));
}

TEST_CASE("sweep --moe-histogram: the measured skew slows every point as plan's does, and a sweep without experts "
          "refuses it", "[apps]") {
  const std::vector<std::string> base = {"sweep", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus", "8",
                                         "--global-batch", "16", "--ep", "8", "--tp", "1", "--json", "--threads", "1"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    const Run r = run(a);
    INFO(r.err);
    REQUIRE(r.code == 0);
    return nlohmann::json::parse(r.out).at("points").at(0).at("tokens_per_s").get<double>();
  };
  const double balanced = with({});
  CHECK(with({"--moe-histogram", histogram(100)}) == Approx(balanced).epsilon(1e-9));
  const double skewed = with({"--moe-histogram", histogram(200)});
  CHECK(skewed < 0.95 * balanced);
  CHECK(skewed == Approx(with({"--moe-imbalance", std::to_string(16.0 * 200 / (14400.0 / 8))})).epsilon(1e-6));
  const Run dense = run({"sweep", "--model", "gpt-1.7b", "--cluster", "dgx-a100", "--gpus", "8", "--global-batch", "16",
                         "--moe-histogram", histogram(100)});
  CHECK(dense.code != 0);
  CHECK_THAT(dense.err, Catch::Contains("--moe-histogram") && Catch::Contains("no model of the sweep has experts"));
}
