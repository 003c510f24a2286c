// The published runs the benchmarks compare against (tests/reference): each
// row of Narayanan et al. 2021 Table 1 (A100) and of the Megatron-LM README
// H100 weak-scaling table, with its model, cluster, batch and plan as run.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/training.hpp"

namespace megascope::bench {

inline std::vector<std::map<std::string, std::string>> read_csv(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::map<std::string, std::string>> rows;
  std::vector<std::string> header;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> cells;
    std::stringstream ss(line);
    std::string c;
    while (std::getline(ss, c, ',')) cells.push_back(c);
    if (header.empty()) {
      header = cells;
      continue;
    }
    std::map<std::string, std::string> row;
    for (std::size_t i = 0; i < header.size() && i < cells.size(); ++i) row[header[i]] = cells[i];
    rows.push_back(row);
  }
  return rows;
}

// A cell of a CSV row as an integer, `absent` when empty or "n/a".
inline int int_cell(const std::map<std::string, std::string>& row, const std::string& key, int absent) {
  const auto it = row.find(key);
  if (it == row.end() || it->second.empty() || it->second == "n/a") return absent;
  return std::stoi(it->second);
}

inline std::string model_name(const std::string& prefix, std::string size) {
  if (size == "1008.0") return "gpt-1t";
  if (!size.empty() && size.back() == 'B') size.pop_back();
  return prefix + size + "b";
}

struct PublishedRun {
  std::string table;      // "narayanan-table1" or "megatron-h100"
  std::string label;      // "175B", ...
  std::string model, cluster, plan;
  int gpus = 0;
  std::int64_t batch = 0;
  double tflops_per_gpu = 0;   // as published
  // Number formats as run: the weights, and the main gradients that weight
  // gradients accumulate into and data parallelism reduces.
  Dtype params_dtype = Dtype::bf16;
  Dtype grad_dtype = Dtype::fp32;
  // Rows published as tokens/s per GPU (Megatron-Bridge / NeMo): that figure,
  // the GEMM precision and FP8 recipe, and the sequence length (0: the model's).
  double tokens_per_s_per_gpu = 0;
  Precision precision = Precision::bf16;
  Fp8Recipe fp8_recipe = Fp8Recipe::delayed;
  std::int64_t seq_len = 0;
  std::string gpu = "";   // "H100", "B200", "GB200"
  int cp = 1;
  // MoE rows: published with token dropping (capacity factor 1, experts
  // padded to it) rather than dropless; the model's MTP layers (-1: as shipped).
  bool token_drop = false;
  int mtp_layers = -1;
};

// A plan as Megatron-LM of 2021 ran it (the sc21 scripts): no fused
// attention, full recomputation, no asynchronous TP all-reduce and no gradient
// accumulation fusion (both added to Megatron-LM later), pipeline tensors
// scattered over TP and gathered after the receive (removed in Megatron-Core);
// PyTorch DDP ("torch") overlaps the gradient all-reduce, Megatron's "local"
// does not. With vpp > 1 the interleaved schedule, every batched pipeline
// exchange waited for (and the device then synchronized): the 2021 code had
// no overlapped pipeline communication.
inline std::string megatron_2021_plan(int tp, int pp, int mbs, int vpp, bool torch_ddp) {
  std::string plan = fmt::format("tp={},pp={},mbs={},recompute=full,recompute_method=uniform,recompute_layers=1,attention=unfused,grad_accum_fusion=off",
                                 tp, pp, mbs);
  if (tp != 1) plan += ",tp_grad_overlap=off";
  if (tp != 1 && pp > 1) plan += ",pp_scatter_gather=on";
  if (torch_ddp) plan += ",overlap_grad_reduce=on";
  if (vpp > 1) plan += fmt::format(",vpp={},schedule=interleaved,overlap_p2p_comm=off", vpp);
  return plan;
}

