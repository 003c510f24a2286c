// A measured per-expert token distribution (config/token_histogram.hpp):
// the file read as written, every malformed line refused with its file and
// line, and the busiest EP rank's load computed from it
// (core/model.hpp expert_load_factor) against hand-counted examples.
#include "config/token_histogram.hpp"

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "support.hpp"

using namespace megascope;

namespace {

std::string write(const std::string& name, const std::string& text) {
  const std::string path = (std::filesystem::temp_directory_path() / name).string();
  std::ofstream(path) << text;
  return path;
}

}  // namespace

TEST_CASE("A token histogram file is read as written: comments and blank lines skipped, one row per layer", "[config]") {
  const std::string path = write("megascope-hist-ok.txt", "# layer 1, 4 experts\n10, 20,30 ,40\n\n  5,5,5,5\r\n");
  const auto rows = load_token_histogram(path);
  REQUIRE(rows);
  REQUIRE(rows->size() == 2);
  CHECK((*rows)[0] == std::vector<double>{10, 20, 30, 40});
  CHECK((*rows)[1] == std::vector<double>{5, 5, 5, 5});
}

TEST_CASE("A malformed token histogram is refused with its file, line and rule", "[config]") {
  struct Case {
    const char* text;
    int line;
    const char* words;
  };
  const Case cases[] = {
      {"1,2,3\n1,2\n", 2, "2 counts, but the first layer's line has 3"},
      {"1,x,3\n", 1, "count 2 ('x') must be a finite number >= 0"},
      {"1,-2,3\n", 1, "count 2 ('-2') must be a finite number >= 0"},
      {"1,nan,3\n", 1, "must be a finite number"},
      {"1,,3\n", 1, "count 2 ('') must be"},
      {"1,2,3,\n", 1, "ends with a comma"},
      {"1e999,2\n", 1, "must be a finite number"},
  };
  for (const Case& c : cases) {
    INFO(c.text);
    const auto r = load_token_histogram(write("megascope-hist-bad.txt", c.text));
    REQUIRE_FALSE(r);
    CHECK(r.error().field == "token_histogram");
    REQUIRE(r.error().where);
    CHECK(r.error().where->line == c.line);
    CHECK_THAT(r.error().message, Catch::Contains(c.words));
  }
  std::string rows;
  for (int i = 0; i < 1025; ++i) rows += "1,2,3,4\n";
  const auto many = load_token_histogram(write("megascope-hist-many.txt", rows));
  REQUIRE_FALSE(many);
  REQUIRE(many.error().where);
  CHECK(many.error().where->line == 1025);
  CHECK_THAT(many.error().message, Catch::Contains("more than 1024 layers' lines"));
  rows.resize(rows.size() - 8);   // 1024 lines
  CHECK(load_token_histogram(write("megascope-hist-1024.txt", rows)));
  const auto empty = load_token_histogram(write("megascope-hist-empty.txt", "# nothing\n\n"));
  REQUIRE_FALSE(empty);
  CHECK_THAT(empty.error().message, Catch::Contains("no layer's counts"));
  CHECK_FALSE(load_token_histogram("/nonexistent/megascope-hist.txt"));
}

TEST_CASE("The busiest EP rank's load from a histogram: each layer's busiest block of experts over the mean, averaged "
          "over the layers, with the capacity's drops",
          "[config]") {
  ModelSpec m = test::shipped_model("tiny-moe");   // 4 experts
  const std::string path = write("megascope-hist-load.txt", "10,30,20,40\n25,25,25,25\n");
  REQUIRE(apply_token_histogram(m, path));
  // ep 2, layer 1: blocks {10,30} = 40 and {20,40} = 60 over a mean of 50: 1.2; layer 2: 1.0.
  CHECK(expert_load_factor(*m.moe, 2) == Approx((1.2 + 1.0) / 2));
  // ep 4, layer 1: 40 over 25: 1.6; layer 2: 1.0.
  CHECK(expert_load_factor(*m.moe, 4) == Approx((1.6 + 1.0) / 2));
  CHECK(expert_load_factor(*m.moe, 1) == Approx(1.0));
  // Capacity 1.2 x the mean expert's 25 = 30: expert 3's 40 drops to 30; ep 4: 30 / 25 = 1.2.
  m.moe->capacity_factor = 1.2;
  CHECK(expert_load_factor(*m.moe, 4) == Approx((1.2 + 1.0) / 2));
  // A histogram of another model's expert count, and a dense model, are refused.
  const std::string wrong = write("megascope-hist-wrong.txt", "1,2,3\n");
  ModelSpec n = test::shipped_model("tiny-moe");
  const auto r = apply_token_histogram(n, wrong);
  REQUIRE_FALSE(r);
  CHECK(r.error().field == "model.moe.token_histogram");
  CHECK_THAT(r.error().message, Catch::Contains("has 3 experts' counts; the model has 4 experts"));
  ModelSpec dense = test::shipped_model("tiny-gpt");
  CHECK_FALSE(apply_token_histogram(dense, path));
  // Counts each finite whose sum is not (it made the load NaN downstream).
  ModelSpec big = test::shipped_model("tiny-moe");
  const auto huge = apply_token_histogram(big, write("megascope-hist-huge.txt", "1e308,1e308,1e308,1e308\n1,2,3,4\n"));
  REQUIRE_FALSE(huge);
  CHECK(huge.error().field == "model.moe.token_histogram");
  CHECK_THAT(huge.error().message, Catch::Contains("layer row 1: its counts sum past the largest number"));
}
