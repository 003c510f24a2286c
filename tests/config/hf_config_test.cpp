#include <catch2/catch.hpp>

#include <string>

#include "config/hf_config.hpp"

using namespace megascope;

namespace {

std::string fixture(const std::string& name) { return std::string(MEGASCOPE_TEST_FIXTURES) + "/hf/" + name; }

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

ModelSpec load_ok(const std::string& name) {
  auto r = load_hf_config(fixture(name));
  INFO((r ? std::string() : r.error().str()));
  REQUIRE(r.has_value());
  return *r;
}

Error load_error(const std::string& name) {
  auto r = load_hf_config(fixture(name));
  REQUIRE_FALSE(r.has_value());
  return r.error();
}

Error parse_error(const std::string& text) {
  auto r = parse_hf_config(text, "<string>");
  REQUIRE_FALSE(r.has_value());
  return r.error();
}

// A minimal Llama config; `extra` is spliced in as further keys.
std::string llama_json(const std::string& extra = "") {
  return R"({"model_type": "llama", "hidden_size": 1024, "intermediate_size": 4096,
             "num_hidden_layers": 4, "num_attention_heads": 16, "vocab_size": 32000,
             "max_position_embeddings": 2048)" +
         (extra.empty() ? std::string() : ", " + extra) + "}";
}

}  // namespace

TEST_CASE("Meta-Llama-3-8B maps to a 32-layer GQA SwiGLU model with untied embeddings", "[config]") {
  const ModelSpec m = load_ok("llama3-8b.json");
  CHECK(m.name == "llama3-8b");
  CHECK(m.num_layers == 32);
  CHECK(m.hidden_size == 4096);
  CHECK(m.ffn_hidden_size == 14336);
  CHECK(m.num_attention_heads == 32);
  CHECK(m.num_query_groups == 8);
  CHECK(m.kv_channels == 128);
  CHECK(m.vocab_size == 128256);
  CHECK(m.seq_length == 8192);
  CHECK(m.activation == Activation::swiglu);
  CHECK(m.norm == Norm::rmsnorm);
  CHECK(m.position_embedding == PositionEmbedding::rope);
  CHECK_FALSE(m.add_bias_linear);
  CHECK_FALSE(m.add_qkv_bias);
  CHECK_FALSE(m.tied_embeddings);
  CHECK_FALSE(m.qk_layernorm);
  CHECK(m.hidden_dropout == 0.0);
  CHECK(m.attention_dropout == 0.0);
  CHECK(m.mtp_num_layers == 0);
  CHECK_FALSE(m.moe.has_value());
  CHECK_FALSE(m.mla.has_value());
}

TEST_CASE("Mistral-7B-v0.1 maps to a 32-layer model with 8 KV heads and a 32k context", "[config]") {
  const ModelSpec m = load_ok("mistral-7b.json");
  CHECK(m.name == "mistral-7b");
  CHECK(m.num_layers == 32);
  CHECK(m.hidden_size == 4096);
  CHECK(m.ffn_hidden_size == 14336);
  CHECK(m.num_attention_heads == 32);
  CHECK(m.num_query_groups == 8);
  CHECK(m.kv_channels == 128);
  CHECK(m.vocab_size == 32000);
  CHECK(m.seq_length == 32768);
  CHECK(m.activation == Activation::swiglu);
  CHECK(m.norm == Norm::rmsnorm);
  CHECK(m.position_embedding == PositionEmbedding::rope);
  CHECK_FALSE(m.add_bias_linear);
  CHECK_FALSE(m.add_qkv_bias);
  CHECK_FALSE(m.tied_embeddings);
  CHECK_FALSE(m.qk_layernorm);
  CHECK_FALSE(m.moe.has_value());
  CHECK_FALSE(m.mla.has_value());
}

