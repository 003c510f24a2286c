// Test helpers: build a validated Setup from shipped names and an inline plan,
// and read the reference CSV tables.
#pragma once

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "config/library.hpp"
#include "config/plan_settings.hpp"
#include "core/setup.hpp"

namespace megascope::test {

// A setup refused on `field` with a message containing `words`.
inline void expect_error(const Result<Setup>& r, const std::string& field, const std::string& words) {
  INFO("expected an error on " << field << " saying: " << words);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().field == field);
  CHECK_THAT(r.error().message, Catch::Contains(words));
}

inline ModelSpec shipped_model(const std::string& name) {
  auto m = resolve_model(name);
  if (!m) FAIL(m.error().str());
  return *m;
}

inline ClusterSpec shipped_cluster(const std::string& name) {
  auto c = resolve_cluster(name);
  if (!c) FAIL(c.error().str());
  return *c;
}

inline Result<Setup> try_setup(const ModelSpec& m, const std::string& cluster, const std::string& plan,
                               std::int64_t global_batch, int gpus, std::optional<std::int64_t> seq = std::nullopt) {
  auto p = parse_inline_plan(plan);
  if (!p) return tl::unexpected(p.error());
  TrainingSpec t;
  t.global_batch_size = global_batch;
  t.seq_length = seq;
  auto c = with_device_count(shipped_cluster(cluster), gpus);
  if (!c) return tl::unexpected(c.error());
  return validate_setup(m, *c, t, *p, gpus);
}

inline Setup make_setup(const ModelSpec& m, const std::string& cluster, const std::string& plan,
                        std::int64_t global_batch, int gpus, std::optional<std::int64_t> seq = std::nullopt) {
  auto s = try_setup(m, cluster, plan, global_batch, gpus, seq);
  if (!s) FAIL(s.error().str());
  return *s;
}

// A shipped model without its MTP layers on `gpus` H100s (4096 tokens, one
// sequence per GPU), in BF16 and the same in FP8.
inline std::pair<Setup, Setup> bf16_and_fp8(const std::string& model, const std::string& plan, int gpus) {
  ModelSpec m = shipped_model(model);
  m.mtp_num_layers = 0;
  const Setup s = make_setup(m, "dgx-h100", plan, gpus, gpus, 4096);
  Setup s8 = s;
  s8.training.precision = Precision::fp8;
  return {s, s8};
}

// Rows of a CSV file (lines starting with '#' skipped), keyed by header name.
inline std::vector<std::map<std::string, std::string>> read_csv(const std::string& name) {
  std::ifstream in(std::string(MEGASCOPE_REFERENCE_DIR) + "/" + name);
  REQUIRE(in.good());
  std::vector<std::map<std::string, std::string>> rows;
  std::vector<std::string> header;
  std::string line;
  auto split = [](const std::string& l) {
    std::vector<std::string> out;
    std::stringstream ss(l);
    std::string cell;
    while (std::getline(ss, cell, ',')) out.push_back(cell);
    if (!l.empty() && l.back() == ',') out.emplace_back();
    return out;
  };
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (header.empty()) {
      header = split(line);
      continue;
    }
    auto cells = split(line);
    std::map<std::string, std::string> row;
    for (std::size_t i = 0; i < header.size() && i < cells.size(); ++i) row[header[i]] = cells[i];
    rows.push_back(row);
  }
  return rows;
}

inline double num(const std::map<std::string, std::string>& row, const std::string& key) {
  auto it = row.find(key);
  REQUIRE(it != row.end());
  return std::stod(it->second);
}

}  // namespace megascope::test
