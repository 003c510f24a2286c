// Megatron-LM flag tables, after megatron/training/arguments.py (argparse):
// each flag is a switch (store_true/store_false), takes one value, or takes a
// list (nargs='*' / nargs='+').
//
// Does: list every flag Megascope knows with its arity and role (used,
// ignored, unmodelled with the reason), and look names up / suggest close ones.
// Does not: parse command lines (megatron_cmdline.cpp) or read flag values
// (megatron_args.cpp).
#include "config/megatron_flags.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/result.hpp"

namespace megascope::megatron_detail {

namespace {

struct Entry {
  std::string_view name;
  Arity arity;
};

// Flags that shape the model, the batch or the plan (read by interpret()).
constexpr Entry kUsed[] = {
    // model shape
    {"--num-layers", Arity::one},
    {"--encoder-num-layers", Arity::one},
    {"--hidden-size", Arity::one},
    {"--ffn-hidden-size", Arity::one},
    {"--num-attention-heads", Arity::one},
    {"--group-query-attention", Arity::none},
    {"--num-query-groups", Arity::one},
    {"--kv-channels", Arity::one},
    {"--swiglu", Arity::none},
    {"--normalization", Arity::one},
    {"--untie-embeddings-and-output-weights", Arity::none},
    {"--disable-bias-linear", Arity::none},
    {"--add-qkv-bias", Arity::none},
    {"--qk-layernorm", Arity::none},
    {"--seq-length", Arity::one},
    {"--encoder-seq-length", Arity::one},
    {"--max-position-embeddings", Arity::one},
    {"--position-embedding-type", Arity::one},
    {"--use-rotary-position-embeddings", Arity::none},
    {"--no-position-embedding", Arity::none},
    {"--vocab-size", Arity::one},
    {"--make-vocab-size-divisible-by", Arity::one},
    {"--hidden-dropout", Arity::one},
    {"--attention-dropout", Arity::one},
    {"--mtp-num-layers", Arity::one},
    {"--window-size", Arity::one},              // model window_size: "W,0" or "(W,0)"
    {"--window-attn-skip-freq", Arity::one},    // model window_skip_freq: N (a list pattern is refused)
    // MoE
    {"--num-experts", Arity::one},
    {"--moe-router-topk", Arity::one},
    {"--moe-grouped-gemm", Arity::none},   // how the Program runs experts (one GEMM per rank); moe_act recompute needs it
    {"--moe-ffn-hidden-size", Arity::one},
    {"--moe-shared-expert-intermediate-size", Arity::one},
    {"--moe-layer-freq", Arity::one},
    {"--moe-expert-capacity-factor", Arity::one},
    {"--moe-pad-expert-input-to-capacity", Arity::none},
    {"--moe-shared-expert-overlap", Arity::none},
    {"--moe-token-dispatcher-type", Arity::one},
    {"--moe-enable-deepep", Arity::none},
    {"--moe-flex-dispatcher-backend", Arity::one},
    {"--overlap-moe-expert-parallel-comm", Arity::none},
    {"--moe-router-num-groups", Arity::one},
    {"--moe-router-group-topk", Arity::one},
    // MLA
    {"--multi-latent-attention", Arity::none},
    {"--q-lora-rank", Arity::one},
    {"--kv-lora-rank", Arity::one},
    {"--qk-head-dim", Arity::one},
    {"--qk-pos-emb-head-dim", Arity::one},
    {"--v-head-dim", Arity::one},
    // batch and precision
    {"--micro-batch-size", Arity::one},
    {"--global-batch-size", Arity::one},
    {"--bf16", Arity::none},
    {"--fp16", Arity::none},
    {"--fp8-format", Arity::one},
    {"--fp8-recipe", Arity::one},
    {"--fp8-param-gather", Arity::none},
    {"--grad-reduce-in-bf16", Arity::none},
    {"--accumulate-allreduce-grads-in-fp32", Arity::none},
    {"--main-grads-dtype", Arity::one},
    {"--main-params-dtype", Arity::one},
    {"--exp-avg-dtype", Arity::one},
    {"--exp-avg-sq-dtype", Arity::one},
    {"--use-precision-aware-optimizer", Arity::none},
    {"--no-store-param-remainders", Arity::none},
    {"--optimizer", Arity::one},
    {"--num-distributed-optimizer-instances", Arity::one},
    {"--cpu-offloading-num-layers", Arity::one},
    // parallelism
    {"--tensor-model-parallel-size", Arity::one},
    {"--pipeline-model-parallel-size", Arity::one},
    {"--num-layers-per-virtual-pipeline-stage", Arity::one},
    {"--num-virtual-stages-per-pipeline-rank", Arity::one},
    {"--decoder-first-pipeline-num-layers", Arity::one},
    {"--decoder-last-pipeline-num-layers", Arity::one},
    {"--pipeline-model-parallel-layout", Arity::one},
    {"--microbatch-group-size-per-virtual-pipeline-stage", Arity::one},
    {"--account-for-embedding-in-pipeline-split", Arity::none},
    {"--account-for-loss-in-pipeline-split", Arity::none},
    {"--context-parallel-size", Arity::one},
    {"--cp-comm-type", Arity::some},
    {"--expert-model-parallel-size", Arity::one},
    {"--expert-tensor-parallel-size", Arity::one},
    {"--sequence-parallel", Arity::none},
    {"--use-distributed-optimizer", Arity::none},
    // sharded data parallelism
    {"--use-megatron-fsdp", Arity::none},
    {"--use-torch-fsdp2", Arity::none},
    {"--data-parallel-sharding-strategy", Arity::one},
    {"--torch-fsdp2-no-reshard-after-forward", Arity::none},
    {"--fsdp-double-buffer", Arity::none},
    {"--recompute-activations", Arity::none},
    {"--recompute-granularity", Arity::one},
    {"--recompute-method", Arity::one},
    {"--recompute-num-layers", Arity::one},
    {"--recompute-modules", Arity::any},
    {"--checkpoint-activations", Arity::none},  // pre-2023 spelling of full recompute
    {"--checkpoint-num-layers", Arity::one},
    {"--activations-checkpoint-method", Arity::one},
    {"--activations-checkpoint-num-layers", Arity::one},
    {"--overlap-grad-reduce", Arity::none},
    {"--overlap-param-gather", Arity::none},
    {"--tp-comm-overlap", Arity::none},
    {"--overlap-p2p-communication", Arity::none},      // plan overlap_p2p_comm (interleaved only)
    {"--overlap-p2p-communication-warmup-flush", Arity::none},   // plan overlap_p2p_warmup_flush (interleaved only)
    {"--no-overlap-p2p-communication", Arity::none},
    {"--no-async-tensor-model-parallel-allreduce", Arity::none},
    {"--no-gradient-accumulation-fusion", Arity::none},
    {"--use-flash-attn", Arity::none},
    {"--attention-backend", Arity::one},
};

// Accepted flags that do not change the model shape, the batch or the plan.
constexpr Entry kIgnored[] = {
    // tokenizer
    {"--tokenizer-type", Arity::one},
    {"--vocab-file", Arity::one},
    {"--merge-file", Arity::one},
    {"--tokenizer-model", Arity::one},
    {"--tokenizer-metadata", Arity::one},
    {"--tiktoken-pattern", Arity::one},
    {"--tiktoken-num-special-tokens", Arity::one},
    {"--tiktoken-special-tokens", Arity::some},
    {"--vocab-extra-ids", Arity::one},
    {"--legacy-tokenizer", Arity::none},
    {"--trust-remote-code", Arity::none},
    // learning rate and optimizer hyperparameters
    {"--lr", Arity::one},
    {"--min-lr", Arity::one},
    {"--lr-decay-style", Arity::one},
    {"--lr-wsd-decay-style", Arity::one},
    {"--lr-decay-iters", Arity::one},
    {"--lr-decay-samples", Arity::one},
    {"--lr-wsd-decay-iters", Arity::one},
    {"--lr-wsd-decay-samples", Arity::one},
    {"--lr-warmup-fraction", Arity::one},
    {"--lr-warmup-iters", Arity::one},
    {"--lr-warmup-samples", Arity::one},
    {"--lr-warmup-init", Arity::one},
    {"--warmup", Arity::one},
    {"--decoupled-lr", Arity::one},
    {"--decoupled-min-lr", Arity::one},
    {"--override-opt_param-scheduler", Arity::none},
    {"--override-opt-param-scheduler", Arity::none},
    {"--use-checkpoint-opt_param-scheduler", Arity::none},
    {"--use-checkpoint-opt-param-scheduler", Arity::none},
    {"--override-lr-scheduler", Arity::none},
    {"--use-checkpoint-lr-scheduler", Arity::none},
    {"--weight-decay", Arity::one},
    {"--start-weight-decay", Arity::one},
    {"--end-weight-decay", Arity::one},
    {"--weight-decay-incr-style", Arity::one},
    {"--clip-grad", Arity::one},
    {"--adam-beta1", Arity::one},
    {"--adam-beta2", Arity::one},
    {"--adam-eps", Arity::one},
    {"--sgd-momentum", Arity::one},
    {"--init-method-std", Arity::one},
    {"--embedding-init-method-std", Arity::one},
    {"--init-method-xavier-uniform", Arity::none},
    {"--data-parallel-random-init", Arity::none},
    {"--loss-scale", Arity::one},
    {"--initial-loss-scale", Arity::one},
    {"--min-loss-scale", Arity::one},
    {"--loss-scale-window", Arity::one},
    {"--hysteresis", Arity::one},
    // iterations and samples
    {"--train-iters", Arity::one},
    {"--train-samples", Arity::one},
    {"--exit-interval", Arity::one},
    {"--exit-duration-in-mins", Arity::one},
    {"--exit-signal-handler", Arity::none},
    {"--eval-iters", Arity::one},
    {"--eval-interval", Arity::one},
    {"--full-validation", Arity::none},
    {"--multiple-validation-sets", Arity::none},
    {"--skip-train", Arity::none},
    {"--test-mode", Arity::none},
    {"--rampup-batch-size", Arity::any},
    {"--decrease-batch-size-if-needed", Arity::none},
    {"--iterations-to-skip", Arity::some},
    // data
    {"--data-path", Arity::any},
    {"--train-data-path", Arity::any},
    {"--valid-data-path", Arity::any},
    {"--test-data-path", Arity::any},
    {"--data-args-path", Arity::one},
    {"--per-split-data-args-path", Arity::one},
    {"--split", Arity::one},
    {"--data-cache-path", Arity::one},
    {"--mock-data", Arity::none},
    {"--num-workers", Arity::one},
    {"--num-dataset-builder-threads", Arity::one},
    {"--dataloader-type", Arity::one},
    {"--object-storage-cache-path", Arity::one},
    {"--mid-level-dataset-surplus", Arity::one},
    {"--no-mmap-bin-files", Arity::none},
    {"--reset-position-ids", Arity::none},
    {"--reset-attention-mask", Arity::none},
    {"--eod-mask-loss", Arity::none},
    {"--no-create-attention-mask-in-dataloader", Arity::none},
    {"--allow-ambiguous-pad-tokens", Arity::none},
    {"--sample-rate", Arity::one},
    {"--mask-prob", Arity::one},
    {"--short-seq-prob", Arity::one},
    {"--retriever-seq-length", Arity::one},
    {"--sft", Arity::none},
    // checkpointing
    {"--save", Arity::one},
    {"--load", Arity::one},
    {"--save-interval", Arity::one},
    {"--persistent-save-interval", Arity::one},
    {"--save-retain-interval", Arity::one},
    {"--no-save-optim", Arity::none},
    {"--no-save-rng", Arity::none},
    {"--no-load-optim", Arity::none},
    {"--no-load-rng", Arity::none},
    {"--load-main-params-from-ckpt", Arity::none},
    {"--no-strict-fsdp-dtensor-load", Arity::none},
    {"--non-persistent-save-interval", Arity::one},
    {"--non-persistent-ckpt-type", Arity::one},
    {"--non-persistent-global-ckpt-dir", Arity::one},
    {"--non-persistent-local-ckpt-dir", Arity::one},
    {"--non-persistent-local-ckpt-algo", Arity::one},
    {"--finetune", Arity::none},
    {"--pretrained-checkpoint", Arity::one},
    {"--ckpt-step", Arity::one},
    {"--no-initialization", Arity::none},
    {"--use-checkpoint-args", Arity::none},
    {"--use-mp-args-from-checkpoint-args", Arity::none},
    {"--no-use-tokenizer-model-from-checkpoint-args", Arity::none},
    {"--exit-on-missing-checkpoint", Arity::none},
    {"--use-dist-ckpt", Arity::none},
    {"--use-persistent-ckpt-worker", Arity::none},
    {"--auto-detect-ckpt-format", Arity::none},
    {"--dist-ckpt-format", Arity::one},
    {"--ckpt-format", Arity::one},
    {"--ckpt-convert-format", Arity::one},
    {"--ckpt-convert-save", Arity::one},
    {"--ckpt-convert-update-legacy-dist-opt-format", Arity::none},
    {"--ckpt-fully-parallel-save", Arity::none},
    {"--no-ckpt-fully-parallel-save", Arity::none},
    {"--async-save", Arity::none},
    {"--ckpt-fully-parallel-load", Arity::none},
    {"--ckpt-assume-constant-structure", Arity::none},
    {"--dist-ckpt-strictness", Arity::one},
    {"--dist-ckpt-save-pre-mcore-014", Arity::none},
    {"--dist-ckpt-optim-fully-reshardable", Arity::none},
    {"--distrib-optim-fully-reshardable-mem-efficient", Arity::none},
    {"--adlr-autoresume", Arity::none},
    {"--adlr-autoresume-interval", Arity::one},
    // logging and profiling
    {"--log-interval", Arity::one},
    {"--log-params-norm", Arity::none},
    {"--log-num-zeros-in-grad", Arity::none},
    {"--log-throughput", Arity::none},
    {"--log-progress", Arity::none},
    {"--log-energy", Arity::none},
    {"--log-timers-to-tensorboard", Arity::none},
    {"--log-validation-ppl-to-tensorboard", Arity::none},
    {"--log-memory-to-tensorboard", Arity::none},
    {"--log-world-size-to-tensorboard", Arity::none},
    {"--log-batch-size-to-tensorboard", Arity::none},
    {"--log-loss-scale-to-tensorboard", Arity::none},
    {"--no-log-loss-scale-to-tensorboard", Arity::none},
    {"--no-log-learning-rate-to-tensorboard", Arity::none},
    {"--log-straggler", Arity::none},
    {"--disable-straggler-on-startup", Arity::none},
    {"--straggler-ctrlr-port", Arity::one},
    {"--straggler-minmax-count", Arity::one},
    {"--timing-log-level", Arity::one},
    {"--timing-log-option", Arity::one},
    {"--no-barrier-with-level-1-timing", Arity::none},
    {"--tensorboard-dir", Arity::one},
    {"--tensorboard-log-interval", Arity::one},
    {"--tensorboard-queue-size", Arity::one},
    {"--logging-level", Arity::one},
    {"--wandb-project", Arity::one},
    {"--wandb-entity", Arity::one},
    {"--wandb-exp-name", Arity::one},
    {"--wandb-save-dir", Arity::one},
    {"--no-one-logger", Arity::none},
    {"--one-logger-project", Arity::one},
    {"--one-logger-run-name", Arity::one},
    {"--one-logger-async", Arity::none},
    {"--app-tag-run-name", Arity::one},
    {"--app-tag-run-version", Arity::one},
    {"--config-logger-dir", Arity::one},
    {"--enable-ft-package", Arity::none},
    {"--calc-ft-timeouts", Arity::none},
    {"--run-workload-inspector-server", Arity::none},
    {"--profile", Arity::none},
    {"--use-pytorch-profiler", Arity::none},
    {"--profile-step-start", Arity::one},
    {"--profile-step-end", Arity::one},
    {"--profile-ranks", Arity::some},
    {"--record-memory-history", Arity::none},
    {"--memory-snapshot-path", Arity::one},
    {"--result-rejected-tracker-filename", Arity::one},
    {"--error-injection-rate", Arity::one},
    {"--error-injection-type", Arity::one},
    {"--rerun-mode", Arity::one},
    {"--check-for-spiky-loss", Arity::none},
    {"--check-for-large-grads", Arity::none},
    {"--no-check-for-nan-in-loss-and-grad", Arity::none},
    {"--check-weight-hash-across-dp-replicas-interval", Arity::one},
    // runtime, fusions and kernels (same tensors, same schedule)
    {"--seed", Arity::one},
    {"--distributed-backend", Arity::one},
    {"--distributed-timeout-minutes", Arity::one},
    {"--distributed-timeout-seconds-after-init", Arity::one},
    {"--local-rank", Arity::one},
    {"--lazy-mpu-init", Arity::one},
    {"--transformer-impl", Arity::one},
    {"--spec", Arity::any},
    {"--use-mcore-models", Arity::none},
    {"--use-legacy-models", Arity::none},
    {"--enable-experimental", Arity::none},
    {"--no-masked-softmax-fusion", Arity::none},
    {"--no-bias-gelu-fusion", Arity::none},
    {"--no-bias-swiglu-fusion", Arity::none},
    {"--no-bias-dropout-fusion", Arity::none},
    {"--no-rope-fusion", Arity::none},
    {"--cross-entropy-loss-fusion", Arity::none},
    {"--cross-entropy-fusion-impl", Arity::one},
    {"--no-persist-layer-norm", Arity::none},
    {"--use-te-activation-func", Arity::none},
    {"--use-fused-weighted-squared-relu", Arity::none},
    {"--no-clone-scatter-output-in-embedding", Arity::none},
    {"--manual-gc", Arity::none},
    {"--manual-gc-interval", Arity::one},
    {"--no-manual-gc-eval", Arity::none},
    {"--use-cpu-initialization", Arity::none},
    {"--init-model-with-meta-device", Arity::none},
    {"--deterministic-mode", Arity::none},
    {"--calculate-per-token-loss", Arity::none},
    {"--empty-unused-memory-level", Arity::one},
    {"--train-sync-interval", Arity::one},
    {"--disable-gloo-process-groups", Arity::none},
    {"--distribute-saved-activations", Arity::none},
    {"--distribute-checkpointed-activations", Arity::none},
    {"--enable-cuda-graph", Arity::none},
    {"--external-cuda-graph", Arity::none},
    {"--cuda-graph-impl", Arity::one},
    {"--cuda-graph-scope", Arity::one},
    {"--cuda-graph-warmup-steps", Arity::one},
    {"--te-rng-tracker", Arity::none},
    {"--onnx-safe", Arity::one},
    {"--DDP-impl", Arity::one},
    {"--use-contiguous-buffers-in-local-ddp", Arity::none},
    {"--no-contiguous-buffers-in-local-ddp", Arity::none},
    {"--use-torch-optimizer-for-cpu-offload", Arity::none},
    {"--overlap-cpu-optimizer-d2h-h2d", Arity::none},
    {"--no-pin-cpu-grads", Arity::none},
    {"--no-pin-cpu-params", Arity::none},
    // communication tuning
    {"--defer-embedding-wgrad-compute", Arity::none},
    {"--wgrad-deferral-limit", Arity::one},
    {"--no-align-grad-reduce", Arity::none},
    {"--no-align-param-gather", Arity::none},
    {"--ddp-num-buckets", Arity::one},
    {"--ddp-bucket-size", Arity::one},
    {"--ddp-pad-buckets-for-high-nccl-busbw", Arity::none},
    {"--ddp-reduce-scatter-with-fp32-accumulation", Arity::none},
    {"--ddp-average-in-collective", Arity::none},
    {"--overlap-param-gather-with-optimizer-step", Arity::none},
    {"--no-scatter-gather-tensors-in-pipeline", Arity::none},   // no effect in Megatron-Core (plan pp_scatter_gather)
    {"--use-ring-exchange-p2p", Arity::none},
    {"--use-nccl-ub", Arity::none},
    {"--disable-symmetric-registration", Arity::none},
    {"--use-sharp", Arity::none},
    {"--sharp-enabled-group", Arity::one},
    {"--no-gradient-reduce-div-fusion", Arity::none},
    {"--use-tp-pp-dp-mapping", Arity::none},
    {"--nccl-communicator-config-path", Arity::one},
    {"--high-priority-stream-groups", Arity::any},
    {"--pipeline-model-parallel-comm-backend", Arity::one},
    {"--replication", Arity::none},
    {"--replication-jump", Arity::one},
    {"--replication-factor", Arity::one},
    {"--tp-comm-overlap-cfg", Arity::one},
    {"--tp-comm-bootstrap-backend", Arity::one},
    {"--disable-tp-comm-overlap-ag", Arity::none},
    {"--disable-tp-comm-overlap-rs", Arity::none},
    {"--tp-comm-overlap-rs-dgrad", Arity::none},
    {"--disable-tp-comm-bulk-dgrad", Arity::none},
    {"--disable-tp-comm-bulk-wgrad", Arity::none},
    {"--disable-tp-comm-split-ag", Arity::none},
    {"--disable-tp-comm-split-rs", Arity::none},
    // mixed precision details
    {"--fp32-residual-connection", Arity::none},
    {"--apply-query-key-layer-scaling", Arity::none},
    {"--no-query-key-layer-scaling", Arity::none},
    {"--attention-softmax-in-fp32", Arity::none},
    {"--fp16-lm-cross-entropy", Arity::none},
    {"--disable-bf16-reduced-precision-matmul", Arity::none},
    {"--reuse-grad-buf-for-mxfp8-param-ag", Arity::none},
    {"--fp8-margin", Arity::one},
    {"--fp8-interval", Arity::one},
    {"--fp8-amax-history-len", Arity::one},
    {"--fp8-amax-compute-algo", Arity::one},
    {"--no-fp8-wgrad", Arity::none},
    {"--first-last-layers-bf16", Arity::none},
    {"--num-layers-at-start-in-bf16", Arity::one},
    {"--num-layers-at-end-in-bf16", Arity::one},
    // model details that leave the tensor shapes alone
    {"--norm-epsilon", Arity::one},
    {"--apply-layernorm-1p", Arity::none},
    {"--apply-residual-connection-post-layernorm", Arity::none},
    {"--openai-gelu", Arity::none},
    {"--bert-no-binary-head", Arity::none},
    {"--rotary-base", Arity::one},
    {"--rotary-percent", Arity::one},
    {"--rotary-interleaved", Arity::none},
    {"--rotary-seq-len-interpolation-factor", Arity::one},
    {"--use-rope-scaling", Arity::none},
    {"--rope-scaling-factor", Arity::one},
    {"--rope-type", Arity::one},
    {"--no-rope-freq", Arity::one},
    {"--mrope-section", Arity::some},
    {"--relative-attention-num-buckets", Arity::one},
    {"--relative-attention-max-distance", Arity::one},
    {"--rotary-scaling-factor", Arity::one},
    {"--mscale", Arity::one},
    {"--mscale-all-dim", Arity::one},
    {"--cache-mla-latents", Arity::none},
    {"--qk-l2-norm", Arity::none},
    {"--softmax-type", Arity::one},
    {"--glu-linear-offset", Arity::one},
    {"--activation-func-clamp-value", Arity::one},
    {"--mtp-loss-scaling-factor", Arity::one},
    // MoE routing and dispatch
    {"--moe-router-load-balancing-type", Arity::some},
    {"--moe-aux-loss-coeff", Arity::some},
    {"--moe-z-loss-coeff", Arity::one},
    {"--moe-input-jitter-eps", Arity::one},
    {"--moe-router-dtype", Arity::one},
    {"--moe-router-score-function", Arity::one},
    {"--moe-router-topk-scaling-factor", Arity::one},
    {"--moe-router-bias-update-rate", Arity::one},
    {"--moe-router-pre-softmax", Arity::none},
    {"--moe-router-enable-expert-bias", Arity::none},
    {"--moe-router-fusion", Arity::none},
    {"--moe-router-force-load-balancing", Arity::none},
    {"--moe-router-padding-for-fp8", Arity::none},
    {"--moe-deepep-num-sms", Arity::one},
    {"--moe-permute-fusion", Arity::none},
    {"--moe-use-legacy-grouped-gemm", Arity::none},
    {"--moe-layer-recompute", Arity::none},
    {"--moe-use-upcycling", Arity::none},
    {"--moe-upcycling-granularity", Arity::one},
    {"--moe-per-layer-logging", Arity::none},
    {"--moe-token-drop-policy", Arity::one},
    {"--moe-apply-probs-on-input", Arity::none},
    {"--moe-pad-experts-for-cuda-graph-inference", Arity::none},
    {"--delay-wgrad-compute", Arity::none},
};

struct Unmodelled {
  std::string_view name;
  Arity arity;
  std::string_view why;
};

// Megatron-LM flags whose effect Megascope does not model: importing them
// would silently give a wrong estimate, so they are errors.
constexpr Unmodelled kUnmodelled[] = {
    {"--hierarchical-context-parallel-sizes", Arity::some, "hierarchical context parallelism is not modelled"},
    {"--enable-full-sharding-in-hsdp", Arity::none, "hybrid sharded data parallelism (HSDP) is not modelled"},
    {"--outer-dp-sharding-strategy", Arity::one, "hybrid sharded data parallelism (HSDP) is not modelled"},
    {"--suggested-communication-unit-size", Arity::one,
     "FSDP communication units other than one transformer layer are not modelled"},
    {"--keep-fp8-transpose-cache", Arity::none, "FSDP's cached FP8 transposes are not modelled"},
    {"--optimizer-cpu-offload", Arity::none, "optimizer CPU offload is not modelled"},
    {"--optimizer-offload-fraction", Arity::one, "optimizer CPU offload is not modelled"},
    {"--squared-relu", Arity::none, "only GeLU and SwiGLU MLPs are modelled"},
    {"--quick-geglu", Arity::none, "only GeLU and SwiGLU MLPs are modelled"},
    {"--padded-vocab-size", Arity::one,
     "give the unpadded --vocab-size (and --make-vocab-size-divisible-by) instead"},
    {"--decoder-num-layers", Arity::one, "encoder-decoder models are not modelled"},
    {"--decoder-seq-length", Arity::one, "encoder-decoder models are not modelled"},
    {"--heterogeneous-layers-config-path", Arity::one, "heterogeneous layer configurations are not modelled"},
    {"--heterogeneous-layers-config-encoded-json", Arity::one,
     "heterogeneous layer configurations are not modelled"},
    {"--is-hybrid-model", Arity::none, "hybrid Mamba models are not modelled"},
    {"--hybrid-attention-ratio", Arity::one, "hybrid Mamba models are not modelled"},
    {"--hybrid-mlp-ratio", Arity::one, "hybrid Mamba models are not modelled"},
    {"--hybrid-override-pattern", Arity::one, "hybrid Mamba models are not modelled"},
    {"--retro-add-retriever", Arity::none, "Retro models are not modelled"},
    {"--fp4-format", Arity::one, "FP4 training is not modelled"},
    {"--fp4-param-gather", Arity::none, "FP4 training is not modelled"},
    {"--yaml-cfg", Arity::one, "arguments from a YAML file are not read; give the flags on the command line"},
    {"--model-parallel-size", Arity::one,
     "this flag is no longer valid in Megatron-LM; use --tensor-model-parallel-size"},
    {"--batch-size", Arity::one, "this flag is no longer valid in Megatron-LM; use --micro-batch-size"},
    {"--moe-extended-tp", Arity::none,
     "this flag is deprecated in Megatron-LM; use --expert-tensor-parallel-size"},
};

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

const std::unordered_map<std::string_view, FlagInfo>& flag_table() {
  static const std::unordered_map<std::string_view, FlagInfo> table = [] {
    std::unordered_map<std::string_view, FlagInfo> t;
    auto add = [&t](std::string_view name, FlagInfo info) {
      const bool inserted = t.emplace(name, info).second;
      MEGASCOPE_CHECK(inserted, fmt::format("Megatron flag {} is listed twice", name));
    };
    for (const Entry& e : kUsed) add(e.name, FlagInfo{e.arity, Role::used, {}});
    for (const Entry& e : kIgnored) add(e.name, FlagInfo{e.arity, Role::ignored, {}});
    for (const Unmodelled& e : kUnmodelled) add(e.name, FlagInfo{e.arity, Role::unmodelled, e.why});
    return t;
  }();
  return table;
}

std::string suggestion_for(std::string_view name) {
  std::string dashed(name);
  std::replace(dashed.begin(), dashed.end(), '_', '-');
  const auto& table = flag_table();
  if (dashed != name && table.count(dashed) != 0) return fmt::format("; did you mean {}?", dashed);
  std::string_view best;
  std::size_t best_d = 3;  // suggest only close matches
  for (const auto& [known, info] : table) {
    if (info.role == Role::unmodelled) continue;
    const std::size_t d = edit_distance(name, known);
    if (d < best_d || (d == best_d && !best.empty() && known < best)) {
      best = known;
      best_d = d;
    }
  }
  if (!best.empty()) return fmt::format("; did you mean {}?", best);
  if (name.find('_') != std::string_view::npos)
    return " (a launcher flag? put the script name ending in .py before the Megatron-LM flags)";
  return "";
}

}  // namespace megascope::megatron_detail
