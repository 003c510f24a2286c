// Variable-length training as users write it: [training.lengths] in a
// training TOML (a lognormal, or a histogram file beside it) and the packing
// flags of a Megatron-LM launch line, read, refused with the field and rule,
// and written back.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "config/megatron_support.hpp"
#include "config/spec_toml.hpp"
#include "support.hpp"

using namespace megascope;
using namespace megascope::test;

namespace {

std::filesystem::path temp_dir() {
  const auto dir = std::filesystem::temp_directory_path() / "megascope-varlen-config";
  std::filesystem::create_directories(dir);
  return dir;
}

std::string write(const std::string& name, const std::string& text) {
  const auto path = temp_dir() / name;
  std::ofstream(path, std::ios::binary) << text;
  return path.string();
}

const std::string kHead = "[training]\nglobal_batch_size = 64\nseq_length = 8192\n\n[training.lengths]\n";

}  // namespace

TEST_CASE("A training TOML's lengths table reads a lognormal and a histogram beside the file", "[config][varlen]") {
  auto t = load_training_toml(write("lognormal.toml", kHead + "distribution = \"lognormal\"\nmean = 2048\nsigma = 1.1\n"
                                                              "min = 128\nmax = 8192\npacking = \"pack\"\nseed = 7\nsteps = 3\n"));
  if (!t) FAIL(t.error().str());
  REQUIRE(t->varlen);
  CHECK(t->varlen->lengths.kind == LengthDistribution::Kind::lognormal);
  CHECK(t->varlen->lengths.mean == 2048);
  CHECK(t->varlen->lengths.sigma == Approx(1.1));
  CHECK(t->varlen->lengths.min == 128);
  CHECK(t->varlen->lengths.max == 8192);
  CHECK(t->varlen->packing == Packing::pack);
  CHECK(t->varlen->seed == 7);
  CHECK(t->varlen->steps == 3);

  // A histogram's file is read relative to the TOML that names it.
  write("lengths.txt", "# length count\n512 3\n4096,1\n");
  auto h = load_training_toml(write("histogram.toml", kHead + "distribution = \"histogram\"\nfile = \"lengths.txt\"\n"
                                                              "packing = \"pad\"\n"));
  if (!h) FAIL(h.error().str());
  REQUIRE(h->varlen);
  REQUIRE(h->varlen->lengths.histogram.size() == 2);
  CHECK(h->varlen->lengths.histogram[0] == std::pair<std::int64_t, double>{512, 3.0});
  CHECK(h->varlen->lengths.histogram[1] == std::pair<std::int64_t, double>{4096, 1.0});
  CHECK(h->varlen->packing == Packing::pad);

  // Without the table, fixed-length training as before.
  auto plain = load_training_toml(write("plain.toml", "[training]\nglobal_batch_size = 64\n"));
  REQUIRE(plain);
  CHECK_FALSE(plain->varlen);
}

TEST_CASE("A lengths table's mistakes are errors naming the key", "[config][varlen]") {
  struct Row { std::string body; std::string field; std::string words; };
  for (const Row& r : {Row{"distribution = \"lognormal\"\nmeen = 3\n", "training.lengths.meen", ""},
                       Row{"distribution = \"gamma\"\n", "training.lengths.distribution", "lognormal"},
                       Row{"mean = 3\n", "training.lengths.distribution", ""},
                       Row{"distribution = \"histogram\"\n", "training.lengths.file", "histogram"},
                       Row{"distribution = \"lognormal\"\nmean = 100\nsigma = 1\nfile = \"x.txt\"\n", "training.lengths.file",
                           "only with"},
                       Row{"distribution = \"histogram\"\nfile = \"missing-lengths.txt\"\n", "training.lengths.file", ""},
                       Row{"distribution = \"lognormal\"\nmean = 100\nsigma = 1\npacking = \"thd\"\n",
                           "training.lengths.packing", "pad, pack"},
                       Row{"distribution = \"lognormal\"\nmean = 100\nsigma = 1\nseed = -1\n", "training.lengths.seed", ">= 0"}}) {
    INFO(r.body);
    auto t = load_training_toml(write("bad.toml", kHead + r.body));
    REQUIRE_FALSE(t);
    CHECK(t.error().field == r.field);
    CHECK_THAT(t.error().message, Catch::Contains(r.words));
    CHECK(t.error().where);
  }
}

