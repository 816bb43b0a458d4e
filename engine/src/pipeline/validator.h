// The checks that need no model and no data: names, the stage graph, plugin bindings and their
// options, and every value range in the pipeline language. Fills in `pipeline` (name, output_dir,
// stages, run order) and reports each problem with its position.
#pragma once

#include "pipeline/diagnostics.h"
#include "pipeline/pipeline_loader.h"
#include "pipeline/resolved_pipeline.h"
#include "plugins/plugin_registry.h"

namespace engine {

void ValidatePipeline(const LoadOptions& options, const PluginRegistry& registry,
                      ResolvedPipeline* pipeline, Diagnostics* diagnostics);

// Empty when `dir` exists as a writable directory or can be created; otherwise why not.
std::string OutputDirProblem(const std::filesystem::path& dir);

}  // namespace engine
