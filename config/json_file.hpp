// Reading JSON input files (Hugging Face config.json, DeepSpeed configs):
// the file's text, and its parse with nlohmann::json, each failing with one
// Error that names the file and, for malformed JSON, the line and column.
// Internal to config/.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "core/result.hpp"

namespace megascope::json_detail {

// The whole file. `what` names it in messages ("Hugging Face config").
Result<std::string> read_text_file(const std::string& path, std::string_view what, const std::string& field);

// 1-based line and column of the character at 0-based `offset` in `text`.
std::pair<int, int> line_column(std::string_view text, std::size_t offset);

// Arrays and objects nested deeper than this are refused before parsing
// (nlohmann::json's parser recurses once per level: a million levels
// overflow the stack).
inline constexpr int kMaxJsonDepth = 512;

// The offset of the first '[' or '{' (outside strings) deeper than
// `max_depth`, if any.
std::optional<std::size_t> over_deep_json(std::string_view text, int max_depth);

// Parses `text`; a malformed document is "malformed JSON: <what>" at its
// line and column in `source`, on `field`; one nested deeper than
// kMaxJsonDepth is refused at the level that passes it.
Result<nlohmann::json> parse_json(std::string_view text, const std::string& source, const std::string& field);

}  // namespace megascope::json_detail
