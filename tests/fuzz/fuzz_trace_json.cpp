// libFuzzer target: a trace JSON (megascope compare SIMULATED MEASURED), read
// and compared with a simulated trace of a small step in both orders, as the
// measured and as the simulated file, with and without --force.
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "apps/compare.hpp"
#include "harness.hpp"

using namespace megascope;

namespace {

void check(const cli::Comparison& c) {
  const auto bad = [](double v) { return !std::isfinite(v) || v < 0; };
  if (bad(c.simulated_s) || bad(c.measured_s) || bad(c.mae_by_kind) || bad(c.mae_by_op) ||
      (c.step_error && !std::isfinite(*c.step_error))) {
    std::fprintf(stderr, "megascope fuzz: an accepted trace gave an impossible comparison\n");
    std::abort();
  }
  for (const auto& k : c.kinds)
    if (bad(k.simulated_s) || bad(k.measured_s) || (k.error && !std::isfinite(*k.error))) {
      std::fprintf(stderr, "megascope fuzz: an accepted trace gave an impossible error for %s\n", k.kind.c_str());
      std::abort();
    }
  cli::CompareOptions o;
  (void)cli::compare_text(c, o);
  (void)cli::compare_json(c, o).dump();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const TraceFile& ref = fuzz::reference_trace();
  const auto path = fuzz::write_input(data, size, "trace.json");
  auto t = read_trace(path);
  if (!t) return 0;
  for (const bool force : {false, true}) {
    if (auto c = cli::compare_traces(ref, *t, "simulated.json", path, force)) check(*c);
    if (auto c = cli::compare_traces(*t, ref, path, "measured.json", force)) check(*c);
  }
  return 0;
}
