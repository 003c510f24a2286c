// Sharded data parallelism from a Megatron-LM launch line (Megatron-FSDP,
// PyTorch FSDP2, --fp8-param-gather) and from a DeepSpeed ds_config.json:
// what each key sets, and the errors that name the file, line and key.
#include <catch2/catch.hpp>

#include "config/deepspeed_config.hpp"
#include "config/megatron_support.hpp"
#include "core/accounting/params.hpp"

using namespace megascope;
using namespace megascope::test;

TEST_CASE("Megatron-FSDP's sharding strategies import as ZeRO stages", "[config][zero]") {
  const std::string fsdp = kSmall + "--use-megatron-fsdp ";
  // The default strategy shards everything; --overlap-param-gather prefetches.
  PlanSpec p = import_ok(fsdp + "--overlap-grad-reduce --overlap-param-gather").plan;
  CHECK(zero_stage(p) == 3);
  CHECK(p.distributed_optimizer);
  CHECK(p.fsdp_prefetch == 1);
  CHECK_FALSE(p.overlap_param_gather);
  CHECK(import_ok(fsdp).plan.fsdp_prefetch == 0);
  struct Row { const char* strategy; int zero; };
  for (const Row& r : {Row{"optim_grads_params", 3}, Row{"optim_grads", 2}, Row{"optim", 1}, Row{"no_shard", 0}}) {
    INFO(r.strategy);
    const PlanSpec q = import_ok(fsdp + "--data-parallel-sharding-strategy " + r.strategy).plan;
    CHECK(zero_stage(q) == r.zero);
  }
  const Error bad = import_error(fsdp + "--data-parallel-sharding-strategy full");
  CHECK(bad.field == "megatron.--data-parallel-sharding-strategy");
  const Error alone = import_error(kSmall + "--data-parallel-sharding-strategy optim_grads");
  CHECK(alone.field == "megatron.--data-parallel-sharding-strategy");
  CHECK_THAT(alone.message, Catch::Contains("--use-megatron-fsdp"));
  const Error unit = import_error(fsdp + "--suggested-communication-unit-size 1000000");
  CHECK(unit.field == "megatron.--suggested-communication-unit-size");
  // The double buffer holds the two units the working set counts: accepted, listed.
  CHECK(contains(import_ok(fsdp + "--fsdp-double-buffer").ignored, "--fsdp-double-buffer"));
}

TEST_CASE("PyTorch FSDP2 imports as ZeRO-3 under Megatron-LM's own rules", "[config][zero]") {
  const std::string ok = kSmall + "--untie-embeddings-and-output-weights --no-gradient-accumulation-fusion --use-torch-fsdp2 ";
  PlanSpec p = import_ok(ok).plan;
  CHECK(zero_stage(p) == 3);
  CHECK(p.reshard_after_forward);
  CHECK_FALSE(import_ok(ok + "--torch-fsdp2-no-reshard-after-forward").plan.reshard_after_forward);
  struct Row { std::string line; std::string words; };
  for (const Row& r : {Row{ok + "--pipeline-model-parallel-size 2", "pipeline parallelism"},
                       Row{ok + "--use-distributed-optimizer", "distributed optimizer"},
                       Row{kSmall + "--untie-embeddings-and-output-weights --use-torch-fsdp2", "gradient accumulation fusion"},
                       Row{kSmall + "--no-gradient-accumulation-fusion --use-torch-fsdp2", "untie"},
                       Row{ok + "--use-megatron-fsdp", "exclude each other"}}) {
    INFO(r.line);
    const Error e = import_error(r.line);
    CHECK(e.field == "megatron.--use-torch-fsdp2");
    CHECK_THAT(e.message, Catch::Contains(r.words));
  }
  CHECK(import_error(kSmall + "--torch-fsdp2-no-reshard-after-forward").field ==
        "megatron.--torch-fsdp2-no-reshard-after-forward");
}

TEST_CASE("The FP8 parameter gather flag imports as the plan's FP8 parameter gathers", "[config][zero]") {
  const PlanSpec p =
      import_ok(kSmall + "--fp8-format hybrid --use-distributed-optimizer --fp8-param-gather").plan;
  CHECK(p.fp8_param_gather);
}

