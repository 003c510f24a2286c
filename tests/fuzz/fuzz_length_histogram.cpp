// libFuzzer target: a sequence-length histogram ([training.lengths] file = ...)
// for packed variable-length training of a small model with context parallelism.
#include <string>

#include "harness.hpp"

using namespace megascope;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto o = fuzz::small_scenario();
  const std::string lengths = fuzz::write_input(data, size, "lengths.txt");
  const std::string training = "[training]\nglobal_batch_size = 16\nseq_length = 64\n\n[training.lengths]\n"
                               "distribution = \"histogram\"\nfile = \"" + lengths + "\"\npacking = \"pack\"\n";
  o.training = fuzz::write_input(reinterpret_cast<const std::uint8_t*>(training.data()), training.size(), "training.toml");
  o.global_batch.reset();
  o.plan = "tp=2,cp=2,mbs=1";
  fuzz::load_and_check(o);
  return 0;
}
