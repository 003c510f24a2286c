// `megascope sweep`: its variables, their values (lists and ranges), devices
// by name and the cluster variants they make (declared in apps/sweep.hpp).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "apps/sweep.hpp"
#include "config/library.hpp"

namespace megascope::cli {

namespace {

using Err = tl::unexpected<Error>;
constexpr std::size_t kMaxValues = 4096;  // per swept option

Error usage(const std::string& option, const std::string& message) { return Error{message, option, std::nullopt}; }

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::optional<double> number(const std::string& s) {
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

}  // namespace

// "a,b,,c" -> {"a", "b", "", "c"}: every item, empty ones included.
std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t comma = std::min(text.find(',', pos), text.size());
    out.push_back(text.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return out;
}

// ---------------------------------------------------------------------------
// Variables and their values

const char* to_string(SweepVar v) {
  static constexpr const char* kNames[] = {"model",           "cluster",  "device", "gpus_per_node",
                                           "scale_up_domain", "nic_gbps", "gpus"};
  return kNames[static_cast<int>(v)];
}

const char* option_of(SweepVar v) {
  static constexpr const char* kOptions[] = {"--model",           "--cluster",  "--device", "--gpus-per-node",
                                             "--scale-up-domain", "--nic-gbps", "--gpus"};
  return kOptions[static_cast<int>(v)];
}


std::optional<SweepVar> parse_sweep_var(const std::string& text) {
  for (int i = 0; i < kSweepVars; ++i) {
    const auto v = static_cast<SweepVar>(i);
    if (text == to_string(v) || text == option_of(v) || text == std::string(option_of(v)).substr(2)) return v;
  }
  return std::nullopt;
}

Result<std::vector<double>> parse_sweep_values(const std::string& text, const std::string& option, bool integer) {
  std::vector<double> out;
  auto add = [&](double v) -> Result<void> {
    if (!(v > 0)) return Err(usage(option, fmt::format("values must be positive, found {:g} in '{}'", v, text)));
    if (integer && v != std::floor(v))
      return Err(usage(option, fmt::format("values must be whole numbers, found {:g} in '{}'", v, text)));
    if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
    if (out.size() > kMaxValues)
      return Err(usage(option, fmt::format("more than {} values in '{}'", kMaxValues, text)));
    return {};
  };
  for (const std::string& item : split_commas(text)) {
    const std::size_t dash = item.find('-', 1);
    if (dash == std::string::npos) {
      auto v = number(item);
      if (!v) return Err(usage(option, fmt::format("'{}' is not a number (use N, A,B,C, A-BxK or A-B+K)", item)));
      if (auto ok = add(*v); !ok) return Err(ok.error());
      continue;
    }
    const std::string rest = item.substr(dash + 1);
    const std::size_t op = rest.find_first_of("x+");
    if (op == std::string::npos)
      return Err(usage(option, fmt::format("the range '{}' needs a step: A-BxK (times K) or A-B+K (plus K)", item)));
    const auto a = number(item.substr(0, dash));
    const auto b = number(rest.substr(0, op));
    const auto k = number(rest.substr(op + 1));
    if (!a || !b || !k) return Err(usage(option, fmt::format("'{}' is not a range A-BxK or A-B+K", item)));
    if (*b < *a) return Err(usage(option, fmt::format("the range '{}' ends before it starts", item)));
    const bool times = rest[op] == 'x';
    if (times ? !(*k > 1) : !(*k > 0))
      return Err(usage(option, fmt::format("the step of '{}' must be {}", item, times ? "> 1" : "> 0")));
    const double tolerance = 1e-9 * *b;
    for (std::size_t i = 0;; ++i) {
      const double v = times ? *a * std::pow(*k, static_cast<double>(i)) : *a + *k * static_cast<double>(i);
      if (v > *b + tolerance) break;
      if (auto ok = add(v); !ok) return Err(ok.error());
    }
  }
  return out;
}

Result<DeviceSpec> resolve_device(const std::string& name) {
  const std::vector<std::string> clusters = shipped_clusters();
  const bool is_cluster = std::find(clusters.begin(), clusters.end(), name) != clusters.end() ||
                          name.find('/') != std::string::npos || name.ends_with(".toml") ||
                          std::filesystem::is_regular_file(name);
  if (is_cluster) {
    auto c = resolve_cluster(name);
    if (!c) return Err(c.error());
    return c->device;
  }
  struct Known {
    DeviceSpec device;
    std::string cluster;
  };
  std::vector<Known> known;
  for (const std::string& c : clusters) {
    auto spec = resolve_cluster(c);
    if (!spec) continue;
    const bool seen =
        std::any_of(known.begin(), known.end(), [&](const Known& k) { return k.device.name == spec->device.name; });
    if (!seen) known.push_back({spec->device, c});
  }
  const std::string want = lower(name);
  std::vector<const Known*> hits;
  for (const Known& k : known)
    if (lower(k.device.name) == want) return k.device;
  for (const Known& k : known)
    if (lower(k.device.name).starts_with(want)) hits.push_back(&k);
  if (hits.size() == 1) return hits.front()->device;
  const bool ambiguous = !hits.empty();
  std::vector<std::string> listed;
  if (hits.empty())
    for (const Known& k : known) hits.push_back(&k);
  for (const Known* k : hits) listed.push_back(fmt::format("{} ({})", k->device.name, k->cluster));
  return Err(usage("--device",
                   fmt::format("'{}' {}: {}; give a device name, a prefix of one, a shipped cluster or a "
                               "cluster file",
                               name, ambiguous ? "is ambiguous" : "names no known device", fmt::join(listed, ", "))));
}

Result<ClusterSpec> apply_variant(const ClusterSpec& base, const ClusterVariant& v) {
  ClusterSpec c = base;
  std::string set_by;  // the options applied, for the error message
  auto note = [&](const std::string& s) { set_by += (set_by.empty() ? "" : ", ") + s; };
  if (v.device) {
    c.device = *v.device;
    note(fmt::format("--device {}", v.device->name));
  }
  if (v.gpus_per_node) {
    const int old = c.node.devices_per_node;
    const int g = *v.gpus_per_node;
    if (g < 1) return fail("cluster.node.devices", fmt::format("must be >= 1, found {} (from --gpus-per-node)", g));
    if (old > 0) {
      // Same NICs per GPU (rounded up), a node-sized NVLink domain stays node-sized, about the same devices.
      c.node.nics_per_node = (c.node.nics_per_node * g + old - 1) / old;
      if (c.scale_up_domain == 0 || (c.scale_up_domain == old && c.scale_up_domain_size <= old)) {
        c.scale_up_domain = g;
        c.scale_up_domain_used = c.scale_up_domain_size = 0;
      } else if (c.scale_up_domain_size > c.scale_up_domain) {
        // A rack-sized domain stays whole, and the job keeps using as many of its GPUs (validation checks them).
        c.scale_up_domain = c.scale_up_domain_size;
      }
      c.num_nodes = std::max(1, (c.num_nodes * old + g - 1) / g);
    }
    c.node.devices_per_node = g;
    note(fmt::format("--gpus-per-node {}", g));
  }
  if (v.scale_up_domain) {
    c.scale_up_domain = *v.scale_up_domain;
    c.scale_up_domain_used = c.scale_up_domain_size = 0;   // the swept domain is used whole
    note(fmt::format("--scale-up-domain {}", *v.scale_up_domain));
  }
  if (v.nic_gbps) {
    if (c.node.nics_per_node == 0)
      return fail("cluster.node.nics",
                  fmt::format("is 0 on cluster '{}': --nic-gbps {:g} has no NIC to set", c.name, *v.nic_gbps));
    c.node.nic_bandwidth_Bps = *v.nic_gbps * 1e9 / 8;
    note(fmt::format("--nic-gbps {:g}", *v.nic_gbps));
  }
  auto ok = validate_cluster(c);
  if (!ok) {
    Error e = ok.error();
    e.message += fmt::format(" (cluster '{}' with {})", base.name, set_by);
    return Err(e);
  }
  return ok;
}

}  // namespace megascope::cli
