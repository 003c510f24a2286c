// Activation memory against Korthikanti et al. 2022 (Table 2 and Eq. 5/6 and
// the derived reference table), tensor by tensor.
#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <vector>

#include "core/accounting/activations.hpp"
#include "core/accounting/memory.hpp"
#include "models.hpp"
#include "support.hpp"

using namespace megascope;
using namespace megascope::test;

namespace {
constexpr double GiB = 1024.0 * 1024.0 * 1024.0;

double edge_terms(const StageMemory& st) {
  double e = 0;
  for (const auto& t : st.activation_terms)
    if (t.name == "input_ids" || t.name == "embedding_dropout_mask" || t.name == "final_norm_input" ||
        t.name == "output_layer_input" || t.name == "logits_fp32")
      e += t.bytes;
  return e;
}

double term(const StageMemory& st, const std::string& name) {
  for (const auto& t : st.activation_terms)
    if (t.name == name) return t.bytes;
  return 0;
}
}  // namespace

TEST_CASE("Per-layer activations equal every row of Korthikanti Table 2 for the paper's four models", "[core]") {
  for (const auto& row : read_csv("korthikanti2022_activation_memory_derived.csv")) {
    INFO(row.at("model"));
    const int L = static_cast<int>(num(row, "L")), a = static_cast<int>(num(row, "a"));
    const auto h = static_cast<std::int64_t>(num(row, "h"));
    const int b = static_cast<int>(num(row, "b")), t = static_cast<int>(num(row, "t"));
    const ModelSpec m = gpt(L, h, a);
    const std::string mbs = ",mbs=" + std::to_string(b);
    auto per_layer = [&](const std::string& plan, int tp) {
      return layer_activations(make_setup(m, "dgx-a100", plan + mbs, b, tp), 0);
    };
    const std::string tps = "tp=" + std::to_string(t);
    CHECK(per_layer("tp=1,attention=unfused", 1).stored / GiB == Approx(num(row, "per_layer_no_parallel_GiB")).margin(6e-5));
    CHECK(per_layer(tps + ",attention=unfused", t).stored / GiB == Approx(num(row, "per_layer_tp_GiB")).margin(6e-5));
    CHECK(per_layer(tps + ",sp=on,attention=unfused", t).stored / GiB == Approx(num(row, "per_layer_tp_sp_GiB")).margin(6e-5));
    CHECK(per_layer(tps + ",recompute=selective", t).stored / GiB ==
          Approx(num(row, "per_layer_tp_selective_GiB")).margin(6e-5));
    CHECK(per_layer(tps + ",sp=on,recompute=selective", t).stored / GiB ==
          Approx(num(row, "per_layer_tp_sp_selective_GiB")).margin(6e-5));
    CHECK(per_layer(tps, t).checkpoint / GiB == Approx(num(row, "per_layer_full_recompute_GiB")).margin(6e-5));
  }
}

