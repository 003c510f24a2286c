// Pipeline layouts: Megatron-Core's layout strings parsed as
// PipelineParallelLayerLayout.parse_str_to_list parses them, the split rules
// (even, uneven first/last, embedding and loss counted in the split) as
// Megatron-LM's get_num_layers_to_build applies them, and the same layout
// reached by two routes giving the same Program.
#include <catch2/catch.hpp>

#include "config/library.hpp"
#include "core/pipeline_layout.hpp"
#include "core/program/builder.hpp"
#include "models.hpp"
#include "support.hpp"

using namespace megascope;
using namespace megascope::test;

namespace {

std::vector<int> decoders(const std::vector<LayoutStage>& stages) {
  std::vector<int> out;
  for (const LayoutStage& s : stages) out.push_back(s.decoders);
  return out;
}

// Layers of each chunk of each rank, rank by rank.
std::vector<std::vector<int>> chunk_layers(const Setup& s) {
  std::vector<std::vector<int>> out;
  for (const auto& rank : s.chunks) {
    out.emplace_back();
    for (const ChunkLayers& c : rank) out.back().push_back(c.count);
  }
  return out;
}

ModelSpec layers(int n) { return gpt(n, 1024, 16); }

}  // namespace

TEST_CASE("Layout strings parse as Megatron-Core parses them", "[core][layout]") {
  // Megatron-Core's own docstring example: "Ettt|(tt|)*29,m|L" is
  // [["E","t","t","t"]] + [["t","t"]] * 29 + [["m"], ["L"]].
  auto ds = parse_pipeline_layout("Ettt|(tt|)*29,m|L", "f");
  REQUIRE(ds);
  REQUIRE(ds->size() == 32);
  CHECK(ds->front() == LayoutStage{3, true, false, 0});
  for (std::size_t i = 1; i <= 29; ++i) CHECK((*ds)[i] == LayoutStage{2, false, false, 0});
  CHECK((*ds)[30] == LayoutStage{0, false, false, 1});
  CHECK((*ds)[31] == LayoutStage{0, false, true, 0});
  // "t*3" is "ttt"; commas are cosmetic.
  auto same = parse_pipeline_layout("Et*3|(tt|)*29,m|L", "f");
  REQUIRE(same);
  CHECK(*same == *ds);
  // A character repeat inside a repeated group.
  auto nested = parse_pipeline_layout("Et*4|(t*4|)*14,tmL", "f");
  REQUIRE(nested);
  REQUIRE(nested->size() == 16);
  CHECK((*nested)[7] == LayoutStage{4, false, false, 0});
  CHECK(nested->back() == LayoutStage{1, false, true, 1});
  // Empty stages are stages ("(empty stage)" in Megatron-Core's printout).
  auto empty = parse_pipeline_layout("Et||tL", "f");
  REQUIRE(empty);
  CHECK(decoders(*empty) == std::vector<int>{1, 0, 1});
}

TEST_CASE("Layout strings: format gives back the stages, compactly", "[core][layout]") {
  for (const char* text : {"Et*3|(tt|)*29,m|L", "Et*4|(t*4|)*14,tmL", "Et|tL", "EtL", "E|(t*8|)*14,L", "Et||tL",
                           "E|t|t|t|L", "(Et|)*1,tt|tL"}) {
    auto stages = parse_pipeline_layout(text, "f");
    REQUIRE(stages);
    const std::string formatted = format_pipeline_layout(*stages);
    auto back = parse_pipeline_layout(formatted, "f");
    INFO(text << " -> " << formatted);
    REQUIRE(back);
    CHECK(*back == *stages);
  }
  auto ds = parse_pipeline_layout("Ettt|(tt|)*29,m|L", "f");
  CHECK(format_pipeline_layout(*ds) == "Et*3|(tt|)*29m|L");
  CHECK(format_pipeline_layout(*parse_pipeline_layout("Ett|tt|tt|ttL", "f")) == "Ett|(tt|)*2ttL");
}

