#include "apps/compare.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <set>
#include <unordered_map>

namespace megascope::cli {

namespace {

using Err = tl::unexpected<Error>;

Error problem(std::string message) { return Error{std::move(message), "", std::nullopt}; }

std::uint64_t key(int rank, std::uint32_t op) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(rank)) << 32) | op;
}

// "0, 2, 4, 6" or "0, 1, 2, 3, 4, 5, ... (16 ranks)".
std::string rank_list(const std::vector<int>& ranks) {
  std::vector<std::string> s;
  for (std::size_t i = 0; i < ranks.size() && i < 8; ++i) s.push_back(std::to_string(ranks[i]));
  std::string out = fmt::format("{}", fmt::join(s, ", "));
  if (ranks.size() > 8) out += fmt::format(", ... ({} ranks)", ranks.size());
  return out;
}

std::optional<double> rel(double a, double b) {
  if (!(b > 0)) return std::nullopt;
  return (a - b) / b;
}

std::string pct(const std::optional<double>& e) { return e ? fmt::format("{:+.1f}%", 100 * *e) : std::string("-"); }

// Spans of one file by (rank, op); a repeated pair is a malformed file.
Result<std::unordered_map<std::uint64_t, std::size_t>> index_of(const TraceFile& t, const std::string& name) {
  std::unordered_map<std::uint64_t, std::size_t> at;
  at.reserve(t.spans.size());
  for (std::size_t i = 0; i < t.spans.size(); ++i) {
    const TraceRecord& r = t.spans[i];
    if (!(r.end_s >= r.start_s))
      return Err(problem(fmt::format("{}: rank {} op {} ends before it starts", name, r.rank, r.op)));
    if (!at.emplace(key(r.rank, r.op), i).second)
      return Err(problem(fmt::format("{}: rank {} op {} appears twice", name, r.rank, r.op)));
  }
  return at;
}

}  // namespace