TEST_CASE("First-stage activations equal Korthikanti Eq. 5/6 with the interleaving factor, edge terms aside", "[core]") {
  for (const auto& row : read_csv("korthikanti2022_activation_memory_derived.csv")) {
    INFO(row.at("model"));
    const int L = static_cast<int>(num(row, "L")), a = static_cast<int>(num(row, "a"));
    const auto h = static_cast<std::int64_t>(num(row, "h"));
    const int b = static_cast<int>(num(row, "b")), t = static_cast<int>(num(row, "t"));
    const int p = static_cast<int>(num(row, "p")), v = static_cast<int>(num(row, "interleave_chunks"));
    const ModelSpec m = gpt(L, h, a);
    std::string base = fmt::format("tp={},pp={},mbs={}", t, p, b);
    if (v > 1) base += fmt::format(",vpp={},schedule=interleaved", v);
    const std::int64_t batch = static_cast<std::int64_t>(b) * p * 4;   // m = 4p micro-batches
    auto stage0 = [&](const std::string& extra) {
      return memory_report(make_setup(m, "dgx-a100", base + extra, batch, t * p)).stages.at(0);
    };
    const StageMemory tp_only = stage0(",attention=unfused");
    CHECK((tp_only.activations_bytes - edge_terms(tp_only)) / GiB == Approx(num(row, "first_stage_tp_GiB")).margin(0.006));
    const StageMemory tp_sp = stage0(",sp=on,attention=unfused");
    CHECK((tp_sp.activations_bytes - edge_terms(tp_sp)) / GiB == Approx(num(row, "first_stage_tp_sp_GiB")).margin(0.006));
    const StageMemory sel = stage0(",sp=on,recompute=selective");
    CHECK((sel.activations_bytes - edge_terms(sel)) / GiB ==
          Approx(num(row, "first_stage_tp_sp_selective_GiB")).margin(0.006));
    const StageMemory full = stage0(",recompute=full,recompute_method=uniform,recompute_layers=1");
    CHECK(term(full, "recompute_checkpoints") / GiB == Approx(num(row, "first_stage_full_recompute_GiB")).margin(0.006));
  }
}

TEST_CASE("Selective recomputation removes exactly the 5as/h attention-score term", "[core]") {
  // GPT-3: 5as/h = 80 (Korthikanti section 5); per layer the unfused tp=8 cost
  // is sbh(10 + 24/8 + 80/8) and selective leaves sbh(10 + 24/8).
  const ModelSpec m = gpt(96, 12288, 96);
  const double sbh = 2048.0 * 12288.0;
  const auto full = layer_activations(make_setup(m, "dgx-a100", "tp=8,attention=unfused", 8, 8), 0);
  const auto sel = layer_activations(make_setup(m, "dgx-a100", "tp=8,recompute=selective", 8, 8), 0);
  CHECK(full.stored == Approx(sbh * (10 + 3 + 10)));
  CHECK(sel.stored == Approx(sbh * (10 + 3)));
}

TEST_CASE("Flash attention keeps only the fp32 log-sum-exp instead of the score matrices", "[core]") {
  const ModelSpec m = gpt(24, 2048, 16);
  const auto flash = layer_activations(make_setup(m, "dgx-a100", "tp=1", 1, 1), 0);
  const auto sel = layer_activations(make_setup(m, "dgx-a100", "tp=1,recompute=selective", 1, 1), 0);
  CHECK(flash.stored - sel.stored == Approx(4.0 * 16 * 2048));   // a x s x b x 4 bytes
}

TEST_CASE("GQA, SwiGLU and context parallelism scale the tensors they touch", "[core]") {
  ModelSpec m = gpt(8, 4096, 32, 51200, 4096);
  m.hidden_dropout = m.attention_dropout = 0;
  const double T = 4096.0, h = 4096.0;
  const auto mha = layer_activations(make_setup(m, "dgx-h100", "tp=1,recompute=selective", 1, 1, 4096), 0);
  m.num_query_groups = 8;   // K and V shrink 4x: 2 x 2T(h - h/4) fewer bytes
  const auto gqa = layer_activations(make_setup(m, "dgx-h100", "tp=1,recompute=selective", 1, 1, 4096), 0);
  CHECK(mha.stored - gqa.stored == Approx(2.0 * 2.0 * T * (h - h / 4)));
  m.activation = Activation::swiglu;  // the activation input doubles: + 2 T f
  const auto swiglu = layer_activations(make_setup(m, "dgx-h100", "tp=1,recompute=selective", 1, 1, 4096), 0);
  CHECK(swiglu.stored - gqa.stored == Approx(2.0 * T * 4 * h));
  const auto cp2 = layer_activations(make_setup(m, "dgx-h100", "tp=1,cp=2,recompute=selective", 2, 2, 4096), 0);
  CHECK(cp2.stored == Approx(swiglu.stored / 2));
}

