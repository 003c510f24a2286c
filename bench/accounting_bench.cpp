// accounting_bench: how fast Megascope validates a plan and accounts its
// parameters, FLOPs and memory, the work the planner's first stage repeats
// for every candidate. Prints a header row, a units row and one row per
// case (with a correctness column: the result equals a reference run), then
// the same rows as JSON. Not a test: no assertions on time.
//
//   ./build/bench/accounting_bench [--seconds S]
#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "config/library.hpp"
#include "config/plan_settings.hpp"
#include "core/accounting/flops.hpp"
#include "core/accounting/memory.hpp"

using namespace megascope;
using Clock = std::chrono::steady_clock;

namespace {

struct Case {
  const char* model;
  const char* cluster;
  const char* plan;
  std::int64_t batch;
  int gpus;
};

struct Row {
  std::string name;
  double evals_per_s = 0;
  double us_per_eval = 0;
  int stages = 0;
  bool ok = false;
};

}  // namespace

int main(int argc, char** argv) {
  double seconds = 1.0;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--seconds") == 0) seconds = std::stod(argv[i + 1]);

  const std::vector<Case> cases = {
      {"gpt3-175b", "dgx-a100", "tp=8,pp=8,vpp=3,schedule=interleaved,sp=on,recompute=selective,distopt=on", 1536, 1024},
      {"gpt-1t", "dgx-a100", "tp=8,pp=64,recompute=full,recompute_method=uniform,recompute_layers=1", 3072, 3072},
      {"llama3-70b", "dgx-h100", "tp=8,pp=4,sp=on,distopt=on", 128, 64},
      {"deepseek-v3", "dgx-h100", "tp=1,pp=8,ep=64,distopt=on,first_stage_layers=4,last_stage_layers=3", 15360, 2048},
  };
  std::vector<Row> rows;
  for (const Case& c : cases) {
    auto model = resolve_model(c.model);
    auto cluster = resolve_cluster(c.cluster);
    auto plan = parse_inline_plan(c.plan);
    if (!model || !cluster || !plan) {
      fmt::print(stderr, "cannot load case {}\n", c.model);
      return 1;
    }
    auto sized = with_device_count(*cluster, c.gpus);
    TrainingSpec t;
    t.global_batch_size = c.batch;
    auto once = [&]() {
      auto s = validate_setup(*model, *sized, t, *plan, c.gpus);
      if (!s) return std::pair<double, int>{-1, 0};
      const MemoryReport m = memory_report(*s);
      return std::pair<double, int>{m.peak_bytes + iteration_flops(*s).model, static_cast<int>(m.stages.size())};
    };
    const auto reference = once();
    if (reference.first < 0) {
      fmt::print(stderr, "case {} {} is not a valid plan: {}\n", c.model, c.plan,
                 validate_setup(*model, *sized, t, *plan, c.gpus).error().str());
      return 1;
    }
    Row row;
    row.name = fmt::format("{} {}", c.model, c.plan);
    std::int64_t n = 0;
    bool same = true;
    const auto start = Clock::now();
    double elapsed = 0;
    while (elapsed < seconds) {
      for (int i = 0; i < 16; ++i, ++n) same = same && once().first == reference.first;
      elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    }
    row.evals_per_s = static_cast<double>(n) / elapsed;
    row.us_per_eval = 1e6 * elapsed / static_cast<double>(n);
    row.stages = reference.second;
    row.ok = same && reference.first > 0;
    rows.push_back(row);
  }

  fmt::print("{:<90} {:>12} {:>10} {:>7} {:>6}\n", "case (validate + params + FLOPs + memory per stage)", "evals/s",
             "time", "stages", "check");
  fmt::print("{:<90} {:>12} {:>10} {:>7} {:>6}\n", "", "1/s", "us", "", "");
  for (const Row& r : rows)
    fmt::print("{:<90} {:>12.0f} {:>10.2f} {:>7} {:>6}\n", r.name, r.evals_per_s, r.us_per_eval, r.stages,
               r.ok ? "OK" : "FAIL");
  fmt::print("\n[");
  for (std::size_t i = 0; i < rows.size(); ++i)
    fmt::print("{}{{\"case\": \"{}\", \"evals_per_s\": {:.1f}, \"us_per_eval\": {:.3f}, \"stages\": {}, \"ok\": {}}}",
               i ? ",\n " : "", rows[i].name, rows[i].evals_per_s, rows[i].us_per_eval, rows[i].stages,
               rows[i].ok ? "true" : "false");
  fmt::print("]\n");
  return 0;
}
