#include "core/pipeline_layout.hpp"

#include <fmt/format.h>

namespace megascope {

namespace {

using Err = tl::unexpected<Error>;

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Reads the repeat count after a '*' at text[i]; advances i past it.
Result<std::size_t> repeat_count(std::string_view text, std::size_t& i, const std::string& field) {
  const std::size_t star = i;
  ++i;
  std::size_t n = 0;
  const std::size_t start = i;
  while (i < text.size() && is_digit(text[i])) {
    n = n * 10 + static_cast<std::size_t>(text[i] - '0');
    if (n > kMaxLayoutLength)
      return fail(field, fmt::format("the repeat count at position {} is larger than {}", star + 1, kMaxLayoutLength));
    ++i;
  }
  if (i == start) return fail(field, fmt::format("'*' at position {} must be followed by a repeat count", star + 1));
  return n;
}

Result<void> append_repeated(std::string& out, std::string_view what, std::size_t n, const std::string& field) {
  if (what.size() * n + out.size() > kMaxLayoutLength)
    return fail(field, fmt::format("the layout expands to more than {} characters", kMaxLayoutLength));
  for (std::size_t k = 0; k < n; ++k) out.append(what);
  return {};
}

// Megatron-Core's two substitutions: "(group)*n" first, then "x*n".
Result<std::string> expand(std::string_view text, const std::string& field) {
  std::string groups;
  for (std::size_t i = 0; i < text.size();) {
    const char c = text[i];
    if (c == ')') return fail(field, fmt::format("')' at position {} closes no '('", i + 1));
    if (c != '(') {
      groups.push_back(c);
      ++i;
      continue;
    }
    const std::size_t close = text.find(')', i + 1);
    if (close == std::string_view::npos) return fail(field, fmt::format("'(' at position {} is not closed", i + 1));
    const std::string_view inner = text.substr(i + 1, close - i - 1);
    if (inner.find('(') != std::string_view::npos)
      return fail(field, fmt::format("nested parentheses at position {} (Megatron-Core does not expand them)", i + 1));
    if (inner.empty()) return fail(field, fmt::format("empty group '()' at position {}", i + 1));
    if (close + 1 >= text.size() || text[close + 1] != '*')
      return fail(field, fmt::format("the group at position {} must be followed by '*' and a repeat count", i + 1));
    std::size_t j = close + 1;
    auto n = repeat_count(text, j, field);
    if (!n) return Err(n.error());
    if (auto ok = append_repeated(groups, inner, *n, field); !ok) return Err(ok.error());
    i = j;
  }
  std::string out;
  for (std::size_t i = 0; i < groups.size();) {
    const char c = groups[i];
    if (c == '*') return fail(field, "'*' must follow a layer character or a group");
    if (i + 1 < groups.size() && groups[i + 1] == '*') {
      std::size_t j = i + 1;
      auto n = repeat_count(groups, j, field);
      if (!n) return Err(n.error());
      if (auto ok = append_repeated(out, std::string_view(&groups[i], 1), *n, field); !ok) return Err(ok.error());
      i = j;
    } else {
      out.push_back(c);
      ++i;
    }
  }
  return out;
}

std::string run(char c, int n) {
  if (n <= 0) return {};
  if (n <= 2) return std::string(static_cast<std::size_t>(n), c);
  return fmt::format("{}*{}", c, n);
}

std::string stage_text(const LayoutStage& st) {
  std::string s;
  if (st.embedding) s += 'E';
  s += run('t', st.decoders);
  s += run('m', st.mtp);
  if (st.loss) s += 'L';
  return s;
}

}  // namespace

Result<std::vector<LayoutStage>> parse_pipeline_layout(std::string_view text, const std::string& field) {
  std::string cleaned;
  for (char c : text)
    if (c != ',') cleaned.push_back(c);   // Megatron-Core drops commas only
  if (cleaned.empty()) return fail(field, "the layout is empty");
  auto expanded = expand(cleaned, field);
  if (!expanded) return Err(expanded.error());
  std::vector<LayoutStage> stages(1);
  int embeddings = 0, losses = 0;
  bool seen_layer = false, seen_mtp = false, after_loss = false;
  for (char c : *expanded) {
    if (c == '|') {
      if (stages.size() >= kMaxLayoutStages)
        return fail(field, fmt::format("the layout has more than {} stages", kMaxLayoutStages));
      stages.emplace_back();
      continue;
    }
    LayoutStage& st = stages.back();
    if (after_loss)
      return fail(field, fmt::format("'{}' after the loss: L must be the last layer of the layout", c));
    switch (c) {
      case 'E':
        if (++embeddings > 1) return fail(field, "the embedding (E) must appear exactly once");
        if (seen_layer) return fail(field, "the embedding (E) must be the first layer of the layout");
        st.embedding = true;
        break;
      case 't':
        if (seen_mtp) return fail(field, "transformer layers (t) must come before the MTP layers (m)");
        ++st.decoders;
        break;
      case 'm':
        seen_mtp = true;
        ++st.mtp;
        break;
      case 'L':
        ++losses;
        st.loss = true;
        after_loss = true;
        break;
      default:
        return fail(field, fmt::format("unknown layer character '{}': use E (embedding), t (transformer layer), "
                                       "m (MTP layer), L (loss), '|' between stages, X*n and (...)*n to repeat",
                                       c));
    }
    if (c != 'E') seen_layer = true;
  }
  if (embeddings == 0) return fail(field, "the layout must hold the embedding (E) in its first stage");
  if (losses == 0) return fail(field, "the layout must end with the loss (L)");
  return stages;
}

std::string format_pipeline_layout(const std::vector<LayoutStage>& stages) {
  std::string out;
  for (std::size_t i = 0; i < stages.size();) {
    std::size_t j = i + 1;
    while (j < stages.size() && stages[j] == stages[i]) ++j;
    const std::string s = stage_text(stages[i]);
    const std::size_t n = j - i;
    const bool ends = j == stages.size();
    // A run of equal stages: "(s|)*k", the last of the layout written plainly.
    const std::size_t grouped = ends ? n - 1 : n;
    if (grouped >= 2) {
      out += fmt::format("({}|)*{}", s, grouped);
      if (ends) out += s;
    } else {
      for (std::size_t k = 0; k < n; ++k) {
        out += s;
        if (i + k + 1 < stages.size()) out += '|';
      }
    }
    i = j;
  }
  return out;
}

}  // namespace megascope
