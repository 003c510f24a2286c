// Cost profile files (docs/cost-model.md): the shipped defaults under
// topologies/profiles/ and the calibration files of `megascope calibrate`
// share one format. Every key is optional; a file sets what it names and the
// rest comes from the profile it is laid over. Unknown tables or keys, wrong
// types and out-of-range values are errors naming file, line and column.
#include <fmt/format.h>

#include <array>
#include <limits>
#include <map>
#include <memory>
#include <string_view>

#include "config/toml_reader.hpp"
#include "sim/cost_model.hpp"

namespace megascope::sim {

namespace {

using Shared = std::shared_ptr<std::optional<Error>>;

constexpr std::array<std::string_view, 7> kTables = {"profile", "gemm", "memory", "attention", "launch", "passes", "interference"};

struct MemoryKey {
  MemoryOp op;
  const char* key;
};
constexpr std::array<MemoryKey, 7> kMemoryKeys = {{{MemoryOp::norm, "norm_GBps"},
                                                   {MemoryOp::activation, "activation_GBps"},
                                                   {MemoryOp::dropout_residual, "dropout_residual_GBps"},
                                                   {MemoryOp::embedding, "embedding_GBps"},
                                                   {MemoryOp::cross_entropy, "cross_entropy_GBps"},
                                                   {MemoryOp::optimizer, "optimizer_GBps"},
                                                   {MemoryOp::other, "other_GBps"}}};

std::string memory_kind_name(MemoryOp op) {
  for (const auto& mk : kMemoryKeys)
    if (mk.op == op) {
      const std::string_view k(mk.key);
      return std::string(k.substr(0, k.size() - 5));
    }
  return "other";
}

std::optional<Precision> parse_dtype(std::string_view s) {
  if (s == "bf16") return Precision::bf16;
  if (s == "fp8") return Precision::fp8;
  return std::nullopt;
}

// A number with a range check; absent -> nullopt.
std::optional<double> number_in(TomlReader& r, std::string_view key, double lo, bool lo_open, double hi,
                                const char* rule) {
  auto v = r.opt_number(key);
  if (!v) return std::nullopt;
  const bool ok = (lo_open ? *v > lo : *v >= lo) && *v <= hi;
  if (!ok) {
    r.fail_at(key, fmt::format("must be {}, found {}", rule, *v));
    return std::nullopt;
  }
  return v;
}

// A share of a peak: from 1e-6 (no kernel runs slower than a millionth of
// its peak; 5e-324 priced an infinite step) to 1.
std::optional<double> fraction(TomlReader& r, std::string_view key) {
  return number_in(r, key, 1e-6, false, 1, "in [1e-6, 1]");
}

std::optional<double> positive(TomlReader& r, std::string_view key) {
  return number_in(r, key, 0, true, std::numeric_limits<double>::max(), "positive");
}

std::optional<double> non_negative(TomlReader& r, std::string_view key) {
  return number_in(r, key, 0, false, std::numeric_limits<double>::max(), "zero or more");
}

std::optional<int> int_in(TomlReader& r, std::string_view key, std::int64_t lo, std::int64_t hi) {
  auto v = r.opt_integer(key);
  if (!v) return std::nullopt;
  if (*v < lo || *v > hi) {
    r.fail_at(key, fmt::format("must be an integer from {} to {}, found {}", lo, hi, *v));
    return std::nullopt;
  }
  return static_cast<int>(*v);
}

// A top-level table by name; a key of another type is an error.
std::optional<TomlReader> section(const toml::table& root, std::string_view name, const std::string& file,
                                  const Shared& first) {
  const toml::node* n = root.get(name);
  if (!n) return std::nullopt;
  if (const toml::table* t = n->as_table()) return TomlReader(*t, std::string(name), file, first);
  if (!first->has_value())
    *first = Error{fmt::format("expected a table [{}]", name), std::string(name), location_of(*n, file)};
  return std::nullopt;
}

// Calls f(reader, node) on each entry of an array of tables ([[name]]) until
// f returns false; an entry that is not a table is an error.
template <class F>
void each_entry(TomlReader& r, const toml::array& list, const char* name, const char* keys, const std::string& file,
                const Shared& first, F f) {
  for (std::size_t i = 0; i < list.size(); ++i) {
    const toml::node& node = *list.get(i);
    const toml::table* t = node.as_table();
    if (!t) {
      r.fail_at_node(node, "measured", fmt::format("each entry must be a table {{{}}} ([[{}]])", keys, name));
      return;
    }
    TomlReader e(*t, fmt::format("{}[{}]", name, i), file, first);
    if (!f(e, node)) return;
  }
}

// An entry's `seconds`: required, positive.
double seconds_of(TomlReader& e) {
  const double seconds = e.number("seconds");
  if (e.ok() && !(seconds > 0)) e.fail_at("seconds", fmt::format("must be positive, found {}", seconds));
  return seconds;
}

void read_measured(TomlReader& g, const toml::array& list, const std::string& file, const Shared& first,
                   CostProfile& out) {
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t, int>, double> seen;
  each_entry(g, list, "gemm.measured", "m, n, k, dtype, seconds", file, first, [&](TomlReader& e, const toml::node& node) {
    std::int64_t dims[3] = {0, 0, 0};
    const char* names[3] = {"m", "n", "k"};
    for (int d = 0; d < 3; ++d) {
      dims[d] = e.integer(names[d]);
      if (e.ok() && dims[d] < 1) e.fail_at(names[d], fmt::format("must be 1 or more, found {}", dims[d]));
    }
    const Precision dtype = e.choice<Precision>("dtype", parse_dtype, "\"bf16\", \"fp8\"", Precision::bf16);
    const double seconds = seconds_of(e);
    if (e.finish()) return false;
    const auto key = std::make_tuple(dims[0], dims[1], dims[2], static_cast<int>(dtype));
    if (seen.count(key)) {
      e.fail_at_node(node, "m",
                     fmt::format("shape {}x{}x{} {} is measured twice", dims[0], dims[1], dims[2],
                                 dtype == Precision::fp8 ? "fp8" : "bf16"));
      return false;
    }
    seen[key] = seconds;
    return true;
  });
  for (const auto& [key, seconds] : seen) out.gemm_seconds[key] = seconds;
}

std::optional<MemoryOp> parse_memory_kind(std::string_view s) {
  for (const auto& mk : kMemoryKeys)
    if (std::string_view(mk.key) == std::string(s) + "_GBps") return mk.op;
  return std::nullopt;
}

// [[memory.measured]]: {kind, bytes, seconds}, bytes as the Program counts them.
void read_memory_measured(TomlReader& r, const toml::array& list, const std::string& file, const Shared& first,
                          CostProfile& out) {
  std::map<std::pair<MemoryOp, std::int64_t>, double> seen;
  each_entry(r, list, "memory.measured", "kind, bytes, seconds", file, first, [&](TomlReader& e, const toml::node& node) {
    const MemoryOp kind = e.choice<MemoryOp>(
        "kind", parse_memory_kind,
        "\"norm\", \"activation\", \"dropout_residual\", \"embedding\", \"cross_entropy\", \"optimizer\", \"other\"",
        MemoryOp::other);
    const std::int64_t bytes = e.integer("bytes");
    if (e.ok() && bytes < 1) e.fail_at("bytes", fmt::format("must be 1 or more, found {}", bytes));
    const double seconds = seconds_of(e);
    if (e.finish()) return false;
    if (seen.count({kind, bytes})) {
      e.fail_at_node(node, "bytes", fmt::format("a {} kernel of {} bytes is measured twice", memory_kind_name(kind), bytes));
      return false;
    }
    seen[{kind, bytes}] = seconds;
    return true;
  });
  for (const auto& [key, seconds] : seen) out.memory_seconds[key] = seconds;
}

// Lays the file's keys over `base`; on error `base` is untouched.
Result<CostProfile> overlay(const std::string& path, const CostProfile& base) {
  auto doc = parse_toml_file(path);
  if (!doc) return tl::unexpected(doc.error());
  for (auto&& [k, node] : *doc) {
    bool known = false;
    for (auto name : kTables) known = known || k.str() == name;
    if (!known) {
      SourceLocation loc{path, std::nullopt, std::nullopt};
      if (k.source().begin.line > 0) {
        loc.line = static_cast<int>(k.source().begin.line);
        loc.column = static_cast<int>(k.source().begin.column);
      }
      return tl::unexpected(Error{"unknown table (expected [profile], [gemm], [memory], [attention], [launch], [passes], [interference])",
                                  std::string(k.str()), loc});
    }
  }
  const Shared first = std::make_shared<std::optional<Error>>();
  CostProfile out = base;

  if (auto r = section(*doc, "profile", path, first)) {
    if (auto v = r->opt_string("device")) out.device = *v;
    if (auto v = r->opt_string("source")) out.source = *v;
    if (auto v = r->opt_string("date")) out.date = *v;
    if (auto v = fraction(*r, "sustained_clock")) out.sustained_clock = *v;
    if (auto e = r->finish()) return tl::unexpected(*e);
  }
  if (auto r = section(*doc, "gemm", path, first)) {
    if (auto v = fraction(*r, "max_efficiency")) out.gemm_max_efficiency = *v;
    if (auto v = non_negative(*r, "half_size")) out.gemm_half_size = *v;
    if (auto v = fraction(*r, "fp8_max_efficiency")) out.gemm_fp8_max_efficiency = *v;
    if (auto v = non_negative(*r, "fp8_half_size")) out.gemm_fp8_half_size = *v;
    if (auto v = int_in(*r, "tile_m", 1, 4096)) out.tile_m = *v;
    if (auto v = int_in(*r, "tile_n", 1, 4096)) out.tile_n = *v;
    if (auto v = int_in(*r, "sms", 0, 1 << 20)) out.sms = *v;
    if (auto v = number_in(*r, "roofline_exponent", 1, false, 64, "from 1 to 64")) out.gemm_roofline_exponent = *v;
    if (const toml::array* list = r->opt_array("measured")) read_measured(*r, *list, path, first, out);
    if (auto e = r->finish()) return tl::unexpected(*e);
  }
  if (auto r = section(*doc, "memory", path, first)) {
    if (auto v = fraction(*r, "efficiency")) out.memory_efficiency = *v;
    for (const auto& mk : kMemoryKeys) {
      const std::string bwd_key = std::string(mk.key).insert(std::string_view(mk.key).size() - 5, "_bwd");
      const auto fwd = positive(*r, mk.key), bwd = positive(*r, bwd_key);
      if (fwd) out.memory_Bps[mk.op] = *fwd * 1e9;
      // A file that sets a kind's bandwidth without a backward one prices both
      // directions with it, whatever a profile under it said of the backward.
      if (bwd)
        out.memory_bwd_Bps[mk.op] = *bwd * 1e9;
      else if (fwd)
        out.memory_bwd_Bps.erase(mk.op);
    }
    if (const toml::array* list = r->opt_array("measured")) read_memory_measured(*r, *list, path, first, out);
    if (auto e = r->finish()) return tl::unexpected(*e);
  }
  if (auto r = section(*doc, "attention", path, first)) {
    if (auto v = fraction(*r, "fwd_efficiency")) out.attention_fwd_efficiency = *v;
    if (auto v = fraction(*r, "bwd_efficiency")) out.attention_bwd_efficiency = *v;
    if (auto v = non_negative(*r, "fwd_half_flops")) out.attention_fwd_half_flops = *v;
    if (auto v = non_negative(*r, "bwd_half_flops")) out.attention_bwd_half_flops = *v;
    if (auto v = fraction(*r, "unfused_efficiency")) out.attention_unfused_efficiency = *v;
    if (auto v = fraction(*r, "fwd_dropout_factor")) out.attention_fwd_dropout_factor = *v;
    if (auto v = fraction(*r, "bwd_dropout_factor")) out.attention_bwd_dropout_factor = *v;
    if (auto v = number_in(*r, "exp_share", 0, false, 1, "in [0, 1]")) out.attention_exp_share = *v;
    if (auto v = int_in(*r, "ref_head_dim", 1, 1 << 16)) out.attention_ref_head_dim = *v;
    if (auto e = r->finish()) return tl::unexpected(*e);
  }
  if (auto r = section(*doc, "launch", path, first)) {
    if (auto v = non_negative(*r, "overhead_us")) out.launch_overhead_s = *v * 1e-6;
    if (auto v = non_negative(*r, "op_overhead_us")) out.op_overhead_s = *v * 1e-6;
    if (auto v = non_negative(*r, "host_us")) out.host_launch_s = *v * 1e-6;
    if (auto e = r->finish()) return tl::unexpected(*e);
  }
  if (auto r = section(*doc, "passes", path, first)) {
    if (auto v = fraction(*r, "forward_efficiency")) out.forward_efficiency = *v;
    if (auto e = r->finish()) return tl::unexpected(*e);
  }
  if (auto r = section(*doc, "interference", path, first)) {
    if (auto v = int_in(*r, "comm_sms", 0, 4096)) out.comm_sms = *v;
    if (auto e = r->finish()) return tl::unexpected(*e);
  }
  if (first->has_value()) return tl::unexpected(**first);
  return out;
}

}  // namespace

Result<CostProfile> load_cost_profile(const std::string& path) { return overlay(path, CostProfile{}); }

Result<void> CostModel::apply_calibration(const std::string& path) {
  auto p = overlay(path, profile_);
  if (!p) return tl::unexpected(p.error());
  const std::string calibrated = p->source != profile_.source ? p->source : std::string("calibration");
  p->source = fmt::format("{} (calibration file {}); other entries: {}", calibrated, path, profile_.source);
  profile_ = std::move(*p);
  return {};
}

}  // namespace megascope::sim
