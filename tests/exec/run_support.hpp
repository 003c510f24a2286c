// Launching `megascope run ... --json` for the executor's equivalence tests:
// under mpirun for more than one rank, and the per-step loss and gradient
// norm it prints.
#pragma once

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "subprocess.hpp"

namespace megascope::test {

struct Step {
  double loss = 0, grad_norm = 0;
};

inline std::string mpirun(int np) {
  return fmt::format("{} --allow-run-as-root --oversubscribe {} {}", MEGASCOPE_MPIEXEC, MEGASCOPE_MPIEXEC_NUMPROC_FLAG, np);
}

// `megascope run --model M --plan P --json ARGS` on np ranks; each step's loss and gradient norm.
inline std::vector<Step> run_steps(const std::string& model, int np, const std::string& plan, const std::string& args) {
  const std::string cmd = fmt::format("{} {} run --model {} --plan '{}' --json {}", np > 1 ? mpirun(np) : std::string(),
                                      MEGASCOPE_BINARY, model, plan, args);
  const Launch l = shell(cmd);
  INFO(cmd << "\n" << l.output);
  REQUIRE(l.status == 0);
  const auto j = nlohmann::json::parse(l.output.substr(l.output.find('{')));
  std::vector<Step> out;
  for (const auto& s : j.at("steps")) out.push_back({s.at("loss").get<double>(), s.at("grad_norm").get<double>()});
  return out;
}

}  // namespace megascope::test
