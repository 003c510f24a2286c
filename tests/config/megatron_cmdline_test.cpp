// import_megatron_args: reading the command line. Shell-style tokenizing,
// skipping the launcher, --flag value / --flag=value, unknown flags, arity
// and value errors, and the --moe-layer-freq syntax. What the flags mean for
// the model, training and plan is in megatron_import_test.cpp.
#include "config/megatron_args.hpp"

#include <catch2/catch.hpp>

#include "config/megatron_support.hpp"

#include <algorithm>
#include <string>
#include <vector>

using namespace megascope;
using namespace megascope::test;

TEST_CASE("Both --flag value and --flag=value are read", "[config]") {
  const MegatronLaunch l = import_ok(
      "--num-layers=4 --hidden-size=1024 --num-attention-heads 16 --seq-length=1024 --vocab-size=32000 "
      "--micro-batch-size=2 --global-batch-size 8 --bf16 --tensor-model-parallel-size=2 --data-path=a");
  CHECK(l.model.num_layers == 4);
  CHECK(l.plan.micro_batch_size == 2);
  CHECK(l.plan.tp == 2);
  CHECK(contains(l.ignored, "--data-path"));
}

TEST_CASE("Launcher tokens before the training script are skipped", "[config]") {
  const MegatronLaunch a = import_ok("torchrun --nproc_per_node 8 --nnodes 2 --node_rank 0 --master_addr 10.0.0.1 "
                                     "--master_port 29500 --rdzv_id 7 --rdzv_endpoint 10.0.0.1:29400 "
                                     "/opt/megatron/pretrain_gpt.py " +
                                     kSmall);
  CHECK(a.model.num_layers == 4);
  const MegatronLaunch b = import_ok("python -u -m torch.distributed.run --nproc-per-node=8 pretrain_gpt.py " + kSmall);
  CHECK(b.model.num_layers == 4);
  // A .py file given as a flag's value is not taken for the script.
  const MegatronLaunch v = import_ok(kSmall + "--tokenizer-model tok.py --data-path a.py");
  CHECK(v.model.num_layers == 4);
  CHECK(contains(v.ignored, "--tokenizer-model"));
  // Without a script name, words before the first --flag are skipped.
  const MegatronLaunch c = import_ok("megatron train " + kSmall);
  CHECK(c.model.num_layers == 4);
}

TEST_CASE("Quotes and backslash-newline continuations are read as a shell would", "[config]") {
  const MegatronLaunch l = import_ok(
      "--num-layers \"4\" --hidden-size '1024' \\\n --num-attention-heads 1\\6 --seq-length 1024 \\\r\n"
      "--vocab-size 32000 --micro-batch-size 1 --global-batch-size 8 --bf16 --wandb-exp-name \"my run\" "
      "--tensorboard-dir 'a b'");
  CHECK(l.model.num_layers == 4);
  CHECK(l.model.hidden_size == 1024);
  CHECK(l.model.num_attention_heads == 16);
  CHECK(contains(l.ignored, "--wandb-exp-name"));
  CHECK(contains(l.ignored, "--tensorboard-dir"));
}

TEST_CASE("An unterminated quote is an error", "[config]") {
  const Error e = import_error(kSmall + "--wandb-project 'oops");
  CHECK(e.field == "megatron");
  REQUIRE_THAT(e.message, Catch::Contains("unterminated single quote"));
  const Error d = import_error(kSmall + "--wandb-project \"oops");
  REQUIRE_THAT(d.message, Catch::Contains("unterminated double quote"));
}

TEST_CASE("An unknown flag is an error naming it, with a suggestion when one is close", "[config]") {
  const Error e = import_error(kSmall + "--num-layerz 4");
  CHECK(e.field == "megatron.--num-layerz");
  REQUIRE_THAT(e.message, Catch::Contains("unknown Megatron-LM flag --num-layerz"));
  REQUIRE_THAT(e.message, Catch::Contains("did you mean --num-layers?"));

  const Error far = import_error(kSmall + "--frobnicate");
  CHECK(far.field == "megatron.--frobnicate");
  REQUIRE_THAT(far.message, Catch::Contains("unknown Megatron-LM flag --frobnicate"));
  CHECK_THAT(far.message, !Catch::Contains("did you mean"));

  // A launcher flag with no script name in the line.
  const Error launcher = import_error("torchrun --nproc_per_node 8 " + kSmall);
  CHECK(launcher.field == "megatron.--nproc_per_node");
}

