// Parameter and FLOP counts against the published formulas: Narayanan 2021
// Eq. 2 and Eq. 3 (with Table 1), Korthikanti 2022 Eq. 7/8, and Megatron-LM's
// FLOPs counter in its 2024 and current forms (megatron_formulas.md 2.1-2.3).
#include <catch2/catch.hpp>
#include <cmath>
#include <map>

#include "core/accounting/flops.hpp"
#include "core/program/builder.hpp"
#include "core/program/stage_writer.hpp"
#include "core/accounting/params.hpp"
#include "models.hpp"
#include "support.hpp"

using namespace megascope;
using namespace megascope::test;

TEST_CASE("Parameter counts equal Narayanan Eq. 2 plus the final LayerNorm for every Table 1 model", "[core]") {
  for (const auto& row : read_csv("narayanan2021_table1_weak_scaling.csv")) {
    const double l = num(row, "num_layers"), h = num(row, "hidden_size"), V = 51200, s = 2048;
    const ModelSpec m = gpt(static_cast<int>(l), static_cast<std::int64_t>(h), static_cast<int>(num(row, "attention_heads")));
    const double eq2 = 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h));
    INFO("params_b " << row.at("params_b"));
    // Eq. 2 leaves out the final LayerNorm (2h).
    CHECK(model_params(m).total() - 2 * h == Approx(eq2).epsilon(1e-12));
    CHECK(std::round(model_params(m).total() / 1e8) / 10 == Approx(num(row, "params_b")));
  }
}

TEST_CASE("The shipped Table 1 and README H100 models have the published parameter counts", "[core]") {
  for (const auto& row : read_csv("narayanan2021_table1_weak_scaling.csv")) {
    std::string name = "gpt-" + row.at("params_b") + "b";
    if (row.at("params_b") == "1008.0") name = "gpt-1t";
    INFO(name);
    CHECK(std::round(model_params(shipped_model(name)).total() / 1e8) / 10 == Approx(num(row, "params_b")));
  }
  for (const auto& row : read_csv("megatron_readme_h100_weak_scaling.csv")) {
    std::string name = "mcore-gpt-" + row.at("model");
    name.back() = 'b';
    INFO(name);
    // params_calc_b = 12 L h^2 + 2 V h, rounded to 0.1 B, leaves out biases, norms and the
    // position table (under 0.6% here).
    const double calc = num(row, "params_calc_b");
    CHECK(model_params(shipped_model(name)).total() / 1e9 == Approx(calc).margin(0.05 + 0.006 * calc));
  }
}

TEST_CASE("Summed over pipeline ranks, per-rank parameters give the model plus the tied-embedding copy", "[core]") {
  const ModelSpec m = gpt(24, 2048, 16);
  const Setup s = make_setup(m, "dgx-a100", "tp=1,pp=4", 8, 4);
  double sum = 0;
  for (int r = 0; r < 4; ++r) sum += rank_params(s, r).total();
  const double word = static_cast<double>(s.padded_vocab) * 2048;
  CHECK(sum == Approx(model_params(m, s.padded_vocab).total() + word));
  // With tp = 2 the sharded parts halve and the replicated ones (norms, row biases, positions) do not.
  const Setup s2 = make_setup(m, "dgx-a100", "tp=2,pp=1", 8, 2);
  const double replicated = 24 * (4 * 2048 + 2 * 2048) + 2 * 2048 + 2048.0 * 2048;
  CHECK(rank_params(s2, 0).total() == Approx((model_params(m, s2.padded_vocab).total() - replicated) / 2 + replicated));
}

