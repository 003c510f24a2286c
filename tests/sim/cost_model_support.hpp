// Shared by the cost-model tests (cost_model_test.cpp, profile_file_test.cpp).
#pragma once

#include <catch2/catch.hpp>

#include <string>

#include "sim/cost_model.hpp"
#include "support.hpp"

namespace megascope::test {

// A profile file of tests/fixtures/profiles.
inline std::string profile_fixture(const std::string& name) {
  return std::string(MEGASCOPE_TEST_FIXTURES) + "/profiles/" + name;
}

// The cost model of a shipped cluster's device.
inline sim::CostModel model_for(const std::string& cluster) {
  auto m = sim::CostModel::for_device(shipped_cluster(cluster).device);
  if (!m) FAIL(m.error().str());
  return *m;
}

// The same at the clock its profile's efficiencies were measured at
// (sustained_clock 1): what the microbenchmarks the profile is fitted to
// measured, before the sustained clock of training load.
inline sim::CostModel measured_clock_model_for(const std::string& cluster) {
  const sim::CostModel m = model_for(cluster);
  sim::CostProfile p = m.profile();
  p.sustained_clock = 1.0;
  return sim::CostModel(m.device(), p);
}

}  // namespace megascope::test