TEST_CASE("Layout strings: each syntax error is named", "[core][layout]") {
  const auto err = [](const char* text) {
    auto r = parse_pipeline_layout(text, "plan.layout");
    REQUIRE_FALSE(r);
    CHECK(r.error().field == "plan.layout");
    return r.error().message;
  };
  CHECK_THAT(err("Etx|tL"), Catch::Contains("unknown layer character 'x'"));
  CHECK_THAT(err("E((t|)*2)*2L"), Catch::Contains("nested parentheses"));
  CHECK_THAT(err("Et*|tL"), Catch::Contains("must be followed by a repeat count"));
  CHECK_THAT(err("E(t|tL"), Catch::Contains("is not closed"));
  CHECK_THAT(err("Et)|tL"), Catch::Contains("closes no '('"));
  CHECK_THAT(err("E(t|)tL"), Catch::Contains("must be followed by '*'"));
  CHECK_THAT(err("Et*99999999999|L"), Catch::Contains("larger than"));
  CHECK_THAT(err("E(t*1000|)*5000L"), Catch::Contains("expands to more than"));
  CHECK_THAT(err("EtE|tL"), Catch::Contains("exactly once"));
  CHECK_THAT(err("tE|tL"), Catch::Contains("first layer"));
  CHECK_THAT(err("Etm|tL"), Catch::Contains("before the MTP layers"));
  CHECK_THAT(err("Et|t"), Catch::Contains("end with the loss"));
  CHECK_THAT(err("t|tL"), Catch::Contains("embedding (E)"));
  CHECK_THAT(err("Et|L|t"), Catch::Contains("after the loss"));
  CHECK_THAT(err(""), Catch::Contains("empty"));
  CHECK_THAT(err("Et*3|t*29, L"), Catch::Contains("unknown layer character ' '"));   // Megatron-Core refuses spaces
  CHECK_THAT(err("E(|)*70000L"), Catch::Contains("more than 65536 stages"));
}

TEST_CASE("Layouts: embedding and loss counted in the split (Megatron-LM's get_num_layers_to_build)",
          "[core][layout]") {
  // Megatron-Bridge's Llama 3.1 405B recipe: 126 layers, pp 8, vpp 8; the
  // embedding and loss make 128, 2 per virtual stage, one fewer on the first
  // and the last.
  const ModelSpec m405 = layers(126);
  const Setup b = make_setup(m405, "dgx-h100", "pp=8,vpp=8,schedule=interleaved,embedding_in_split=on,loss_in_split=on",
                             64, 8);
  REQUIRE(b.layout.size() == 64);
  CHECK(b.layout.front() == LayoutStage{1, true, false, 0});
  CHECK(b.layout.back() == LayoutStage{1, false, true, 0});
  for (std::size_t vs = 1; vs + 1 < 64; ++vs) CHECK(b.layout[vs].decoders == 2);
  CHECK(b.layers_on_rank(0) == 15);
  CHECK(b.layers_on_rank(3) == 16);
  CHECK(b.layers_on_rank(7) == 15);
  // Meta's Llama 3 405B: pp 16, 7 + 14 x 8 + 7 layers, interleaved.
  const Setup meta = make_setup(m405, "dgx-h100", "pp=16,vpp=2,schedule=interleaved,embedding_in_split=on,loss_in_split=on",
                                32, 16);
  CHECK(meta.layers_on_rank(0) == 7);
  for (int r = 1; r < 15; ++r) CHECK(meta.layers_on_rank(r) == 8);
  CHECK(meta.layers_on_rank(15) == 7);
  CHECK(chunk_layers(meta)[0] == std::vector<int>{3, 4});
  CHECK(chunk_layers(meta)[15] == std::vector<int>{4, 3});
  CHECK(meta.chunks[0][0].embedding);
  CHECK(meta.chunks[15][1].loss);
  CHECK_FALSE(meta.chunks[0][1].embedding);
  // Only the embedding: 24 + 1 over pp 5.
  const Setup e = make_setup(layers(24), "dgx-a100", "pp=5,embedding_in_split=on", 5, 5);
  CHECK(decoders(e.layout) == std::vector<int>{4, 5, 5, 5, 5});
  // A V schedule: rank 0 holds the first and the last virtual stage.
  const Setup v = make_setup(layers(30), "dgx-a100", "pp=4,schedule=zb-v,embedding_in_split=on,loss_in_split=on", 16, 4);
  CHECK(chunk_layers(v)[0] == std::vector<int>{3, 3});
  CHECK(chunk_layers(v)[1] == std::vector<int>{4, 4});
  CHECK(v.holds_embedding(0));
  CHECK(v.holds_output(0));

  expect_error(try_setup(layers(24), "dgx-a100", "pp=4,embedding_in_split=on", 4, 4), "plan.embedding_in_split",
               "(25) must be divisible by pp (4)");
  expect_error(try_setup(layers(126), "dgx-h100", "pp=16,vpp=3,schedule=interleaved,embedding_in_split=on,loss_in_split=on",
                         16, 16),
               "plan.vpp", "holds 8 layers counting the embedding and loss, which must divide into vpp = 3");
  expect_error(try_setup(layers(126), "dgx-h100", "pp=16,embedding_in_split=on,first_stage_layers=7", 16, 16),
               "plan.embedding_in_split", "cannot combine");
  // pp 8, vpp 16: one layer per virtual stage; the first then holds only the embedding.
  const Setup only = make_setup(layers(126), "dgx-h100",
                                "pp=8,vpp=16,schedule=interleaved,embedding_in_split=on,loss_in_split=on", 64, 8);
  CHECK(only.layout.front() == LayoutStage{0, true, false, 0});
  CHECK(only.layout.back() == LayoutStage{0, false, true, 0});
}