// Narayanan Table 1: the sc21 run_table_1.sh settings (megatron_2021_plan),
// fp16 weights and fp16 main gradients (the scripts' --fp16 without
// --accumulate-allreduce-grads-in-fp32).
inline std::vector<PublishedRun> narayanan_table1(const std::string& ref_dir) {
  std::vector<PublishedRun> out;
  for (const auto& row : read_csv(ref_dir + "/narayanan2021_table1_weak_scaling.csv")) {
    const int L = std::stoi(row.at("num_layers")), pp = std::stoi(row.at("pp"));
    const int vpp = row.at("layers_per_virtual_stage").empty() ? 1 : L / pp / std::stoi(row.at("layers_per_virtual_stage"));
    const std::string plan = megatron_2021_plan(std::stoi(row.at("tp")), pp, std::stoi(row.at("micro_batch")), vpp,
                                                row.at("ddp_impl") == "torch");
    out.push_back({"narayanan-table1", row.at("params_b") + "B", model_name("gpt-", row.at("params_b")), "dgx-a100",
                   plan, std::stoi(row.at("gpus")), static_cast<std::int64_t>(std::stod(row.at("global_batch"))),
                   std::stod(row.at("tflops_per_gpu")), Dtype::fp16, Dtype::fp16});
  }
  return out;
}

// Shoeybi et al. 2019 (Megatron-LM, arXiv:1909.08053) on DGX-2H V100s, the
// figures its text states (the paper has no table of throughputs):
//   - the 1.2B model on one GPU, batch 8: "39 TeraFLOPs per second during the
//     overall training process, which is 30% of the theoretical peak" (Sec. 5.1);
//   - the 8.3B model with 8-way model parallelism, batch 8: "77% of linear
//     scaling" of that baseline (Sec. 5.1), i.e. 0.77 x 39 TFLOP/s per GPU;
//   - the 8.3B model on 512 GPUs (8-way model x 64-way data parallel), batch
//     512: "15.1 PetaFLOPs per second across the entire application with 76%
//     scaling efficiency" (abstract), 15.1 / 512 TFLOP/s per GPU.
// Plans: the 2019 code as Megatron-LM of 2021 ran it in these respects
// (megatron_2021_plan: unfused attention, no asynchronous TP all-reduce, no
// gradient accumulation fusion; "activation checkpointing after every
// transformer layer", Sec. 5), fp16 with fp16 gradients (mixed precision
// with dynamic loss scaling, Sec. 5), one micro-batch of 8 sequences per
// model replica. The data-parallel run overlaps its gradient all-reduce with
// the backward (PyTorch DDP, as the sc21 scripts ran their rows without
// pipelining): the paper's Fig. 5 loses 3 points of scaling from 8 GPUs to
// 512 (77% to 74%), where an all-reduce after the backward of 2 GB of fp16
// gradients per GPU over one 100 Gb/s NIC per two GPUs would take over 10%
// of the step. TFLOP/s are compared as Narayanan et al. count them (the
// same group's Eq. 3, with recomputation); the 2019 paper does not give
// its count (docs/validation.md says what its figures imply).
inline std::vector<PublishedRun> shoeybi_2019() {
  const auto run = [](const char* label, const char* model, int tp, int gpus, int batch, double tflops) {
    return PublishedRun{"shoeybi-2019", label, model, "dgx-2h", megatron_2021_plan(tp, 1, 8, 1, gpus > tp),
                        gpus,           batch, tflops, Dtype::fp16, Dtype::fp16};
  };
  return {run("1.2B", "shoeybi-gpt-1.2b", 1, 1, 8, 39.0), run("8.3B (tp 8)", "shoeybi-gpt-8.3b", 8, 8, 8, 0.77 * 39.0),
          run("8.3B (tp 8, dp 64)", "shoeybi-gpt-8.3b", 8, 512, 512, 15.1e3 / 512)};
}

