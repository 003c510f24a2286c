// Cost-model profile and calibration files (sim/cost_model.hpp,
// docs/cost-model.md): the shipped profiles and how they are found, the
// measured calibrations in topologies/calibrations against the shipped
// curves, calibration overlays, and the errors of bad files.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "sim/cost_model.hpp"
#include "sim/cost_model_support.hpp"
#include "support.hpp"

using namespace megascope;
using namespace megascope::sim;
using megascope::test::model_for;

namespace {

std::string fixture(const std::string& name) { return test::profile_fixture(name); }

// The TOML files of a folder of the shipped data (profiles, calibrations), sorted.
std::vector<std::filesystem::path> toml_files(const std::string& folder) {
  std::vector<std::filesystem::path> out;
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(MEGASCOPE_DATA_DIR_FOR_TESTS) / folder))
    if (e.path().extension() == ".toml") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

Error profile_error(const std::string& name) {
  auto r = load_cost_profile(fixture(name));
  REQUIRE_FALSE(r.has_value());
  return r.error();
}

struct EnvGuard {
  std::optional<std::string> old;
  explicit EnvGuard(const std::string& value) {
    if (const char* v = std::getenv("MEGASCOPE_DATA_DIR")) old = v;
    ::setenv("MEGASCOPE_DATA_DIR", value.c_str(), 1);
  }
  ~EnvGuard() {
    if (old)
      ::setenv("MEGASCOPE_DATA_DIR", old->c_str(), 1);
    else
      ::unsetenv("MEGASCOPE_DATA_DIR");
  }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;
};

}  // namespace

// ---- shipped profiles ---------------------------------------------------------

TEST_CASE("Every shipped cluster device gets its shipped profile and an unknown device gets a generic one that says so",
          "[sim]") {
  const std::map<std::string, std::string> expected = {
      {"dgx-a100", "a100"}, {"dgx-h100", "h100"}, {"dgx-h800", "h100"}, {"dgx-h200", "h200"}, {"dgx-b200", "b200"},
      {"gb200-nvl72", "gb200"}, {"pcie-8gpu", "h100-pcie"}, {"cpu-host", "cpu"}, {"dgx-2h", "v100"}};
  for (const auto& [cluster, name] : expected) {
    const DeviceSpec d = test::shipped_cluster(cluster).device;
    INFO(cluster << ": " << d.name);
    CHECK(shipped_profile_name(d) == name);
    const CostModel cm = model_for(cluster);
    // The H800 runs on the H100 SXM's profile (the same GH100 compute and HBM3).
    CHECK(cm.profile().device == (cluster == "dgx-h800" ? test::shipped_cluster("dgx-h100").device.name : d.name));
    CHECK_FALSE(cm.profile().source.empty());
    CHECK(cm.profile().source.find("generic") == std::string::npos);
  }
  DeviceSpec mystery = test::shipped_cluster("dgx-h100").device;
  mystery.name = "MI300X";
  auto cm = CostModel::for_device(mystery);
  REQUIRE(cm.has_value());
  CHECK_FALSE(shipped_profile_name(mystery).has_value());
  REQUIRE_THAT(cm->profile().source, Catch::Contains("generic") && Catch::Contains("MI300X"));
  CHECK(cm->profile().sms == 132);  // the device's own SM count
  CHECK(cm->gemm_s({4096, 4096, 4096}, Precision::bf16) > 0);

  DeviceSpec broken = mystery;
  broken.peak_bf16_flops = 0;
  auto bad = CostModel::for_device(broken);
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error().field == "device.peak_bf16_flops");
}

TEST_CASE("Shipped profiles are looked up under MEGASCOPE_DATA_DIR and a missing one falls back to generic",
          "[sim]") {
  const DeviceSpec a100 = test::shipped_cluster("dgx-a100").device;
  const auto dir = std::filesystem::temp_directory_path() / "megascope-cost-model-test-empty";
  std::filesystem::create_directories(dir);
  const EnvGuard env(dir.string());
  auto cm = CostModel::for_device(a100);
  REQUIRE(cm.has_value());
  REQUIRE_THAT(cm->profile().source, Catch::Contains("generic") && Catch::Contains("missing"));
}

