// `megascope sweep`: value lists and ranges, cluster variants with errors
// that name the field, the best plan at each point equal to `plan`'s winner,
// CSV/JSON/SVG outputs, determinism across threads, and the same CSV byte for
// byte under `mpirun -np 2` as in one process.
#include "apps/sweep.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli_runner.hpp"
#include "config/library.hpp"

namespace {

using megascope::test::Run;
using megascope::test::run;
namespace fs = std::filesystem;
namespace cli = megascope::cli;

// Small enough for a few seconds per sweep on two cores.
const std::vector<std::string> kSweep = {"sweep",          "--model", "gpt-1.7b", "--cluster", "dgx-a100",
                                         "--global-batch", "32",      "--top",    "4",         "--no-progress"};

std::vector<std::string> with(std::vector<std::string> a, std::initializer_list<std::string> more) {
  a.insert(a.end(), more);
  return a;
}

// A file in this process's scratch folder, removed when the tests end.
fs::path scratch(const std::string& name) {
  struct Folder {
    fs::path path = fs::temp_directory_path() / ("megascope-sweep-test-" + std::to_string(getpid()));
    Folder() { fs::create_directories(path); }
    ~Folder() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  };
  static const Folder dir;
  return dir.path / name;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// Runs a shell command line; returns its exit status and stdout.
Run shell(const std::string& command) {
  const fs::path err = scratch("shell-stderr.txt");
  std::FILE* p = popen((command + " 2>" + err.string()).c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out, slurp(err)};
}

}  // namespace

TEST_CASE("sweep values: lists, doubling and stepped ranges, duplicates once, bad ones name the option", "[apps]") {
  CHECK(*cli::parse_sweep_values("64-1024x2", "--gpus", true) == std::vector<double>{64, 128, 256, 512, 1024});
  CHECK(*cli::parse_sweep_values("8-32+8", "--gpus", true) == std::vector<double>{8, 16, 24, 32});
  CHECK(*cli::parse_sweep_values("8,16,8-64x2,16", "--gpus", true) == std::vector<double>{8, 16, 32, 64});
  CHECK(*cli::parse_sweep_values("8-64x4", "--gpus", true) == std::vector<double>{8, 32});
  CHECK(*cli::parse_sweep_values("100-400x2,800", "--nic-gbps", false) == std::vector<double>{100, 200, 400, 800});
  CHECK(*cli::parse_sweep_values("12.5", "--nic-gbps", false) == std::vector<double>{12.5});
  for (const char* bad : {"0", "8-64", "64-8x2", "8-64x1", "8-64+0", "abc", "1.5", "8,,16", ""}) {
    auto v = cli::parse_sweep_values(bad, "--gpus", true);
    INFO(bad);
    REQUIRE_FALSE(v);
    CHECK(v.error().field == "--gpus");
  }
}

TEST_CASE("cluster variants replace fields of the cluster and invalid ones name the field and the option", "[apps]") {
  const auto a100 = *megascope::resolve_cluster("dgx-a100");
  auto four = cli::apply_variant(a100, {std::nullopt, 4, std::nullopt, 800.0});
  REQUIRE(four);
  CHECK(four->node.devices_per_node == 4);
  CHECK(four->node.nics_per_node == 4);  // one NIC per GPU kept
  CHECK(four->scale_up_domain == 4);     // a node-sized NVLink domain follows the node
  CHECK(four->node.nic_bandwidth_Bps == 100e9);
  CHECK(four->total_devices() == a100.total_devices());

  const auto nvl72 = *megascope::resolve_cluster("gb200-nvl72");
  auto eight = cli::apply_variant(nvl72, {std::nullopt, 8, std::nullopt, std::nullopt});
  REQUIRE(eight);
  CHECK(eight->scale_up_domain_size == 72);  // a rack-sized domain stays
  CHECK(eight->scale_up_domain == 64);       // and a job still uses 64 GPUs of it

  auto h200 = cli::resolve_device("h200");
  REQUIRE(h200);
  auto swapped = cli::apply_variant(a100, {*h200, std::nullopt, 16, std::nullopt});
  REQUIRE(swapped);
  CHECK(swapped->device.name == "H200-SXM-141GB");
  CHECK(swapped->scale_up_domain == 16);

  auto bad = cli::apply_variant(a100, {std::nullopt, std::nullopt, 12, std::nullopt});
  REQUIRE_FALSE(bad);
  CHECK(bad.error().field == "cluster.scale_up_domain");
  CHECK_THAT(bad.error().message, Catch::Contains("--scale-up-domain 12") && Catch::Contains("dgx-a100"));
  auto no_nic =
      cli::apply_variant(*megascope::resolve_cluster("cpu-host"), {std::nullopt, std::nullopt, std::nullopt, 100.0});
  REQUIRE_FALSE(no_nic);
  CHECK(no_nic.error().field == "cluster.node.nics");

  CHECK(cli::resolve_device("dgx-b200")->name == "B200-SXM-180GB");
  CHECK(cli::resolve_device("H200-SXM-141GB")->name == "H200-SXM-141GB");
  auto ambiguous = cli::resolve_device("h100");  // SXM5 (dgx-h100) and PCIe (pcie-8gpu)
  REQUIRE_FALSE(ambiguous);
  CHECK_THAT(ambiguous.error().message, Catch::Contains("ambiguous") && Catch::Contains("H100-PCIe-80GB"));
  CHECK_FALSE(cli::resolve_device("z9"));
}

TEST_CASE("sweep over GPU counts gives plan's winner at every point, as a table, CSV, JSON and an SVG", "[apps]") {
  const fs::path csv = scratch("gpus.csv"), svg = scratch("gpus.svg");
  const Run r =
      run(with(kSweep, {"--gpus", "8-32x2", "--csv", csv.string(), "--plot", svg.string(), "--threads", "2"}));
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("megascope sweep: 3 points; gpt-1.7b on dgx-a100 (A100-SXM4-80GB)") &&
                        Catch::Contains("swept: gpus (3 values)"));

