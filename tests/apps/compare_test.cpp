// `megascope compare`: a trace from `megascope simulate --trace` against a
// "measured" one made from it by scaling known spans, so that every reported
// error is known in advance; traces of different plans refused; partial
// traces and malformed files reported with the file name.
#include "apps/compare.hpp"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apps/scenario.hpp"
#include "cli_runner.hpp"
#include "config/trace_file.hpp"
#include "core/program/builder.hpp"
#include "core/trace.hpp"

namespace {

using megascope::test::Run;
using megascope::test::run;
namespace fs = std::filesystem;
namespace ms = megascope;

// gpt-1.7b on 8 A100s: tp 2, pp 2, dp 2, 4 micro-batches; reduced mode traces one rank per stage.
const std::string kPlan = "tp=2,pp=2,mbs=1,sp=on,distopt=on";
std::vector<std::string> simulate_args(const std::string& plan, const std::string& trace) {
  return {"simulate", "--model",        "gpt-1.7b", "--cluster", "dgx-a100", "--gpus",  "8",  "--plan",
          plan,       "--global-batch", "8",        "--seq-len", "1024",     "--trace", trace};
}

// A file in this process's scratch folder, removed when the tests end.
fs::path scratch(const std::string& name) {
  struct Folder {
    fs::path path = fs::temp_directory_path() / ("megascope-compare-test-" + std::to_string(getpid()));
    Folder() { fs::create_directories(path); }
    ~Folder() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  };
  static const Folder dir;
  return dir.path / name;
}

// The simulated trace of kPlan, written once.
const fs::path& simulated() {
  static const fs::path p = [] {
    const fs::path t = scratch("simulated.json");
    const Run r = run(simulate_args(kPlan, t.string()));
    INFO(r.err);
    REQUIRE(r.code == 0);
    return t;
  }();
  return p;
}

// A "measured" trace: the simulated spans of the kept ranks with compute (stream 0) durations times
// `compute`, communication unchanged, and the step time times `step`.
void write_measured(const fs::path& out, double compute, double step, const std::vector<int>& keep_ranks = {}) {
  auto t = ms::read_trace(simulated().string());
  REQUIRE(t);
  ms::cli::ScenarioOptions so;
  so.model = "gpt-1.7b";
  so.cluster = "dgx-a100";
  so.gpus = 8;
  so.plan = kPlan;
  so.global_batch = 8;
  so.seq_len = 1024;
  auto sc = ms::cli::load_scenario(so);
  REQUIRE(sc);
  auto program = ms::build_program(sc->setup);
  REQUIRE(program);
  std::vector<ms::Span> spans;
  for (const ms::TraceRecord& r : t->spans) {
    const double dur = (r.end_s - r.start_s) * (r.stream == 0 ? compute : 1.0);
    spans.push_back({r.rank, r.op, r.start_s, r.start_s + dur});
  }
  ms::TraceInfo info = t->info;
  info.source = ms::TraceSource::measured;
  info.step_time_s *= step;
  REQUIRE(ms::write_trace(out.string(), *program, info, keep_ranks.empty() ? t->ranks : keep_ranks, spans));
}

}  // namespace

