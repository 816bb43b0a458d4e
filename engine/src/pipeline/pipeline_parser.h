// Reading a pipeline file in two passes.
//
// Pass 1 (ParsePipelineHeader) runs before any plugin is loaded, so the types of plugin options are
// not yet known: it reads the file with every options body skipped, which is enough to learn the
// pipeline's own plugin libraries and search paths, and to report syntax errors. Pass 2
// (ParsePipeline) runs after the plugins are loaded, when their option messages are in the
// descriptor pool, and reads everything.
//
// Both report errors as "file:line:col" diagnostics and return false when there are any.
#pragma once

#include <google/protobuf/any.pb.h>

#include <functional>
#include <string>

#include "engine/pipeline.pb.h"
#include "pipeline/diagnostics.h"
#include "pipeline/source_map.h"

namespace engine {

bool ParsePipelineHeader(const std::string& file, const std::string& text, proto::Pipeline* header,
                         SourceMap* map, Diagnostics* diagnostics);

bool ParsePipeline(const std::string& file, const std::string& text, proto::Pipeline* pipeline,
                   SourceMap* map, Diagnostics* diagnostics);

// Calls `visit(path, any)` for every google.protobuf.Any set anywhere in `message`, with canonical
// paths ("stage[0].data.options").
void ForEachAny(
    const google::protobuf::Message& message,
    const std::function<void(const std::string& path, const google::protobuf::Any& any)>& visit);

// The message name in a type URL: "type.googleapis.com/a.B" -> "a.B".
std::string TypeNameFromUrl(const std::string& type_url);

}  // namespace engine