TEST_CASE("Mixtral-8x7B maps to 8 experts, top-2, with every one of its 32 layers MoE", "[config]") {
  const ModelSpec m = load_ok("mixtral-8x7b.json");
  CHECK(m.num_layers == 32);
  CHECK(m.hidden_size == 4096);
  CHECK(m.ffn_hidden_size == 14336);
  CHECK(m.num_attention_heads == 32);
  CHECK(m.num_query_groups == 8);
  CHECK(m.kv_channels == 128);
  CHECK(m.vocab_size == 32000);
  CHECK(m.seq_length == 32768);
  CHECK(m.activation == Activation::swiglu);
  CHECK_FALSE(m.add_bias_linear);
  CHECK_FALSE(m.tied_embeddings);
  REQUIRE(m.moe.has_value());
  CHECK(m.moe->num_experts == 8);
  CHECK(m.moe->top_k == 2);
  CHECK(m.moe->expert_ffn_hidden == 14336);
  CHECK(m.moe->shared_expert_ffn_hidden == 0);
  CHECK(m.num_moe_layers() == 32);
  CHECK_FALSE(m.mla.has_value());
}

TEST_CASE("Qwen2-7B maps to a 28-layer model with QKV biases and 4 KV heads", "[config]") {
  const ModelSpec m = load_ok("qwen2-7b.json");
  CHECK(m.name == "qwen2-7b");
  CHECK(m.num_layers == 28);
  CHECK(m.hidden_size == 3584);
  CHECK(m.ffn_hidden_size == 18944);
  CHECK(m.num_attention_heads == 28);
  CHECK(m.num_query_groups == 4);
  CHECK(m.kv_channels == 128);
  CHECK(m.vocab_size == 152064);
  CHECK(m.seq_length == 131072);
  CHECK(m.activation == Activation::swiglu);
  CHECK(m.norm == Norm::rmsnorm);
  CHECK(m.position_embedding == PositionEmbedding::rope);
  CHECK_FALSE(m.add_bias_linear);
  CHECK(m.add_qkv_bias);
  CHECK_FALSE(m.qk_layernorm);
  CHECK_FALSE(m.tied_embeddings);
  CHECK_FALSE(m.moe.has_value());
}

TEST_CASE("Qwen3-30B-A3B maps to 128 experts top-8 in all 48 layers with head_dim 128 and QK norms",
          "[config]") {
  const ModelSpec m = load_ok("qwen3-30b-a3b.json");
  CHECK(m.num_layers == 48);
  CHECK(m.hidden_size == 2048);
  CHECK(m.ffn_hidden_size == 6144);
  CHECK(m.num_attention_heads == 32);
  CHECK(m.num_query_groups == 4);
  CHECK(m.kv_channels == 128);  // head_dim, not hidden_size / heads = 64
  CHECK(m.q_width() == 4096);
  CHECK(m.vocab_size == 151936);
  CHECK(m.seq_length == 40960);
  CHECK(m.activation == Activation::swiglu);
  CHECK(m.norm == Norm::rmsnorm);
  CHECK(m.qk_layernorm);
  CHECK_FALSE(m.add_bias_linear);
  CHECK_FALSE(m.add_qkv_bias);
  CHECK_FALSE(m.tied_embeddings);
  REQUIRE(m.moe.has_value());
  CHECK(m.moe->num_experts == 128);
  CHECK(m.moe->top_k == 8);
  CHECK(m.moe->expert_ffn_hidden == 768);
  CHECK(m.moe->shared_expert_ffn_hidden == 0);
  CHECK(m.num_moe_layers() == 48);
  CHECK_FALSE(m.mla.has_value());
}

