// The CPU executor under MPI: every sharding of the same model and batch
// reaches the same losses and gradient norms as the single-rank run, because
// initialisation, data and dropout masks do not depend on the plan and the
// collectives only regroup the same sums. Tolerances (fp32 kernels): losses
// to 2e-6 relative, gradient norms to 2e-5 relative (summation order differs);
// with bf16 GEMMs (--bf16) against fp32, 1e-3 and 1e-2.
// Each case launches `mpirun -np N megascope run ... --json` as a subprocess.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <sys/wait.h>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "run_support.hpp"
#include "subprocess.hpp"

namespace {

using megascope::test::Launch;
using megascope::test::mpirun;
using megascope::test::shell;
using megascope::test::Step;

std::vector<Step> train(const std::string& model, int np, const std::string& plan, int steps = 2,
                        const std::string& extra = "") {
  return megascope::test::run_steps(model, np, plan, fmt::format("--steps {} --global-batch 8 {}", steps, extra));
}

void check_close(const std::vector<Step>& got, const std::vector<Step>& want, double loss_eps, double norm_eps) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    CHECK(got[i].loss == Approx(want[i].loss).epsilon(loss_eps));
    CHECK(got[i].grad_norm == Approx(want[i].grad_norm).epsilon(norm_eps));
  }
}

void check_same(const std::vector<Step>& got, const std::vector<Step>& want) { check_close(got, want, 2e-6, 2e-5); }

}  // namespace

TEST_CASE("Every sharding of tiny-gpt trains the same losses and gradient norms as one rank", "[exec][mpi]") {
  static const std::vector<Step> ref = train("tiny-gpt", 1, "tp=1");   // once for all sections
  REQUIRE(ref.size() == 2);
  CHECK(ref[1].loss < ref[0].loss);   // it learns
  const std::vector<std::pair<int, std::string>> plans = {
      {2, "tp=2"},
      {2, "tp=2,sp=on"},
      {2, "dp=2"},
      {2, "dp=2,distopt=on"},
      {2, "pp=2"},
      {2, "pp=2,vpp=2,schedule=interleaved"},
      {2, "pp=2,vpp=2,schedule=interleaved,overlap_p2p_comm=off"},   // forward sends held past the next backward
      {2, "pp=2,overlap_p2p_comm=on"},
      {2, "pp=2,schedule=zb-h1"},
      {2, "pp=2,schedule=zb-v"},
      {2, "pp=2,schedule=zb-h2"},
      {2, "pp=2,schedule=zb-1p"},   // placed from the CPU profile's priced stage times
      {2, "pp=2,schedule=zb-2p"},
      {2, "pp=2,vpp=2,schedule=interleaved,microbatch_group=4"},
      // Stages holding only the embedding or only the loss: 4 + 2 layers, one per virtual stage.
      {2, "pp=2,vpp=3,schedule=interleaved,embedding_in_split=on,loss_in_split=on"},
      {2, "pp=2,schedule=interleaved,layout=E|tt|tt|L"},
      {2, "pp=2,schedule=zb-v,layout=Et||tt|tL"},   // an empty stage handing over on its own rank at the V's turn
      {2, "pp=2,recompute=full,recompute_method=uniform,recompute_layers=1"},
      {4, "tp=2,pp=2,sp=on"},
      {4, "tp=2,pp=2"},
      {4, "tp=2,pp=2,pp_scatter_gather=on"},   // the Program's gather after each receive: nothing to do here
      {4, "tp=2,dp=2,sp=on,distopt=on,overlap_grad_reduce=on,overlap_param_gather=on"},
      {2, "cp=2"},
      {4, "cp=2,tp=2,sp=on"},
      {4, "cp=4"},
      // Sharded gradients (reduce-scattered per micro-batch) and parameters (gathered per layer).
      {2, "dp=2,zero=2"},
      {4, "dp=4,zero=2,overlap_grad_reduce=on"},
      {2, "dp=2,zero=3"},
      {4, "dp=4,zero=3,overlap_grad_reduce=on,fsdp_prefetch=0"},
      {4, "tp=2,dp=2,sp=on,zero=3,overlap_grad_reduce=on,fsdp_prefetch=2"},
      {4, "cp=2,dp=2,zero=3,recompute=full,recompute_method=uniform,recompute_layers=2"},
      // Hybrid sharding: sharded inside two replicas, the shards all-reduced across them.
      {4, "dp=4,distopt=on,overlap_grad_reduce=on,overlap_param_gather=on,dp_replicas=2"},
      {4, "dp=4,zero=2,overlap_grad_reduce=on,dp_replicas=2"},
      {4, "dp=4,zero=3,dp_replicas=2"},
      {4, "cp=2,dp=2,zero=3,dp_replicas=2"},
  };
  for (const auto& [np, plan] : plans) {
    SECTION(plan) { check_same(train("tiny-gpt", np, plan), ref); }
  }
}