TEST_CASE("compare reports the step time error and, per op kind, exactly the scaling applied to the measured trace",
          "[apps]") {
  const fs::path measured = scratch("measured.json");
  write_measured(measured, 1.1, 1.2);
  const Run r = run({"compare", simulated().string(), measured.string(), "--json"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j.at("simulated").at("source") == "simulated");
  CHECK(j.at("measured").at("source") == "measured");
  CHECK(j.at("step_time").at("error").get<double>() == Approx(1 / 1.2 - 1));
  CHECK(j.at("matched").at("ranks") == nlohmann::json::array({0, 4}));  // one rank per stage (tp 2, dp 2 before pp)
  CHECK(j.at("unmatched").at("simulated_spans") == 0);
  CHECK(j.at("unmatched").at("measured_spans") == 0);

  // Expected sums per kind straight from the simulated file.
  auto t = ms::read_trace(simulated().string());
  REQUIRE(t);
  struct Expect {
    std::size_t count = 0;
    double seconds = 0;
    bool compute = false;
  };
  std::map<std::string, Expect> expect;
  for (const auto& s : t->spans) {
    Expect& e = expect[ms::cli::op_kind(s)];
    ++e.count;
    e.seconds += s.end_s - s.start_s;
    e.compute = s.stream == 0;
  }
  const auto& kinds = j.at("kinds");
  REQUIRE(kinds.size() == expect.size());
  bool compute = false, comm = false;
  double abs = 0, measured_total = 0;
  for (const auto& k : kinds) {
    const std::string kind = k.at("kind");
    INFO(kind);
    REQUIRE(expect.count(kind));
    CHECK(k.at("count").get<std::size_t>() == expect[kind].count);
    CHECK(k.at("simulated_s").get<double>() == Approx(expect[kind].seconds));
    const bool is_compute = expect[kind].compute;
    // Traces keep whole nanoseconds: a few-microsecond op is exact to 1e-4 or so.
    if (k.at("measured_s").get<double>() > 0)
      CHECK(k.at("error").get<double>() == Approx(is_compute ? 1 / 1.1 - 1 : 0.0).margin(1e-3));
    compute |= is_compute;
    comm |= !is_compute;
    abs += std::abs(k.at("simulated_s").get<double>() - k.at("measured_s").get<double>());
    measured_total += k.at("measured_s").get<double>();
  }
  CHECK(compute);
  CHECK(comm);
  for (const char* kind : {"forward attention", "backward_input mlp", "backward_weight mlp", "optimizer",
                           "tp reduce-scatter", "dp-grad reduce-scatter", "pp-activation send"})
    CHECK(expect.count(kind));
  CHECK(j.at("mean_abs_error_by_kind").get<double>() == Approx(abs / measured_total));
  CHECK(j.at("mean_abs_error_by_kind").get<double>() > 0.01);

  // The text report says the same.
  const Run text = run({"compare", simulated().string(), measured.string()});
  REQUIRE(text.code == 0);
  CHECK_THAT(text.out, Catch::Contains("step time") && Catch::Contains("error -16.7%") &&
                           Catch::Contains("forward attention") && Catch::Contains("-9.1%"));
}

TEST_CASE("compare counts spans traced in one file only and says why", "[apps]") {
  const fs::path measured = scratch("one-rank.json");
  write_measured(measured, 1.0, 1.0, {0});
  const Run r = run({"compare", simulated().string(), measured.string(), "--json"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j.at("matched").at("ranks") == nlohmann::json::array({0}));
  CHECK(j.at("unmatched").at("simulated_spans").get<std::size_t>() > 0);
  CHECK(j.at("unmatched").at("measured_spans") == 0);
  CHECK(j.at("mean_abs_error_by_op").get<double>() == Approx(0.0).margin(1e-9));
  CHECK_THAT(j.at("unmatched").at("notes").dump(),
             Catch::Contains("on ranks 4 that") && Catch::Contains("one-rank.json"));
}

TEST_CASE("compare refuses traces of different plans unless --force, naming both files", "[apps]") {
  const fs::path other = scratch("other-plan.json");
  const Run s = run(simulate_args("tp=2,pp=1,mbs=1", other.string()));
  REQUIRE(s.code == 0);
  const Run r = run({"compare", simulated().string(), other.string()});
  CHECK(r.code == 1);
  CHECK(r.out.empty());
  CHECK_THAT(r.err, Catch::Contains("megascope compare: error:") && Catch::Contains("different plans") &&
                        Catch::Contains("simulated.json") && Catch::Contains("other-plan.json") &&
                        Catch::Contains("--force"));
  const Run forced = run({"compare", simulated().string(), other.string(), "--force", "--json"});
  INFO(forced.err);
  REQUIRE(forced.code == 0);
  const auto j = nlohmann::json::parse(forced.out);
  CHECK(j.at("unmatched").at("differing_ops").get<std::size_t>() > 0);
}

TEST_CASE("compare refuses malformed or foreign files with one error naming the file", "[apps]") {
  const fs::path bad = scratch("not-json.json"), foreign = scratch("foreign.json"), missing = scratch("missing.json");
  std::ofstream(bad) << "{\"traceEvents\": [";
  std::ofstream(foreign) << "{\"traceEvents\": []}";
  for (const auto& [file, words] : std::vector<std::pair<fs::path, std::string>>{
           {bad, "not JSON"}, {foreign, "not a Megascope trace"}, {missing, "cannot open"}}) {
    const Run r = run({"compare", simulated().string(), file.string()});
    INFO(r.err);
    CHECK(r.code == 1);
    CHECK(r.out.empty());
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK_THAT(r.err, Catch::Contains(file.string()) && Catch::Contains(words));
  }
  const Run usage = run({"compare", simulated().string()});
  CHECK(usage.code == 2);
}