TEST_CASE("MoE layers keep the routed tokens' expert activations, k copies per token", "[core]") {
  const ModelSpec m = shipped_model("mixtral-8x7b");
  const auto s1 = make_setup(m, "dgx-h100", "tp=1,ep=1,recompute=selective", 1, 1);
  const auto s2 = make_setup(m, "dgx-h100", "tp=1,ep=2,recompute=selective", 2, 2);
  const auto a1 = layer_activations(s1, 0), a2 = layer_activations(s2, 0);
  // Balanced routing: each EP rank processes its own tokens x top-k, whatever ep is.
  CHECK(a1.stored == Approx(a2.stored));
  double expert_fc1 = 0;
  for (const auto& t : a1.terms)
    if (t.name == "expert_fc1_input") expert_fc1 = t.bytes;
  CHECK(expert_fc1 == Approx(2.0 * 4096 * 2 * 4096));   // 2 bytes x s x top-2 x h
}

TEST_CASE("Recompute modules drop exactly the tensors they rebuild: norm outputs, MLA's q, k and v, the experts' activation output",
          "[core]") {
  ModelSpec m = shipped_model("deepseek-v3");
  m.mtp_num_layers = 0;
  const int moe_layer = 3;   // DeepSeek-V3's first MoE layer (three dense ones before it)
  REQUIRE(m.is_moe_layer(moe_layer));
  const std::string base = "tp=1,ep=8,recompute=selective";
  const auto names = [](const LayerActivations& a) {
    std::map<std::string, double> out;
    for (const auto& t : a.terms) out[t.name] = t.bytes;
    return out;
  };
  const auto core = names(layer_activations(make_setup(m, "dgx-h100", base, 8, 8), moe_layer));
  struct Case { const char* modules; std::vector<std::string> dropped; };
  for (const Case& c : {Case{"core_attn+layernorm", {"qkv_input", "fc1_input"}},
                        Case{"core_attn+mla_up_proj", {"q", "k", "v"}},
                        Case{"core_attn+moe_act", {"expert_fc2_input"}},
                        Case{"core_attn+layernorm+mla_up_proj+moe_act", {"qkv_input", "fc1_input", "q", "k", "v", "expert_fc2_input"}}}) {
    INFO(c.modules);
    const Setup s = make_setup(m, "dgx-h100", base + ",recompute_modules=" + c.modules, 8, 8);
    const LayerActivations a = layer_activations(s, moe_layer);
    auto expected = core;
    double dropped = 0;
    for (const std::string& d : c.dropped) {
      REQUIRE(expected.count(d) == 1);
      dropped += expected[d];
      expected.erase(d);
    }
    CHECK(names(a) == expected);
    CHECK(a.stored == Approx(layer_activations(make_setup(m, "dgx-h100", base, 8, 8), moe_layer).stored - dropped).epsilon(1e-12));
  }
  // Without core_attn the attention core's state is stored again (flash: its log-sum-exp).
  const auto no_core = names(layer_activations(make_setup(m, "dgx-h100", base + ",recompute_modules=moe_act", 8, 8), moe_layer));
  CHECK(no_core.count("softmax_lse") == 1);
  CHECK(core.count("softmax_lse") == 0);
}