// Narayanan Table 2, its PTD-P rows (GPT-3 175B and the 530B model at three
// GPU counts each; the ZeRO-3 rows are a sharding Megascope does not model).
// The table gives t*p and the micro-batch; t = 8, so p = 12 and 35. No script
// for this table was published, so the rest follows the paper's other runs of
// the same models: 530B as its Table 1 row (run_table_1.sh: interleaved, one
// layer per virtual stage, vpp 3), 175B as the interleaved case of Figure 12
// (run_figure_12.sh: two layers per virtual stage, vpp 4); both with
// Megatron's "local" DDP (no overlapped gradient all-reduce), as every
// pipelined sc21 run; fp16.
inline std::vector<PublishedRun> narayanan_table2_ptdp(const std::string& ref_dir) {
  std::vector<PublishedRun> out;
  for (const auto& row : read_csv(ref_dir + "/narayanan2021_table2_zero3_vs_ptdp.csv")) {
    if (row.at("scheme") != "PTD-P") continue;
    const std::string& size = row.at("params_b");
    const bool gpt3 = size == "174.6";
    const int tp = 8, pp = std::stoi(row.at("model_parallel_size")) / tp;
    const std::string plan = megatron_2021_plan(tp, pp, std::stoi(row.at("micro_batch")), gpt3 ? 4 : 3, false);
    out.push_back({"narayanan-table2", size + "B", gpt3 ? "gpt3-175b" : model_name("gpt-", size), "dgx-a100", plan,
                   std::stoi(row.at("gpus")), static_cast<std::int64_t>(std::stod(row.at("global_batch"))),
                   std::stod(row.at("tflops_per_gpu")), Dtype::fp16, Dtype::fp16});
  }
  return out;
}

// Narayanan Table 2, its ZeRO-3 rows: DeepSpeed's ZeRO-3 inside Megatron-LM
// of 2021, no model parallelism, the published micro-batch and batch. The
// paper gives no configuration beyond that; the plan takes the 2021 kernels
// (megatron_2021_plan: unfused attention, every layer recomputed) and
// DeepSpeed's ZeRO-3 defaults as apply_deepspeed_config sets them:
// overlap_comm on, gradients reduced in buckets of reduce_bucket_size (5e8
// elements), parameters prefetched up to stage3_prefetch_bucket_size (5e7
// elements), less than one 1.8B-parameter layer of these models, so each
// layer is gathered when it is reached (fsdp_prefetch 0); fp16.
inline std::vector<PublishedRun> narayanan_table2_zero3(const std::string& ref_dir) {
  std::vector<PublishedRun> out;
  for (const auto& row : read_csv(ref_dir + "/narayanan2021_table2_zero3_vs_ptdp.csv")) {
    if (row.at("scheme") != "ZeRO-3") continue;
    const std::string& size = row.at("params_b");
    const bool gpt3 = size == "174.6";
    const std::string plan = megatron_2021_plan(1, 1, std::stoi(row.at("micro_batch")), 1, true) +
                             ",zero=3,fsdp_prefetch=0,grad_bucket=500000000";
    out.push_back({"narayanan-table2-zero3", size + "B", gpt3 ? "gpt3-175b" : model_name("gpt-", size), "dgx-a100",
                   plan, std::stoi(row.at("gpus")), static_cast<std::int64_t>(std::stod(row.at("global_batch"))),
                   std::stod(row.at("tflops_per_gpu")), Dtype::fp16, Dtype::fp16});
  }
  return out;
}

// Megatron-LM README (H100): the table's tp/pp/dp with the README's flags
// (distributed optimizer, overlapped gradient reduce and parameter gather, TP
// communication overlap with sequence parallelism), micro-batch 1.
inline std::vector<PublishedRun> megatron_h100(const std::string& ref_dir) {
  std::vector<PublishedRun> out;
  for (const auto& row : read_csv(ref_dir + "/megatron_readme_h100_weak_scaling.csv")) {
    const std::string tp = row.at("tp");
    std::string plan = fmt::format("tp={},pp={},mbs=1,distopt=on,overlap_grad_reduce=on,overlap_param_gather=on", tp, row.at("pp"));
    if (tp != "1") plan += ",sp=on,tp_comm_overlap=on";
    out.push_back({"megatron-h100", row.at("model"), model_name("mcore-gpt-", row.at("model")), "dgx-h100", plan,
                   std::stoi(row.at("gpus")), static_cast<std::int64_t>(std::stod(row.at("global_batch"))),
                   std::stod(row.at("tflops_per_gpu"))});
  }
  return out;
}