TEST_CASE("Every sharding of tiny-llama (GQA, RoPE, SwiGLU, untied) trains the same as one rank", "[exec][mpi]") {
  static const std::vector<Step> ref = train("tiny-llama", 1, "tp=1");
  const std::vector<std::pair<int, std::string>> plans = {
      {2, "tp=2,sp=on"},
      {2, "dp=2,distopt=on"},
      {4, "pp=2,dp=2,vpp=2,schedule=interleaved,distopt=on"},
      {4, "tp=2,pp=2,sp=on,recompute=selective"},
      {4, "cp=2,dp=2,distopt=on"},
      {4, "pp=2,dp=2,vpp=2,schedule=interleaved,zero=3,overlap_grad_reduce=on"},
      {2, "dp=2,zero=3,reshard_after_forward=off"},
      {4, "pp=2,dp=2,zero=2,dp_replicas=2"},   // replicas of one rank: the shard is all of it
  };
  for (const auto& [np, plan] : plans) {
    SECTION(plan) { check_same(train("tiny-llama", np, plan), ref); }
  }
}

TEST_CASE("bf16 GEMMs train within bf16 tolerance of fp32, and DP and TP shardings of them agree", "[exec][mpi]") {
  static const std::vector<Step> fp32 = train("tiny-gpt", 1, "tp=1", 3);
  const std::vector<Step> bf16 = train("tiny-gpt", 1, "tp=1", 3, "--bf16");
  // bf16 keeps 8 significant bits; the loss is an average over many of them.
  check_close(bf16, fp32, 1e-3, 1e-2);
  bool differs = false;
  for (std::size_t i = 0; i < bf16.size(); ++i) differs = differs || bf16[i].loss != fp32[i].loss;
  CHECK(differs);   // the GEMMs did round
  // DP splits the batch, not the GEMMs' rows: the first step rounds alike and only its gradient sums
  // reorder (fp32); after an update, a weight that differs in its last fp32 bits can round to the
  // neighbouring bf16 value, so later steps agree to 1e-4 (losses) and 1e-3 (norms).
  SECTION("dp=2") {
    const std::vector<Step> dp = train("tiny-gpt", 2, "dp=2", 3, "--bf16");
    check_close({dp.at(0)}, {bf16.at(0)}, 2e-6, 2e-5);
    check_close(dp, bf16, 1e-4, 1e-3);
  }
  // TP splits the GEMMs and rounds partial sums before the reduction: bf16 tolerance.
  SECTION("tp=2,sp=on") { check_close(train("tiny-gpt", 2, "tp=2,sp=on", 3, "--bf16"), bf16, 1e-3, 1e-2); }
}

TEST_CASE("Expert parallelism of tiny-moe (top-2 of 4 experts) trains the same as one rank", "[exec][mpi]") {
  static const std::vector<Step> ref = train("tiny-moe", 1, "tp=1");
  const std::vector<std::pair<int, std::string>> plans = {
      {2, "ep=2,dp=2"},
      {2, "ep=2,dp=2,distopt=on"},
      {4, "ep=2,dp=2,pp=2"},
      {4, "ep=4,dp=4,distopt=on"},
      {4, "ep=2,cp=2,dp=2"},
      {4, "ep=2,dp=4,zero=3,overlap_grad_reduce=on"},
      {2, "ep=2,dp=2,zero=2"},
  };
  for (const auto& [np, plan] : plans) {
    SECTION(plan) { check_same(train("tiny-moe", np, plan), ref); }
  }
}

