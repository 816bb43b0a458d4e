// libFuzzer target: a pipeline file (pipeline/: both parser passes, the source map that places
// errors at file:line:col, and the diagnostics printed for them), as `engine check` reads it
// before any plugin is involved.
#include <cstddef>
#include <cstdint>
#include <string>

#include "pipeline/pipeline_parser.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  engine::Diagnostics diagnostics;
  engine::proto::Pipeline header;
  engine::SourceMap header_map("fuzz.pbtxt", text);
  if (engine::ParsePipelineHeader("fuzz.pbtxt", text, &header, &header_map, &diagnostics)) {
    engine::proto::Pipeline pipeline;
    engine::SourceMap map("fuzz.pbtxt", text);
    if (engine::ParsePipeline("fuzz.pbtxt", text, &pipeline, &map, &diagnostics)) {
      engine::ForEachAny(pipeline, [&](const std::string& path, const google::protobuf::Any&) {
        map.Locate(engine::proto::Pipeline::descriptor(), path);
      });
    }
  }
  diagnostics.ToString();
  return 0;
}