// The rows of megatron_bridge_nemo_perf_summary.csv of a model in `models`
// (the summary's name -> the shipped model) on a shipped system (DGX H100,
// DGX B200, GB200 NVL72), not NVFP4, without FSDP (with `fsdp`: only the
// FSDP rows, their plan zero=3 instead of the parameter gather): each
// passed to `use` with a run holding what every row states (model, cluster,
// GPU, GPUs, batch, sequence length, cp, throughputs, number formats) and
// the plan every recipe shares (the published tp, pp, vp and micro-batch,
// sequence parallelism and TP communication overlap with tp > 1, the
// distributed optimizer, overlapped gradient reduce and parameter gather,
// interleaving with vp > 1), to which `use` adds its table, label and the
// rest of the plan. FP8 recipes: NeMo 24.07's FP8 is Transformer Engine's
// delayed scaling (its default then); Megatron-Bridge's "FP8" and "FP8-CS"
// are current (tensorwise) scaling, the performance scripts' default;
// MXFP8/FP8-MX is mxfp8; FP8-blockwise is blockwise.
template <class Use>
void for_bridge_rows(const std::string& ref_dir, const std::map<std::string, std::string>& models, Use use,
                     bool fsdp = false) {
  const std::map<std::string, std::pair<std::string, std::string>> systems = {
      {"DGX-H100", {"dgx-h100", "H100"}}, {"DGX-B200", {"dgx-b200", "B200"}}, {"DGX-GB200", {"gb200-nvl72", "GB200"}}};
  for (const auto& row : read_csv(ref_dir + "/megatron_bridge_nemo_perf_summary.csv")) {
    const auto m = models.find(row.at("model"));
    const auto sys = systems.find(row.at("system"));
    const std::string& prec = row.at("precision");
    if (m == models.end() || sys == systems.end() || prec == "NVFP4") continue;
    if ((!row.at("fsdp").empty() && row.at("fsdp") != "0") != fsdp) continue;
    PublishedRun r;
    r.model = m->second;
    r.cluster = sys->second.first;
    r.gpu = sys->second.second;
    r.gpus = int_cell(row, "gpus", 0);
    r.batch = int_cell(row, "gbs", 0);
    r.seq_len = int_cell(row, "seq_len", 0);
    r.cp = int_cell(row, "cp", 1);
    r.tflops_per_gpu = std::stod(row.at("tflops_per_gpu"));
    r.tokens_per_s_per_gpu = std::stod(row.at("tokens_per_s_per_gpu"));
    if (prec != "BF16") {
      r.precision = Precision::fp8;
      r.fp8_recipe = prec == "MXFP8" || prec == "FP8-MX"  ? Fp8Recipe::mxfp8
                     : prec == "FP8-blockwise"             ? Fp8Recipe::blockwise
                     : row.at("source") == "NEMO_24.07"    ? Fp8Recipe::delayed
                                                           : Fp8Recipe::tensorwise;
    }
    const int tp = int_cell(row, "tp", 1), vp = int_cell(row, "vp", 1);
    r.plan = fmt::format("tp={},pp={},mbs={},distopt=on,overlap_grad_reduce=on,{}", tp, int_cell(row, "pp", 1),
                         int_cell(row, "mbs", 1), fsdp ? "zero=3" : "overlap_param_gather=on");
    if (tp > 1) r.plan += ",sp=on,tp_comm_overlap=on";
    if (vp > 1) r.plan += fmt::format(",vpp={},schedule=interleaved", vp);
    use(row, r);
  }
}