  const auto rows = lines(slurp(csv));
  REQUIRE(rows.size() == 4);
  CHECK(rows[0].rfind("model,cluster,device,gpus_per_node,scale_up_domain,nic_gbps,gpus,status,tokens_per_s,", 0) == 0);
  for (int i = 0; i < 3; ++i) {
    const std::string gpus = std::to_string(8 << i);
    CHECK(rows[static_cast<std::size_t>(i) + 1].rfind("gpt-1.7b,dgx-a100,A100-SXM4-80GB,8,8,200," + gpus + ",ok,", 0) ==
          0);
    // The point's best plan is `megascope plan`'s winner for that GPU count.
    const Run p = run({"plan", "--model", "gpt-1.7b", "--cluster", "dgx-a100", "--global-batch", "32", "--top", "4",
                       "--gpus", gpus, "--json", "--threads", "1"});
    REQUIRE(p.code == 0);
    const auto best = nlohmann::json::parse(p.out).at("ranked").at(0);
    const std::string plan = best.at("plan").get<std::string>();
    CHECK_THAT(rows[static_cast<std::size_t>(i) + 1], Catch::EndsWith(",\"" + plan + "\""));
    CHECK_THAT(r.out, Catch::Contains(plan));
  }

  const Run j = run(with(kSweep, {"--gpus", "8-32x2", "--json"}));
  REQUIRE(j.code == 0);
  const auto points = nlohmann::json::parse(j.out).at("points");
  REQUIRE(points.size() == 3);
  CHECK(points[1].at("gpus") == 16);
  CHECK(points[1].at("nic_gbps") == 200);
  CHECK(points[1].at("model") == "gpt-1.7b");
  CHECK(points[1].at("status") == "ok");
  for (std::size_t i = 0; i + 1 < points.size(); ++i)  // more GPUs, more tokens/s; never above the peak
    CHECK(points[i + 1].at("tokens_per_s").get<double>() > points[i].at("tokens_per_s").get<double>());
  for (const auto& p : points) CHECK((p.at("mfu").get<double>() > 0.05 && p.at("mfu").get<double>() < 1.0));

