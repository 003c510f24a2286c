// Philox4x32-10 (Salmon et al., SC'11; the Random123 reference algorithm) and
// the dropout keep test built on it. Host and device code share this header,
// so CPU and GPU draw identical masks.
//
// Element e of a dropout stream with key `seed` uses the counter
// (lo32(e), hi32(e), 0, 0) and the first output word x0; it is DROPPED iff
// x0 < threshold(p) = round(p * 2^32) (an integer test: no float rounding can
// make CPU and GPU disagree). The keep probability is 1 - threshold / 2^32.
// Does not: produce the same stream as cuRAND's or PyTorch's dropout.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MEGASCOPE_HD __host__ __device__
#else
#define MEGASCOPE_HD
#endif

namespace megascope::kernels {

struct Philox4x32 {
  std::uint32_t v[4];
};

// Ten rounds; the key is bumped by the Weyl constants between rounds.
MEGASCOPE_HD inline Philox4x32 philox4x32_10(Philox4x32 ctr, std::uint32_t key0, std::uint32_t key1) {
  constexpr std::uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr std::uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key0 += kW0;
      key1 += kW1;
    }
    const std::uint64_t p0 = static_cast<std::uint64_t>(kM0) * ctr.v[0];
    const std::uint64_t p1 = static_cast<std::uint64_t>(kM1) * ctr.v[2];
    const auto hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    const auto hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    ctr = Philox4x32{{hi1 ^ ctr.v[1] ^ key0, lo1, hi0 ^ ctr.v[3] ^ key1, lo0}};
  }
  return ctr;
}

// round(p * 2^32) clamped to [0, 2^32]; computed once per call on the host.
inline std::uint64_t dropout_threshold(float p) {
  if (!(p > 0.0f)) return 0;
  if (p >= 1.0f) return std::uint64_t{1} << 32;
  return static_cast<std::uint64_t>(static_cast<double>(p) * 4294967296.0 + 0.5);
}

// Whether element `index` (already including the caller's offset) is kept.
// p = 0 (threshold 0) keeps every element without drawing: Megatron-LM's
// dropout at p = 0 draws no random numbers either, and the result is the same.
MEGASCOPE_HD inline bool dropout_keep(std::uint64_t seed, std::uint64_t index, std::uint64_t threshold) {
  if (threshold == 0) return true;
  const Philox4x32 ctr{{static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32), 0u, 0u}};
  const Philox4x32 r = philox4x32_10(ctr, static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
  return static_cast<std::uint64_t>(r.v[0]) >= threshold;
}

}  // namespace megascope::kernels