TEST_CASE("FP8 training keeps the linear layers' inputs and output gradients in one byte, the rest in two", "[core]") {
  // Transformer Engine's linear layers keep the FP8 copy of their input for
  // the weight gradient; norms, the activation function, attention, the
  // router and the gate keep their 16-bit tensors.
  const std::map<std::string, double> linear = {{"qkv_input", 0.5},        {"proj_input", 0.5},
                                                {"fc1_input", 0.5},        {"fc2_input", 0.5},
                                                {"expert_fc1_input", 0.5}, {"expert_fc2_input", 0.5},
                                                {"shared_fc2_input", 0.5}, {"q_latent", 0.75},
                                                {"kv_latent", 0.75}};   // the latents: norm input 16-bit, up-projection input FP8
  struct Case {
    const char* model; const char* plan; int gpus; int layer;
    std::map<std::string, double> other;   // scales that differ from `linear`
  };
  // MLA: two projections from the hidden state, each with its own FP8 copy
  // (one shared 16-bit tensor in BF16). MoE: the norm's output is the
  // router's 16-bit input, plus the shared experts' FP8 copy.
  for (const Case& c : {Case{"llama3-70b", "tp=2,sp=on", 2, 0, {}},
                        Case{"deepseek-v3", "tp=2,sp=on,ep=4", 8, 3, {{"qkv_input", 1.0}, {"fc1_input", 1.5}}},
                        Case{"mixtral-8x7b", "tp=1,ep=2,recompute=selective", 2, 0, {{"fc1_input", 1.0}}}}) {
    INFO(c.model << " " << c.plan);
    const auto [s, s8] = bf16_and_fp8(c.model, c.plan, c.gpus);
    const ModelSpec& m = s.model;
    const LayerActivations a = layer_activations(s, c.layer), a8 = layer_activations(s8, c.layer);
    REQUIRE(a.terms.size() == a8.terms.size());
    int scaled = 0;
    for (std::size_t i = 0; i < a.terms.size(); ++i) {
      const std::string& name = a.terms[i].name;
      INFO(name);
      REQUIRE(a8.terms[i].name == name);
      double k = 1.0;
      if (auto it = c.other.find(name); it != c.other.end()) k = it->second;
      else if (auto jt = linear.find(name); jt != linear.end()) k = jt->second;
      scaled += k != 1.0;
      CHECK(a8.terms[i].bytes == Approx(a.terms[i].bytes * k).epsilon(1e-12));
    }
    CHECK(scaled >= 4);
    // GEMM inputs and output gradients only; MLA's second copy of its input in FP8.
    const double mla_extra = m.mla ? 4096.0 * static_cast<double>(m.hidden_size) : 0.0;
    CHECK(a8.weight_grad_state == Approx(a.weight_grad_state / 2 + mla_extra).epsilon(1e-12));
    CHECK(a8.checkpoint == a.checkpoint);   // the layer input, 16-bit
  }
}

TEST_CASE("FP8: recomputing a norm or an activation frees its 16-bit output, not the linear layer's FP8 copy", "[core]") {
  const auto names = [](const LayerActivations& a) {
    std::map<std::string, double> out;
    for (const auto& t : a.terms) out[t.name] = t.bytes;
    return out;
  };
  struct Case { const char* model; const char* plan; int gpus; int layer; std::vector<std::string> kept; };
  for (const Case& c : {Case{"llama3-70b", "tp=2,sp=on,recompute=selective,recompute_modules=core_attn+layernorm", 2, 0,
                             {"qkv_input", "fc1_input"}},
                        Case{"mixtral-8x7b", "tp=1,ep=2,recompute=selective,recompute_modules=core_attn+moe_act", 2, 0,
                             {"expert_fc2_input"}}}) {
    INFO(c.model << " " << c.plan);
    const ModelSpec m = shipped_model(c.model);
    const Setup s = make_setup(m, "dgx-h100", c.plan, c.gpus, c.gpus, 4096);
    Setup s8 = s;
    s8.training.precision = Precision::fp8;
    const auto bf16 = names(layer_activations(s, c.layer)), fp8 = names(layer_activations(s8, c.layer));
    const Setup plain = make_setup(m, "dgx-h100", "tp=" + std::to_string(s.plan.tp) + (s.sequence_parallel ? ",sp=on" : "") +
                                                      ",ep=" + std::to_string(s.plan.ep) + ",recompute=selective",
                                   c.gpus, c.gpus, 4096);
    const auto plain_bf16 = names(layer_activations(plain, c.layer));
    for (const std::string& k : c.kept) {
      INFO(k);
      CHECK(bf16.count(k) == 0);                                 // dropped in BF16
      REQUIRE(fp8.count(k) == 1);                                // kept in FP8,
      CHECK(fp8.at(k) == Approx(plain_bf16.at(k) / 2).epsilon(1e-12));   // at one byte
    }
  }
}

