#include "config/json_file.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <system_error>

#include "config/input_file.hpp"

namespace megascope::json_detail {

Result<std::string> read_text_file(const std::string& path, std::string_view what, const std::string& field) {
  if (auto ok = check_input_file(path, field, what); !ok) return tl::unexpected(ok.error());
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) {
    const int err = errno;
    return fail(field, fmt::format("cannot open {} \"{}\": {}", what, path, std::generic_category().message(err)));
  }
  std::string text;
  char buf[65536];
  for (;;) {
    const std::size_t n = std::fread(buf, 1, sizeof buf, f);
    text.append(buf, n);
    if (n < sizeof buf) break;
  }
  const bool read_failed = std::ferror(f) != 0;
  const int err = errno;
  std::fclose(f);
  if (read_failed)
    return fail(field, fmt::format("cannot read {} \"{}\": {}", what, path, std::generic_category().message(err)));
  return text;
}

std::pair<int, int> line_column(std::string_view text, std::size_t offset) {
  offset = std::min(offset, text.size());
  int line = 1;
  std::size_t line_start = 0;
  for (std::size_t i = 0; i < offset; ++i) {
    if (text[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  return {line, static_cast<int>(offset - line_start) + 1};
}

std::optional<std::size_t> over_deep_json(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (in_string) {
      if (ch == '\\') ++i;   // the escaped character
      else if (ch == '"') in_string = false;
      continue;
    }
    if (ch == '"') in_string = true;
    else if (ch == '[' || ch == '{') {
      if (++depth > max_depth) return i;
    } else if ((ch == ']' || ch == '}') && depth > 0) --depth;
  }
  return std::nullopt;
}

Result<nlohmann::json> parse_json(std::string_view text, const std::string& source, const std::string& field) {
  if (const auto at = over_deep_json(text, kMaxJsonDepth)) {
    const auto [line, column] = line_column(text, *at);
    return tl::unexpected(Error{fmt::format("JSON nested more than {} levels deep is refused", kMaxJsonDepth), field,
                                SourceLocation{source, line, column}});
  }
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    // nlohmann's "[json.exception.parse_error.101] parse error at line 3,
    // column 5: <what>": keep <what>, the location goes into `where`.
    std::string what = e.what();
    if (auto at = what.find("parse error"); at != std::string::npos) {
      if (auto colon = what.find(": ", at); colon != std::string::npos) what = what.substr(colon + 2);
    }
    Error err{fmt::format("malformed JSON: {}", what), field, SourceLocation{source, std::nullopt, std::nullopt}};
    if (e.byte > 0) {
      // `byte` is the 1-based index of the last character read.
      auto [line, column] = line_column(text, e.byte - 1);
      err.where->line = line;
      err.where->column = column;
    }
    return tl::unexpected(std::move(err));
  } catch (const nlohmann::json::exception& e) {
    // A number out of double's range (out_of_range.406) and the like.
    std::string what = e.what();
    if (auto at = what.find("] "); at != std::string::npos) what = what.substr(at + 2);
    return tl::unexpected(Error{fmt::format("malformed JSON: {}", what), field, SourceLocation{source, std::nullopt, std::nullopt}});
  }
}

}  // namespace megascope::json_detail
