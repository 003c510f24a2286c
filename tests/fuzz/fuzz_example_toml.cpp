// libFuzzer target: an [example] TOML file (--example FILE.toml), which names its model and cluster.
#include "harness.hpp"

using namespace megascope;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  cli::ScenarioOptions o;
  o.example = fuzz::write_input(data, size, "example.toml");
  fuzz::load_and_check(o);
  return 0;
}