TEST_CASE("Every shipped profile loads and every number in it carries a comment naming its source", "[sim]") {
  const auto files = toml_files("profiles");
  for (const auto& path : files) {
    INFO(path.string());
    auto p = load_cost_profile(path.string());
    if (!p) FAIL(p.error().str());
    CHECK_FALSE(p->source.empty());
    CHECK_FALSE(p->device.empty());
    std::ifstream in(path);
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
      ++n;
      const auto eq = line.find('=');
      if (line.empty() || line[0] == '#' || line[0] == '[' || eq == std::string::npos) continue;
      const std::string key = line.substr(0, line.find_first_of(" =\t"));
      if (key == "device" || key == "source" || key == "date") continue;
      INFO("line " << n << ": " << line);
      const auto hash = line.find('#', eq);
      REQUIRE(hash != std::string::npos);
      const std::string comment = line.substr(hash);
      const bool sourced = comment.find("fit") != std::string::npos || comment.find("derived") != std::string::npos || comment.find("measured") != std::string::npos ||
                           comment.find("assumption") != std::string::npos || comment.find(".csv") != std::string::npos ||
                           comment.find(".toml") != std::string::npos;
      CHECK(sourced);
    }
  }
  CHECK(files.size() >= 7);
}

// ---- calibration --------------------------------------------------------------

TEST_CASE("An exact measured shape in a calibration file returns the measured seconds and other shapes keep the curve",
          "[sim]") {
  CostModel cm = model_for("dgx-a100");
  const GemmShape shape{4096, 4096, 4096}, other{4096, 4096, 4095};
  const double curve = cm.gemm_s(shape, Precision::bf16), curve_other = cm.gemm_s(other, Precision::bf16);
  CHECK(curve != Approx(0.0125));
  REQUIRE(cm.apply_calibration(fixture("calibration-exact.toml")).has_value());
  CHECK(cm.gemm_s(shape, Precision::bf16) == 0.0125);
  CHECK(cm.gemm_s(shape, Precision::fp8) == 0.0125);  // A100 runs fp8 as bf16
  CHECK(cm.gemm_s(other, Precision::bf16) == curve_other);
  REQUIRE_THAT(cm.profile().source, Catch::Contains("one measured shape") && Catch::Contains("Azure ND A100"));

  // On an FP8 device the bf16 measurement does not answer an fp8 question.
  CostModel h100 = model_for("dgx-h100");
  const double fp8 = h100.gemm_s(shape, Precision::fp8);
  REQUIRE(h100.apply_calibration(fixture("calibration-exact.toml")).has_value());
  CHECK(h100.gemm_s(shape, Precision::bf16) == 0.0125);
  CHECK(h100.gemm_s(shape, Precision::fp8) == fp8);
}

TEST_CASE("A measured memory kernel is used at its kind and exact bytes, the bandwidth elsewhere", "[sim]") {
  CostModel cm = model_for("dgx-a100");
  const double bytes = 25165824;   // 6 bytes x 2048 tokens x 2048 hidden
  const double curve = cm.memory_s(MemoryOp::dropout_residual, bytes);
  CHECK(curve != Approx(0.002));
  REQUIRE(cm.apply_calibration(fixture("calibration-exact.toml")).has_value());
  CHECK(cm.memory_s(MemoryOp::dropout_residual, bytes) == 0.002);
  CHECK(cm.memory_s(MemoryOp::dropout_residual, bytes + 6) == Approx(curve).epsilon(1e-6));   // not the measured size
  CHECK(cm.memory_s(MemoryOp::norm, bytes) == Approx(cm.memory_s(MemoryOp::norm, bytes + 1)).epsilon(1e-6));  // another kind
  Kernel k;
  k.kind = KernelKind::memory;
  k.memory = MemoryOp::dropout_residual;
  k.bytes = bytes;
  CHECK(cm.kernel_s(k) == 0.002);

  const Error kind = profile_error("bad-memory-measured.toml");
  CHECK(kind.field == "memory.measured[0].kind");
  REQUIRE(kind.where.has_value());
  CHECK(kind.where->line == 5);
  REQUIRE_THAT(kind.message, Catch::Contains("\"dropout_residual\"") && Catch::Contains("softmax"));

  const Error twice = profile_error("twice-memory-measured.toml");
  REQUIRE(twice.where.has_value());
  CHECK(twice.where->line == 9);
  REQUIRE_THAT(twice.message, Catch::Contains("norm kernel of 4096 bytes is measured twice"));
}