TEST_CASE("DeepSeek-V3 maps to 61 layers, the first 3 dense, 256 experts top-8, MLA and one MTP layer",
          "[config]") {
  const ModelSpec m = load_ok("deepseek-v3.json");
  CHECK(m.name == "deepseek-v3");
  CHECK(m.num_layers == 61);
  CHECK(m.hidden_size == 7168);
  CHECK(m.ffn_hidden_size == 18432);
  CHECK(m.num_attention_heads == 128);
  CHECK(m.num_query_groups == 128);
  CHECK(m.kv_channels == 192);  // qk_nope_head_dim + qk_rope_head_dim
  CHECK(m.vocab_size == 129280);
  CHECK(m.seq_length == 163840);
  CHECK(m.activation == Activation::swiglu);
  CHECK(m.norm == Norm::rmsnorm);
  CHECK(m.position_embedding == PositionEmbedding::rope);
  CHECK_FALSE(m.add_bias_linear);
  CHECK_FALSE(m.add_qkv_bias);
  CHECK_FALSE(m.tied_embeddings);
  CHECK(m.mtp_num_layers == 1);
  REQUIRE(m.moe.has_value());
  CHECK(m.moe->num_experts == 256);
  CHECK(m.moe->top_k == 8);
  CHECK(m.moe->expert_ffn_hidden == 2048);
  CHECK(m.moe->shared_expert_ffn_hidden == 2048);
  CHECK(m.moe->num_groups == 8);   // n_group, topk_group with topk_method noaux_tc
  CHECK(m.moe->group_topk == 4);
  CHECK(m.num_moe_layers() == 58);
  for (int i = 0; i < 3; ++i) CHECK_FALSE(m.is_moe_layer(i));
  for (int i = 3; i < 61; ++i) CHECK(m.is_moe_layer(i));
  REQUIRE(m.mla.has_value());
  REQUIRE(m.mla->q_lora_rank.has_value());
  CHECK(*m.mla->q_lora_rank == 1536);
  CHECK(m.mla->kv_lora_rank == 512);
  CHECK(m.mla->qk_head_dim == 128);
  CHECK(m.mla->qk_rope_head_dim == 64);
  CHECK(m.mla->v_head_dim == 128);
}

TEST_CASE("A malformed config.json reports the file, line and column of the syntax error", "[config]") {
  const Error e = load_error("malformed.json");
  REQUIRE(e.where.has_value());
  CHECK(e.where->file == fixture("malformed.json"));
  REQUIRE(e.where->line.has_value());
  CHECK(*e.where->line == 7);  // the key after the missing comma
  CHECK(e.where->column.has_value());
  CHECK(contains(e.message, "malformed JSON"));
  CHECK(contains(e.str(), "malformed.json:7:"));
}