namespace {
const char* kZero3 = R"({
  "train_batch_size": 64,
  "train_micro_batch_size_per_gpu": 2,
  "gradient_accumulation_steps": 4,
  "bf16": {"enabled": true},
  "gradient_clipping": 1.0,
  "zero_optimization": {
    "stage": 3,
    "overlap_comm": true,
    "contiguous_gradients": true,
    "reduce_bucket_size": 5e8,
    "stage3_prefetch_bucket_size": 30000000,
    "stage3_param_persistence_threshold": 1e5
  }
})";

DeepSpeedConfig parse_ok(const std::string& text) {
  auto r = parse_deepspeed_config(text, "ds.json");
  if (!r) FAIL(r.error().str());
  return *r;
}
}  // namespace

TEST_CASE("A DeepSpeed ZeRO-3 config sets the stage, overlap, buckets, prefetch, batch and precision", "[config][zero]") {
  const DeepSpeedConfig ds = parse_ok(kZero3);
  CHECK(ds.stage == 3);
  CHECK(ds.reduce_bucket_size == 5e8);
  CHECK(contains(ds.ignored, "gradient_clipping"));
  CHECK(contains(ds.ignored, "zero_optimization.stage3_param_persistence_threshold"));
  ModelSpec m = import_ok(kSmall).model;
  PlanSpec plan;
  TrainingSpec t;
  REQUIRE(apply_deepspeed_config(ds, m, plan, t, 8));
  CHECK(zero_stage(plan) == 3);
  CHECK(plan.overlap_grad_reduce);
  CHECK(plan.grad_bucket == 500000000);
  CHECK(plan.micro_batch_size == 2);
  CHECK(t.global_batch_size == 64);
  CHECK(t.params_dtype == Dtype::bf16);
  // 3e7 elements ahead over a 12.6M-parameter layer: two layers prefetched.
  const double layer = layer_params(m, 0).total();
  CHECK(plan.fsdp_prefetch == static_cast<int>(3e7 / layer));
  CHECK(plan.fsdp_prefetch == 2);
  // Without overlap_comm nothing is prefetched; stage 3 overlaps by default.
  std::string off = kZero3;
  off.replace(off.find("\"overlap_comm\": true"), 20, "\"overlap_comm\": false");
  PlanSpec q;
  REQUIRE(apply_deepspeed_config(parse_ok(off), m, q, t, 8));
  CHECK(q.fsdp_prefetch == 0);
  CHECK_FALSE(q.overlap_grad_reduce);
  // train_batch_size must be micro-batch x accumulation x DP.
  const auto wrong = apply_deepspeed_config(ds, m, plan, t, 4);
  REQUIRE_FALSE(wrong);
  CHECK(wrong.error().field == "deepspeed.train_batch_size");
  // Stages 2 and 3 do not run with DeepSpeed's pipeline engine.
  PlanSpec piped;
  piped.pp = 2;
  const auto pp = apply_deepspeed_config(ds, m, piped, t, std::nullopt);
  REQUIRE_FALSE(pp);
  CHECK(pp.error().field == "deepspeed.zero_optimization.stage");
}

TEST_CASE("DeepSpeed keys that are not modelled or not known are errors naming the file, line and key", "[config][zero]") {
  struct Row { std::string text; std::string field; int line; std::string words; };
  for (const Row& r : {
           Row{"{\n  \"zero_optimization\": {\n    \"stage\": 3,\n    \"offload_optimizer\": {\"device\": \"cpu\"}\n  }\n}",
               "deepspeed.zero_optimization.offload_optimizer", 4, "ZeRO-Offload"},
           Row{"{\n  \"zero_optimization\": {\"stage\": 2,\n  \"zero_hpz_partition_size\": 8}\n}",
               "deepspeed.zero_optimization.zero_hpz_partition_size", 3, "ZeRO++"},
           Row{"{\n  \"train_batch_size\": 8,\n  \"zero_optimisation\": {\"stage\": 2}\n}", "deepspeed.zero_optimisation", 3,
               "unknown DeepSpeed key"},
           Row{"{\"zero_optimization\": {\"stage\": 4}}", "deepspeed.zero_optimization.stage", 1, "[0, 3]"},
           Row{"{\"zero_optimization\": {\"stage\": 2, \"reduce_scatter\": false}}",
               "deepspeed.zero_optimization.reduce_scatter", 1, "not modelled"},
           Row{"{\n\"optimizer\": {\"type\": \"Lamb\"}}", "deepspeed.optimizer.type", 2, "Lamb"},
           Row{"{\"bf16\": {\"enabled\": true}, \"fp16\": {\"enabled\": true}}", "deepspeed.fp16.enabled", 1, "one"},
           Row{"{\"train_micro_batch_size_per_gpu\": 1.5}", "deepspeed.train_micro_batch_size_per_gpu", 1, "whole"}}) {
    INFO(r.text);
    const auto e = parse_deepspeed_config(r.text, "ds.json");
    REQUIRE_FALSE(e);
    CHECK(e.error().field == r.field);
    REQUIRE(e.error().where);
    CHECK(e.error().where->file == "ds.json");
    CHECK(e.error().where->line == r.line);
    CHECK_THAT(e.error().message, Catch::Contains(r.words));
  }
  const auto malformed = parse_deepspeed_config("{\"zero_optimization\": {", "ds.json");
  REQUIRE_FALSE(malformed);
  CHECK_THAT(malformed.error().message, Catch::Contains("malformed JSON"));
  const auto missing = load_deepspeed_config("/nonexistent/ds.json");
  REQUIRE_FALSE(missing);
  CHECK_THAT(missing.error().message, Catch::Contains("/nonexistent/ds.json"));
}

