// Every published Megatron-Bridge / NeMo run whose model, cluster and
// precision Megascope ships is expressible with its published tp, pp, vp,
// cp and ep (megatron_bridge_nemo_perf_summary.csv), placing layers as the
// recipes do: Llama 3.1 405B counts the embedding and the loss in the split
// (account_for_*_in_pipeline_split), DeepSeek-V3 takes a layout string with
// its MTP layer beside the loss (Megatron-Bridge's
// _get_deepseek_v3_pipeline_layout), every other model an even split.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <map>
#include <string>

#include "bench/published.hpp"
#include "support.hpp"

using namespace megascope;
using namespace megascope::test;

namespace {

int cell(const std::map<std::string, std::string>& row, const std::string& key, int absent) {
  const std::string& v = row.at(key);
  return v.empty() || v == "n/a" ? absent : std::stoi(v);
}

}  // namespace

TEST_CASE("Every Megatron-Bridge / NeMo run of a shipped model, cluster and precision is expressible with its "
          "published pp and vp", "[core][layout]") {
  const std::map<std::string, std::string> models = {
      {"LLAMA3_8B", "llama3-8b"},          {"LLAMA3-8B", "llama3-8b"},     {"LLAMA3_70B", "llama3-70b"},
      {"LLAMA3-70B", "llama3-70b"},        {"LLAMA3.1_405B", "llama3-405b"}, {"DeepSeekV3", "deepseek-v3"},
      {"Qwen3_30B_a3B", "qwen3-30b-a3b"}, {"GPT3-175B", "gpt3-175b"}};
  const std::map<std::string, std::string> clusters = {
      {"DGX-H100", "dgx-h100"}, {"DGX-B200", "dgx-b200"}, {"DGX-GB200", "gb200-nvl72"}};
  int priced = 0, layouts = 0;
  for (const auto& row : read_csv("megatron_bridge_nemo_perf_summary.csv")) {
    const auto m = models.find(row.at("model"));
    const auto c = clusters.find(row.at("system"));
    if (m == models.end() || c == clusters.end() || row.at("precision") == "NVFP4") continue;
    if (row.at("fsdp") != "0") continue;   // FSDP is not modelled
    const std::string id = fmt::format("{} {} {} {} GPUs", row.at("source"), row.at("system"), row.at("model"),
                                       row.at("gpus"));
    INFO(id);
    ModelSpec model = shipped_model(m->second);
    const bool no_mtp = row.at("notes").find("w/o MTP") != std::string::npos;
    if (no_mtp) model.mtp_num_layers = 0;
    const int gpus = cell(row, "gpus", 0), tp = cell(row, "tp", 1), pp = cell(row, "pp", 1), cp = cell(row, "cp", 1),
              vp = cell(row, "vp", 1), ep = cell(row, "ep", 1);
    std::string plan = fmt::format("tp={},pp={},cp={},mbs={}", tp, pp, cp, cell(row, "mbs", 1));
    if (ep > 1) plan += fmt::format(",ep={},etp=1", ep);
    if (tp > 1) plan += ",sp=on";
    if (vp > 1) plan += fmt::format(",vpp={},schedule=interleaved", vp);
    if (m->second == "llama3-405b") {
      plan += ",embedding_in_split=on,loss_in_split=on";
      ++layouts;
    } else if (m->second == "deepseek-v3" && pp > 1) {
      const std::string layout = bench::deepseek_v3_layout(pp * vp, model.mtp_num_layers > 0);
      REQUIRE(!layout.empty());
      plan += ",layout=" + layout;
      ++layouts;
    }
    auto s = try_setup(model, c->second, plan, cell(row, "gbs", 0), gpus, cell(row, "seq_len", 0));
    INFO(plan);
    if (!s) FAIL_CHECK(s.error().str());
    ++priced;
  }
  // Llama 3 8B/70B/405B, DeepSeek-V3, Qwen3-30B-A3B and GPT-3 rows on H100,
  // B200 and GB200 (FP8 and BF16, without FSDP): 33, of which 16 (405B and
  // DeepSeek-V3 with their published pp x vp) need a layout beyond an even split.
  CHECK(priced == 33);
  CHECK(layouts == 16);
}
