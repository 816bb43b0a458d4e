// From a pipeline file to a ResolvedPipeline: read, parse (two passes), load the pipeline's own
// plugins, bind every plugin reference and check every value.
//
//   PluginRegistry registry;
//   registry.LoadSearchPath(PluginSearchPath(flag_dirs));
//   Diagnostics diagnostics;
//   std::unique_ptr<ResolvedPipeline> pipeline =
//       LoadPipeline("pipelines/digits_mlp.pbtxt", {}, &registry, &diagnostics);
//   if (pipeline == nullptr) std::cerr << diagnostics.ToString();
//
// All problems that can be found without building models or opening data are reported together,
// each with its position. Nothing is written to disk.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>

#include "pipeline/diagnostics.h"
#include "pipeline/resolved_pipeline.h"
#include "plugins/plugin_registry.h"

namespace engine {

struct LoadOptions {
  // Replaces the pipeline's output_dir (already absolute or relative to the working directory).
  std::optional<std::filesystem::path> output_dir;
  // Asked for each stage whose model reads a `pretrained` directory (absolute, lexically normal),
  // before the model's options are checked: where the stage's base is now when it is no longer
  // there (run/moved_bases.h), which the stage then reads instead; nothing to leave it. The
  // pipeline's output_dir is resolved by then.
  using BaseFinder = std::function<std::optional<std::filesystem::path>(
      const ResolvedPipeline& pipeline, const ResolvedStage& stage,
      const std::filesystem::path& pretrained_dir)>;
  BaseFinder find_moved_base;
};

std::unique_ptr<ResolvedPipeline> LoadPipeline(const std::filesystem::path& file,
                                               const LoadOptions& options, PluginRegistry* registry,
                                               Diagnostics* diagnostics);

// The plugin kind referenced by a field of Stage ("model" -> model loader, ...), if any.
std::optional<PluginKind> KindOfStageField(std::string_view field);

}  // namespace engine
