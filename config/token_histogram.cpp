#include "config/token_histogram.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "config/input_file.hpp"

namespace megascope {

namespace {

tl::unexpected<Error> at(const std::string& path, int line, std::string message) {
  return tl::unexpected<Error>(Error{std::move(message), "token_histogram", SourceLocation{path, line, std::nullopt}});
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

}  // namespace

Result<std::vector<std::vector<double>>> load_token_histogram(const std::string& path) {
  if (auto ok = check_input_file(path, "token_histogram", "token histogram"); !ok) return tl::unexpected(ok.error());
  std::ifstream in(path);
  if (!in) return tl::unexpected<Error>(Error{"cannot open the file", "token_histogram", SourceLocation{path, {}, {}}});
  std::vector<std::vector<double>> rows;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    const std::string t = trim(line);
    if (t.empty() || t[0] == '#') continue;
    std::vector<double> row;
    std::stringstream ss(t);
    std::string cell;
    int col = 0;
    while (std::getline(ss, cell, ',')) {
      ++col;
      const std::string c = trim(cell);
      char* end = nullptr;
      errno = 0;
      const double v = c.empty() ? NAN : std::strtod(c.c_str(), &end);
      if (c.empty() || end != c.c_str() + c.size() || errno == ERANGE || !std::isfinite(v) || v < 0)
        return at(path, n, fmt::format("count {} ('{}') must be a finite number >= 0 (tokens routed to expert {})", col,
                                       c, col - 1));
      row.push_back(v);
    }
    if (t.back() == ',') return at(path, n, "the line ends with a comma: one count per expert, separated by commas");
    if (!rows.empty() && row.size() != rows.front().size())
      return at(path, n, fmt::format("{} counts, but the first layer's line has {}: every line holds one count per expert",
                                     row.size(), rows.front().size()));
    rows.push_back(std::move(row));
    if (rows.size() > kMaxHistogramLayers)
      return at(path, n, fmt::format("more than {} layers' lines: average repeated measurements of a layer into one line "
                                     "(every plan's load reads them all)",
                                     kMaxHistogramLayers));
  }
  if (rows.empty())
    return tl::unexpected<Error>(
        Error{"no layer's counts in the file (one line of per-expert token counts per layer)", "token_histogram",
              SourceLocation{path, {}, {}}});
  return rows;
}

Result<void> apply_token_histogram(ModelSpec& m, const std::string& path) {
  if (!m.moe)
    return tl::unexpected<Error>(Error{fmt::format("'{}' has no experts to route to", m.name), "--moe-histogram", std::nullopt});
  auto rows = load_token_histogram(path);
  if (!rows) return tl::unexpected(rows.error());
  ModelSpec with = m;
  with.moe->token_histogram = std::move(*rows);
  auto valid = validate_model(std::move(with));
  if (!valid) {
    Error e = valid.error();
    e.where = SourceLocation{path, {}, {}};
    return tl::unexpected(e);
  }
  m = std::move(*valid);
  return {};
}

}  // namespace megascope