TEST_CASE("Model FLOPs equal Korthikanti Eq. 7 and selective recompute adds one forward QK^T and PV per layer", "[core]") {
  const double B = 1536, s = 2048, L = 96, h = 12288, V = 51200;
  const Setup st = make_setup(gpt(96, 12288, 96), "dgx-a100", "tp=8,pp=8,recompute=selective", 1536, 1024);
  const IterationFlops f = iteration_flops(st);
  CHECK(f.model_no_causal == Approx(72 * B * L * s * h * h * (1 + s / (6 * h) + V / (12 * h * L))).epsilon(1e-12));
  // Recomputing QK^T and attention-over-V (2 B s^2 h each, Korthikanti section 5) adds 4 B L s^2 h.
  // Eq. 8 as printed, 72 B L s h^2 (1 + s/(3h) + ...), adds 12 B L s^2 h: three passes' worth
  // (docs/accounting.md, "Where Megascope differs").
  CHECK(f.hardware_no_causal - f.model_no_causal == Approx(4 * B * L * s * s * h).epsilon(1e-12));
  const double eq8 = 72 * B * L * s * h * h * (1 + s / (3 * h) + V / (12 * h * L));
  CHECK(eq8 - f.hardware_no_causal == Approx(8 * B * L * s * s * h).epsilon(1e-9));
  // Current Megatron-LM halves causal attention: 72 B s L h^2 (1 + s/(12h) + V/(12hL)).
  CHECK(f.model == Approx(72 * B * s * L * h * h * (1 + s / (12 * h) + V / (12 * h * L))).epsilon(1e-12));
}

TEST_CASE("Hardware FLOPs with full recomputation equal Narayanan Eq. 3 for every Table 1 row", "[core]") {
  for (const auto& row : read_csv("narayanan2021_table1_weak_scaling.csv")) {
    const int L = static_cast<int>(num(row, "num_layers")), t = static_cast<int>(num(row, "tp"));
    const int p = static_cast<int>(num(row, "pp")), gpus = static_cast<int>(num(row, "gpus"));
    const auto h = static_cast<std::int64_t>(num(row, "hidden_size"));
    const auto B = static_cast<std::int64_t>(num(row, "global_batch"));
    const ModelSpec m = gpt(L, h, static_cast<int>(num(row, "attention_heads")));
    const std::string plan = fmt::format("tp={},pp={},mbs={},recompute=full,recompute_method=uniform,recompute_layers=1",
                                         t, p, row.at("micro_batch"));
    const IterationFlops f = iteration_flops(make_setup(m, "dgx-a100", plan, B, gpus));
    const double eq3 = 96.0 * double(B) * 2048 * L * double(h) * double(h) * (1 + 2048.0 / (6 * double(h)) + 51200.0 / (16.0 * L * double(h)));
    INFO("params_b " << row.at("params_b"));
    CHECK(f.hardware_no_causal == Approx(eq3).epsilon(1e-12));
    CHECK(f.hardware_no_causal == Approx(num(row, "flops_per_iter_derived")).epsilon(1e-4));
  }
}

TEST_CASE("Model FLOPs without causal halving reproduce the README H100 table's derived FLOPs", "[core]") {
  for (const auto& row : read_csv("megatron_readme_h100_weak_scaling.csv")) {
    std::string name = "mcore-gpt-" + row.at("model");
    name.back() = 'b';
    const ModelSpec m = shipped_model(name);
    const Setup st = make_setup(m, "dgx-h100", fmt::format("tp={},pp={}", row.at("tp"), row.at("pp")),
                                static_cast<std::int64_t>(num(row, "global_batch")), static_cast<int>(num(row, "gpus")));
    INFO(name);
    CHECK(iteration_flops(st).model_no_causal == Approx(num(row, "flops_per_iter_derived")).epsilon(1e-4));
  }
}