TEST_CASE("Layouts: uneven first/last stages with interleaving and the V schedules", "[core][layout]") {
  // Megatron-LM: the first/last stage's layers divide evenly into its chunks.
  const Setup i = make_setup(layers(26), "dgx-a100", "pp=4,vpp=2,schedule=interleaved,first_stage_layers=4,last_stage_layers=6",
                             8, 4);
  CHECK(chunk_layers(i) == std::vector<std::vector<int>>{{2, 2}, {4, 4}, {4, 4}, {3, 3}});
  // 7 does not divide into 2 chunks: Megatron-LM refuses; the message says
  // what expresses one layer fewer on the first virtual stage instead.
  expect_error(try_setup(layers(126), "dgx-h100", "pp=16,vpp=2,schedule=interleaved,first_stage_layers=7,last_stage_layers=7",
                         32, 16),
               "plan.first_stage_layers", "embedding_in_split/loss_in_split or a layout");
  // zb-v and dualpipev: the keys name the first and the last virtual stage
  // (both on rank 0); the other six share the rest.
  const Setup zbv = make_setup(layers(24), "dgx-a100", "pp=4,schedule=zb-v,first_stage_layers=4,last_stage_layers=2", 16, 4);
  CHECK(decoders(zbv.layout) == std::vector<int>{4, 3, 3, 3, 3, 3, 3, 2});
  CHECK(chunk_layers(zbv)[0] == std::vector<int>{4, 2});
  CHECK(zbv.layers_on_rank(0) == 6);
  const Setup dpv = make_setup(layers(24), "dgx-a100", "pp=4,schedule=dualpipev,first_stage_layers=3,last_stage_layers=3", 16, 4);
  CHECK(dpv.layers_on_rank(0) == 6);
  expect_error(try_setup(layers(24), "dgx-a100", "pp=4,schedule=zb-v,first_stage_layers=2", 16, 4),
               "plan.first_stage_layers", "must divide evenly over the other 7 virtual stages");
}

