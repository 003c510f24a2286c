// `megascope run --backend cuda` before any GPU work: options of the cpu
// backend's training, a plan whose world is not the job's, a bad --shard
// are refused with one line naming the option, with or without a device;
// without a device the command says so (status 1, one line).
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include "apps/cli_runner.hpp"
#include "exec/cuda/device.hpp"

namespace xc = megascope::exec::cuda;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

namespace {

int lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

}  // namespace

TEST_CASE("run --backend cuda without a device: status 1 and one line saying no CUDA device", "[exec][cuda]") {
  if (xc::device_available()) {
    WARN("a CUDA device is present: not testing the no-device error");
    return;
  }
  for (const bool named_cluster : {true, false}) {
    std::vector<std::string> args = {"run", "--backend", "cuda", "--model", "tiny-gpt"};
    if (named_cluster) args.insert(args.end(), {"--cluster", "dgx-h100"});
    const auto r = megascope::test::run(args);
    CHECK(r.code == 1);
    CHECK(r.out.empty());
    CHECK_THAT(r.err, StartsWith("megascope run: error: --backend cuda: no CUDA device ("));
    CHECK(lines(r.err) == 1);
  }
}

TEST_CASE("run --backend cuda refuses a plan of another world before touching a device", "[exec][cuda]") {
  const auto r = megascope::test::run(
      {"run", "--backend", "cuda", "--model", "tiny-gpt", "--cluster", "dgx-h100", "--plan", "tp=2", "--gpus", "2"});
  CHECK(r.code == 1);
  CHECK_THAT(r.err, StartsWith("megascope run: error: --plan: the plan runs on 2 ranks"));
  CHECK_THAT(r.err, Contains("launch with mpirun -np 2, or measure one rank on one GPU with --shard RANK"));
  CHECK(lines(r.err) == 1);
}

TEST_CASE("run --backend cuda refuses the cpu backend's training options and a bad --shard", "[exec][cuda]") {
  const std::vector<std::string> base = {"run", "--backend", "cuda", "--model", "tiny-gpt", "--cluster", "dgx-h100"};
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--data", "/etc/hostname"}, "--data: the cuda backend replays the plan's kernels for timing and does not train"},
      {{"--checkpoint-dir", "ckpt"}, "--checkpoint-dir: the cuda backend"},
      {{"--checkpoint-dir", "ckpt", "--resume"}, "--checkpoint-dir: the cuda backend"},
      {{"--inject-failure", "1:1"}, "--inject-failure: the cuda backend"},
      {{"--bf16"}, "--bf16: a training option (the cpu backend, or --backend cuda --train)"},
  };
  for (const auto& [extra, message] : cases) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    const auto r = megascope::test::run(args);
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Contains(message));
    CHECK(lines(r.err) == 1);
  }
  auto r = megascope::test::run({"run", "--backend", "cuda", "--model", "llama3-8b", "--cluster", "dgx-h100", "--plan",
                                 "tp=8,pp=4", "--shard", "3"});
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Contains("--shard: give the plan's GPU count with --gpus N"));
  r = megascope::test::run({"run", "--backend", "cuda", "--model", "llama3-8b", "--cluster", "dgx-h100", "--plan",
                            "tp=8,pp=4", "--gpus", "32", "--shard", "40"});
  CHECK(r.code == 1);
  CHECK_THAT(r.err, Contains("--shard: rank 40 is not a rank of the plan (0-31)"));
  r = megascope::test::run({"run", "--model", "tiny-gpt", "--shard", "1"});
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Contains("--shard measures one rank on one GPU: it needs --backend cuda"));
}

TEST_CASE("run --backend cuda --train without a device: status 1, the error names the backend", "[exec][cuda]") {
  if (xc::device_available()) {
    WARN("a CUDA device is present: not testing the no-device error");
    return;
  }
  for (const bool bf16 : {false, true}) {
    std::vector<std::string> args = {"run", "--backend", "cuda", "--train", "--model", "tiny-gpt"};
    if (bf16) args.push_back("--bf16");
    const auto r = megascope::test::run(args);
    CHECK(r.code == 1);
    CHECK_THAT(r.err, StartsWith("megascope run: error: --backend: cuda: no CUDA device ("));
    CHECK(lines(r.err) == 1);
  }
  const auto cpu = megascope::test::run({"run", "--train", "--model", "tiny-gpt"});
  CHECK(cpu.code == 2);
  CHECK_THAT(cpu.err, Contains("--train selects training on --backend cuda"));
}