TEST_CASE("The shipped Nemotron models (squared-ReLU MLPs) give NeMo 24.07's published FLOPs per token", "[core]") {
  // NeMo's performance summary states TFLOP/s and tokens/s per GPU for each run: their ratio is the
  // model FLOPs per token it counts (no causal halving then). Both are rounded to whole numbers.
  const std::map<std::string, std::string> models = {
      {"Nemotron-8B", "nemotron3-8b"}, {"Nemotron-22B", "nemotron4-22b"}, {"Nemotron-340B", "nemotron4-340b"}};
  int seen = 0;
  for (const auto& row : read_csv("megatron_bridge_nemo_perf_summary.csv")) {
    const auto it = models.find(row.at("model"));
    if (it == models.end()) continue;
    INFO(it->second);
    const ModelSpec m = shipped_model(it->second);
    CHECK(m.activation == Activation::squared_relu);
    const Setup st = make_setup(m, "dgx-h100", fmt::format("tp={},pp={}", row.at("tp"), row.at("pp")),
                                static_cast<std::int64_t>(num(row, "gbs")), static_cast<int>(num(row, "gpus")));
    const double per_token = iteration_flops(st).model_no_causal / (num(row, "gbs") * num(row, "seq_len"));
    const double published = num(row, "tflops_per_gpu") * 1e12 / num(row, "tokens_per_s_per_gpu");
    CHECK(per_token == Approx(published).epsilon(0.003));
    ++seen;
  }
  CHECK(seen == 3);
  // Not gated: two GEMMs of width f per MLP, as GeLU (SwiGLU has three).
  ModelSpec relu2 = shipped_model("nemotron3-8b"), gelu = relu2;
  gelu.activation = Activation::gelu;
  CHECK(model_params(relu2).total() == model_params(gelu).total());
  const Setup a = make_setup(relu2, "dgx-h100", "tp=1", 8, 1), b = make_setup(gelu, "dgx-h100", "tp=1", 8, 1);
  CHECK(iteration_flops(a).model == iteration_flops(b).model);
}

TEST_CASE("GQA, SwiGLU and MoE FLOPs equal Megatron-LM's counter (2025-03 form)", "[core]") {
  for (const char* name : {"llama3-70b", "mixtral-8x7b", "qwen3-30b-a3b"}) {
    INFO(name);
    const ModelSpec m = shipped_model(name);
    const Setup st = make_setup(m, "dgx-h100", "tp=1", 64, 1);
    const double B = 64, s = static_cast<double>(st.seq_length), L = m.num_layers, h = double(m.hidden_size);
    const double a = m.num_attention_heads, g = m.num_query_groups, q = double(m.q_width());
    const double gamma = m.activation == Activation::swiglu ? 1.5 : 1.0;
    double ffn_sum = 0;
    for (int l = 0; l < m.num_layers; ++l)
      ffn_sum += m.is_moe_layer(l) ? double(m.moe->expert_ffn_hidden) * m.moe->top_k + double(m.moe->shared_expert_ffn_hidden)
                                   : double(m.ffn_hidden_size);
    const double V = double(st.padded_vocab);
    const double megatron = 12 * B * s * L * h * h *
                            ((1 + g / a + s / (2 * h)) * (q / h) + ffn_sum * gamma / (L * h) + V / (2 * L * h));
    CHECK(iteration_flops(st).model == Approx(megatron).epsilon(1e-12));
  }
}

TEST_CASE("MLA FLOPs equal Megatron-LM's counter up to its +1 norm terms", "[core]") {
  ModelSpec m = shipped_model("deepseek-v3");
  m.mtp_num_layers = 0;
  const Setup st = make_setup(m, "dgx-h100", "tp=1", 8, 1);
  const double s = double(st.seq_length), h = double(m.hidden_size), a = m.num_attention_heads;
  const MlaSpec& l = *m.mla;
  const double dqk = double(l.qk_head_dim), dr = double(l.qk_rope_head_dim), dv = double(l.v_head_dim);
  const double rq = double(*l.q_lora_rank), rkv = double(l.kv_lora_rank);
  const double proj = 6 * (rq * (h + a * (dqk + dr) + 1) + rkv * (h + a * (dqk + dv) + 1) + h * dr + a * dv * h);
  const double core = 6 * (a * (dqk + dr) / 2 + a * dv / 2);
  double mlp = 0;
  for (int i = 0; i < m.num_layers; ++i)
    mlp += 6 * h * 3 * (m.is_moe_layer(i) ? double(m.moe->expert_ffn_hidden) * m.moe->top_k + double(m.moe->shared_expert_ffn_hidden)
                                          : double(m.ffn_hidden_size));
  const double per_seq = s * (mlp + m.num_layers * proj + 6 * h * double(st.padded_vocab)) + s * s * m.num_layers * core;
  CHECK(iteration_flops(st).model == Approx(8 * per_seq).epsilon(1e-4));
}

