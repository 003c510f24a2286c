// `megascope calibrate`: its usage errors, and the round trip of the profile
// it writes: the file loads, and a simulation with it prices each op from the
// measured numbers in the file (exact GEMM shapes as written, memory kernels
// at the written bandwidths, the written overheads). The round trip runs the
// binary once with --quick (one Program, tiny sweeps, one process).
#include <catch2/catch.hpp>

#include <cmath>
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "subprocess.hpp"
#include "apps/calibrate.hpp"
#include "cli_runner.hpp"
#include "config/library.hpp"
#include "config/plan_settings.hpp"
#include "core/program/builder.hpp"
#include "sim/engine.hpp"
#include "sim/network.hpp"

using megascope::test::run;
namespace fs = std::filesystem;
using namespace megascope;

namespace {

using megascope::test::Launch;
using megascope::test::shell;

struct Scratch {
  fs::path dir = fs::temp_directory_path() / fmt::format("megascope-calibrate-test-{}", ::getpid());
  Scratch() { fs::create_directories(dir); }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

}  // namespace

TEST_CASE("calibrate refuses the cuda backend, an unknown backend and an unwritable output", "[exec]") {
  const auto cuda = run({"calibrate", "--backend", "cuda"});
  CHECK(cuda.code == 1);
  CHECK_THAT(cuda.err, Catch::Contains("--backend cuda"));
  const auto tpu = run({"calibrate", "--backend", "tpu"});
  CHECK(tpu.code == 2);
  CHECK_THAT(tpu.err, Catch::Contains("--backend"));
  const auto unwritable = run({"calibrate", "--output", "/nonexistent-dir/megascope/cal.toml"});
  CHECK(unwritable.code == 1);
  CHECK_THAT(unwritable.err, Catch::Contains("--output: cannot write /nonexistent-dir/megascope/cal.toml"));
  Scratch s;
  const std::string ok = (s.dir / "cal.toml").string();
  const auto cluster = run({"calibrate", "--output", ok, "--cluster-output", "/nonexistent-dir/c.toml"});
  CHECK(cluster.code == 1);
  CHECK_THAT(cluster.err, Catch::Contains("--cluster-output: cannot write"));
  const auto gpu = run({"calibrate", "--output", ok, "--cluster", "dgx-h100"});
  CHECK(gpu.code == 1);
  CHECK_THAT(gpu.err, Catch::Contains("is a GPU"));
}

TEST_CASE("A written calibration profile loads and prices the simulation from its measurements", "[exec]") {
  Scratch s;
  const std::string profile = (s.dir / "cal.toml").string(), cluster_file = (s.dir / "cal-cluster.toml").string();
  const Launch l = shell(fmt::format("{} calibrate --backend cpu --quick --models tiny-gpt -o {}", MEGASCOPE_BINARY, profile));
  INFO(l.output);
  REQUIRE(l.status == 0);
  REQUIRE(fs::exists(cluster_file));   // the default name: the profile's with -cluster.toml

  auto file = sim::load_cost_profile(profile);
  REQUIRE(file);
  CHECK_THAT(file->source, Catch::Contains("megascope calibrate --backend cpu"));
  {
    // Two models of the same widths: LayerNorm (tiny-gpt) and RMSNorm (tiny-llama) share a key,
    // as do a bias-dropout-add at p = 0.1 and at p = 0: no exact entry for those, the bandwidth
    // prices them; a kernel both use alike (cross-entropy) keeps its entry.
    const std::string both = (s.dir / "both.toml").string();
    const Launch b = shell(fmt::format("{} calibrate --backend cpu --no-reference-run --models tiny-gpt,tiny-llama "
                                       "--tp 1 --micro-batches 1 -o {}",
                                       MEGASCOPE_BINARY, both));
    INFO(b.output);
    REQUIRE(b.status == 0);
    auto two = sim::load_cost_profile(both);
    REQUIRE(two);
    CHECK_FALSE(two->memory_seconds.count({MemoryOp::norm, 4 * 64 * 64}));
    CHECK_FALSE(two->memory_seconds.count({MemoryOp::dropout_residual, 6 * 64 * 64}));
    CHECK(two->memory_seconds.count({MemoryOp::cross_entropy, std::llround(kCrossEntropyFwdBytesPerLogit * 64 * 256)}));
    CHECK(file->memory_seconds.count({MemoryOp::dropout_residual, 6 * 64 * 64}));
  }
  CHECK(file->gemm_seconds.size() >= 4);          // the tiny-gpt Program's exact shapes
  // The executor's attention applies no dropout: the file says so, whatever
  // the profile it is laid over prices for it.
  CHECK(file->attention_fwd_dropout_factor == 1.0);
  CHECK(file->attention_bwd_dropout_factor == 1.0);
  {
    std::ifstream in(profile);
    std::stringstream text;
    text << in.rdbuf();
    CHECK_THAT(text.str(), Catch::Contains("fwd_dropout_factor = 1 ") && Catch::Contains("bwd_dropout_factor = 1 "));
  }
  CHECK(file->memory_Bps.count(MemoryOp::norm));
  CHECK(file->memory_bwd_Bps.count(MemoryOp::norm));        // the backward kernels fitted apart
  CHECK(file->memory_Bps.count(MemoryOp::optimizer));
  CHECK_FALSE(file->memory_bwd_Bps.count(MemoryOp::optimizer));   // AdamW has no backward
  CHECK(file->memory_seconds.count({MemoryOp::norm, 4 * 64 * 64}));   // layernorm forward on the Program's 64 x 64 rows
  auto cluster = resolve_cluster(cluster_file);
  REQUIRE(cluster);
  CHECK(cluster->name == "cpu-host-calibrated");

  // The same run priced with and without the calibration.
  TrainingSpec t;
  t.global_batch_size = 2;
  auto plan = parse_inline_plan("tp=1");
  REQUIRE(plan);
  auto model = resolve_model("tiny-gpt");
  REQUIRE(model);
  auto setup = validate_setup(*model, *cluster, t, *plan, 1);
  REQUIRE(setup);
  auto program = build_program(*setup);
  REQUIRE(program);
  auto shipped = sim::CostModel::for_device(setup->cluster.device);
  REQUIRE(shipped);
  sim::CostModel calibrated = *shipped;
  REQUIRE(calibrated.apply_calibration(profile));

  // Every compute op costs the written op overhead plus its kernels, each
  // at the file's numbers: an exact shape its measured seconds, a memory
  // kernel its measured seconds at the exact bytes, otherwise bytes over its
  // kind's bandwidth (its backward bandwidth for a backward op's kernel) plus
  // the launch overhead.
  const StageProgram& st = program->stages[0];
  const std::vector<double> priced = sim::compute_durations(st, calibrated);
  double expected_total = 0;
  int exact_memory = 0, unmeasured = 0;
  for (std::size_t i = 0; i < st.ops.size(); ++i) {
    const Op& op = st.ops[i];
    if (op.kind != OpKind::compute || op.kernel_count == 0) continue;
    double t_op = file->op_overhead_s;
    for (std::uint32_t k = op.kernel_begin; k < op.kernel_begin + op.kernel_count; ++k) {
      const Kernel& kr = st.kernels[k];
      if (kr.kind == KernelKind::gemm) {
        const auto it = file->gemm_seconds.find({kr.gemm.m, kr.gemm.n, kr.gemm.k, static_cast<int>(Precision::bf16)});
        REQUIRE(it != file->gemm_seconds.end());   // every GEMM of the calibrated Program was measured
        t_op += it->second;
      } else if (kr.kind == KernelKind::memory) {
        const auto it = file->memory_seconds.find({kr.memory, std::llround(kr.bytes)});
        if (it != file->memory_seconds.end()) {
          t_op += it->second;
          ++exact_memory;
        } else if (kr.backward && file->memory_bwd_Bps.count(kr.memory)) {
          t_op += kr.bytes / file->memory_bwd_Bps.at(kr.memory) + file->launch_overhead_s;
        } else if (file->memory_Bps.count(kr.memory)) {
          t_op += kr.bytes / file->memory_Bps.at(kr.memory) + file->launch_overhead_s;
        } else {
          // A kind calibrate does not measure (kind "other": the embeddings'
          // gradient added to the main gradient, and the zero-filled
          // gradient the output layer hands autograd for its tied weight) is
          // priced from the base profile's HBM bandwidth.
          CHECK(kr.memory == MemoryOp::other);
          ++unmeasured;
          t_op += calibrated.memory_s(kr.memory, kr.bytes);
        }
      } else {
        t_op += calibrated.kernel_s(kr);
      }
    }
    CHECK(priced[i] == Approx(t_op).epsilon(1e-12));
    expected_total += t_op;
  }
  CHECK(exact_memory > 0);
  CHECK(unmeasured == 4);   // the embedding's and the tied output layer's, once per micro-batch each
  // One serial rank: the step is the sum of its ops.
  const sim::Topology topo = sim::Topology::build(setup->cluster, 1);
  auto r = sim::simulate(*program, topo, calibrated);
  REQUIRE(r);
  CHECK(r->step_time_s == Approx(expected_total).epsilon(1e-9));
  auto before = sim::simulate(*program, topo, *shipped);
  REQUIRE(before);
  CHECK(r->step_time_s != before->step_time_s);
}

TEST_CASE("The network fit recovers the bandwidth and latency that generated the collective times", "[exec]") {
  // Collective times made by the simulator itself on a known host: the fit must give them back.
  auto host = resolve_cluster("cpu-host");
  REQUIRE(host);
  ClusterSpec truth = *host;
  truth.node.scale_up_bandwidth_Bps = 3e9;
  truth.node.pcie_bandwidth_Bps = 3e9;
  truth.node.scale_up_latency_s = 4e-6;
  const sim::Topology topo = sim::Topology::build(truth, 2);
  cli::CalibrationData d;
  d.world = 2;
  const std::vector<int> pair = {0, 1};
  for (double bytes : {1024.0, 65536.0, 4194304.0}) {
    d.comms.push_back({exec::CommOp::all_reduce, 2, bytes});
    d.comm_t.push_back({sim::isolated_time(topo, sim::collective_flow(topo, sim::Collective::all_reduce, pair, bytes)), 0});
    d.comms.push_back({exec::CommOp::send_recv, 2, bytes});
    d.comm_t.push_back({sim::isolated_time(topo, sim::collective_flow(topo, sim::Collective::send_recv, pair, bytes)), 0});
  }
  const cli::CalibrationFit f = cli::fit_calibration(d, *host, sim::CostProfile{});
  REQUIRE(f.network_fitted);
  CHECK(f.cluster.node.scale_up_bandwidth_Bps == Approx(3e9).epsilon(0.15));   // the bandwidth grid steps by 10^0.1
  CHECK(f.quality.comm_rms < 0.1);
  CHECK(f.quality.comm_cases == 6);
}