TEST_CASE("A run stopped after a checkpoint and resumed continues with the same losses", "[exec][mpi]") {
  const auto dir = std::filesystem::temp_directory_path() / "megascope-test-ckpt";
  std::filesystem::remove_all(dir);
  const std::vector<Step> straight = train("tiny-llama", 2, "dp=2,distopt=on", 4);
  const std::vector<Step> first = train("tiny-llama", 2, "dp=2,distopt=on", 2,
                                        fmt::format("--checkpoint-dir {} --save-every 1", dir.string()));
  CHECK(std::filesystem::exists(dir / "step-2" / "rank-1.bin"));
  CHECK_FALSE(std::filesystem::exists(dir / "step-2" / "rank-1.bin.tmp"));
  const std::vector<Step> rest =
      train("tiny-llama", 2, "dp=2,distopt=on", 2, fmt::format("--checkpoint-dir {} --resume", dir.string()));
  check_same({first[0], first[1], rest[0], rest[1]}, straight);

  // Another sharding refuses the checkpoint, naming the file and the sharding of both.
  const Launch l = shell(fmt::format("{} {} run --model tiny-llama --plan tp=2 --checkpoint-dir {} --resume", mpirun(2),
                                     MEGASCOPE_BINARY, dir.string()));
  CHECK(l.status != 0);
  CHECK_THAT(l.output, Catch::Contains("rank-0.bin: written with shards \"tp=1 cp=1 pp=1 dp=2") &&
                           Catch::Contains("this run has \"tp=2 cp=1 pp=1 dp=1"));
  // So does the same plan with bf16 GEMMs: it would not continue with the same losses.
  const Launch bf16 = shell(fmt::format("{} {} run --model tiny-llama --plan dp=2,distopt=on --checkpoint-dir {} --resume --bf16",
                                        mpirun(2), MEGASCOPE_BINARY, dir.string()));
  CHECK(bf16.status != 0);
  CHECK_THAT(bf16.output, Catch::Contains("GEMM precision (--bf16)") && Catch::Contains("gemms \"fp32\""));
  std::filesystem::remove_all(dir);
}

TEST_CASE("A run killed mid-run resumes from its last whole checkpoint with the same losses", "[exec][mpi]") {
  const auto dir = std::filesystem::temp_directory_path() / "megascope-test-ckpt-killed";
  std::filesystem::remove_all(dir);
  const std::vector<Step> straight = train("tiny-gpt", 2, "pp=2", 4);
  // Checkpoints after steps 1 and 2; rank 1 dies abruptly as step 3 starts.
  const Launch killed = shell(fmt::format("timeout 60 {} {} run --model tiny-gpt --plan pp=2 --steps 4 --global-batch 8 "
                                          "--checkpoint-dir {} --save-every 1 --inject-failure 1:3",
                                          mpirun(2), MEGASCOPE_BINARY, dir.string()));
  INFO(killed.output);
  CHECK(killed.status != 0);
  CHECK(std::filesystem::exists(dir / "step-2" / "rank-0.bin"));
  CHECK(std::filesystem::exists(dir / "step-2" / "rank-1.bin"));
  CHECK_FALSE(std::filesystem::exists(dir / "step-3"));
  std::ifstream latest(dir / "latest");
  std::string last;
  std::getline(latest, last);
  CHECK_THAT(last, Catch::Contains("2"));
  const std::vector<Step> rest = train("tiny-gpt", 2, "pp=2", 2, fmt::format("--checkpoint-dir {} --resume", dir.string()));
  REQUIRE(straight.size() == 4);
  check_same(rest, {straight[2], straight[3]});
  std::filesystem::remove_all(dir);
}

TEST_CASE("A plan that does not match the world size or the executor fails before any work", "[exec][mpi]") {
  const Launch world = shell(fmt::format("{} {} run --model tiny-gpt --plan tp=2,pp=2", mpirun(2), MEGASCOPE_BINARY));
  CHECK(world.status != 0);
  CHECK_THAT(world.output, Catch::Contains("must be divisible by tp x pp x cp"));
  CHECK_THAT(world.output, !Catch::Contains("step    1"));
  const Launch dual =
      shell(fmt::format("{} {} run --model tiny-gpt --plan pp=2,schedule=dualpipev", mpirun(2), MEGASCOPE_BINARY));
  CHECK(dual.status != 0);
  CHECK_THAT(dual.output, Catch::Contains("plan.schedule") && Catch::Contains("not supported by the executor"));
  const Launch data = shell(fmt::format("{} run --model tiny-gpt --data /nonexistent/corpus.txt", MEGASCOPE_BINARY));
  CHECK(data.status != 0);
  CHECK_THAT(data.output, Catch::Contains("/nonexistent/corpus.txt: cannot open"));
  // A directory and a device are named as such, with the usual error exit (1), not an internal error (3).
  const auto dir = std::filesystem::temp_directory_path();
  const Launch folder = shell(fmt::format("{} run --model tiny-gpt --data {}", MEGASCOPE_BINARY, dir.string()));
  CHECK(WEXITSTATUS(folder.status) == 1);
  CHECK_THAT(folder.output, Catch::Contains("--data") && Catch::Contains("is a directory"));
  const Launch device = shell(fmt::format("{} run --model tiny-gpt --data /dev/zero", MEGASCOPE_BINARY));
  CHECK(WEXITSTATUS(device.status) == 1);
  CHECK_THAT(device.output, Catch::Contains("/dev/zero: not a regular file"));
}