// Megatron-Bridge / NeMo performance summaries
// (megatron_bridge_nemo_perf_summary.csv), their dense rows that Megascope can
// express: a shipped model (Llama 2 and 3, NeMo's GPT-3 and Nemotron) on a shipped cluster
// (for_bridge_rows), with the published cp and no recomputation, Llama 3.1
// 405B counting the embedding and the loss in the pipeline split as its
// recipe does.
inline std::vector<PublishedRun> bridge_nemo_dense(const std::string& ref_dir) {
  const std::map<std::string, std::string> models = {
      {"LLAMA3_8B", "llama3-8b"},       {"LLAMA3-8B", "llama3-8b"},       {"LLAMA3_70B", "llama3-70b"},
      {"LLAMA3-70B", "llama3-70b"},     {"LLAMA3.1_405B", "llama3-405b"}, {"LLAMA2-7B", "llama2-7b"},
      {"LLAMA2-13B", "llama2-13b"},     {"LLAMA2-70B", "llama2-70b"},     {"GPT3-5B", "nemo-gpt3-5b"},
      {"GPT3-20B", "nemo-gpt3-20b"},    {"GPT3-175B", "nemo-gpt3-175b"},  {"Nemotron-8B", "nemotron3-8b"},
      {"Nemotron-22B", "nemotron4-22b"}, {"Nemotron-340B", "nemotron4-340b"}};
  std::vector<PublishedRun> out;
  for_bridge_rows(ref_dir, models, [&](const auto& row, PublishedRun& r) {
    r.table = "bridge-nemo";
    r.label = fmt::format("{} {} {}", row.at("source"), row.at("model"), row.at("precision"));
    if (r.cp > 1) r.plan += fmt::format(",cp={}", r.cp);
    if (r.model == "llama3-405b") r.plan += ",embedding_in_split=on,loss_in_split=on";
    out.push_back(std::move(r));
  });
  return out;
}

// The summaries' FSDP rows on a shipped cluster (Megatron-FSDP,
// optim_grads_params, as Megatron-Bridge's set_megatron_fsdp_overrides sets
// it): zero 3 with the next layer's gather overlapped (fsdp_prefetch 1),
// gradient accumulation fusion off and FP8 parameter gathers with FP8, as
// the Llama 3 and 3.1 performance configs (v0.2.0) run FSDP; Llama 3 8B on
// H100 in FP8 with its recipe's full recomputation of 5 layers (block). The
// 70B and 405B recipes also offload 20 to 92 layers' activations to the CPU
// (cpu_offloading_num_layers), which Megascope does not model: their memory
// is reported as it would be without.
inline std::vector<PublishedRun> bridge_fsdp(const std::string& ref_dir) {
  const std::map<std::string, std::string> models = {
      {"LLAMA3_8B", "llama3-8b"}, {"LLAMA3_70B", "llama3-70b"}, {"LLAMA3.1_405B", "llama3-405b"}};
  std::vector<PublishedRun> out;
  for_bridge_rows(
      ref_dir, models,
      [&](const auto& row, PublishedRun& r) {
        r.table = "bridge-fsdp";
        r.label = fmt::format("{} {} {}", row.at("source"), row.at("model"), row.at("precision"));
        r.plan += ",grad_accum_fusion=off";
        if (r.precision == Precision::fp8) r.plan += ",fp8_param_gather=on";
        if (r.cp > 1) r.plan += fmt::format(",cp={}", r.cp);
        if (r.model == "llama3-8b" && r.gpu == "H100" && r.precision == Precision::fp8)
          r.plan += ",recompute=full,recompute_method=block,recompute_layers=5";
        out.push_back(std::move(r));
      },
      true);
  return out;
}

// DeepSeek-V3's pipeline layout for `stages` virtual stages (61 layers, the
// embedding on the first, the MTP layer if any and the loss on the last):
// Megatron-Bridge's recipe layouts for 4, 8 and 16 stages
// (_get_deepseek_v3_pipeline_layout); for 32 the shape of Megatron-Core's own
// example ("Et*3|(tt|)*29,m|L") with the MTP layer and the loss in one stage.
inline std::string deepseek_v3_layout(int stages, bool mtp) {
  const std::string last = mtp ? "mL" : "L";
  switch (stages) {
    case 4: return "Et*16|t*16|t*16|t*13" + last;
    case 8: return "Et*8|(t*8|)*6,t*5" + last;
    case 16: return "Et*4|(t*4|)*14,t" + last;
    case 32: return "Et|(tt|)*30," + last;
    default: return "";
  }
}

