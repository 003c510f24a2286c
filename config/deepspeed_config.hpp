// DeepSpeed configuration file (ds_config.json) -> the ZeRO stage, batch and
// precision of a plan. Read beside a model and plan (--deepspeed-config next
// to --megatron-args, --plan or an example), as Megatron-DeepSpeed runs take
// them. Keys that change the cost and are not modelled (optimizer and
// parameter offload, ZeRO++ quantisation and hierarchical partitioning,
// ZeRO-Infinity) are errors naming the file, line and key; keys that change
// nothing Megascope prices (logging, the learning-rate scheduler) are listed
// as ignored; unknown keys are errors.
//
// What each modelled key sets (docs/spec-format.md, "DeepSpeed"):
//   zero_optimization.stage                 plan zero (and distopt from 1)
//   zero_optimization.overlap_comm          overlap_grad_reduce; at stage 3
//                                           with stage3_prefetch_bucket_size,
//                                           how many layers are prefetched
//   zero_optimization.reduce_bucket_size    plan grad_bucket
//   train_batch_size, train_micro_batch_size_per_gpu,
//   gradient_accumulation_steps             global batch and micro-batch
//   bf16.enabled / fp16.enabled             16-bit weights (fp16: fp16 gradients)
//   zero_optimization.mics_shard_size       dp_replicas = DP / it (MiCS: hybrid sharding)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/model.hpp"
#include "core/plan.hpp"
#include "core/result.hpp"
#include "core/training.hpp"

namespace megascope {

struct DeepSpeedConfig {
  std::string source;                              // the file, for messages
  int stage = 0;                                   // zero_optimization.stage
  std::optional<bool> overlap_comm;                // DeepSpeed's default: on at stage 3 only
  std::optional<double> reduce_bucket_size;        // elements (default 5e8)
  std::optional<double> prefetch_bucket_size;      // stage3_prefetch_bucket_size, elements (default 5e7)
  std::optional<std::int64_t> train_batch_size;
  std::optional<std::int64_t> micro_batch;         // train_micro_batch_size_per_gpu
  std::optional<std::int64_t> grad_accum;          // gradient_accumulation_steps
  std::optional<bool> bf16, fp16;                  // *.enabled
  std::optional<int> mics_shard_size;              // MiCS: ranks per sharding group (plan dp_replicas)
  std::vector<std::string> ignored;                // keys read and not priced ("zero_optimization.sub_group_size")
};

Result<DeepSpeedConfig> load_deepspeed_config(const std::string& path);
// `source` names the text in errors (a path or "<string>").
Result<DeepSpeedConfig> parse_deepspeed_config(std::string_view json_text, const std::string& source);

// Sets the plan's ZeRO stage, overlap, bucket and micro-batch and the
// training's batch and precision from the file. `model` sizes the stage-3
// prefetch (the bucket over one layer's parameters); `data_parallel` (when
// known) checks train_batch_size = micro-batch x accumulation x DP. Errors
// name the file and the key; a stage DeepSpeed does not run with pipeline
// parallelism (2 and 3) is refused.
Result<void> apply_deepspeed_config(const DeepSpeedConfig& ds, const ModelSpec& model, PlanSpec& plan,
                                    TrainingSpec& training, std::optional<int> data_parallel);

}  // namespace megascope