TEST_CASE("An unknown model_type is an error naming it and listing the supported ones", "[config]") {
  const Error e = load_error("unknown-type.json");
  CHECK(e.field == "hf.model_type");
  CHECK(contains(e.message, "\"gpt2\""));
  CHECK(contains(e.message, "unknown-type.json"));
  for (const char* t :
       {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v2", "deepseek_v3"})
    CHECK(contains(e.message, t));
}

TEST_CASE("A missing required key is an error naming the key and the file", "[config]") {
  const Error e = load_error("missing-key.json");
  CHECK(e.field == "hf.num_hidden_layers");
  CHECK(contains(e.message, "missing"));
  CHECK(contains(e.message, "missing-key.json"));
}

TEST_CASE("A key of the wrong JSON type is an error saying the expected and the found type", "[config]") {
  const Error e = load_error("wrong-type.json");
  CHECK(e.field == "hf.hidden_size");
  CHECK(contains(e.message, "expected an integer"));
  CHECK(contains(e.message, "found string"));
  CHECK(contains(e.message, "wrong-type.json"));
}

TEST_CASE("An unreadable file is an error naming the path and the system's reason", "[config]") {
  const std::string path = fixture("does-not-exist.json");
  auto r = load_hf_config(path);
  REQUIRE_FALSE(r.has_value());
  CHECK(contains(r.error().message, path));
  CHECK(contains(r.error().message, "No such file or directory"));
}

TEST_CASE("parse_hf_config converts inline JSON text with the defaults of absent optional keys", "[config]") {
  auto r = parse_hf_config(llama_json(), "<string>");
  INFO((r ? std::string() : r.error().str()));
  REQUIRE(r.has_value());
  CHECK(r->name == "hf-model");
  CHECK(r->num_layers == 4);
  CHECK(r->hidden_size == 1024);
  CHECK(r->ffn_hidden_size == 4096);
  CHECK(r->num_attention_heads == 16);
  CHECK(r->num_query_groups == 16);  // no num_key_value_heads: MHA
  CHECK(r->kv_channels == 64);       // no head_dim: hidden_size / heads
  CHECK(r->vocab_size == 32000);
  CHECK(r->seq_length == 2048);
  CHECK(r->activation == Activation::swiglu);  // hidden_act defaults to silu
  CHECK_FALSE(r->tied_embeddings);
  CHECK_FALSE(r->add_bias_linear);
  CHECK_FALSE(r->add_qkv_bias);
  CHECK(r->attention_dropout == 0.0);
}

TEST_CASE("_name_or_path, head_dim, attention_dropout, a GeLU gate and tied embeddings are read when present",
          "[config]") {
  auto r = parse_hf_config(llama_json(R"("_name_or_path": "org/tiny", "head_dim": 128,
                                          "attention_dropout": 0.1, "hidden_act": "gelu_pytorch_tanh",
                                          "tie_word_embeddings": true, "num_key_value_heads": 2)"),
                           "<string>");
  INFO((r ? std::string() : r.error().str()));
  REQUIRE(r.has_value());
  CHECK(r->name == "org/tiny");
  CHECK(r->kv_channels == 128);
  CHECK(r->num_query_groups == 2);
  CHECK(r->attention_dropout == Approx(0.1));
  CHECK(r->hidden_dropout == 0.0);
  // Llama's MLP is gated whatever its activation: priced as SwiGLU.
  CHECK(r->activation == Activation::swiglu);
  CHECK(r->tied_embeddings);
}

TEST_CASE("Llama attention_bias gives QKV biases, and with mlp_bias biases on every linear layer", "[config]") {
  auto qkv = parse_hf_config(llama_json(R"("attention_bias": true)"), "<string>");
  REQUIRE(qkv.has_value());
  CHECK(qkv->add_qkv_bias);
  CHECK_FALSE(qkv->add_bias_linear);

  auto all = parse_hf_config(llama_json(R"("attention_bias": true, "mlp_bias": true)"), "<string>");
  REQUIRE(all.has_value());
  CHECK(all->add_qkv_bias);
  CHECK(all->add_bias_linear);
}

TEST_CASE("A hidden_size not divisible by the heads without head_dim is an error on hf.head_dim", "[config]") {
  const Error e = parse_error(R"({"model_type": "mistral", "hidden_size": 1000, "intermediate_size": 4096,
                                  "num_hidden_layers": 4, "num_attention_heads": 16, "vocab_size": 32000,
                                  "max_position_embeddings": 2048})");
  CHECK(e.field == "hf.head_dim");
  CHECK(contains(e.message, "<string>"));
}

TEST_CASE("A Nemotron config maps to a squared-ReLU MLP (not gated) with LayerNorm, relu2 its default, and other families stay gated",
          "[config]") {
  // The keys of Hugging Face's NemotronConfig, shaped like Nemotron-4 15B (NeMo Nemotron4Config15B).
  const std::string nemotron = R"({"model_type": "nemotron", "hidden_size": 6144, "intermediate_size": 24576,
      "num_hidden_layers": 32, "num_attention_heads": 48, "num_key_value_heads": 8, "vocab_size": 256000,
      "max_position_embeddings": 4096, "partial_rotary_factor": 0.5, "norm_eps": 1e-05, "attention_bias": false,
      "mlp_bias": false, "tie_word_embeddings": false)";
  for (const std::string& act : {std::string(), std::string(R"(, "hidden_act": "relu2")")}) {
    INFO("hidden_act" << (act.empty() ? " absent" : " relu2"));
    auto r = parse_hf_config(nemotron + act + "}", "<string>");
    INFO((r ? std::string() : r.error().str()));
    REQUIRE(r.has_value());
    CHECK(r->activation == Activation::squared_relu);
    CHECK(r->norm == Norm::layernorm);
    CHECK(r->num_query_groups == 8);
    CHECK(r->kv_channels == 128);
    CHECK_FALSE(r->add_bias_linear);
    CHECK_FALSE(r->tied_embeddings);
  }
  CHECK(parse_hf_config(nemotron + R"(, "hidden_act": "gelu"})", "<string>")->activation == Activation::gelu);
  // A Nemotron MLP is not gated: SiLU there is not a SwiGLU, and is refused.
  const Error silu = parse_error(nemotron + R"(, "hidden_act": "silu"})");
  CHECK(silu.field == "hf.hidden_act");
  CHECK(contains(silu.message, "not gated"));
  // A Llama MLP is gated whatever it names: relu2 there is a gated MLP, priced as SwiGLU.
  CHECK(parse_hf_config(llama_json(), "<string>")->activation == Activation::swiglu);
  CHECK(parse_hf_config(llama_json(R"("hidden_act": "relu2")"), "<string>")->activation == Activation::swiglu);
}