TEST_CASE("A partial calibration file changes only the keys it sets", "[sim]") {
  CostModel cm = model_for("dgx-h200");
  const CostProfile before = cm.profile();
  REQUIRE(cm.apply_calibration(fixture("calibration-partial.toml")).has_value());
  const CostProfile& after = cm.profile();
  CHECK(after.memory_efficiency == 0.5);
  CHECK(after.launch_overhead_s == Approx(3e-6));
  REQUIRE(after.memory_Bps.size() == 1);
  CHECK(after.memory_Bps.at(MemoryOp::norm) == Approx(1e12));
  CHECK(after.device == before.device);
  CHECK(after.date == before.date);
  CHECK(after.gemm_max_efficiency == before.gemm_max_efficiency);
  CHECK(after.gemm_half_size == before.gemm_half_size);
  CHECK(after.gemm_fp8_max_efficiency == before.gemm_fp8_max_efficiency);
  CHECK(after.gemm_fp8_half_size == before.gemm_fp8_half_size);
  CHECK(after.tile_m == before.tile_m);
  CHECK(after.tile_n == before.tile_n);
  CHECK(after.sms == before.sms);
  CHECK(after.gemm_roofline_exponent == before.gemm_roofline_exponent);
  CHECK(after.attention_fwd_efficiency == before.attention_fwd_efficiency);
  CHECK(after.attention_fwd_dropout_factor == before.attention_fwd_dropout_factor);
  CHECK(after.attention_bwd_dropout_factor == before.attention_bwd_dropout_factor);
  CHECK(after.attention_bwd_efficiency == before.attention_bwd_efficiency);
  CHECK(after.attention_unfused_efficiency == before.attention_unfused_efficiency);
  CHECK(after.gemm_seconds == before.gemm_seconds);
  CHECK(after.forward_efficiency == before.forward_efficiency);
  REQUIRE_THAT(after.source, Catch::Contains("partial calibration") && Catch::Contains(before.source));
}

TEST_CASE("The forward-pass efficiency: 1 unless a profile sets it, the a100 profile's fitted value, and a calibration's over it",
          "[sim]") {
  CHECK(model_for("dgx-h100").forward_efficiency() == 1.0);
  CostModel a100 = model_for("dgx-a100");
  CHECK(a100.forward_efficiency() == Approx(0.886));   // docs/cost-model.md 4.7; refitted in tests/apps/validation_test.cpp
  auto file = load_cost_profile(fixture("forward-pass.toml"));
  REQUIRE(file);
  CHECK(file->forward_efficiency == 0.8);
  const CostProfile before = a100.profile();
  REQUIRE(a100.apply_calibration(fixture("forward-pass.toml")).has_value());
  CHECK(a100.forward_efficiency() == 0.8);
  CHECK(a100.profile().gemm_max_efficiency == before.gemm_max_efficiency);
  CHECK(a100.profile().memory_efficiency == before.memory_efficiency);
}