TEST_CASE("Setups refuse variable-length plans they cannot price", "[config][varlen]") {
  const ModelSpec m = shipped_model("llama3-8b");
  const auto with = [&](const std::string& plan, LengthDistribution d, Packing packing) {
    auto p = parse_inline_plan(plan);
    REQUIRE(p);
    TrainingSpec t;
    t.global_batch_size = 16;
    t.seq_length = 8192;
    auto v = std::make_shared<VarlenSpec>();
    v->lengths = std::move(d);
    v->packing = packing;
    t.varlen = v;
    auto c = with_device_count(shipped_cluster("dgx-h100"), 8);
    REQUIRE(c);
    return validate_setup(m, *c, t, *p, 8);
  };
  LengthDistribution logn;
  logn.kind = LengthDistribution::Kind::lognormal;
  logn.mean = 2000;
  logn.sigma = 1;
  // max left out: the sequence length.
  auto ok = with("tp=1,cp=2,mbs=1", logn, Packing::pack);
  if (!ok) FAIL(ok.error().str());
  CHECK(ok->training.varlen->lengths.max == 8192);
  expect_error(with("tp=1,mbs=2", logn, Packing::pack), "plan.mbs", "mbs must be 1");
  CHECK(with("tp=1,mbs=2", logn, Packing::pad).has_value());   // padded sequences: any micro-batch
  expect_error(with("tp=1,cp=2,mbs=1,cp_comm=a2a", logn, Packing::pack), "plan.cp_comm", "p2p");
  expect_error(with("tp=1,mbs=1,attention=unfused", logn, Packing::pack), "plan.attention", "fused");
  expect_error(with("tp=1,mbs=2,dynamic_cp=on", logn, Packing::pad), "plan.dynamic_cp", "pack");
  LengthDistribution longer = logn;
  longer.max = 16384;
  expect_error(with("tp=1,mbs=1", longer, Packing::pack), "training.lengths.max", "8192");
  // Without lengths, dynamic CP has nothing to schedule.
  expect_error(try_setup(m, "dgx-h100", "tp=1,cp=2,dynamic_cp=on", 16, 8, 8192), "plan.dynamic_cp", "training.lengths");
}

TEST_CASE("A Megatron-LM line's packing flags import as lengths and dynamic CP, and export back", "[config][varlen]") {
  const std::string mock =
      "--sft-mock-dataset-config-json '{\"mode\":\"distribution\",\"type\":\"lognormal\",\"min_seq_len\":128,"
      "\"max_seq_len\":1024,\"mean_seq_len\":512,\"lognormal_sigma\":1.1}' ";
  const std::string cp2 = kSmall + "--context-parallel-size 2 ";
  const MegatronLaunch dyn = import_ok(cp2 + mock +
                                       "--sequence-packing-scheduler default_dynamic_cp --dynamic-context-parallel "
                                       "--max-seqlen-per-dp-cp-rank 512");
  REQUIRE(dyn.training.varlen);
  const LengthDistribution& d = dyn.training.varlen->lengths;
  CHECK(d.kind == LengthDistribution::Kind::lognormal);
  CHECK(d.mean == 512);
  CHECK(d.sigma == Approx(1.1));
  CHECK(d.min == 128);
  CHECK(d.max == 1024);
  CHECK(dyn.training.varlen->packing == Packing::pack);
  CHECK(dyn.plan.dynamic_cp);
  const MegatronLaunch stat = import_ok(cp2 + mock + "--sequence-packing-scheduler dp_balanced");
  CHECK_FALSE(stat.plan.dynamic_cp);
  REQUIRE(stat.training.varlen);
  CHECK(stat.training.varlen->packing == Packing::pack);
  // The mock data alone, without packing: padded sequences.
  CHECK(import_ok(cp2 + mock).training.varlen->packing == Packing::pad);
  // Without any of the flags: fixed length, as before.
  CHECK_FALSE(import_ok(cp2).training.varlen);

  struct Row { std::string line; std::string field; std::string words; };
  for (const Row& r :
       {Row{cp2 + mock + "--max-seqlen-per-dp-cp-rank 256", "megatron.--max-seqlen-per-dp-cp-rank", "512"},
        Row{cp2 + "--sequence-packing-scheduler dp_balanced", "megatron.--sequence-packing-scheduler", "dataset"},
        Row{cp2 + mock + "--sequence-packing-scheduler naive_sequence_packing", "megatron.--sequence-packing-scheduler",
            "dp_balanced"},
        Row{cp2 + mock + "--sequence-packing-scheduler dp_balanced --dynamic-context-parallel",
            "megatron.--dynamic-context-parallel", "default_dynamic_cp"},
        Row{cp2 + mock + "--dynamic-context-parallel --min-dynamic-context-parallel-size 2",
            "megatron.--min-dynamic-context-parallel-size", "1"},
        Row{cp2 + "--sft-mock-dataset-config-json '{\"mode\":\"file\",\"path\":\"x.csv\"}'",
            "megatron.--sft-mock-dataset-config-json", "lognormal"},
        Row{cp2 + "--sft-mock-dataset-config-json '{\"mode\":\"distribution\",\"type\":\"lognormal\"}'",
            "megatron.--sft-mock-dataset-config-json", "min_seq_len"}}) {
    INFO(r.line);
    const Error e = import_error(r.line);
    CHECK(e.field == r.field);
    CHECK_THAT(e.message, Catch::Contains(r.words));
  }

  // Export: the scheduler's flags (the lengths are the dataset's).
  const ModelSpec m = shipped_model("llama3-8b");
  TrainingSpec t;
  t.global_batch_size = 16;
  t.seq_length = 8192;
  t.varlen = dyn.training.varlen;
  auto p = parse_inline_plan("tp=1,cp=2,mbs=1,dynamic_cp=on");
  REQUIRE(p);
  auto c = with_device_count(shipped_cluster("dgx-h100"), 8);
  REQUIRE(c);
  auto s = validate_setup(m, *c, t, *p, 8);
  if (!s) FAIL(s.error().str());
  auto line = export_megatron_args(*s);
  if (!line) FAIL(line.error().str());
  CHECK_THAT(*line, Catch::Contains("--sequence-packing-scheduler default_dynamic_cp"));
  CHECK_THAT(*line, Catch::Contains("--dynamic-context-parallel"));
  CHECK_THAT(*line, Catch::Contains("--max-seqlen-per-dp-cp-rank 4096"));
}
