#include "config/library.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "config/hf_config.hpp"
#include "config/plan_settings.hpp"

namespace fs = std::filesystem;

namespace megascope {

std::string data_dir() {
  if (const char* env = std::getenv("MEGASCOPE_DATA_DIR"); env && *env) return env;
  if (fs::is_directory(MEGASCOPE_SOURCE_DATA_DIR)) return MEGASCOPE_SOURCE_DATA_DIR;
  return MEGASCOPE_INSTALL_DATA_DIR;
}

namespace {

std::vector<std::string> stems(const std::string& sub) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(data_dir()) / sub, ec))
    if (e.path().extension() == ".toml") out.push_back(e.path().stem().string());
  std::sort(out.begin(), out.end());
  return out;
}

bool looks_like_path(const std::string& s) {
  return s.find('/') != std::string::npos || s.ends_with(".toml") || s.ends_with(".json");
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// A regular file at `p`; false (not an exception) for a name the file
// system refuses, such as one longer than a file name may be.
bool regular_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

Error unknown_name(const char* what, const std::string& name, const std::vector<std::string>& known) {
  return Error{fmt::format("'{}' is neither a file nor a shipped {} (shipped: {})", name, what, join(known)), what,
               std::nullopt};
}

}  // namespace

std::vector<std::string> shipped_models() { return stems("models"); }
std::vector<std::string> shipped_clusters() { return stems("clusters"); }
std::vector<std::string> shipped_examples() { return stems("examples"); }
std::string default_example_path() { return (fs::path(data_dir()) / "examples" / "default.toml").string(); }

Result<ModelSpec> resolve_model(const std::string& s) {
  if (s.ends_with(".json")) return load_hf_config(s);
  if (looks_like_path(s) || regular_file(s)) return load_model_toml(s);
  const fs::path shipped = fs::path(data_dir()) / "models" / (s + ".toml");
  if (regular_file(shipped)) return load_model_toml(shipped.string());
  return tl::unexpected(unknown_name("model", s, shipped_models()));
}

Result<ClusterSpec> resolve_cluster(const std::string& s) {
  if (looks_like_path(s) || regular_file(s)) return load_cluster_toml(s);
  const fs::path shipped = fs::path(data_dir()) / "clusters" / (s + ".toml");
  if (regular_file(shipped)) return load_cluster_toml(shipped.string());
  return tl::unexpected(unknown_name("cluster", s, shipped_clusters()));
}

Result<PlanSpec> resolve_plan(const std::string& s) {
  if (s.ends_with(".toml") || (s.find('=') == std::string::npos && regular_file(s))) return load_plan_toml(s);
  return parse_inline_plan(s);
}

}  // namespace megascope