TEST_CASE("Every measured calibration in topologies/calibrations applies over its device's shipped profile",
          "[sim]") {
  const auto files = toml_files("calibrations");
  for (const auto& path : files) {
    INFO(path.string());
    auto p = load_cost_profile(path.string());
    if (!p) FAIL(p.error().str());
    // A measured file: the date and command in its header, measured shapes in it.
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    REQUIRE_THAT(text.str(), Catch::Contains("megascope calibrate --backend cuda") && Catch::Contains(p->date));
    REQUIRE_FALSE(p->gemm_seconds.empty());
    // The shipped cluster whose device it measured.
    std::optional<CostModel> cm;
    for (const char* cluster : {"dgx-a100", "dgx-h100", "dgx-h200", "dgx-b200", "gb200-nvl72", "pcie-8gpu"}) {
      const DeviceSpec d = test::shipped_cluster(cluster).device;
      if (d.name == p->device) cm = CostModel::for_device(d).value();
    }
    REQUIRE(cm.has_value());
    REQUIRE(cm->apply_calibration(path.string()).has_value());
    for (const auto& [key, seconds] : p->gemm_seconds) {
      const auto [m, n, k, prec] = key;
      CHECK(cm->gemm_s({m, n, k}, static_cast<Precision>(prec)) == seconds);
      // Measured, not invented: no GEMM beats the device's peak.
      CHECK(2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) / seconds <
            cm->device().peak_bf16_flops);
    }
    // The executor's attention runs no dropout, so a replayed program with
    // attention dropout is priced as the kernels measured.
    AttentionShape a{.batch = 1, .heads = 16, .kv_heads = 16, .seq_q = 2048, .seq_kv = 2048, .head_dim = 128};
    const double fwd = cm->attention_fwd_s(a), bwd = cm->attention_bwd_s(a);
    a.dropout = true;
    CHECK(cm->attention_fwd_s(a) == fwd);
    CHECK(cm->attention_bwd_s(a) == bwd);
  }
  CHECK(files.size() >= 1);
}

namespace {
// Mean and RMS of log(shipped curve's time / measured time) over the bf16
// GEMMs of a measured calibration file.
std::tuple<int, double, double> curve_against(const char* cluster, const char* file) {
  const auto path = std::filesystem::path(MEGASCOPE_DATA_DIR_FOR_TESTS) / "calibrations" / file;
  auto measured = load_cost_profile(path.string());
  if (!measured) FAIL(measured.error().str());
  const CostModel shipped = megascope::test::measured_clock_model_for(cluster);
  double sum = 0, sum2 = 0;
  int n = 0;
  for (const auto& [key, seconds] : measured->gemm_seconds) {
    const auto [m, nn, k, prec] = key;
    if (static_cast<Precision>(prec) != Precision::bf16) continue;
    const double e = std::log(shipped.gemm_s({m, nn, k}, Precision::bf16) / seconds);
    sum += e;
    sum2 += e * e;
    ++n;
  }
  return {n, n ? sum / n : 0.0, n ? std::sqrt(sum2 / n) : 0.0};
}
}  // namespace

TEST_CASE("The shipped H200 BF16 GEMM curve is within 8 percent on average of cuBLASLt measured on an H200",
          "[sim]") {
  // Out of sample: the shipped BF16 curve is derived from Azure's FP8 rows and
  // the MAMF BF16/FP8 ratio (docs/cost-model.md 4.2); these are 252 bf16
  // GEMMs of real models' shapes (all three passes) measured by `megascope
  // calibrate --backend cuda` on one H200.
  const auto [n, mean, rms] = curve_against("dgx-h200", "h200-measured-2026-11-27.toml");
  REQUIRE(n >= 200);
  INFO(fmt::format("{} shapes: mean log error {:+.3f}, RMS {:.3f}", n, mean, rms));
  CHECK(std::abs(mean) < 0.08);   // measured: -0.057 (the curve is slightly optimistic)
  CHECK(rms < 0.14);              // measured: 0.118
}

