#include "config/trace_file.hpp"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "config/input_file.hpp"
#include "config/json_file.hpp"

namespace megascope {

namespace {

std::optional<int> opt_int(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  return it->get<int>();
}

}  // namespace

Result<TraceFile> read_trace(const std::string& path) {
  if (auto ok = check_input_file(path, "trace", "trace"); !ok) return tl::unexpected(ok.error());
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail("trace", fmt::format("{}: cannot open the trace file", path));
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (json_detail::over_deep_json(text, json_detail::kMaxJsonDepth))
    return fail("trace", fmt::format("{}: JSON nested more than {} levels deep is refused", path, json_detail::kMaxJsonDepth));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {   // malformed, or a number out of double's range
    return fail("trace", fmt::format("{}: not JSON: {}", path, e.what()));
  }
  if (!j.is_object() || !j.contains("traceEvents") || !j["traceEvents"].is_array())
    return fail("trace", fmt::format("{}: not a Chrome trace (no traceEvents array)", path));
  TraceFile t;
  auto meta = j.find("megascope");
  if (meta == j.end() || !meta->is_object())
    return fail("trace", fmt::format("{}: not a Megascope trace (no \"megascope\" object; write it with "
                                     "`megascope simulate --trace` or `megascope run --trace`)", path));
  try {
    const std::string source = meta->value("source", "");
    if (source == "simulated") t.info.source = TraceSource::simulated;
    else if (source == "measured") t.info.source = TraceSource::measured;
    else return fail("trace", fmt::format("{}: megascope.source is \"{}\", expected simulated or measured", path, source));
    t.info.step_time_s = meta->at("step_time_s").get<double>();
    t.info.plan = meta->value("plan", "");
    t.info.model = meta->value("model", "");
    t.info.world = meta->value("world", 0);
  } catch (const nlohmann::json::exception& e) {
    return fail("trace", fmt::format("{}: megascope object: {}", path, e.what()));
  }
  std::size_t index = 0;
  for (const auto& e : j["traceEvents"]) {
    try {
      const std::string ph = e.value("ph", "");
      if (ph == "M" && e.value("name", "") == "process_name") {
        t.ranks.push_back(e.at("pid").get<int>());
      } else if (ph == "X" && e.contains("args") && e["args"].contains("op")) {
        const auto& a = e["args"];
        TraceRecord r;
        r.rank = e.at("pid").get<int>();
        r.stream = e.at("tid").get<int>();
        r.op = a.at("op").get<std::uint32_t>();
        const double ts = e.at("ts").get<double>(), dur = e.at("dur").get<double>();
        // A span starts at a finite time and lasts a finite time >= 0 (in microseconds).
        if (!std::isfinite(ts) || !(dur >= 0) || !std::isfinite(dur))
          return fail("trace", fmt::format("{}: traceEvents[{}]: ts {} and dur {}: a span needs a finite start and a "
                                           "finite duration >= 0",
                                           path, index, ts, dur));
        r.start_s = ts * 1e-6;
        r.end_s = r.start_s + dur * 1e-6;
        r.name = e.value("name", "");
        r.label = e.value("cat", "");
        r.phase = a.value("phase", "");
        r.microbatch = opt_int(a, "microbatch");
        r.chunk = opt_int(a, "chunk");
        r.layer = opt_int(a, "layer");
        r.bytes = a.value("bytes", 0.0);
        r.flops = a.value("flops", 0.0);
        t.spans.push_back(std::move(r));
      }
    } catch (const nlohmann::json::exception& ex) {
      return fail("trace", fmt::format("{}: traceEvents[{}]: {}", path, index, ex.what()));
    }
    ++index;
  }
  return t;
}

}  // namespace megascope
