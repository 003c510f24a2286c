// libFuzzer target: a model TOML file (--model FILE.toml) on a small cluster.
#include "harness.hpp"

using namespace megascope;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto o = fuzz::small_scenario();
  o.model = fuzz::write_input(data, size, "model.toml");
  fuzz::load_and_check(o);
  return 0;
}
