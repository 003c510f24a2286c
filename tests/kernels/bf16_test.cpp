// round_to_bf16: round to nearest, ties to even, on the 16 bits bf16 keeps.
#include "kernels/bf16.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

using megascope::kernels::round_to_bf16;

namespace {
float of_bits(std::uint32_t u) {
  float x = 0;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
}  // namespace

TEST_CASE("round_to_bf16 keeps bf16 values, rounds to nearest with ties to even, keeps inf and NaN", "[kernels]") {
  for (float x : {0.0f, -0.0f, 1.0f, -2.5f, 3.140625f, 1e-30f, 6.5e4f}) {
    const float r = round_to_bf16(x);
    CHECK(round_to_bf16(r) == r);   // idempotent
  }
  CHECK(round_to_bf16(1.0f) == 1.0f);
  CHECK(round_to_bf16(3.140625f) == 3.140625f);           // 8 significant bits: exact in bf16
  // The bf16 step at 1 is 2^-7: 1 + 2^-8 is a tie and goes to the even 1; 1 + 3 x 2^-8 goes to 1 + 2^-6.
  CHECK(round_to_bf16(1.0f + std::ldexp(1.0f, -8)) == 1.0f);
  CHECK(round_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 1.0f + std::ldexp(1.0f, -6));
  CHECK(round_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)) == 1.0f + std::ldexp(1.0f, -7));
  CHECK(round_to_bf16(-1.0f - 3 * std::ldexp(1.0f, -8)) == -1.0f - std::ldexp(1.0f, -6));
  // Low bits cleared, relative error at most half a bf16 step: 2^-8.
  for (float x : {0.1f, 123.456f, -7.77e-5f, 2.0e20f}) {
    const float r = round_to_bf16(x);
    std::uint32_t u = 0;
    std::memcpy(&u, &r, sizeof u);
    CHECK((u & 0xFFFFu) == 0u);
    CHECK(std::abs(r - x) <= std::ldexp(std::abs(x), -8));
  }
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(round_to_bf16(inf) == inf);
  CHECK(round_to_bf16(-inf) == -inf);
  CHECK(std::isnan(round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  CHECK(std::isnan(round_to_bf16(of_bits(0x7F800001u))));    // a NaN whose payload is only in the dropped bits
  CHECK(round_to_bf16(std::numeric_limits<float>::max()) == inf);   // past the largest bf16
}
