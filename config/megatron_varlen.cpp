#include "config/megatron_varlen.hpp"

#include <fmt/format.h>

#include <cmath>
#include <memory>

#include "config/json_file.hpp"

namespace megascope::megatron_detail {

namespace {

// The mock variable-length dataset's configuration
// (--sft-mock-dataset-config-json / --varlen-mock-dataset-config-json):
// {"mode": "distribution", "type": "lognormal", "min_seq_len", "max_seq_len",
//  "mean_seq_len", "lognormal_sigma"}. Other modes read files Megascope does
// not see.
Result<LengthDistribution> mock_lengths(const std::string& flag, const std::string& text) {
  const std::string field = field_of(flag);
  auto j = json_detail::parse_json(text, flag, field);
  if (!j) return tl::unexpected(j.error());
  if (!j->is_object()) return fail(field, "expected a JSON object");
  const auto str = [&](const char* key) -> std::string {
    const auto it = j->find(key);
    return it != j->end() && it->is_string() ? it->template get<std::string>() : std::string();
  };
  if (str("mode") != "distribution" || str("type") != "lognormal")
    return fail(field, fmt::format("only {{\"mode\": \"distribution\", \"type\": \"lognormal\", ...}} is modelled; "
                                   "give other datasets' lengths as [training.lengths] with a histogram file, found "
                                   "mode '{}', type '{}'", str("mode"), str("type")));
  const auto num = [&](const char* key) -> Result<double> {
    const auto it = j->find(key);
    if (it == j->end() || !it->is_number())
      return fail(field, fmt::format("the lognormal distribution needs a number \"{}\"", key));
    const double v = it->template get<double>();
    if (!std::isfinite(v)) return fail(field, fmt::format("\"{}\" must be finite", key));
    return v;
  };
  LengthDistribution d;
  d.kind = LengthDistribution::Kind::lognormal;
  auto mn = num("min_seq_len"), mx = num("max_seq_len"), mean = num("mean_seq_len"), sigma = num("lognormal_sigma");
  for (const auto* r : {&mn, &mx, &mean, &sigma})
    if (!*r) return tl::unexpected(r->error());
  if (*mn < 1 || *mx < *mn || *mx > 1e12)
    return fail(field, fmt::format("needs 1 <= min_seq_len <= max_seq_len, found {} and {}", *mn, *mx));
  d.min = static_cast<std::int64_t>(*mn);
  d.max = static_cast<std::int64_t>(*mx);
  d.mean = *mean;
  d.sigma = *sigma;
  return d;
}

}  // namespace

Result<void> import_varlen(Args& args, std::int64_t seq_length, TrainingSpec& t, PlanSpec& p) {
  const std::string* scheduler = args.value("--sequence-packing-scheduler");
  const bool dynamic = args.has("--dynamic-context-parallel") || args.has("--hybrid-context-parallel");
  const char* mock_flag = args.has("--sft-mock-dataset-config-json")      ? "--sft-mock-dataset-config-json"
                          : args.has("--varlen-mock-dataset-config-json") ? "--varlen-mock-dataset-config-json"
                                                                          : nullptr;
  const bool packed = scheduler || dynamic || args.has("--sequence-packing") || args.has("--use-varlen-dataset") ||
                      args.has("--max-seqlen-per-dp-cp-rank");
  if (!packed && !mock_flag) return {};
  if (scheduler && *scheduler != "dp_balanced" && *scheduler != "default_dynamic_cp" &&
      *scheduler != "default_hybrid_cp")
    return fail("megatron.--sequence-packing-scheduler",
                fmt::format("only dp_balanced and default_dynamic_cp are modelled, found '{}'", *scheduler));
  const bool dynamic_scheduler = scheduler && *scheduler != "dp_balanced";
  if (dynamic != dynamic_scheduler && scheduler)
    return fail("megatron.--dynamic-context-parallel",
                "--dynamic-context-parallel goes with --sequence-packing-scheduler default_dynamic_cp (and "
                "dp_balanced without it)");
  if (const std::string* budget = args.value("--max-seqlen-per-dp-cp-rank")) {
    const std::int64_t want = seq_length / p.cp;
    if (*budget != std::to_string(want))
      return fail("megatron.--max-seqlen-per-dp-cp-rank",
                  fmt::format("Megascope packs seq_length / cp = {} tokens per rank (one full sequence per CP group); "
                              "found {}", want, *budget));
  }
  if (const std::string* min_cp = args.value("--min-dynamic-context-parallel-size"); min_cp && *min_cp != "1")
    return fail("megatron.--min-dynamic-context-parallel-size",
                fmt::format("only 1 (the default) is modelled, found {}", *min_cp));
  if (!mock_flag)
    return fail("megatron.--sequence-packing-scheduler",
                "the line packs variable-length sequences but their lengths come from its dataset, which Megascope "
                "does not read: give --sft-mock-dataset-config-json with a lognormal distribution, or the training's "
                "[training.lengths]");
  auto d = mock_lengths(mock_flag, *args.value(mock_flag));
  if (!d) return tl::unexpected(d.error());
  auto v = std::make_shared<VarlenSpec>();
  v->lengths = std::move(*d);
  v->packing = packed ? Packing::pack : Packing::pad;
  t.varlen = std::move(v);
  p.dynamic_cp = dynamic;
  return {};
}

std::vector<std::string> export_varlen(const Setup& s) {
  std::vector<std::string> a;
  const VarlenSpec* v = s.training.varlen.get();
  if (!v || v->packing != Packing::pack) return a;
  a.push_back(fmt::format("--sequence-packing-scheduler {}", s.plan.dynamic_cp ? "default_dynamic_cp" : "dp_balanced"));
  if (s.plan.dynamic_cp) a.emplace_back("--dynamic-context-parallel");
  a.push_back(fmt::format("--max-seqlen-per-dp-cp-rank {}", s.seq_length / s.plan.cp));
  return a;
}

}  // namespace megascope::megatron_detail