// The mixture-of-experts rows of the same summaries that Megascope can
// express: Qwen3-30B-A3B, Qwen3-235B-A22B, DeepSeek-V3 and gpt-oss-120b on
// DGX H100, DGX B200 and GB200 NVL72, BF16 or FP8 (not NVFP4). Plans: the published tp, pp,
// vp, ep and batch, expert tensor parallelism 1, the alltoall dispatcher,
// routing balanced (the runs force it) and dropless unless the row says
// "tokendrop" (capacity factor 1, experts padded to it, as Megatron-Bridge's
// apply_moe_token_drop sets), with what every recipe turns on (as for the
// dense rows). DeepSeek-V3: the recipes' pipeline layouts, MLA's
// up-projections recomputed (every recipe's recompute_modules has
// mla_up_proj), the MTP layer unless the row says "w/o MTP".
// What Megatron-Bridge's performance scripts of the row's release set for a
// MoE model on a GPU, of what Megascope models (the scripts are
// scripts/performance/ of Megatron-Bridge: run_script.py of v0.1.0rc4 for
// the 25.09 rows, configs/*/workload_base_configs.py of v0.2.0 for 25.11 and
// of v0.3.0 for 26.02):
// - DeepSeek-V3 on H100 (25.09): the flex dispatcher on DeepEP, EP
//   all-to-all overlap (with delayed weight gradients), no shared-expert
//   overlap, dense MLPs recomputed besides MLA's up-projections, no
//   overlapped gradient reduce; on B200 and GB200 with token dropping
//   (25.09) the shared experts overlapped with the dispatch.
// - Qwen3-235B-A22B and Qwen3-30B-A3B on H100 (25.11, 26.02): EP all-to-all
//   overlap, with DeepEP for Qwen3-30B-A3B in 26.02; Qwen3-235B-A22B on B200
//   (25.11, interleaved) likewise. The 25.09 Qwen3 scripts set none.
// - gpt-oss-120b (25.11, 26.02): the norms and the experts' activation
//   recomputed.
// Not modelled, so left out: HybridEP (the flex dispatcher's backend on
// GB200 from 25.11) and CUDA graphs of the router and attention.
inline std::string bridge_moe_recipe(const std::string& source, const std::string& model, const std::string& gpu,
                                     int pp, int vp, bool token_drop) {
  const bool rc4 = source == "MB_25.09";
  if (model == "deepseek-v3") {
    if (gpu == "H100")
      return ",moe_dispatcher=flex,moe_ep_overlap=on,recompute=selective,recompute_modules=mla_up_proj+mlp";
    return std::string(rc4 && token_drop ? ",moe_shared_expert_overlap=on" : "") +
           ",recompute=selective,recompute_modules=mla_up_proj";
  }
  if (model == "qwen3-235b-a22b" || model == "qwen3-30b-a3b") {
    const bool interleaved = pp == 1 || vp > 1;   // Megatron-Core's all-to-all overlap needs it with pp > 1
    const bool overlap = !rc4 && interleaved && (gpu == "H100" || (gpu == "B200" && model == "qwen3-235b-a22b"));
    if (!overlap) return "";
    const bool deepep = model == "qwen3-30b-a3b" && source == "MB_26.02";
    return std::string(deepep ? ",moe_dispatcher=flex" : "") + ",moe_ep_overlap=on";
  }
  if (model == "gpt-oss-120b" && !rc4) return ",recompute=selective,recompute_modules=layernorm+moe_act";
  return "";
}

