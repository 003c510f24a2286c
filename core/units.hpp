// Units. Plain doubles with suffixed names (_s, _bytes, _Bps, _flops), and the
// constants to convert. GB = 1e9 bytes, GiB = 2^30 bytes: say which.
#pragma once

#include <cstdint>

namespace megascope::units {

inline constexpr double KiB = 1024.0;
inline constexpr double MiB = 1024.0 * 1024.0;
inline constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
inline constexpr double KB = 1e3;
inline constexpr double MB = 1e6;
inline constexpr double GB = 1e9;
inline constexpr double TB = 1e12;
inline constexpr double Gbit = 1e9 / 8.0;   // bytes in a gigabit
inline constexpr double TFLOP = 1e12;
inline constexpr double us = 1e-6;
inline constexpr double ns = 1e-9;

}  // namespace megascope::units