TEST_CASE("DeepSeek-V3 has 671B parameters of which 37B are active, plus its MTP module", "[core]") {
  // The technical report's 671B / 37B count the main model; the MTP module
  // (one layer plus its projection; the embedding and output are shared) adds about 14B.
  ModelSpec m = shipped_model("deepseek-v3");
  const ModelParams p = model_params(m);
  CHECK((p.total() - p.mtp.total()) / 1e9 == Approx(671).epsilon(0.005));
  CHECK(p.mtp.total() / 1e9 == Approx(11.7).epsilon(0.05));
  m.mtp_num_layers = 0;
  CHECK(active_params(m) / 1e9 == Approx(37).epsilon(0.03));
}

TEST_CASE("Sliding-window attention: each query's pairs are min(position, window), the accounting and the program's "
          "fused kernels count the same, and full layers keep causal attention",
          "[core]") {
  // Hand count: 8 queries, window 3: 1 + 2 + 3 x 6 = 21 pairs, against the continuous
  // count F(8) = 3^2/2 + 5 x 3 = 19.5 (the causal count's s^2/2 convention: 32 for 8).
  AttentionShape a;
  a.seq_q = a.seq_kv = 8;
  a.window = 3;
  CHECK(attention_pairs(a) == Approx(19.5));
  a.window = 8;   // a window as long as the sequence is plain causal attention
  CHECK(attention_pairs(a) == Approx(32.0));
  a.window = 0;
  CHECK(attention_pairs(a) == Approx(32.0));

  const ModelSpec m = shipped_model("gpt-oss-120b");
  REQUIRE(m.window_size == 128);
  CHECK(m.is_window_layer(0));
  CHECK_FALSE(m.is_window_layer(1));   // 1-based layer 2: full attention
  CHECK(m.is_window_layer(34));
  CHECK_FALSE(m.is_window_layer(35));
  const std::int64_t s = 4096;
  const double q = static_cast<double>(m.q_width());
  // Windowed layer: 2 GEMMs x 2 FLOPs x q x (s w - w^2 / 2); full layer: x s^2 / 2.
  CHECK(layer_forward_flops(m, 0, s, true).attention_core == Approx(4.0 * q * (4096.0 * 128 - 128.0 * 128 / 2)));
  CHECK(layer_forward_flops(m, 1, s, true).attention_core == Approx(4.0 * q * 4096.0 * 4096 / 2));
  // The program's fused attention kernels count the same FLOPs as the accounting, layer by layer.
  const Setup st = make_setup(m, "dgx-h100", "tp=1,ep=8", 8, 8, s);
  const auto p = build_program(st);
  REQUIRE(p);
  std::map<int, double> core_by_layer;
  for (const Op& op : p->stages[0].ops) {
    if (op.kind != OpKind::compute || op.phase != Phase::forward || !op.layer || op.microbatch != 0) continue;
    for (std::uint32_t k = op.kernel_begin; k < op.kernel_begin + op.kernel_count; ++k)
      if (p->stages[0].kernels[k].kind == KernelKind::attention_fwd)
        core_by_layer[*op.layer] += detail::kernel_flops(p->stages[0].kernels[k]);
  }
  REQUIRE(core_by_layer.size() == 36);
  for (const auto& [layer, f] : core_by_layer) {
    INFO("layer " << layer);
    CHECK(f == Approx(layer_forward_flops(m, layer, s, true).attention_core).epsilon(1e-12));
  }
  // Context parallelism does not price windowed work: refused.
  const auto cp = try_setup(m, "dgx-h100", "tp=1,cp=2,ep=8", 8, 8, s);
  REQUIRE_FALSE(cp);
  CHECK(cp.error().field == "plan.cp");
  CHECK_THAT(cp.error().message, Catch::Contains("sliding-window"));
}