inline std::vector<PublishedRun> bridge_nemo_moe(const std::string& ref_dir) {
  const std::map<std::string, std::string> models = {
      {"Qwen3_30B_a3B", "qwen3-30b-a3b"}, {"Qwen3_235B_a22B", "qwen3-235b-a22b"}, {"DeepSeekV3", "deepseek-v3"},
      {"GPT-OSS-120B", "gpt-oss-120b"}};
  std::vector<PublishedRun> out;
  for_bridge_rows(ref_dir, models, [&](const auto& row, PublishedRun& r) {
    const int pp = int_cell(row, "pp", 1), vp = int_cell(row, "vp", 1), ep = int_cell(row, "ep", 1);
    const auto note = row.find("notes");
    const std::string notes = note == row.end() ? "" : note->second;
    r.plan += fmt::format(",ep={},etp=1", ep);
    r.token_drop = notes.find("tokendrop") != std::string::npos;
    if (r.model == "deepseek-v3") {
      r.mtp_layers = notes.find("w/o MTP") != std::string::npos ? 0 : 1;
      if (pp > 1) r.plan += ",layout=" + deepseek_v3_layout(pp * vp, r.mtp_layers > 0);
      if (r.gpu == "H100") {   // the H100 script overlaps neither the gradient reduce nor (so) the parameter gather
        const std::string on = "overlap_grad_reduce=on,overlap_param_gather=on";
        r.plan.replace(r.plan.find(on), on.size(), "overlap_grad_reduce=off,overlap_param_gather=off");
      }
    } else if (r.model == "qwen3-235b-a22b" && pp > 1) {
      r.plan += ",embedding_in_split=on,loss_in_split=on";   // Megatron-Bridge's Qwen3-235B recipes
    }
    r.plan += bridge_moe_recipe(row.at("source"), r.model, r.gpu, pp, vp, r.token_drop);
    r.table = "bridge-nemo-moe";
    r.label = fmt::format("{} {} {}{} (tp{} pp{} vp{} ep{} mbs{})", row.at("source"), row.at("model"),
                          row.at("precision"), r.token_drop ? " tokendrop" : "", int_cell(row, "tp", 1), pp, vp, ep,
                          int_cell(row, "mbs", 1));
    out.push_back(std::move(r));
  });
  return out;
}

// Qi et al. 2024 ("Zero Bubble Pipeline Parallelism", arXiv:2401.10241),
// Table 9: the forward (F), input-gradient (B) and weight-gradient (W) time
// of one micro-batch on one pipeline stage, as their ZB-2p runs profiled them
// on A100 80GB (tests/reference/zero_bubble_2401.10241_profiled_times.csv, in
// ms: the paper prints no unit; in ms its W column matches the GEMM prices
// within 2%), with the models of their Table 3: GPTs of 1024 tokens, tp 1, one GPU
// per stage, each stage k layers but the first and last, which have one fewer
// (num_layers = k p - 2, as the paper's Megatron-LM fork recommends).
struct StageTimeRow {
  std::string model;           // "1.5B", ...
  int layers = 0, hidden = 0, heads = 0;
  int pp = 0, microbatches = 0, mbs = 0;
  double f_s = 0, b_s = 0, w_s = 0;   // as published, in seconds
};

inline std::vector<StageTimeRow> zero_bubble_stage_times(const std::string& ref_dir) {
  struct Dims {
    const char* model;
    int layers, hidden, heads;
  };
  // Qi et al. 2024, Table 3.
  constexpr Dims kDims[] = {{"1.5B", 22, 2304, 24}, {"6.2B", 30, 4096, 32}, {"14.6B", 46, 5120, 40}, {"28.3B", 62, 6144, 48}};
  std::vector<StageTimeRow> out;
  for (const auto& row : read_csv(ref_dir + "/zero_bubble_2401.10241_profiled_times.csv")) {
    StageTimeRow r;
    r.model = row.at("model");
    for (const Dims& d : kDims)
      if (r.model == d.model) {
        r.layers = d.layers;
        r.hidden = d.hidden;
        r.heads = d.heads;
      }
    r.pp = std::stoi(row.at("p"));
    r.microbatches = std::stoi(row.at("num_microbatches"));
    r.mbs = std::stoi(row.at("micro_batch"));
    r.f_s = std::stod(row.at("T_F")) * 1e-3;
    r.b_s = std::stod(row.at("T_B")) * 1e-3;
    r.w_s = std::stod(row.at("T_W")) * 1e-3;
    out.push_back(r);   // layers 0: a model Table 3 does not give (zero_bubble_stage says so)
  }
  return out;
}

}  // namespace megascope::bench