  const std::string s = slurp(svg);
  CHECK(s.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0) == 0);
  CHECK_THAT(s, Catch::EndsWith("</svg>\n"));
  CHECK_THAT(s, Catch::Contains("throughput per GPU (tokens/s)") && Catch::Contains("MFU (% of dense BF16 peak)") &&
                    Catch::Contains(">GPUs (log scale)<") && Catch::Contains(">16<"));
  // Both panels label the x axis: each GPU count appears twice.
  std::size_t sixteen = 0;
  for (std::size_t at = 0; (at = s.find(">16</text>", at)) != std::string::npos; ++at) ++sixteen;
  CHECK(sixteen == 2);
  // The top panel plots tokens/s per GPU (each point's tooltip says so).
  std::size_t per_gpu = 0;
  for (std::size_t at = 0; (at = s.find(" tokens/s per GPU</title>", at)) != std::string::npos; ++at) ++per_gpu;
  CHECK(per_gpu == 3);
  CHECK(std::count(s.begin(), s.end(), '\n') > 20);
  // One polyline per panel for the single series; a circle per point and panel.
  std::size_t polylines = 0, circles = 0;
  for (std::size_t at = 0; (at = s.find("<polyline", at)) != std::string::npos; ++at) ++polylines;
  for (std::size_t at = 0; (at = s.find("<circle", at)) != std::string::npos; ++at) ++circles;
  CHECK(polylines == 2);
  CHECK(circles == 6);
}

TEST_CASE("two swept variables give a cross product and one line per series, and points that do not fit are marked",
          "[apps]") {
  const fs::path csv = scratch("two.csv"), svg = scratch("two.svg");
  const Run r =
      run(with(kSweep, {"--gpus", "8,16", "--nic-gbps", "100,400", "--csv", csv.string(), "--plot", svg.string()}));
  INFO(r.err);
  REQUIRE(r.code == 0);
  const auto rows = lines(slurp(csv));
  REQUIRE(rows.size() == 5);
  CHECK(rows[1].find(",100,8,ok,") != std::string::npos);  // gpus innermost
  CHECK(rows[2].find(",100,16,ok,") != std::string::npos);
  CHECK(rows[3].find(",400,8,ok,") != std::string::npos);
  const std::string s = slurp(svg);
  CHECK_THAT(s, Catch::Contains(">NIC 100 Gb/s<") && Catch::Contains(">NIC 400 Gb/s<"));

  // A node-sized NVLink domain follows --gpus-per-node: a column of the table, but one series, not two.
  const Run nodes = run(with(kSweep, {"--gpus", "8", "--gpus-per-node", "4,8", "--plot", svg.string()}));
  INFO(nodes.err);
  REQUIRE(nodes.code == 0);
  CHECK_THAT(nodes.out, Catch::Contains("swept: gpus_per_node (2 values);") && Catch::Contains("gpus/node  domain"));
  const std::string one = slurp(svg);
  CHECK_THAT(one, Catch::Contains(">GPUs per node<") && !Catch::Contains("NVLink domain 4"));

  // The model does not fit on 1 GPU: the point is reported, not dropped.
  const Run tight = run({"sweep", "--model", "gpt-7.5b", "--cluster", "dgx-a100", "--global-batch", "16", "--gpus",
                         "1,8", "--top", "2", "--csv", csv.string(), "--plot", svg.string(), "--no-progress"});
  INFO(tight.err);
  REQUIRE(tight.code == 0);
  CHECK_THAT(tight.out, Catch::Contains("no plan fits in 80.0 GiB"));
  const auto t = lines(slurp(csv));
  REQUIRE(t.size() == 3);
  CHECK(t[1].find(",1,no_fit,,,,,,") != std::string::npos);
  CHECK(t[2].find(",8,ok,") != std::string::npos);
  CHECK_THAT(slurp(svg), Catch::Contains("no plan fits"));
}

TEST_CASE("sweep output is the same whatever the number of threads", "[apps]") {
  const fs::path a = scratch("t1.csv"), b = scratch("t2.csv");
  const Run r1 = run(with(kSweep, {"--gpus", "8,16", "--threads", "1", "--csv", a.string()}));
  const Run r2 = run(with(kSweep, {"--gpus", "8,16", "--threads", "2", "--csv", b.string()}));
  REQUIRE(r1.code == 0);
  REQUIRE(r2.code == 0);
  CHECK(r1.out == r2.out);
  CHECK(slurp(a) == slurp(b));
}