std::string op_kind(const TraceRecord& r) {
  // The trace names ops "F mlp mb3" (compute: phase, label) or "tp all-gather mb3" (communication: label, kind).
  std::string n = r.name.empty() ? r.phase + " " + r.label : r.name;
  const std::size_t mb = n.rfind(" mb");
  if (mb != std::string::npos && mb + 3 < n.size() &&
      std::all_of(n.begin() + static_cast<std::ptrdiff_t>(mb + 3), n.end(),
                  [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
    n.erase(mb);
  if (n == r.phase + " " + r.label) {
    static const std::map<std::string, std::string> kLong = {
        {"F", "forward"}, {"B", "backward_input"}, {"W", "backward_weight"}, {"R", "recompute"}};
    auto it = kLong.find(r.phase);
    if (it != kLong.end())
      n = it->second + " " + r.label;
    else if (r.phase == r.label)
      n = r.label;  // "optimizer optimizer"
  }
  return n;
}

Result<Comparison> compare_traces(const TraceFile& a, const TraceFile& b, const std::string& a_name,
                                  const std::string& b_name, bool force) {
  Comparison c;
  c.simulated = a.info;
  c.measured = b.info;
  if (!force) {
    for (auto [what, x, y] : {std::tuple<const char*, std::string, std::string>{"models", a.info.model, b.info.model},
                              {"plans", a.info.plan, b.info.plan},
                              {"world sizes", std::to_string(a.info.world), std::to_string(b.info.world)}})
      if (x != y)
        return Err(
            problem(fmt::format("{} and {} are traces of different {}: '{}' and '{}' (--force compares them anyway)",
                                a_name, b_name, what, x, y)));
  }
  auto ia = index_of(a, a_name);
  if (!ia) return Err(ia.error());
  auto ib = index_of(b, b_name);
  if (!ib) return Err(ib.error());
  c.step_error = rel(a.info.step_time_s, b.info.step_time_s);
  if (a.info.source == TraceSource::measured && b.info.source == TraceSource::simulated)
    c.notes.push_back(
        fmt::format("{} is measured and {} simulated: errors are of the first against the second; swap "
                    "the files for the usual sign",
                    a_name, b_name));

  std::set<int> ranks_a, ranks_b;
  for (const TraceRecord& r : a.spans) ranks_a.insert(r.rank);
  for (const TraceRecord& r : b.spans) ranks_b.insert(r.rank);
  for (int r : ranks_a)
    if (ranks_b.count(r)) c.matched_ranks.push_back(r);

  std::map<std::string, KindError> kinds;
  double abs_op = 0;
  std::size_t first_differing = a.spans.size();
  for (std::size_t i = 0; i < a.spans.size(); ++i) {
    const TraceRecord& ra = a.spans[i];
    auto it = ib->find(key(ra.rank, ra.op));
    if (it == ib->end()) continue;
    const TraceRecord& rb = b.spans[it->second];
    const std::string kind = op_kind(ra);
    if (kind != op_kind(rb) || ra.stream != rb.stream) {
      if (!force)
        return Err(
            problem(fmt::format("{} and {} disagree on rank {} op {}: '{}' and '{}': not the same program "
                                "(--force compares the ops that agree)",
                                a_name, b_name, ra.rank, ra.op, kind, op_kind(rb))));
      ++c.differing;
      first_differing = std::min(first_differing, i);
      continue;
    }
    const double sa = ra.end_s - ra.start_s, sb = rb.end_s - rb.start_s;
    KindError& k = kinds[kind];
    k.kind = kind;
    ++k.count;
    k.simulated_s += sa;
    k.measured_s += sb;
    c.simulated_s += sa;
    c.measured_s += sb;
    abs_op += std::abs(sa - sb);
    ++c.matched_spans;
  }
  c.only_simulated = a.spans.size() - c.matched_spans;
  c.only_measured = b.spans.size() - c.matched_spans;

  double abs_kind = 0;
  for (auto& [name, k] : kinds) {
    k.error = rel(k.simulated_s, k.measured_s);
    abs_kind += std::abs(k.simulated_s - k.measured_s);
    c.kinds.push_back(k);
  }
  std::stable_sort(c.kinds.begin(), c.kinds.end(),
                   [](const KindError& x, const KindError& y) { return x.measured_s > y.measured_s; });
  c.mae_by_kind = c.measured_s > 0 ? abs_kind / c.measured_s : 0;
  c.mae_by_op = c.measured_s > 0 ? abs_op / c.measured_s : 0;

  // Why spans went unmatched.
  auto only_on = [](const std::set<int>& mine, const std::set<int>& other) {
    std::vector<int> out;
    for (int r : mine)
      if (!other.count(r)) out.push_back(r);
    return out;
  };
  auto count_on = [](const TraceFile& t, const std::vector<int>& ranks) {
    std::size_t n = 0;
    for (const TraceRecord& r : t.spans) n += std::binary_search(ranks.begin(), ranks.end(), r.rank) ? 1 : 0;
    return n;
  };
  for (auto [t, name, other_name, mine, other] :
       {std::tuple<const TraceFile*, const std::string*, const std::string*, const std::set<int>*,
                   const std::set<int>*>{&a, &a_name, &b_name, &ranks_a, &ranks_b},
        {&b, &b_name, &a_name, &ranks_b, &ranks_a}}) {
    const std::vector<int> alone = only_on(*mine, *other);
    const std::size_t on_alone = count_on(*t, alone);
    const std::size_t unmatched = (t == &a ? c.only_simulated : c.only_measured) - c.differing;
    if (!alone.empty())
      c.notes.push_back(fmt::format("{} spans of {} are on ranks {} that {} does not trace{}", on_alone, *name,
                                    rank_list(alone), *other_name,
                                    t->info.source == TraceSource::measured
                                        ? " (a reduced simulation traces one rank per pipeline stage; simulate with "
                                          "--mode full to trace every rank)"
                                        : ""));
    if (unmatched > on_alone)
      c.notes.push_back(fmt::format("{} spans of {} on ranks traced in both have no op of the same index in {}",
                                    unmatched - on_alone, *name, *other_name));
  }
  if (c.differing > 0) {
    const TraceRecord& r = a.spans[first_differing];
    c.notes.push_back(fmt::format("{} ops differ between the files (first: rank {} op {}, '{}'); they are left out",
                                  c.differing, r.rank, r.op, op_kind(r)));
  }
  if (c.matched_spans == 0) c.notes.push_back("no span matched: the errors by op kind are empty");
  return c;
}

nlohmann::json compare_json(const Comparison& c, const CompareOptions& o) {
  auto info = [](const TraceInfo& t, const std::string& file) {
    return nlohmann::json{{"file", file},
                          {"source", to_string(t.source)},
                          {"step_time_s", t.step_time_s},
                          {"model", t.model},
                          {"plan", t.plan},
                          {"world", t.world}};
  };
  auto opt = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
  nlohmann::json kinds = nlohmann::json::array();
  for (const KindError& k : c.kinds)
    kinds.push_back({{"kind", k.kind},
                     {"count", k.count},
                     {"simulated_s", k.simulated_s},
                     {"measured_s", k.measured_s},
                     {"error", opt(k.error)}});
  return {{"simulated", info(c.simulated, o.simulated)},
          {"measured", info(c.measured, o.measured)},
          {"step_time",
           {{"simulated_s", c.simulated.step_time_s},
            {"measured_s", c.measured.step_time_s},
            {"error", opt(c.step_error)}}},
          {"matched",
           {{"ranks", c.matched_ranks},
            {"spans", c.matched_spans},
            {"simulated_s", c.simulated_s},
            {"measured_s", c.measured_s},
            {"error", opt(rel(c.simulated_s, c.measured_s))}}},
          {"kinds", kinds},
          {"mean_abs_error_by_kind", c.mae_by_kind},
          {"mean_abs_error_by_op", c.mae_by_op},
          {"unmatched",
           {{"simulated_spans", c.only_simulated},
            {"measured_spans", c.only_measured},
            {"differing_ops", c.differing},
            {"notes", c.notes}}},
          {"error_definition", "(simulated - measured) / measured"}};
}

std::string compare_text(const Comparison& c, const CompareOptions& o) {
  // Columns are named by the files' sources, or "first" and "second" when both say the same.
  const bool same = c.simulated.source == c.measured.source;
  const std::string a = same ? "first" : to_string(c.simulated.source);
  const std::string b = same ? "second" : to_string(c.measured.source);
  std::string t;
  t += fmt::format("megascope compare: {} ({}) against {} ({})\n", o.simulated, to_string(c.simulated.source),
                   o.measured, to_string(c.measured.source));
  t += fmt::format("  model      {}\n  plan       {}\n  world      {} ranks\n", c.simulated.model, c.simulated.plan,
                   c.simulated.world);
  if (c.measured.model != c.simulated.model || c.measured.plan != c.simulated.plan ||
      c.measured.world != c.simulated.world)
    t += fmt::format("  {:<10} {}, {}, {} ranks (compared with --force)\n", "(" + b + ")", c.measured.model,
                     c.measured.plan, c.measured.world);
  t += fmt::format("  step time  {:.4f} s {}, {:.4f} s {}: error {}\n", c.simulated.step_time_s, a,
                   c.measured.step_time_s, b, pct(c.step_error));
  t += fmt::format("  matched    {} spans on {} rank{} ({})\n", c.matched_spans, c.matched_ranks.size(),
                   c.matched_ranks.size() == 1 ? "" : "s", rank_list(c.matched_ranks));
  t += fmt::format("  op time    {:.4f} s {}, {:.4f} s {} (summed over matched spans): error {}\n", c.simulated_s, a,
                   c.measured_s, b, pct(rel(c.simulated_s, c.measured_s)));
  t += fmt::format("  mean absolute error, weighted by {} time: {:.1f}% over op kinds, {:.1f}% over ops\n", b,
                   100 * c.mae_by_kind, 100 * c.mae_by_op);
  t += "\n";
  std::size_t w = 7;
  for (const KindError& k : c.kinds) w = std::max(w, k.kind.size());
  t += fmt::format("  {:<{}} {:>8} {:>12} {:>12} {:>8}\n", "op kind", w, "spans", a + " s", b + " s", "error");
  for (const KindError& k : c.kinds)
    t += fmt::format("  {:<{}} {:>8} {:>12.6f} {:>12.6f} {:>8}\n", k.kind, w, k.count, k.simulated_s, k.measured_s,
                     pct(k.error));
  t += fmt::format("\n  error = ({} - {}) / {}\n", a, b, b);
  if (c.only_simulated || c.only_measured)
    t += fmt::format("  not matched: {} spans of {}, {} spans of {}\n", c.only_simulated, o.simulated, c.only_measured,
                     o.measured);
  for (const std::string& n : c.notes) t += "  note: " + n + "\n";
  return t;
}

void add_compare_options(CLI::App& cmd, CompareOptions& o) {
  cmd.add_option("simulated", o.simulated, "trace of the simulated iteration (megascope simulate --trace)")->required();
  cmd.add_option("measured", o.measured, "trace of the measured iteration (megascope run --trace)")->required();
  cmd.add_flag("--json", o.json, "print one JSON object");
  cmd.add_flag("--force", o.force, "compare traces of different plans, models or world sizes, and the ops that agree");
}

int run_compare(const CompareOptions& o, std::ostream& out, std::ostream& err) {
  auto a = read_trace(o.simulated);
  if (!a) {
    err << "megascope compare: error: " << a.error().str() << "\n";
    return 1;
  }
  auto b = read_trace(o.measured);
  if (!b) {
    err << "megascope compare: error: " << b.error().str() << "\n";
    return 1;
  }
  auto c = compare_traces(*a, *b, o.simulated, o.measured, o.force);
  if (!c) {
    err << "megascope compare: error: " << c.error().str() << "\n";
    return 1;
  }
  if (o.json)
    out << compare_json(*c, o).dump(2) << "\n";
  else
    out << compare_text(*c, o);
  return 0;
}

}  // namespace megascope::cli
