// The TOML and JSON readers on hostile input: errors naming the file and
// position, never a crash (the TOML library recurses once per dotted part
// of a key, and nlohmann throws its own exception for numbers out of range).
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

#include "config/hf_config.hpp"
#include "config/json_file.hpp"
#include "config/spec_toml.hpp"
#include "config/toml_reader.hpp"
#include "config/trace_file.hpp"

using namespace megascope;

namespace {

std::string write_temp(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / name;
  std::ofstream(path, std::ios::binary) << text;
  return path.string();
}

std::string dotted(int parts) {
  std::string key = "a";
  for (int i = 1; i < parts; ++i) key += ".a";
  return key;
}

}  // namespace

TEST_CASE("A TOML key of tens of thousands of dotted parts is an error at its line, not a stack overflow", "[config]") {
  // 50,000 parts crashed the TOML library by recursion.
  for (const auto& [text, line] : {std::pair{"[model]\n" + dotted(50000) + " = 1\n", 2},
                                   std::pair{"[" + dotted(50000) + "]\nx = 1\n", 1},
                                   std::pair{"# a comment\nx = { " + dotted(70) + " = 1 }\n", 2}}) {
    const std::string path = write_temp("megascope-deep-key.toml", text);
    const auto r = parse_toml_file(path);
    REQUIRE_FALSE(r);
    CHECK_THAT(r.error().message, Catch::Contains("dotted parts"));
    REQUIRE(r.error().where);
    CHECK(r.error().where->file == path);
    CHECK(r.error().where->line == line);
    // The model loader reports it the same way.
    const auto m = load_model_toml(path);
    REQUIRE_FALSE(m);
    CHECK_THAT(m.error().str(), Catch::Contains(path + ":"));
    std::filesystem::remove(path);
  }
  // Dots in strings, multi-line strings and comments, floats and dates, and
  // keys of up to 65 parts are ordinary TOML.
  const std::string many = std::string(200, '.');
  const std::string ok = fmt::format(
      "# {}\ns = \"{}\"\nl = '{}'\nm = \"\"\"\n{}\n\"\"\"\nn = '''\n{}\n'''\nf = [1.5, 2.5, 3.5, 4.5]\n"
      "d = 1979-05-27T07:32:00.999\n{} = 1\n",
      many, many, many, many, many, dotted(65));
  const std::string path = write_temp("megascope-dots.toml", ok);
  const auto r = parse_toml_file(path);
  INFO((r ? std::string() : r.error().str()));
  REQUIRE(r);
  CHECK((*r)["s"].value<std::string>() == many);
  CHECK((*r)["f"].as_array()->size() == 4);
  std::filesystem::remove(path);
  // A multi-line string may end in extra quotes ("""a"""" is a"): the scan
  // stays in step, neither missing a deep key after it nor refusing dots in
  // a string after it.
  const std::string quotes = write_temp("megascope-quotes.toml", "x = { s = \"\"\"a\"\"\"\", " + dotted(50000) + " = 1 }\n");
  const auto q = parse_toml_file(quotes);
  REQUIRE_FALSE(q);
  CHECK_THAT(q.error().message, Catch::Contains("dotted parts"));
  std::filesystem::remove(quotes);
  const std::string fine = write_temp("megascope-quotes-ok.toml", "x = [\"\"\"a\"\"\"\", '''b''''', \"" + many + "\"]\n");
  const auto f = parse_toml_file(fine);
  INFO((f ? std::string() : f.error().str()));
  CHECK(f);
  std::filesystem::remove(fine);
  const std::string deeper = write_temp("megascope-dots66.toml", dotted(66) + " = 1\n");
  CHECK_FALSE(parse_toml_file(deeper));
  std::filesystem::remove(deeper);
}

TEST_CASE("A JSON number out of double's range is an input error naming the file, in config.json and in traces", "[config]") {
  const auto hf = parse_hf_config(R"({"model_type": "llama", "hidden_size": 1e400})", "big.json");
  REQUIRE_FALSE(hf);
  CHECK_THAT(hf.error().message, Catch::Contains("malformed JSON"));
  REQUIRE(hf.error().where);
  CHECK(hf.error().where->file == "big.json");
  const std::string trace = write_temp("megascope-big-trace.json", R"({"traceEvents": [], "x": 1e400})");
  const auto t = read_trace(trace);
  REQUIRE_FALSE(t);
  CHECK_THAT(t.error().message, Catch::Contains(trace));
  CHECK_THAT(t.error().message, Catch::Contains("not JSON"));
  std::filesystem::remove(trace);
  // A directory is named as one.
  const auto dir = read_trace(std::filesystem::temp_directory_path().string());
  REQUIRE_FALSE(dir);
  CHECK_THAT(dir.error().message, Catch::Contains("is a directory"));
}

TEST_CASE("JSON nested past 512 levels is refused where it passes them, before the parser recurses", "[config]") {
  // A million levels overflowed the parser's stack (a segfault); 512 parse.
  const std::string deep = "{\"model_type\": \"llama\", \"x\": " + std::string(1000000, '[') + std::string(1000000, ']') + "}";
  const auto hf = parse_hf_config(deep, "deep.json");
  REQUIRE_FALSE(hf);
  CHECK_THAT(hf.error().message, Catch::Contains("nested more than 512 levels"));
  REQUIRE(hf.error().where);
  CHECK(hf.error().where->line == 1);
  CHECK(hf.error().where->column == 541);   // the 512th '[' (column 30 + 511), level 513 under the '{'
  // Brackets inside strings do not count; 512 levels are fine for the depth check.
  CHECK_FALSE(json_detail::over_deep_json("{\"a\": \"" + std::string(5000, '[') + "\"}", 512));
  CHECK_FALSE(json_detail::over_deep_json(std::string(512, '[') + std::string(512, ']'), 512));
  CHECK(json_detail::over_deep_json(std::string(513, '[') + std::string(513, ']'), 512) == std::size_t{512});
  const std::string trace = write_temp("megascope-deep-trace.json", "{\"traceEvents\": " + std::string(100000, '[') + "}");
  const auto t = read_trace(trace);
  REQUIRE_FALSE(t);
  CHECK_THAT(t.error().message, Catch::Contains("nested more than 512 levels"));
  std::filesystem::remove(trace);
  // A span of negative duration is refused, naming the event.
  const std::string negative = write_temp("megascope-negative-span.json",
                                          R"({"megascope": {"format": 1, "source": "measured", "step_time_s": 1, "plan": "tp=1", "model": "m", "world": 1},)"
                                          R"( "traceEvents": [{"ph": "X", "pid": 0, "tid": 0, "ts": 5, "dur": -1e-300,)"
                                          R"( "name": "F mlp mb0", "args": {"op": 3}}]})");
  const auto neg = read_trace(negative);
  REQUIRE_FALSE(neg);
  CHECK_THAT(neg.error().message, Catch::Contains("traceEvents[0]") && Catch::Contains("finite duration >= 0"));
  std::filesystem::remove(negative);
  // Devices are refused by name (reading /dev/zero would never end).
  const auto zero = read_trace("/dev/zero");
  REQUIRE_FALSE(zero);
  CHECK_THAT(zero.error().message, Catch::Contains("not a regular file"));
  const auto toml = parse_toml_file("/dev/zero");
  REQUIRE_FALSE(toml);
  CHECK_THAT(toml.error().message, Catch::Contains("not a regular file"));
}
