// The GPU runtime's watchdog loop (exec/cuda/watchdog.hpp) on any machine:
// it returns when the work is done, ends at once on an asynchronous error,
// and past its limit runs the abort and names what it waited for.
#include <catch2/catch.hpp>

#include <chrono>
#include <optional>
#include <string>

#include "exec/cuda/watchdog.hpp"

namespace xc = megascope::exec::cuda;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

TEST_CASE("The watchdog returns once the work is done, without aborting", "[exec][cuda]") {
  int polls = 0;
  bool aborted = false;
  xc::wait_until([&] { return ++polls == 200; }, [] { return std::optional<std::string>{}; }, 10.0, "rank 0: a dp barrier",
                 [&] { aborted = true; });
  CHECK(polls == 200);
  CHECK_FALSE(aborted);
}

TEST_CASE("A wait that outlives the limit aborts and names the rank, the group and the time", "[exec][cuda]") {
  bool aborted = false;
  const auto start = std::chrono::steady_clock::now();
  try {
    xc::wait_until([] { return false; }, [] { return std::optional<std::string>{}; }, 0.05,
                   "rank 3: a barrier of the dp group (4 ranks)", [&] { aborted = true; });
    FAIL("no exception: expected WatchdogTimeout");
  } catch (const xc::WatchdogTimeout& e) {
    CHECK_THAT(e.what(), StartsWith("rank 3: a barrier of the dp group (4 ranks) still waiting after "));
    CHECK_THAT(e.what(), Contains("--recv-timeout"));
  }
  CHECK(aborted);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(waited >= 0.05);
}

TEST_CASE("An asynchronous error ends the wait at once with its message, without the abort", "[exec][cuda]") {
  int polls = 0;
  bool aborted = false;
  auto failed = [&]() -> std::optional<std::string> {
    if (polls < 5) return std::nullopt;
    return std::string("NCCL reports remote process exited or there was a network error");
  };
  CHECK_THROWS_WITH(xc::wait_until([&] { ++polls; return false; }, failed, 60.0, "rank 1: the step's ops on stage 0",
                                   [&] { aborted = true; }),
                    "rank 1: the step's ops on stage 0: NCCL reports remote process exited or there was a network error");
  CHECK(polls == 5);   // the fifth poll's error ends it
  CHECK_FALSE(aborted);
}