TEST_CASE("Mutated DeepSpeed configs give a config or one error, never a crash or an exception", "[config][zero]") {
  // Every truncation, and seeded single-byte substitutions, deletions and
  // insertions of JSON's structural characters, of a full config.
  const std::string base = kZero3;
  std::uint64_t state = 0x9e3779b97f4a7c15ULL;
  const auto next = [&]() {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  const std::string alphabet = "{}[]:,\"0123456789.-+eE truefalsnul\\\n";
  std::vector<std::string> cases;
  for (std::size_t n = 0; n <= base.size(); ++n) cases.push_back(base.substr(0, n));
  for (int i = 0; i < 3000; ++i) {
    std::string t = base;
    const std::size_t at = next() % t.size();
    switch (next() % 3) {
      case 0: t[at] = alphabet[next() % alphabet.size()]; break;
      case 1: t.erase(at, 1); break;
      default: t.insert(at, 1, alphabet[next() % alphabet.size()]); break;
    }
    cases.push_back(std::move(t));
  }
  int parsed = 0, refused = 0;
  const ModelSpec m = import_ok(kSmall).model;
  for (const std::string& text : cases) {
    Result<DeepSpeedConfig> r = DeepSpeedConfig{};
    REQUIRE_NOTHROW(r = parse_deepspeed_config(text, "ds.json"));
    if (!r) {
      ++refused;
      CHECK_FALSE(r.error().message.empty());
      REQUIRE(r.error().where);
      CHECK(r.error().where->file == "ds.json");
      continue;
    }
    ++parsed;
    PlanSpec plan;
    TrainingSpec t;
    REQUIRE_NOTHROW((void)apply_deepspeed_config(*r, m, plan, t, 8));
  }
  CHECK(parsed > 0);
  CHECK(refused > 0);
}

TEST_CASE("Hybrid sharding imports from distributed-optimizer instances and MiCS, and exports back", "[config][zero]") {
  const PlanSpec p = import_ok(kSmall + "--use-distributed-optimizer --num-distributed-optimizer-instances 4").plan;
  CHECK(p.dp_replicas == 4);
  CHECK(zero_stage(p) == 1);
  CHECK(import_ok(kSmall + "--use-megatron-fsdp --num-distributed-optimizer-instances 2").plan.dp_replicas == 2);
  CHECK(import_error(kSmall + "--num-distributed-optimizer-instances 2").field ==
        "megatron.--num-distributed-optimizer-instances");
  // MiCS: shard groups of 4 ranks over DP 16 are 4 replicas.
  DeepSpeedConfig ds = parse_ok(R"({"zero_optimization": {"stage": 3, "mics_shard_size": 4}})");
  PlanSpec plan;
  TrainingSpec t;
  REQUIRE(apply_deepspeed_config(ds, import_ok(kSmall).model, plan, t, 16));
  CHECK(plan.dp_replicas == 4);
  const auto unknown_dp = apply_deepspeed_config(ds, import_ok(kSmall).model, plan, t, std::nullopt);
  REQUIRE_FALSE(unknown_dp);
  CHECK(unknown_dp.error().field == "deepspeed.zero_optimization.mics_shard_size");
  const auto odd = apply_deepspeed_config(ds, import_ok(kSmall).model, plan, t, 6);
  REQUIRE_FALSE(odd);
  CHECK_THAT(odd.error().message, Catch::Contains("divide"));
}
