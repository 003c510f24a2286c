// libFuzzer target: a Megatron-LM launch line (--megatron-args "..."), which gives the model, plan and batch.
#include "harness.hpp"

using namespace megascope;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  cli::ScenarioOptions o;
  o.megatron_args = fuzz::as_text(data, size);
  o.cluster = "dgx-a100";
  fuzz::load_and_check(o);
  return 0;
}