TEST_CASE("An unsupported hidden_act is an error on hf.hidden_act", "[config]") {
  const Error e = parse_error(llama_json(R"("hidden_act": "relu")"));
  CHECK(e.field == "hf.hidden_act");
  CHECK(contains(e.message, "relu"));
}

TEST_CASE("A missing model_type is an error on hf.model_type", "[config]") {
  const Error e = parse_error(R"({"hidden_size": 1024})");
  CHECK(e.field == "hf.model_type");
  CHECK(contains(e.message, "missing"));
}

TEST_CASE("A JSON document that is not an object is an error", "[config]") {
  const Error e = parse_error("[1, 2, 3]");
  CHECK(e.field == "hf");
  CHECK(contains(e.message, "array"));
}

TEST_CASE("A float where an integer is required is an error saying both types", "[config]") {
  const Error e = parse_error(llama_json(R"("num_key_value_heads": 4.0)"));
  CHECK(e.field == "hf.num_key_value_heads");
  CHECK(contains(e.message, "expected an integer"));
  CHECK(contains(e.message, "found float"));
}

TEST_CASE("A boolean key given as a string is an error saying both types", "[config]") {
  const Error e = parse_error(llama_json(R"("tie_word_embeddings": "false")"));
  CHECK(e.field == "hf.tie_word_embeddings");
  CHECK(contains(e.message, "expected a boolean"));
  CHECK(contains(e.message, "found string"));
}

TEST_CASE("A zero or negative size is an error on the Hugging Face key", "[config]") {
  const Error e = parse_error(R"({"model_type": "llama", "hidden_size": 1024, "intermediate_size": 4096,
                                  "num_hidden_layers": 0, "num_attention_heads": 16, "vocab_size": 32000,
                                  "max_position_embeddings": 2048})");
  CHECK(e.field == "hf.num_hidden_layers");
}

TEST_CASE("Errors found by validate_model keep their model field and name the source", "[config]") {
  const Error e = parse_error(llama_json(R"("num_key_value_heads": 5)"));
  CHECK(e.field == "model.num_query_groups");
  CHECK(contains(e.message, "<string>"));
}

TEST_CASE("Malformed inline JSON reports the line and column of the offending character", "[config]") {
  const Error e = parse_error("{\n  \"model_type\": \"llama\",\n  \"hidden_size\": ,\n}");
  REQUIRE(e.where.has_value());
  CHECK(e.where->file == "<string>");
  CHECK(e.where->line == 3);
  CHECK(e.where->column == 18);
}

