// `megascope run --backend cuda --train`: the cpu backend's training on the
// GPU kernels (fp32, and with --bf16 cuBLASLt's bf16 GEMMs against the cpu
// backend's bf16-rounded ones) gives the cpu backend's losses and gradient
// norms. One
// process: tiny-gpt and tiny-llama on one rank; under mpirun with 2, 4 or 8
// GPUs (scripts/gpu-check.sh): TP 2 with SP, PP 2 and the distributed
// optimizer, with DP over the rest.
#include <catch2/catch.hpp>

#include <cmath>
#include <nlohmann/json.hpp>

#include "apps/cli_runner.hpp"
#include "exec/mpi_env.hpp"

namespace {

// The run's JSON on world rank 0, null elsewhere or on failure. Checks, never
// REQUIREs: every rank must go on to the next run (its communicators are
// collective over the world), else the others wait for it forever.
nlohmann::json train(const std::string& backend, const std::string& model, const std::string& plan, bool bf16 = false) {
  std::vector<std::string> args = {"run", "--backend", backend, "--model", model, "--plan", plan, "--steps", "3", "--json"};
  if (backend == "cuda") args.push_back("--train");
  if (bf16) args.push_back("--bf16");
  const auto r = megascope::test::run(args);
  INFO(r.err);
  CHECK(r.code == 0);
  if (r.code != 0 || megascope::exec::MpiEnv::get().rank() != 0) return nullptr;   // only world rank 0 prints
  return nlohmann::json::parse(r.out);
}

}  // namespace

TEST_CASE("run --backend cuda --train: the cpu backend's losses on the GPU kernels", "[exec][gpu][train]") {
  const int world = megascope::exec::launched_by_mpi() ? megascope::exec::MpiEnv::get().size() : 1;
  if (8 % world != 0) {   // the global batch of 8 must split over DP
    WARN("run --backend cuda --train: not tested on " << world << " ranks (1, 2, 4 or 8)");
    return;
  }
  std::vector<std::pair<std::string, std::string>> cases = {{"tiny-gpt", "tp=1"}, {"tiny-llama", "tp=1"}};
  if (world > 1) {
    const std::string half = std::to_string(world / 2), all = std::to_string(world);
    cases = {{"tiny-gpt", "tp=2,sp=on,dp=" + half}, {"tiny-llama", "pp=2,dp=" + half}, {"tiny-gpt", "distopt=on,dp=" + all}};
  }
  for (const bool bf16 : {false, true})
  for (const auto& [model, plan] : cases) {
    INFO(model << " " << plan << " on " << world << (bf16 ? ", bf16 GEMMs" : ", fp32"));
    const auto cpu = train("cpu", model, plan, bf16);
    const auto gpu = train("cuda", model, plan, bf16);
    if (cpu.is_null() || gpu.is_null()) continue;
    CHECK(cpu.at("steps").size() == 3);
    CHECK(gpu.at("steps").size() == 3);
    if (cpu.at("steps").size() != 3 || gpu.at("steps").size() != 3) continue;
    for (std::size_t k = 0; k < 3; ++k) {
      const double lc = cpu["steps"][k]["loss"], lg = gpu["steps"][k]["loss"];
      const double gc = cpu["steps"][k]["grad_norm"], gg = gpu["steps"][k]["grad_norm"];
      // fp32 on both sides; the GPU sums in other orders (atomics, cuBLASLt tiling): 1e-4 relative.
      // bf16 GEMMs: the same bf16 operands, but a sum in another order can round an output to
      // the neighbouring bf16 value (2^-8 relative), so 1e-3 and 1e-2.
      CHECK(std::abs(lg - lc) <= (bf16 ? 1e-3 : 1e-4) * std::abs(lc));
      CHECK(std::abs(gg - gc) <= (bf16 ? 1e-2 : 1e-3) * std::abs(gc));
    }
  }
}