TEST_CASE("A flag that needs a value and has none is an error", "[config]") {
  const Error end = import_error(kSmall + "--hidden-dropout");
  CHECK(end.field == "megatron.--hidden-dropout");
  REQUIRE_THAT(end.message, Catch::Contains("--hidden-dropout needs a value"));

  const Error next = import_error("--lr --num-layers 4");
  CHECK(next.field == "megatron.--lr");
  REQUIRE_THAT(next.message, Catch::Contains("--lr needs a value"));

  const Error list = import_error(kSmall + "--cp-comm-type");
  CHECK(list.field == "megatron.--cp-comm-type");
  REQUIRE_THAT(list.message, Catch::Contains("at least one value"));
}

TEST_CASE("A switch given a value is an error", "[config]") {
  const Error e = import_error(kSmall + "--swiglu=true");
  CHECK(e.field == "megatron.--swiglu");
  REQUIRE_THAT(e.message, Catch::Contains("takes no value"));
}

TEST_CASE("A stray word between flags is an error", "[config]") {
  const Error e = import_error(kSmall + "--swiglu extra");
  CHECK(e.field == "megatron");
  REQUIRE_THAT(e.message, Catch::Contains("unexpected argument 'extra'"));
}

TEST_CASE("A non-integer where an integer is needed is an error naming the flag", "[config]") {
  const Error e = import_error(kSmall + "--tensor-model-parallel-size 8x");
  CHECK(e.field == "megatron.--tensor-model-parallel-size");
  REQUIRE_THAT(e.message, Catch::Contains("--tensor-model-parallel-size expects an integer, found '8x'"));

  const Error f = import_error(kSmall + "--num-layers 1.5");
  CHECK(f.field == "megatron.--num-layers");
  REQUIRE_THAT(f.message, Catch::Contains("expects an integer, found '1.5'"));

  const Error z = import_error(kSmall + "--pipeline-model-parallel-size 0");
  CHECK(z.field == "megatron.--pipeline-model-parallel-size");
  REQUIRE_THAT(z.message, Catch::Contains("must be a positive integer"));

  const Error d = import_error(kSmall + "--hidden-dropout high");
  CHECK(d.field == "megatron.--hidden-dropout");
  REQUIRE_THAT(d.message, Catch::Contains("expects a number, found 'high'"));
}

TEST_CASE("The flag --moe-layer-freq accepts an integer frequency and 0/1 list expressions", "[config]") {
  auto pattern = [](const std::string& freq, int layers) {
    const MegatronLaunch l = import_ok("--num-layers " + std::to_string(layers) +
                                       " --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 "
                                       "--vocab-size 32000 --micro-batch-size 1 --global-batch-size 8 --bf16 "
                                       "--num-experts 8 --moe-layer-freq " +
                                       freq);
    REQUIRE(l.model.moe.has_value());
    return l.model.moe->moe_layers;
  };
  CHECK(pattern("2", 6) == std::vector<bool>{true, false, true, false, true, false});
  CHECK(pattern("3", 4) == std::vector<bool>{true, false, false, true});
  CHECK(pattern("[1,0,1,0]", 4) == std::vector<bool>{true, false, true, false});
  CHECK(pattern("'[0, 1, 1]'", 3) == std::vector<bool>{false, true, true});
  CHECK(pattern("'([1]*3+[0]*1)*2'", 8) == std::vector<bool>{true, true, true, false, true, true, true, false});
  CHECK(pattern("'([0]+[1]*3)'", 4) == std::vector<bool>{false, true, true, true});
  CHECK(pattern("'2*[1,0]'", 4) == std::vector<bool>{true, false, true, false});
}

TEST_CASE("A malformed or mismatched --moe-layer-freq is an error", "[config]") {
  const std::string moe = kSmall + "--num-experts 8 --moe-layer-freq ";
  const Error length = import_error(moe + "'([0]*1+[1]*5)'");
  CHECK(length.field == "megatron.--moe-layer-freq");
  REQUIRE_THAT(length.message, Catch::Contains("lists 6 layers but --num-layers is 4"));

  const Error value = import_error(moe + "[1,2,1,1]");
  CHECK(value.field == "megatron.--moe-layer-freq");
  REQUIRE_THAT(value.message, Catch::Contains("0 (dense) or 1 (MoE)"));

  const Error syntax = import_error(moe + "'([0]*3+'");
  CHECK(syntax.field == "megatron.--moe-layer-freq");
  REQUIRE_THAT(syntax.message, Catch::Contains("cannot read"));

  const Error zero = import_error(moe + "0");
  CHECK(zero.field == "megatron.--moe-layer-freq");

  const Error dense = import_error(moe + "[0,0,0,0]");
  CHECK(dense.field == "model.moe.layers");
}
