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
};

// Narayanan Table 1: 2021, no fused attention, full recomputation, no
// asynchronous TP all-reduce and no gradient accumulation fusion (both added
// to Megatron-LM later), pipeline tensors scattered over TP and gathered after
// the receive (removed in Megatron-Core); PyTorch DDP ("torch") overlaps the gradient
// all-reduce, Megatron's "local" does not. fp16 weights and fp16 main
// gradients (the sc21 scripts' --fp16 without
// --accumulate-allreduce-grads-in-fp32).
inline std::vector<PublishedRun> narayanan_table1(const std::string& ref_dir) {
  std::vector<PublishedRun> out;
  for (const auto& row : read_csv(ref_dir + "/narayanan2021_table1_weak_scaling.csv")) {
    const int L = std::stoi(row.at("num_layers")), pp = std::stoi(row.at("pp"));
    std::string plan = fmt::format("tp={},pp={},mbs={},recompute=full,recompute_method=uniform,recompute_layers=1,attention=unfused,grad_accum_fusion=off",
                                   row.at("tp"), row.at("pp"), row.at("micro_batch"));
    if (row.at("tp") != "1") plan += ",tp_grad_overlap=off";
    if (row.at("tp") != "1" && pp > 1) plan += ",pp_scatter_gather=on";
    if (row.at("ddp_impl") == "torch") plan += ",overlap_grad_reduce=on";
    if (!row.at("layers_per_virtual_stage").empty()) {
      const int vpp = L / pp / std::stoi(row.at("layers_per_virtual_stage"));
      // The 2021 code waited on every batched pipeline exchange (and then
      // synchronized the device); it had no overlapped pipeline communication.
      if (vpp > 1) plan += fmt::format(",vpp={},schedule=interleaved,overlap_p2p_comm=off", vpp);
    }
    out.push_back({"narayanan-table1", row.at("params_b") + "B", model_name("gpt-", row.at("params_b")), "dgx-a100",
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

}  // namespace megascope::bench
