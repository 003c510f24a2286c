// executor_bench: how well the simulator, calibrated on this machine,
// predicts the CPU executor. Per model it runs `megascope calibrate` under
// mpirun; per plan it runs the plan for real (`mpirun -np 2 megascope run
// --json --trace`), simulates it with the calibration (`megascope simulate
// --calibration --cluster --mode full --trace`) and compares the traces
// (`megascope compare --json`). Prints a header row, a units row and one row
// per plan (predicted and measured step time, error, the ranks' CPU share
// during the run, the op kinds with the largest errors), then the rows as
// JSON. Not a test.
//
//   ./build/bench/executor_bench [--np N] [--steps N] [--warmup N] [--rounds N] [--case TEXT] [--dir DIR] [--keep] [--nice N]
//
// --rounds N (default 3) repeats the whole loop (calibrate, then run and
// simulate every plan) N times; a plan's predicted and measured times are the
// medians over the rounds, and its row lists each round's error. On this VM
// the speed of the same kernel drifts by 10-50% over seconds to minutes, so a
// calibration and a run minutes apart can disagree by that much whatever the
// model; the rounds show that spread and their medians damp it.
//
// --nice N runs calibrate and the measured runs under `nice -n N` (N < 0
// needs root): on a machine shared with other work, a negative N lets the
// ranks run closer to an otherwise idle machine (the load column says how
// busy the machine was).
// Measured step time (default 15 steps after 2 warm-up ones: this VM's speed
// dips for seconds at a time, and 5 steps let one dip move the median): the
// median of the steps after the first `warmup` (the
// executor prints every step's time: the slowest rank's). Load: the
// machine's 1-minute load average just before the run; above np - 1 (the
// ranks' own load) other work competed with the ranks for the cores.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace {

struct Launch {
  int status = 0;
  std::string output;
  double wall_s = 0;
};

Launch shell(const std::string& cmd) {
  Launch l;
  const auto t0 = std::chrono::steady_clock::now();
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return {127, "popen failed", 0};
  char buf[4096];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) l.output.append(buf, n);
  l.status = pclose(p);
  l.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return l;
}

nlohmann::json json_of(const Launch& l) {
  const auto at = l.output.find('{');
  if (at == std::string::npos) return {};
  return nlohmann::json::parse(l.output.substr(at), nullptr, false);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Case {
  std::string model, plan;
  int global_batch;
};

struct Row {
  std::string name;
  double predicted_s = 0, measured_s = 0, error = 0, load = 0;   // medians over the rounds
  std::vector<double> predicted_rounds, measured_rounds, loads;
  std::vector<double> steps;                                       // the last round's
  nlohmann::json kinds = nlohmann::json::array();   // compare's per-kind rows
  std::string failure;
};

}  // namespace