TEST_CASE("The measured trace has one span per op of every rank and reads back as measured", "[exec][mpi]") {
  const auto path = std::filesystem::temp_directory_path() / "megascope-test-measured.json";
  const Launch l = shell(fmt::format("{} {} run --model tiny-gpt --plan pp=2 --trace {}", mpirun(2), MEGASCOPE_BINARY,
                                     path.string()));
  INFO(l.output);
  REQUIRE(l.status == 0);
  std::ifstream in(path);
  const auto j = nlohmann::json::parse(in);
  CHECK(j["megascope"]["source"] == "measured");
  CHECK(j["megascope"]["world"] == 2);
  std::map<int, int> per_rank;
  for (const auto& e : j["traceEvents"])
    if (e["ph"] == "X") ++per_rank[e["pid"].get<int>()];
  CHECK(per_rank.size() == 2);
  CHECK(per_rank[0] > 50);
  std::filesystem::remove(path);
}

TEST_CASE("A rank that dies makes the job stop within a bounded time, naming it", "[exec][mpi]") {
  // Rank 1 of a two-stage pipeline exits abruptly at step 2; rank 0 is then
  // waiting on it (a receive or a collective). mpirun must end the job with a
  // failure that names rank 1, well inside the 60 s bound.
  const auto t0 = std::chrono::steady_clock::now();
  const Launch l = shell(fmt::format("timeout 60 {} {} run --model tiny-gpt --plan pp=2 --steps 4 --inject-failure 1:2",
                                     mpirun(2), MEGASCOPE_BINARY));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(l.output);
  CHECK(l.status != 0);
  CHECK(WEXITSTATUS(l.status) != 124);   // not the timeout: the job ended itself
  CHECK(took < 60);
  CHECK_THAT(l.output, Catch::Contains("step    1"));
  CHECK_THAT(l.output, !Catch::Contains("step    2"));
  CHECK_THAT(l.output, Catch::Contains("],1]") || Catch::Contains("rank 1"));
}

TEST_CASE("A rank that hangs under data or tensor parallelism makes the others name the group and stop the job",
          "[exec][mpi]") {
  // Rank 1 stays alive but does nothing from step 2 on (as a stopped or
  // deadlocked process): its peers wait in a collective of the group they
  // share, which gives up after --recv-timeout, names the group and aborts.
  for (const auto& [plan, group] : {std::pair{"dp=2", "dp group"}, std::pair{"tp=2", "tp group"}}) {
    INFO(plan);
    const auto t0 = std::chrono::steady_clock::now();
    const Launch l = shell(fmt::format("timeout 60 {} {} run --model tiny-gpt --plan {} --steps 4 --inject-failure 1:2:hang "
                                       "--recv-timeout 3",
                                       mpirun(2), MEGASCOPE_BINARY, plan));
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    INFO(l.output);
    CHECK(l.status != 0);
    CHECK(WEXITSTATUS(l.status) != 124);   // not the outer timeout: the job ended itself
    CHECK(took < 60);
    CHECK_THAT(l.output, Catch::Contains("step    1"));
    CHECK_THAT(l.output, !Catch::Contains("step    2"));
    CHECK_THAT(l.output, Catch::Contains("rank 0:") && Catch::Contains(group) && Catch::Contains("after 3 s"));
  }
}

TEST_CASE("A chunk of two gradient buckets trains like one rank (the reduction waits for the last bucket)",
          "[exec][mpi]") {
  // With overlap_grad_reduce the Program reduces each 40M-parameter bucket as
  // soon as the backward completes it, the first one while earlier layers'
  // gradients are still to come.
  const std::string model = std::string(MEGASCOPE_TEST_FIXTURES) + "/toml/wide-gpt.toml";
  const std::vector<Step> ref = train(model, 1, "tp=1");
  for (const char* plan : {"dp=2,overlap_grad_reduce=on", "dp=2,distopt=on,overlap_grad_reduce=on"}) {
    INFO(plan);
    check_same(train(model, 2, plan), ref);
  }
}
