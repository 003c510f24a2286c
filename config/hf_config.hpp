// Hugging Face config.json -> ModelSpec, for the Llama, Mistral, Mixtral,
// Qwen2/Qwen2-MoE, Qwen3/Qwen3-MoE and DeepSeek-V3 families (by
// "model_type"). Keys the model shape depends on are required; keys that do
// not affect the shape (eps values, rope scaling, token ids, ...) are ignored.
#pragma once

#include <string>
#include <string_view>

#include "core/model.hpp"
#include "core/result.hpp"

namespace megascope {

// Reads and converts a config.json file. Errors name the file and the key.
Result<ModelSpec> load_hf_config(const std::string& path);

// Converts the JSON text; `source` names it in errors (a path or "<string>").
Result<ModelSpec> parse_hf_config(std::string_view json_text, const std::string& source);

}  // namespace megascope
