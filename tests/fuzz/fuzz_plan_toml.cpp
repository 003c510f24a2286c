// libFuzzer target: a [plan] TOML file (--plan FILE.toml).
#include "harness.hpp"

using namespace megascope;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto o = fuzz::small_scenario();
  o.plan = fuzz::write_input(data, size, "plan.toml");
  o.gpus.reset();
  fuzz::load_and_check(o);
  return 0;
}
