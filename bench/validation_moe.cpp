// docs/validation.md's section on the mixture-of-experts rows of the
// Megatron-Bridge / NeMo summaries: every row predicted, and for each model
// on each GPU the published splits in published and in predicted order
// (validation_report.cpp assembles the page).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "config/library.hpp"
#include "published_predict.hpp"
#include "sim/cost_model.hpp"
#include "validation_sections.hpp"

using namespace megascope;

namespace megascope {

namespace {
// A run's split: its label's "(tp.. pp.. vp.. ep.. mbs..)", its GPUs, global batch and sequence length.
std::string split_of(const bench::PublishedRun& r) {
  const auto open = r.label.rfind('('), close = r.label.rfind(')');
  const std::string layout = open != std::string::npos && close > open ? r.label.substr(open, close - open + 1) : r.label;
  return fmt::format("{} {} {} {}", layout, r.gpus, r.batch, r.seq_len);
}
}  // namespace

MoeValidation moe_validation(const std::string& ref) {
  MoeValidation v;
  for (const bench::PublishedRun& run : bench::bridge_nemo_moe(ref)) {
    MoeRow row{run, false, "", 0, 0, 0, false};
    const bench::Prediction p = bench::predict(run);
    if (!p.ok) {
      row.error = p.error;
    } else {
      row.ok = true;
      row.predicted = bench::predicted_throughput(run, p.out.report);
      row.error_frac = bench::throughput_error(run, p.out.report);
      row.peak_gib = p.peak_gib;
      row.fits = p.fits;
    }
    v.rows.push_back(std::move(row));
  }
  // Pairs of rows of one model on one GPU: ordered right when the predicted
  // throughputs differ the way the published ones do.
  std::map<std::pair<std::string, std::string>, std::vector<const MoeRow*>> groups;
  for (const MoeRow& r : v.rows)
    if (r.ok) groups[{r.run.model, r.run.gpu}].push_back(&r);
  for (auto& [key, rows] : groups) {
    if (rows.size() < 2) continue;
    MoeRanking g{key.first, key.second, {}, {}, 0, 0};
    std::vector<const MoeRow*> pub = rows, pred = rows;
    std::stable_sort(pub.begin(), pub.end(), [](const MoeRow* a, const MoeRow* b) {
      return a->run.tokens_per_s_per_gpu > b->run.tokens_per_s_per_gpu;
    });
    std::stable_sort(pred.begin(), pred.end(), [](const MoeRow* a, const MoeRow* b) { return a->predicted > b->predicted; });
    for (const MoeRow* r : pub) g.published_order.push_back(r->run.label);
    for (const MoeRow* r : pred) g.predicted_order.push_back(r->run.label);
    for (std::size_t i = 0; i < rows.size(); ++i)
      for (std::size_t j = i + 1; j < rows.size(); ++j) {
        const double dp = rows[i]->run.tokens_per_s_per_gpu - rows[j]->run.tokens_per_s_per_gpu;
        const double ds = rows[i]->predicted - rows[j]->predicted;
        if (dp == 0) continue;
        ++g.pairs;
        const bool right = (dp > 0) == (ds > 0);
        g.right += right;
        if (split_of(rows[i]->run) != split_of(rows[j]->run)) {
          ++g.split_pairs;
          g.split_right += right;
        }
      }
    v.rankings.push_back(std::move(g));
  }
  return v;
}

std::string moe_section(const std::string& ref) {
  const MoeValidation v = moe_validation(ref);
  std::string md;
  auto add = [&](const std::string& s) { md += s + "\n"; };
  add("## Megatron-Bridge performance summaries, mixture-of-experts rows (H100, B200, GB200)");
  add("");
  add("Tokens/s per GPU as published. Every MoE row of a shipped model (Qwen3-30B-A3B, Qwen3-235B-A22B,");
  add("DeepSeek-V3, gpt-oss-120b with its sliding-window layers) on a shipped cluster, BF16 or FP8 (not NVFP4;");
  add("B300/GB300 rows: no shipped cluster). Plans: the published tp, pp, vp, ep, micro-batch and batch,");
  add("expert tensor parallelism 1, balanced routing (the runs force it), dropless unless the row says tokendrop");
  add("(capacity factor 1, experts padded to it), with what every recipe turns on (as for the dense rows) and what");
  add("Megatron-Bridge's performance scripts of the row's release set for the model on that GPU, where Megascope");
  add("models it (scripts/performance of v0.1.0rc4 for 25.09, v0.2.0 for 25.11, v0.3.0 for 26.02): DeepSeek-V3 with");
  add("its pipeline layouts, MLA up-projections recomputed, its MTP layer unless the row says it ran without, and on");
  add("H100 the flex dispatcher (DeepEP), EP all-to-all overlap, dense MLPs recomputed and no overlapped gradient");
  add("reduce, on B200/GB200 in 25.09 the shared experts overlapped; Qwen3 on H100 (and Qwen3-235B-A22B on B200) from");
  add("25.11 EP all-to-all overlap, Qwen3-30B-A3B on H100 in 26.02 with DeepEP; gpt-oss-120b from 25.11 its norms and");
  add("experts' activation recomputed. Otherwise the alltoall dispatcher: HybridEP (GB200 from 25.11) and CUDA graphs");
  add("are not modelled.");
  add("");
  add("| run | GPU | GPUs | plan | batch | published | predicted | error | peak memory |");
  add("|---|---|---|---|---|---|---|---|---|");
  double sum_abs = 0, sum_signed = 0;
  int n = 0;
  std::map<std::string, std::pair<double, int>> by_gpu;
  for (const MoeRow& r : v.rows) {
    std::string plan;   // a layout's '|' escaped for the table
    for (char c : r.run.plan) plan += c == '|' ? std::string("\\|") : std::string(1, c);
    const std::string what = fmt::format("| {} | {} | {} | `{}` | {} | {:.0f} |", r.run.label, r.run.gpu, r.run.gpus,
                                         plan, r.run.batch, r.run.tokens_per_s_per_gpu);
    if (!r.ok) {
      add(fmt::format("{} error: {} | | |", what, r.error));
      continue;
    }
    sum_abs += std::abs(r.error_frac);
    sum_signed += r.error_frac;
    ++n;
    by_gpu[r.run.gpu].first += std::abs(r.error_frac);
    ++by_gpu[r.run.gpu].second;
    add(fmt::format("{} {:.0f} | {:+.1f}% | {:.1f} GiB{} |", what, r.predicted, 100 * r.error_frac, r.peak_gib,
                    r.fits ? "" : " (does not fit)"));
  }
  add("");
  if (n > 0)
    add(fmt::format("- All rows: **{:.1f}%** mean absolute error, signed mean {:+.1f}%, over {} rows (target 12%).",
                    100 * sum_abs / n, 100 * sum_signed / n, n));
  for (const auto& [gpu, s] : by_gpu)
    add(fmt::format("- {}: {:.1f}% mean absolute error over {} rows.", gpu, 100 * s.first / s.second, s.second));
  add("");
  add("What moves these rows: the routed experts run as one GEMM per local expert (small experts run less");
  add("efficiently than one merged GEMM would); a GB200 job uses 64 GPUs of each 72-GPU rack, so EP groups up to 64");
  add("stay on NVLink; a dropless layer's ops wait for the host's launches (below), which is what separates the");
  add("dropless and token-dropping runs of Qwen3-30B-A3B at one sequence per micro-batch. Not explained yet: the");
  add("H100 dropless Qwen3-30B-A3B runs publish the same throughput at one and two sequences per micro-batch, half");
  add("the token-dropping run's, which host pacing cannot give (it would double with the micro-batch), and with their");
  add("scripts' EP all-to-all overlap they come out faster still. Where a script overlaps communication with compute");
  add("(EP all-to-all overlap, shared experts beside the dispatch) the rows move optimistic: the simulator hides an");
  add("overlapped collective completely and does not slow the compute beside it (the SMs and memory bandwidth NCCL");
  add("and DeepEP take are not modelled). The token-dropping runs are priced with balanced experts padded to capacity.");
  add("");
  add("Ranking: for each model on each GPU, its published runs in published order and in predicted order, and the");
  add("pairs of them the simulator orders as published (target: 85% of all pairs); apart, the pairs whose split");
  add("differs (tp, pp, vp, ep, micro-batch, GPUs, batch or sequence length): the others are one split run by different");
  add("releases, in another precision or with token dropping, which a choice of split does not compare.");
  add("");
  add("| model | GPU | published order (fastest first) | predicted order | pairs ordered right | of them, different splits |");
  add("|---|---|---|---|---|---|");
  int pairs = 0, right = 0, split_pairs = 0, split_right = 0;
  for (const MoeRanking& g : v.rankings) {
    std::string pub, pred;
    for (const std::string& s : g.published_order) pub += (pub.empty() ? "" : "; ") + s;
    for (const std::string& s : g.predicted_order) pred += (pred.empty() ? "" : "; ") + s;
    add(fmt::format("| {} | {} | {} | {} | {} of {} | {} of {} |", g.model, g.gpu, pub, pred, g.right, g.pairs, g.split_right,
                    g.split_pairs));
    pairs += g.pairs;
    right += g.right;
    split_pairs += g.split_pairs;
    split_right += g.split_right;
  }
  add("");
  if (pairs > 0)
    add(fmt::format("- **{} of {}** pairs ({:.0f}%) ordered as published.", right, pairs, 100.0 * right / pairs));
  if (split_pairs > 0)
    add(fmt::format("- Pairs of different splits: **{} of {}** ({:.0f}%).", split_right, split_pairs,
                    100.0 * split_right / split_pairs));
  add("");
  add("### Host launch time, fitted per GPU generation");
  add("");
  add("A dropless MoE layer copies its token counts to the host every layer, so from the router on the host's");
  add("launches pace the GPU (`docs/simulator.md`, host-paced ops); token-dropping runs pad experts to a fixed");
  add("capacity and need no copy. `[launch] host_us`, the host's time per kernel launch (a grouped GEMM one per");
  add("expert), is fitted per generation on the dropless rows above, least squares in log throughput over a 10 us");
  add("grid; leave-one-model-out: each model's rows predicted at the value fitted without them.");
  add("");
  add("| generation | rows | fitted (us) | shipped (us) | in sample: mean abs (signed) | leave one model out: mean abs (signed) | fitted without each model (us) |");
  add("|---|---|---|---|---|---|---|");
  for (const auto& [gen, cluster] : {std::pair<const char*, const char*>{"hopper", "dgx-h100"}, {"blackwell", "dgx-b200"}}) {
    const bench::HostFit f = bench::fit_host_launch(ref, gen);
    if (!f.error.empty()) {
      add(fmt::format("| {} | | error: {} | | | | |", gen, f.error));
      continue;
    }
    const auto c = resolve_cluster(cluster);
    const auto cost = c ? sim::CostModel::for_device(c->device) : Result<sim::CostModel>(tl::unexpected(c.error()));
    std::string without;
    for (const auto& [m, x] : f.lomo_by_model) without += fmt::format("{}{} {:.0f}", without.empty() ? "" : ", ", m, x);
    add(fmt::format("| {} | {} | {:.0f} | {} | {:.1f}% ({:+.1f}%) | {:.1f}% ({:+.1f}%) | {} |", gen, f.rows, f.host_us,
                    cost ? fmt::format("{:.0f}", cost->profile().host_launch_s * 1e6) : "?", 100 * f.mean_abs,
                    100 * f.signed_mean, 100 * f.lomo_mean_abs, 100 * f.lomo_signed_mean, without));
  }
  add("");
  return md;
}

}  // namespace megascope
