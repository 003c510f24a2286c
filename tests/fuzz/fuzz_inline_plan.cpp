// libFuzzer target: an inline plan (--plan tp=2,pp=2,...).
#include "harness.hpp"

using namespace megascope;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto o = fuzz::small_scenario();
  o.plan = fuzz::as_text(data, size);
  if (o.plan->find(".toml") != std::string::npos) return 0;  // a file name, not a plan
  o.gpus.reset();
  fuzz::load_and_check(o);
  return 0;
}
