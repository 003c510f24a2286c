#include "config/megatron_sharding.hpp"

#include <fmt/format.h>

namespace megascope::megatron_detail {

Result<void> import_sharding(Args& args, const ModelSpec& model, const std::optional<std::string>& sharding, PlanSpec& p) {
  const bool megatron_fsdp = args.has("--use-megatron-fsdp");
  const bool torch_fsdp2 = args.has("--use-torch-fsdp2");
  // Sharded data parallelism: Megatron-FSDP (its sharding strategy, default
  // optim_grads_params; it turns the distributed optimizer on) or PyTorch
  // FSDP2 (parameters, gradients and optimizer state sharded).
  if (megatron_fsdp && torch_fsdp2)
    return fail("megatron.--use-torch-fsdp2", "--use-torch-fsdp2 and --use-megatron-fsdp exclude each other");
  if (!megatron_fsdp)
    for (const char* flag : {"--data-parallel-sharding-strategy", "--fsdp-double-buffer"})
      if (args.has(flag)) return fail(field_of(flag), fmt::format("{} needs --use-megatron-fsdp", flag));
  if (!torch_fsdp2 && args.has("--torch-fsdp2-no-reshard-after-forward"))
    return fail("megatron.--torch-fsdp2-no-reshard-after-forward", "--torch-fsdp2-no-reshard-after-forward needs --use-torch-fsdp2");
  if (megatron_fsdp) {
    const std::string strategy = sharding.value_or("optim_grads_params");
    p.zero = strategy == "optim_grads_params" ? 3 : strategy == "optim_grads" ? 2 : strategy == "optim" ? 1 : 0;
    p.distributed_optimizer = p.zero >= 1;
    if (p.zero == 0 && args.has("--use-distributed-optimizer"))
      return fail("megatron.--data-parallel-sharding-strategy",
                  "no_shard with --use-distributed-optimizer is not modelled: use optim (the optimizer state sharded)");
    // Megatron-FSDP prefetches the next unit's gather with --overlap-param-gather.
    if (p.zero == 3) {
      p.fsdp_prefetch = p.overlap_param_gather ? 1 : 0;
      p.overlap_param_gather = false;
    }
    // Its double buffer holds the two units the working set counts already.
    if (args.has("--fsdp-double-buffer")) args.note_ignored("--fsdp-double-buffer");
  }
  if (torch_fsdp2) {
    // Megatron-LM's asserts for FSDP2.
    if (p.pp > 1) return fail("megatron.--use-torch-fsdp2", "--use-torch-fsdp2 is not supported with pipeline parallelism");
    if (p.ep > 1) return fail("megatron.--use-torch-fsdp2", "--use-torch-fsdp2 is not supported with expert parallelism");
    if (args.has("--use-distributed-optimizer"))
      return fail("megatron.--use-torch-fsdp2", "--use-torch-fsdp2 is not supported with MCore's distributed optimizer");
    if (!args.has("--no-gradient-accumulation-fusion"))
      return fail("megatron.--use-torch-fsdp2",
                  "--use-torch-fsdp2 is not supported with gradient accumulation fusion (add --no-gradient-accumulation-fusion)");
    if (model.tied_embeddings)
      return fail("megatron.--use-torch-fsdp2", "--use-torch-fsdp2 requires --untie-embeddings-and-output-weights");
    p.zero = 3;
    p.distributed_optimizer = true;
    p.reshard_after_forward = !args.has("--torch-fsdp2-no-reshard-after-forward");
    p.fsdp_prefetch = 1;   // FSDP2's implicit forward and backward prefetch of the next unit
  }
  return {};
}

Result<std::vector<std::string>> export_sharding(const Setup& s) {
  const PlanSpec& p = s.plan;
  std::vector<std::string> a;
  auto sw = [&a](std::string_view flag) { a.emplace_back(flag); };
  auto kv = [&a](std::string_view flag, const auto& value) { a.push_back(fmt::format("{} {}", flag, value)); };
  const int zero = zero_stage(p);
  if (zero >= 2 && !p.reshard_after_forward) {
    // Only PyTorch FSDP2 keeps the parameters gathered from forward to backward.
    if (p.pp > 1 || p.ep > 1)
      return fail("plan.reshard_after_forward", "reshard_after_forward=off exports as --use-torch-fsdp2, which Megatron-LM "
                                                "runs without pipeline and expert parallelism");
    if (p.fsdp_prefetch != 1)
      return fail("plan.fsdp_prefetch", "PyTorch FSDP2 prefetches one unit; the plan's fsdp_prefetch has no flag");
    if (p.grad_accum_fusion)
      return fail("plan.grad_accum_fusion", "reshard_after_forward=off exports as --use-torch-fsdp2, which runs without "
                                            "gradient accumulation fusion: set grad_accum_fusion=off");
    if (s.model.tied_embeddings)
      return fail("plan.reshard_after_forward", "reshard_after_forward=off exports as --use-torch-fsdp2, which needs "
                                                "untied embeddings");
    sw("--use-torch-fsdp2");
    sw("--torch-fsdp2-no-reshard-after-forward");
  } else if (zero >= 2) {
    if (p.fsdp_prefetch > 1)
      return fail("plan.fsdp_prefetch", "Megatron-FSDP prefetches at most one unit (--overlap-param-gather); the plan's "
                                        "fsdp_prefetch has no flag");
    if (zero == 3 && p.fsdp_prefetch == 1 && !p.overlap_grad_reduce)
      return fail("plan.fsdp_prefetch", "Megatron-FSDP prefetches with --overlap-param-gather, which needs "
                                        "--overlap-grad-reduce: set overlap_grad_reduce=on or fsdp_prefetch=0");
    sw("--use-megatron-fsdp");
    sw("--use-distributed-optimizer");
    kv("--data-parallel-sharding-strategy", zero == 3 ? "optim_grads_params" : "optim_grads");
  } else if (p.distributed_optimizer) {
    sw("--use-distributed-optimizer");
  }
  if (p.dp_replicas > 1) kv("--num-distributed-optimizer-instances", p.dp_replicas);
  return a;
}

}  // namespace megascope::megatron_detail
