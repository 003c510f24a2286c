#include "core/trace.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace megascope {

const char* to_string(TraceSource s) { return s == TraceSource::simulated ? "simulated" : "measured"; }

namespace {

std::string json_int(std::optional<std::int32_t> v) { return v ? std::to_string(*v) : "null"; }

std::string json_escaped(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<int>(c));
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

Result<void> write_trace(const std::string& path, const Program& p, const TraceInfo& info,
                         const std::vector<int>& ranks, const std::vector<Span>& spans) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return fail("--trace", fmt::format("cannot write {}: {}", path, std::strerror(errno)));
  std::string buf;
  buf.reserve(1 << 20);
  auto flush = [&] {
    std::fwrite(buf.data(), 1, buf.size(), f);
    buf.clear();
  };
  buf += fmt::format(
      "{{\"displayTimeUnit\":\"ms\",\n\"megascope\":{{\"format\":1,\"source\":\"{}\",\"step_time_s\":{:.9g},"
      "\"plan\":\"{}\",\"model\":\"{}\",\"world\":{}}},\n\"traceEvents\":[\n",
      to_string(info.source), info.step_time_s, json_escaped(info.plan), json_escaped(info.model), info.world);
  bool first = true;
  for (int rank : ranks) {
    const int stage = p.grid.coord(rank).pp;
    buf += fmt::format("{}{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{},\"args\":{{\"name\":\"rank {} (stage {})\"}}}}",
                       first ? "" : ",\n", rank, rank, stage);
    buf += fmt::format(",\n{{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":{},\"args\":{{\"sort_index\":{}}}}}", rank, rank);
    first = false;
    for (int s = 0; s < kStreamCount; ++s)
      buf += fmt::format(",\n{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{},\"tid\":{},\"args\":{{\"name\":\"{}\"}}}}", rank,
                         s, to_string(static_cast<Stream>(s)));
  }
  std::vector<char> traced(static_cast<std::size_t>(p.grid.world()), 0);
  for (int r : ranks)
    if (r >= 0 && r < p.grid.world()) traced[static_cast<std::size_t>(r)] = 1;
  for (const Span& sp : spans) {
    if (sp.rank < 0 || sp.rank >= p.grid.world() || !traced[static_cast<std::size_t>(sp.rank)]) continue;
    const StageProgram& stage = p.of_rank(sp.rank);
    const Op& op = stage.ops.at(sp.op);
    std::string name = op.kind == OpKind::compute ? fmt::format("{} {}", to_string(op.phase), to_string(op.label))
                                                  : fmt::format("{} {}", to_string(op.label), to_string(op.kind));
    if (op.kind == OpKind::compute && std::strcmp(to_string(op.phase), to_string(op.label)) == 0)
      name = to_string(op.label);   // "optimizer", not "optimizer optimizer"
    if (op.span == CommSpan::rails) name += " (rails)";   // the flex dispatcher's hops
    if (op.span == CommSpan::domain) name += " (domain)";
    if (op.microbatch) name += fmt::format(" mb{}", *op.microbatch);
    // Start and end rounded to the nanosecond, the duration their difference:
    // a span that ends where the next starts does not overlap it after rounding.
    const double ts = std::round(sp.start * 1e9) / 1e3, end = std::round(sp.end * 1e9) / 1e3;
    buf += fmt::format(",\n{{\"ph\":\"X\",\"pid\":{},\"tid\":{},\"ts\":{:.3f},\"dur\":{:.3f},\"name\":\"{}\",\"cat\":\"{}\","
                       "\"args\":{{\"op\":{},\"phase\":\"{}\",\"microbatch\":{},\"chunk\":{},\"layer\":{},\"bytes\":{:.0f},"
                       "\"flops\":{:.4g}}}}}",
                       sp.rank, static_cast<int>(op.stream), ts, end - ts, name,
                       to_string(op.label), sp.op, to_string(op.phase), json_int(op.microbatch), json_int(op.chunk),
                       json_int(op.layer), op.bytes, op.flops);
    if (buf.size() > (1 << 20)) flush();
  }
  buf += "\n]}\n";
  flush();
  if (std::fclose(f) != 0) return fail("--trace", fmt::format("cannot write {}: {}", path, std::strerror(errno)));
  return {};
}

}  // namespace megascope
