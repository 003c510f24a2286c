// Pipeline layouts: what each virtual stage of the pipeline holds (transformer
// layers, the embedding, the output layer with the loss, the MTP layers), and
// Megatron-Core's layout string (--pipeline-model-parallel-layout).
//
// The layout string lists the virtual stages in forward order, separated by
// '|'; each stage is a sequence of E (embedding), t (transformer layer), m
// (MTP layer) and L (output layer and loss). "X*n" repeats one character,
// "(...)*n" repeats a group, and commas are cosmetic, as in Megatron-Core's
// PipelineParallelLayerLayout.parse_str_to_list (no spaces: Megatron-Core
// refuses them). Example (DeepSeek-V3,
// pp 16, vpp 2): "Et*3|(tt|)*29,m|L".
//
// Setup (core/setup.hpp) turns every way a plan can place layers (even
// split, uneven first/last stages, embedding and loss counted in the split,
// a layout string) into one vector of LayoutStage, and every consumer reads
// that.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/result.hpp"

namespace megascope {

struct LayoutStage {
  int decoders = 0;        // transformer layers
  bool embedding = false;  // the word (and position) embedding
  bool loss = false;       // the output layer and the loss
  int mtp = 0;             // multi-token-prediction layers
  bool operator==(const LayoutStage&) const = default;
};

// The longest layout string accepted once expanded (a guard against
// "t*999999999"); far above any real model's layer count.
inline constexpr std::size_t kMaxLayoutLength = 1u << 20;
// The most virtual stages a layout may have (pipeline transfers are tagged
// with the stage in 20 bits; no real pipeline comes near).
inline constexpr std::size_t kMaxLayoutStages = 1u << 16;

// Parses a layout string into its virtual stages in forward order. Checks the
// syntax only (characters, repetitions, parentheses); what the stages must
// hold for a model is checked by validate_setup. Errors name `field` and the
// offending position.
Result<std::vector<LayoutStage>> parse_pipeline_layout(std::string_view text, const std::string& field);

// A compact layout string for the stages: runs of a character as "t*n"
// (three or more), runs of equal stages as "(...|)*n" (two or more);
// parse_pipeline_layout gives the stages back.
std::string format_pipeline_layout(const std::vector<LayoutStage>& stages);

}  // namespace megascope
