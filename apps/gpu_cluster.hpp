// The shipped cluster of a GPU, by the name CUDA gives it ("NVIDIA H100 80GB
// HBM3" -> dgx-h100): the default cluster of the cuda backend's commands.
#pragma once

#include <optional>
#include <string>

namespace megascope::cli {

inline std::optional<std::string> shipped_cluster_of_gpu(const std::string& gpu) {
  auto has = [&](const char* s) { return gpu.find(s) != std::string::npos; };
  if (has("GB200")) return "gb200-nvl72";
  if (has("B200")) return "dgx-b200";
  if (has("H200")) return "dgx-h200";
  if (has("H100") && !has("PCIe")) return "dgx-h100";
  if (has("A100")) return "dgx-a100";
  return std::nullopt;
}

}  // namespace megascope::cli