TEST_CASE("Qwen2-MoE places MoE layers by decoder_sparse_step and mlp_only_layers, with a shared expert",
          "[config]") {
  auto r = parse_hf_config(R"({"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632,
    "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 151936,
    "max_position_embeddings": 8192, "num_experts": 60, "num_experts_per_tok": 4,
    "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
    "decoder_sparse_step": 2, "mlp_only_layers": [3], "tie_word_embeddings": false})",
                           "qwen1.5-moe.json");
  INFO((r ? std::string() : r.error().str()));
  REQUIRE(r.has_value());
  CHECK(r->name == "qwen1.5-moe");
  CHECK(r->add_qkv_bias);
  CHECK_FALSE(r->add_bias_linear);
  CHECK(r->ffn_hidden_size == 5632);
  REQUIRE(r->moe.has_value());
  CHECK(r->moe->num_experts == 60);
  CHECK(r->moe->top_k == 4);
  CHECK(r->moe->expert_ffn_hidden == 1408);
  CHECK(r->moe->shared_expert_ffn_hidden == 5632);
  // (i + 1) % 2 == 0 gives layers 1, 3, 5, 7; layer 3 is in mlp_only_layers.
  CHECK(r->moe->moe_layers == std::vector<bool>{false, true, false, false, false, true, false, true});
}

TEST_CASE("Qwen3 dense requires head_dim and turns on QK layernorm", "[config]") {
  const std::string base = R"({"model_type": "qwen3", "hidden_size": 2560, "intermediate_size": 9728,
    "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 151936,
    "max_position_embeddings": 40960, "tie_word_embeddings": true)";
  const Error e = parse_error(base + "}");
  CHECK(e.field == "hf.head_dim");

  auto r = parse_hf_config(base + R"(, "head_dim": 128})", "<string>");
  INFO((r ? std::string() : r.error().str()));
  REQUIRE(r.has_value());
  CHECK(r->kv_channels == 128);
  CHECK(r->qk_layernorm);
  CHECK_FALSE(r->add_qkv_bias);
  CHECK(r->tied_embeddings);
  CHECK_FALSE(r->moe.has_value());
}

TEST_CASE("DeepSeek-V2 with a null q_lora_rank and moe_layer_freq 2 follows the HF layer rule", "[config]") {
  auto r = parse_hf_config(R"({"model_type": "deepseek_v2", "hidden_size": 2048, "intermediate_size": 10944,
    "num_hidden_layers": 6, "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 102400,
    "max_position_embeddings": 163840, "q_lora_rank": null, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 64,
    "num_experts_per_tok": 6, "moe_intermediate_size": 1408, "n_shared_experts": 2,
    "first_k_dense_replace": 1, "moe_layer_freq": 2})",
                           "<string>");
  INFO((r ? std::string() : r.error().str()));
  REQUIRE(r.has_value());
  REQUIRE(r->mla.has_value());
  CHECK_FALSE(r->mla->q_lora_rank.has_value());
  CHECK(r->kv_channels == 192);
  CHECK(r->mtp_num_layers == 0);
  REQUIRE(r->moe.has_value());
  CHECK(r->moe->shared_expert_ffn_hidden == 2 * 1408);
  // layer_idx >= 1 and layer_idx % 2 == 0
  CHECK(r->moe->moe_layers == std::vector<bool>{false, false, true, false, true, false});
}

TEST_CASE("DeepSeek without q_lora_rank is an error, since null and absent mean different things", "[config]") {
  const Error e = parse_error(R"({"model_type": "deepseek_v3", "hidden_size": 2048, "intermediate_size": 10944,
    "num_hidden_layers": 6, "num_attention_heads": 16, "vocab_size": 102400,
    "max_position_embeddings": 4096, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": null})");
  CHECK(e.field == "hf.q_lora_rank");
}