TEST_CASE("Checkpointed submodules (mlp, moe, shared_experts) keep only their input", "[core]") {
  ModelSpec m = shipped_model("deepseek-v3");
  m.mtp_num_layers = 0;
  const int dense_layer = 0, moe_layer = 3;   // three dense layers, then MoE ones
  REQUIRE_FALSE(m.is_moe_layer(dense_layer));
  REQUIRE(m.is_moe_layer(moe_layer));
  REQUIRE(m.moe->shared_expert_ffn_hidden > 0);
  const std::string base = "tp=1,ep=8,recompute=selective";
  const auto names = [](const LayerActivations& a) {
    std::map<std::string, double> out;
    for (const auto& t : a.terms) out[t.name] = t.bytes;
    return out;
  };
  struct Case {
    const char* modules;
    int layer;
    std::vector<std::string> dropped;
  };
  for (const Case& c :
       {Case{"core_attn+mlp", dense_layer, {"fc1_input", "activation_input", "fc2_input"}},
        Case{"core_attn+mlp", moe_layer, {}},   // mlp recomputes dense MLPs only
        Case{"core_attn+moe", dense_layer, {}},
        Case{"core_attn+moe", moe_layer,
             {"router_probs", "expert_fc1_input", "expert_activation_input", "expert_fc2_input", "expert_output",
              "shared_activation_input", "shared_fc2_input"}},
        Case{"core_attn+shared_experts", moe_layer, {"shared_activation_input", "shared_fc2_input"}},
        // With the norms recomputed too the block's input goes as well (freed after it, rebuilt in backward).
        Case{"core_attn+layernorm+moe", moe_layer,
             {"qkv_input", "fc1_input", "router_probs", "expert_fc1_input", "expert_activation_input", "expert_fc2_input",
              "expert_output", "shared_activation_input", "shared_fc2_input"}},
        Case{"core_attn+moe_act+moe", moe_layer,   // moe contains moe_act
             {"router_probs", "expert_fc1_input", "expert_activation_input", "expert_fc2_input", "expert_output",
              "shared_activation_input", "shared_fc2_input"}}}) {
    INFO(c.modules << " layer " << c.layer);
    const LayerActivations before = layer_activations(make_setup(m, "dgx-h100", base, 8, 8), c.layer);
    const LayerActivations after =
        layer_activations(make_setup(m, "dgx-h100", base + ",recompute_modules=" + c.modules, 8, 8), c.layer);
    auto expected = names(before);
    double dropped = 0;
    for (const std::string& d : c.dropped) {
      REQUIRE(expected.count(d) == 1);
      dropped += expected[d];
      expected.erase(d);
    }
    CHECK(names(after) == expected);
    CHECK(after.stored == Approx(before.stored - dropped).epsilon(1e-12));
    // The W pass still needs every GEMM's input and output gradient.
    CHECK(after.weight_grad_state == Approx(before.weight_grad_state).epsilon(1e-12));
  }
  // In FP8 the shared experts keep an FP8 copy of the block's input beside
  // the router's 16-bit one (fc1_input 2 + 1 bytes); recomputing them drops
  // the copy, recomputing the block keeps only its 16-bit input.
  const auto fc1 = [&](const std::string& modules) {
    Setup s = make_setup(m, "dgx-h100", base + (modules.empty() ? "" : ",recompute_modules=" + modules), 8, 8);
    s.training.precision = Precision::fp8;
    return names(layer_activations(s, moe_layer)).at("fc1_input");
  };
  const double T = 4096, h = 7168;
  CHECK(fc1("") == Approx(3.0 * T * h));
  CHECK(fc1("core_attn+shared_experts") == Approx(2.0 * T * h));
  CHECK(fc1("core_attn+moe") == Approx(2.0 * T * h));
}