int main(int argc, char** argv) {
  int np = 2, steps = 15, warmup = 2, rounds = 3;
  std::string only, dir = (std::filesystem::temp_directory_path() / "megascope-executor-bench").string();
  bool keep = false;
  std::optional<int> nice;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--np" && i + 1 < argc) np = std::max(1, std::atoi(argv[++i]));
    else if (a == "--steps" && i + 1 < argc) steps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--warmup" && i + 1 < argc) warmup = std::max(0, std::atoi(argv[++i]));
    else if (a == "--rounds" && i + 1 < argc) rounds = std::max(1, std::atoi(argv[++i]));
    else if (a == "--case" && i + 1 < argc) only = argv[++i];
    else if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    else if (a == "--keep") keep = true;
    else if (a == "--nice" && i + 1 < argc) nice = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr,
                   "usage: executor_bench [--np N] [--steps N] [--warmup N] [--rounds N] [--case TEXT] [--dir DIR] [--keep] "
                   "[--nice N]\n");
      return 2;
    }
  }
  std::filesystem::create_directories(dir);
  const std::string bin = MEGASCOPE_BINARY;
  const std::string mpirun = fmt::format("{}{} --allow-run-as-root --oversubscribe {} {}",
                                         nice ? fmt::format("nice -n {} ", *nice) : std::string(), MEGASCOPE_MPIEXEC,
                                         MEGASCOPE_MPIEXEC_NUMPROC_FLAG, np);
  const std::vector<Case> cases = {
      {"tiny-gpt", fmt::format("dp={}", np), 16 * np},   {"tiny-gpt", fmt::format("tp={}", np), 16},
      {"tiny-gpt", fmt::format("pp={}", np), 16},        {"tiny-llama", fmt::format("dp={}", np), 16 * np},
      {"tiny-llama", fmt::format("tp={}", np), 16},      {"tiny-llama", fmt::format("pp={}", np), 16},
  };
  auto wanted = [&](const Case& c) { return only.empty() || (c.model + " " + c.plan).find(only) != std::string::npos; };

  // One calibration per model: its Programs' shapes and kernels.
  std::vector<std::string> models;
  for (const Case& c : cases)
    if (wanted(c) && std::find(models.begin(), models.end(), c.model) == models.end()) models.push_back(c.model);
  std::vector<double> calibrate_s;
  std::vector<Row> rows;
  for (const Case& c : cases)
    if (wanted(c)) {
      Row row;
      row.name = fmt::format("{} {} gb{}", c.model, c.plan, c.global_batch);
      rows.push_back(row);
    }
  for (int round = 0; round < rounds; ++round) {
    for (const std::string& m : models) {
      const std::string cmd = fmt::format("{} {} calibrate --backend cpu --models {} --tp 1,{} -o {}/{}.toml "
                                          "--cluster-output {}/{}-cluster.toml",
                                          mpirun, bin, m, np, dir, m, dir, m);
      std::fprintf(stderr, "%s\n", cmd.c_str());
      const Launch l = shell(cmd);
      if (l.status != 0) {
        std::fprintf(stderr, "calibrate failed:\n%s\n", l.output.c_str());
        return 1;
      }
      std::fprintf(stderr, "%s", l.output.c_str());
      calibrate_s.push_back(l.wall_s);
    }

    std::size_t at = 0;
    for (const Case& c : cases) {
      if (!wanted(c)) continue;
      Row& row = rows[at++];
      if (!row.failure.empty()) continue;
      const std::string tag = fmt::format("{}/{}-{}", dir, c.model, c.plan);
      const std::string run = fmt::format("{} {} run --backend cpu --model {} --plan {} --global-batch {} --steps {} --json "
                                          "--trace {}-measured.json",
                                          mpirun, bin, c.model, c.plan, c.global_batch, steps + warmup, tag);
      std::fprintf(stderr, "%s\n", run.c_str());
      double load[1] = {0};
      if (getloadavg(load, 1) == 1) row.loads.push_back(load[0]);
      const Launch r = shell(run);
      const nlohmann::json rj = json_of(r);
      if (r.status != 0 || !rj.contains("steps")) {
        row.failure = "run failed: " + r.output.substr(0, 400);
        continue;
      }
      row.steps.clear();
      for (const auto& s : rj["steps"]) row.steps.push_back(s.at("step_time_s").get<double>());
      row.measured_rounds.push_back(median(std::vector<double>(
          row.steps.begin() + std::min<std::ptrdiff_t>(warmup, static_cast<std::ptrdiff_t>(row.steps.size()) - 1),
          row.steps.end())));
      const std::string sim = fmt::format("{} simulate --model {} --cluster {}/{}-cluster.toml --gpus {} --plan {} "
                                          "--global-batch {} --calibration {}/{}.toml --mode full --trace {}-simulated.json --json",
                                          bin, c.model, dir, c.model, np, c.plan, c.global_batch, dir, c.model, tag);
      const Launch s = shell(sim);
      const nlohmann::json sj = json_of(s);
      if (s.status != 0 || !sj.contains("step_time_s")) {
        row.failure = "simulate failed: " + s.output.substr(0, 400);
        continue;
      }
      row.predicted_rounds.push_back(sj["step_time_s"].get<double>());
      const Launch cmp = shell(fmt::format("{} compare --json {}-simulated.json {}-measured.json", bin, tag, tag));
      const nlohmann::json cj = json_of(cmp);
      if (cmp.status == 0 && cj.contains("kinds")) row.kinds = cj["kinds"];
    }
  }   // rounds
  for (Row& row : rows) {
    if (!row.failure.empty()) continue;
    row.predicted_s = median(row.predicted_rounds);
    row.measured_s = median(row.measured_rounds);
    row.load = median(row.loads);
    row.error = (row.predicted_s - row.measured_s) / row.measured_s;
  }

  std::printf("%-28s %10s %10s %8s %6s  %-22s %s\n", "plan", "predicted", "measured", "error", "load", "rounds",
              "op kinds (compare, last round's last step)");
  std::printf("%-28s %10s %10s %8s %6s  %-22s %s\n", "", "s", "s", "%", "1 min", "error per round, %",
              "kind: simulated vs measured s, error");
  nlohmann::json out = nlohmann::json::array();
  double abs_sum = 0;
  int ok = 0;
  for (const Row& r : rows) {
    if (!r.failure.empty()) {
      std::printf("%-28s %s\n", r.name.c_str(), r.failure.c_str());
      out.push_back({{"plan", r.name}, {"failure", r.failure}});
      continue;
    }
    // The three op kinds with the largest measured time.
    std::string kinds;
    for (std::size_t i = 0; i < r.kinds.size() && i < 4; ++i) {
      const auto& k = r.kinds[i];
      const std::string err = k.contains("error") && !k["error"].is_null() ? fmt::format("{:+.0f}%", 100 * k["error"].get<double>()) : "-";
      kinds += fmt::format("{}{} {:.3f}/{:.3f} {}", i ? "; " : "", k.value("kind", "?"), k.value("simulated_s", 0.0),
                           k.value("measured_s", 0.0), err);
    }
    std::string per_round;
    for (std::size_t i = 0; i < r.predicted_rounds.size(); ++i)
      per_round += fmt::format("{}{:+.0f}", i ? " " : "",
                               100 * (r.predicted_rounds[i] - r.measured_rounds[i]) / r.measured_rounds[i]);
    std::printf("%-28s %10.4f %10.4f %+7.1f%% %6.2f  %-22s %s\n", r.name.c_str(), r.predicted_s, r.measured_s,
                100 * r.error, r.load, per_round.c_str(), kinds.c_str());
    abs_sum += std::abs(r.error);
    ++ok;
    out.push_back({{"plan", r.name}, {"predicted_s", r.predicted_s}, {"measured_s", r.measured_s}, {"error", r.error},
                   {"predicted_rounds_s", r.predicted_rounds}, {"measured_rounds_s", r.measured_rounds},
                   {"measured_steps_s", r.steps}, {"load", r.load}, {"kinds", r.kinds}});
  }
  if (ok)
    std::printf("mean absolute error %.1f%% over %d plans (%d ranks; per plan the median over %d rounds of calibrate, run "
                "and simulate; a run's time: the median of %d steps after %d warm-up)\n",
                100 * abs_sum / ok, ok, np, rounds, steps, warmup);
  std::printf("%s\n", nlohmann::json{{"rows", out}, {"np", np}, {"calibrate_s", calibrate_s}, {"nice", nice ? *nice : 0}}
                          .dump()
                          .c_str());
  if (!keep) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  return ok == static_cast<int>(rows.size()) ? 0 : 1;
}