TEST_CASE("Layouts: a layout string places what it says, and only valid ones pass", "[core][layout]") {
  const ModelSpec m = layers(24);
  // Embedding and loss in stages of their own.
  const Setup s = make_setup(m, "dgx-a100", "pp=4,schedule=interleaved,layout=E|t*4|t*4|t*4|t*4|t*4|t*4|L", 8, 4);
  CHECK(s.vpp == 2);   // from the layout's 8 stages
  CHECK(chunk_layers(s) == std::vector<std::vector<int>>{{0, 4}, {4, 4}, {4, 4}, {4, 0}});
  CHECK(s.chunks[0][0].embedding);
  CHECK(s.chunks[3][1].loss);
  CHECK(s.chunks[1][0].first == 0);
  CHECK(s.chunks[0][1].first == 12);

  expect_error(try_setup(m, "dgx-a100", "pp=4,layout=Et*6|t*6|t*6|t*5L", 4, 4), "plan.layout",
               "holds 23 transformer layers (t); the model has 24");
  expect_error(try_setup(m, "dgx-a100", "pp=4,layout=Et*8|t*8|t*8L", 4, 4), "plan.layout",
               "3 stages, which must be a multiple of pp (4)");
  expect_error(try_setup(m, "dgx-a100", "pp=4,vpp=2,schedule=interleaved,layout=Et*6|t*6|t*6|t*6L", 8, 4), "plan.layout",
               "the layout has 4 stages; interleaved with pp = 4 and vpp = 2 needs 8");
  expect_error(try_setup(m, "dgx-a100", "pp=4,layout=|Et*8|t*8|t*8L", 4, 4), "plan.layout",
               "must be in the first stage, virtual stage 0 (pipeline rank 0, chunk 0)");
  expect_error(try_setup(m, "dgx-a100", "pp=4,layout=Et*6|t*6|t*6|t*6L,first_stage_layers=6", 4, 4), "plan.layout",
               "not both");
  expect_error(try_setup(m, "dgx-a100", "pp=2,layout=Et*24L|", 4, 2), "plan.layout",
               "the loss (L) must be in the last stage, virtual stage 1 (pipeline rank 1, chunk 0)");
  // vpp 2 from the layout's 4 stages, with a one-chunk schedule: the layout is named, not vpp.
  expect_error(try_setup(m, "dgx-a100", "pp=2,layout=Et*6|t*6|t*6|t*6L", 4, 2), "plan.layout",
               "schedule 1f1b runs one model chunk per rank");
  ModelSpec ds = shipped_model("deepseek-v3");
  // Megatron-Core's standalone MTP: rank 14's last chunk holds the MTP layer, rank 15's the loss.
  const Setup sa = make_setup(ds, "dgx-h100", "pp=16,vpp=2,schedule=interleaved,ep=8,sp=on,layout=Et*3|(tt|)*29,m|L", 512, 128);
  CHECK(sa.chunks[14][1].mtp == 1);
  CHECK_FALSE(sa.chunks[14][1].loss);
  CHECK(sa.chunks[15][1].loss);
  CHECK(sa.chunks[15][1].mtp == 0);
  expect_error(try_setup(ds, "dgx-h100", "pp=16,vpp=2,schedule=zb-v,ep=8,sp=on,layout=Et*3|(tt|)*29,m|L", 512, 128),
               "plan.layout", "virtual stage 30");
  expect_error(try_setup(ds, "dgx-h100", "pp=16,ep=8,layout=Et*4|(t*4|)*14,tL", 512, 128), "plan.layout",
               "holds 0 MTP layers (m); the model has 1");
  const Setup d = make_setup(ds, "dgx-h100", "pp=16,ep=8,layout=Et*4|(t*4|)*14,tmL", 512, 128);
  CHECK(d.layers_on_rank(0) == 4);
  CHECK(d.layers_on_rank(15) == 1);
  CHECK(d.chunks[15][0].mtp == 1);
}

TEST_CASE("Layouts: the same placement from flags and from a string gives the same Program", "[core][layout]") {
  const ModelSpec m = layers(30);
  const std::string base = "pp=4,vpp=2,schedule=interleaved,";
  const Setup flags = make_setup(m, "dgx-a100", base + "embedding_in_split=on,loss_in_split=on", 16, 4);
  const std::string text = format_pipeline_layout(flags.layout);
  CHECK(text == "Et*3|(t*4|)*6t*3L");
  const Setup str = make_setup(m, "dgx-a100", base + "layout=" + text, 16, 4);
  CHECK(str.layout == flags.layout);
  auto a = build_program(flags);
  auto b = build_program(str);
  REQUIRE(a);
  REQUIRE(b);
  REQUIRE(a->stages.size() == b->stages.size());
  for (std::size_t r = 0; r < a->stages.size(); ++r) {
    REQUIRE(a->stages[r].ops.size() == b->stages[r].ops.size());
    for (std::size_t i = 0; i < a->stages[r].ops.size(); ++i) {
      CHECK(a->stages[r].ops[i].kind == b->stages[r].ops[i].kind);
      CHECK(a->stages[r].ops[i].flops == b->stages[r].ops[i].flops);
    }
  }
  // Moving layers between stages moves no FLOPs in or out of the iteration:
  // the layout with stages of their own for the embedding and the loss does
  // the even split's work.
  const ModelSpec m24 = layers(24);
  const Setup even = make_setup(m24, "dgx-a100", "pp=4,vpp=2,schedule=interleaved", 8, 4);
  const Setup ends = make_setup(m24, "dgx-a100", "pp=4,schedule=interleaved,layout=E|t*4|t*4|t*4|t*4|t*4|t*4|L", 8, 4);
  auto pe = build_program(even);
  auto pn = build_program(ends);
  REQUIRE(pe);
  REQUIRE(pn);
  const auto total_flops = [](const Program& p) {
    double f = 0;
    for (const auto& st : p.stages)
      for (const auto& op : st.ops) f += op.flops;
    return f;
  };
  CHECK(total_flops(*pn) == Approx(total_flops(*pe)).epsilon(1e-12));
  // The first rank of `ends` runs no transformer layer in its first chunk:
  // fewer compute FLOPs there than the even split's first rank.
  double first_even = 0, first_ends = 0;
  for (const auto& op : pe->stages[0].ops) first_even += op.flops;
  for (const auto& op : pn->stages[0].ops) first_ends += op.flops;
  CHECK(first_ends < first_even);
}