TEST_CASE("sweep input errors are one line naming the option or field, before any search", "[apps]") {
  for (auto [args, words] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--gpus", "0"}, "--gpus"},
           {{"--gpus", "8-64"}, "needs a step"},
           {{"--scale-up-domain", "12"}, "cluster.scale_up_domain"},
           {{"--gpus-per-node", "0"}, "--gpus-per-node"},
           {{"--device", "h100"}, "ambiguous"},
           {{"--gpus", "8,16", "--x", "nic_gbps"}, "--x"},
           {{"--model", "gpt-1.7b,nope"}, "nope"},
           {{"--tp", "0"}, "--tp"}}) {
    std::vector<std::string> a = kSweep;
    // --model is in kSweep already: replace it rather than repeat it.
    if (args.front() == "--model")
      a[2] = args[1];
    else
      a.insert(a.end(), args.begin(), args.end());
    const Run e = run(a);
    INFO(e.err);
    CHECK(e.code == 1);
    CHECK(e.out.empty());
    CHECK(std::count(e.err.begin(), e.err.end(), '\n') == 1);
    CHECK_THAT(e.err, Catch::Contains("megascope sweep: error:") && Catch::Contains(words));
  }
}

TEST_CASE("the MPI sweep: mpirun -np 2 writes the single-process CSV byte for byte and prints the same table once",
          "[apps][mpi]") {
#ifndef MEGASCOPE_MPIEXEC
  FAIL("CMake found no MPI launcher (MPIEXEC_EXECUTABLE), though exec/ requires MPI");
#else
  const fs::path one = scratch("single.csv"), two = scratch("mpi.csv"), svg1 = scratch("single.svg"),
                 svg2 = scratch("mpi.svg");
  std::string args;
  for (const std::string& a : with(kSweep, {"--gpus", "8-32x2", "--nic-gbps", "100,200", "--threads", "1"}))
    args += " '" + a + "'";
  const Run single =
      shell(std::string(MEGASCOPE_BINARY) + args + " --csv " + one.string() + " --plot " + svg1.string());
  INFO(single.err);
  REQUIRE(single.code == 0);
  const std::string mpirun =
      std::string(MEGASCOPE_MPIEXEC) + " --allow-run-as-root --oversubscribe " + MEGASCOPE_MPIEXEC_NUMPROC_FLAG + " 2 ";
  const Run mpi = shell(mpirun + MEGASCOPE_BINARY + args + " --csv " + two.string() + " --plot " + svg2.string());
  INFO(mpi.err);
  REQUIRE(mpi.code == 0);
  CHECK(lines(slurp(one)).size() == 7);
  CHECK(slurp(one) == slurp(two));
  CHECK(slurp(svg1) == slurp(svg2));
  CHECK(single.out == mpi.out);  // rank 1 prints nothing
  CHECK_THAT(mpi.err, Catch::Contains("on 2 ranks"));

  // An input error under MPI: every rank exits 1 and the message is printed once.
  const Run bad = shell(mpirun + MEGASCOPE_BINARY + args + " --scale-up-domain 12");
  CHECK(bad.code == 1);
  CHECK(bad.out.empty());
  const std::string error = "megascope sweep: error: cluster.scale_up_domain:";
  const std::size_t first = bad.err.find(error);
  CHECK(first != std::string::npos);
  CHECK(bad.err.find(error, first + 1) == std::string::npos);
#endif
}

TEST_CASE("sweep --training: every point searches with the file's optimizer, and the header and JSON say so", "[apps]") {
  const fs::path file = scratch("training.toml");
  std::ofstream(file) << "[training]\nprecision_aware_optimizer = true\nexp_avg_dtype = \"bf16\"\nexp_avg_sq_dtype = \"bf16\"\n";
  const Run j = run(with(kSweep, {"--gpus", "8,16", "--training", file.string(), "--json"}));
  INFO(j.err);
  REQUIRE(j.code == 0);
  const auto out = nlohmann::json::parse(j.out);
  CHECK(out.at("training").at("exp_avg_dtype").get<std::string>() == "bf16");
  CHECK(out.at("global_batch").get<int>() == 32);
  REQUIRE(out.at("points").size() == 2);
  for (const auto& p : out.at("points")) CHECK_THAT(p.at("plan").get<std::string>(), Catch::Contains("distopt=on"));
  // Each point is plan's winner with the same file.
  const Run one = run({"plan", "--model", "gpt-1.7b", "--cluster", "dgx-a100", "--gpus", "16", "--global-batch", "32", "--top", "4",
                       "--no-progress", "--training", file.string(), "--json"});
  REQUIRE(one.code == 0);
  CHECK(nlohmann::json::parse(one.out).at("ranked")[0].at("plan") == out.at("points")[1].at("plan"));
  const Run text = run(with(kSweep, {"--gpus", "8", "--training", file.string()}));
  REQUIRE(text.code == 0);
  CHECK_THAT(text.out, Catch::Contains("precision-aware optimizer (moments bf16/bf16"));
}
