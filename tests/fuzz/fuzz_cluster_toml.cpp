// libFuzzer target: a cluster TOML file (--cluster FILE.toml) under a small model.
#include "harness.hpp"

using namespace megascope;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto o = fuzz::small_scenario();
  o.cluster = fuzz::write_input(data, size, "cluster.toml");
  o.gpus.reset();
  fuzz::load_and_check(o);
  return 0;
}