TEST_CASE("The shipped H100 BF16 GEMM curve is within 8 percent on average of cuBLASLt measured on an H100",
          "[sim]") {
  // Out of sample twice over: the shipped H100 curve is the H200 derivation
  // reused for the same GH100 compute (topologies/profiles/h100.toml); these
  // are the same 252 shapes measured on one H100 SXM.
  const auto [n, mean, rms] = curve_against("dgx-h100", "h100-measured-2026-11-27.toml");
  REQUIRE(n >= 200);
  INFO(fmt::format("{} shapes: mean log error {:+.3f}, RMS {:.3f}", n, mean, rms));
  CHECK(std::abs(mean) < 0.08);   // measured: -0.035
  CHECK(rms < 0.14);              // measured: 0.109
}

TEST_CASE("A backward bandwidth prices a kind's backward kernels only, and a file without one prices both directions",
          "[sim]") {
  const auto dir = std::filesystem::temp_directory_path() / "megascope-bwd-bandwidth-test";
  std::filesystem::create_directories(dir);
  const auto write = [&](const char* name, const std::string& text) {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  };
  const std::string both = write("both.toml", "[profile]\nsource = \"test\"\n[memory]\nnorm_GBps = 1000\nnorm_bwd_GBps = 250\n");
  const std::string fwd_only = write("fwd.toml", "[profile]\nsource = \"test\"\n[memory]\nnorm_GBps = 500\n");
  CostModel cm = model_for("dgx-h200");
  const double hbm = cm.memory_s(MemoryOp::activation, 1e9, false, true);
  REQUIRE(cm.apply_calibration(both).has_value());
  const double L = cm.profile().launch_overhead_s;
  CHECK(cm.memory_s(MemoryOp::norm, 1e9) == Approx(1e9 / 1000e9 + L));
  CHECK(cm.memory_s(MemoryOp::norm, 1e9, false, true) == Approx(1e9 / 250e9 + L));
  CHECK(cm.memory_s(MemoryOp::activation, 1e9, false, true) == hbm);   // another kind: the HBM's
  // Through the Program's kernels: the flag decides.
  Kernel k;
  k.kind = KernelKind::memory;
  k.memory = MemoryOp::norm;
  k.bytes = 1e9;
  CHECK(cm.kernel_s(k) == Approx(1e9 / 1000e9 + L));
  k.backward = true;
  CHECK(cm.kernel_s(k) == Approx(1e9 / 250e9 + L));
  // A file that sets only the kind's bandwidth prices both directions with it.
  REQUIRE(cm.apply_calibration(fwd_only).has_value());
  CHECK(cm.memory_s(MemoryOp::norm, 1e9, false, true) == Approx(1e9 / 500e9 + L));
  CHECK(cm.profile().memory_bwd_Bps.empty());
  // Bad values are refused like the others.
  const std::string bad = write("bad.toml", "[profile]\nsource = \"test\"\n[memory]\nnorm_bwd_GBps = 0\n");
  const auto r = cm.apply_calibration(bad);
  REQUIRE_FALSE(r.has_value());
  CHECK_THAT(r.error().str(), Catch::Contains("norm_bwd_GBps"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("A bad calibration file leaves the model unchanged", "[sim]") {
  CostModel cm = model_for("dgx-a100");
  const double before = cm.gemm_s({4096, 4096, 4096}, Precision::bf16);
  const std::string source = cm.profile().source;
  auto r = cm.apply_calibration(fixture("out-of-range.toml"));
  REQUIRE_FALSE(r.has_value());
  CHECK(cm.gemm_s({4096, 4096, 4096}, Precision::bf16) == before);
  CHECK(cm.profile().source == source);
  CHECK_FALSE(cm.apply_calibration(fixture("does-not-exist.toml")).has_value());
}

// ---- bad files ------------------------------------------------------------------

TEST_CASE("A malformed profile file is an error naming the file, line and column", "[sim]") {
  const Error e = profile_error("malformed.toml");
  REQUIRE(e.where.has_value());
  CHECK(e.where->file == fixture("malformed.toml"));
  CHECK(e.where->line == 3);
  CHECK(e.where->column.has_value());
  REQUIRE_THAT(e.message, Catch::Contains("TOML syntax error"));
  REQUIRE_THAT(e.str(), Catch::Contains("malformed.toml:3:"));
}

TEST_CASE("An unknown key or table in a profile is an error naming the file, line and dotted key", "[sim]") {
  const Error key = profile_error("unknown-key.toml");
  CHECK(key.field == "gemm.max_eficiency");
  REQUIRE(key.where.has_value());
  CHECK(key.where->line == 6);
  REQUIRE_THAT(key.str(), Catch::Contains("unknown-key.toml:6:1: gemm.max_eficiency: unknown key"));

  const Error table = profile_error("unknown-table.toml");
  CHECK(table.field == "gemms");
  REQUIRE(table.where.has_value());
  CHECK(table.where->line == 4);
  REQUIRE_THAT(table.message, Catch::Contains("unknown table"));
}

TEST_CASE("A value of the wrong type in a profile is an error naming the file, line and expected type", "[sim]") {
  const Error e = profile_error("wrong-type.toml");
  CHECK(e.field == "memory.efficiency");
  REQUIRE(e.where.has_value());
  CHECK(e.where->file == fixture("wrong-type.toml"));
  CHECK(e.where->line == 5);
  REQUIRE_THAT(e.message, Catch::Contains("expected a number") && Catch::Contains("string"));
}

namespace {
// A profile file's error: the dotted key, the line, and what the message says.
void check_error(const char* file, const char* field, int line, std::initializer_list<const char*> says) {
  INFO(file);
  const Error e = profile_error(file);
  CHECK(e.field == field);
  REQUIRE(e.where.has_value());
  CHECK(e.where->line == line);
  for (const char* s : says) REQUIRE_THAT(e.message, Catch::Contains(s));
}
}  // namespace

TEST_CASE("Out-of-range values and an unknown measured dtype are errors naming the file and line", "[sim]") {
  check_error("out-of-range.toml", "attention.fwd_efficiency", 5, {"[1e-6, 1]", "1.5"});
  check_error("unfused-out-of-range.toml", "attention.unfused_efficiency", 7, {"[1e-6, 1]"});
  check_error("dropout-out-of-range.toml", "attention.bwd_dropout_factor", 7, {"[1e-6, 1]", "1.2"});
  check_error("exp-share-out-of-range.toml", "attention.exp_share", 7, {"[0, 1]", "1.4"});
  check_error("forward-out-of-range.toml", "passes.forward_efficiency", 6, {"[1e-6, 1]", "1.3"});
  check_error("bad-measured.toml", "gemm.measured[0].dtype", 8, {"\"bf16\", \"fp8\"", "fp16"});
}

TEST_CASE("The interference SM count: 0 in every shipped profile, read from a calibration, refused out of range", "[sim]") {
  for (const char* cluster : {"dgx-a100", "dgx-h100", "dgx-b200", "gb200-nvl72", "dgx-2h"}) {
    INFO(cluster);
    CHECK(model_for(cluster).profile().comm_sms == 0);
  }
  const auto dir = std::filesystem::temp_directory_path() / "megascope-interference-test";
  std::filesystem::create_directories(dir);
  const auto write = [&](const char* name, const std::string& text) {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  };
  CostModel cm = model_for("dgx-h100");
  REQUIRE(cm.apply_calibration(write("on.toml", "[interference]\ncomm_sms = 24\n")).has_value());
  CHECK(cm.profile().comm_sms == 24);
  CHECK(cm.profile().sms == 132);   // the rest of the shipped profile kept
  const auto bad = load_cost_profile(write("bad.toml", "[profile]\nsource = \"test\"\n[interference]\ncomm_sms = 5000\n"));
  REQUIRE_FALSE(bad);
  CHECK(bad.error().field == "interference.comm_sms");
  REQUIRE(bad.error().where.has_value());
  CHECK(bad.error().where->line == 4);
  REQUIRE_THAT(bad.error().message, Catch::Contains("5000"));
}
