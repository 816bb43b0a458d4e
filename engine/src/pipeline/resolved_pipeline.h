// A pipeline after it has been read and checked: every plugin reference bound to a loaded plugin
// and its options unpacked into the plugin's own message, paths made absolute, stages in run order.
//
// Everything here is immutable once LoadPipeline returns it; plans and runs only read it.
#pragma once

#include <google/protobuf/message.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/pipeline.pb.h"
#include "pipeline/source_map.h"
#include "plugins/plugin_registry.h"

namespace engine {

// "stage 'x'": how every message about a stage names it.
inline std::string StageSubject(const std::string& stage) { return "stage '" + stage + "'"; }

struct ResolvedPluginRef {
  const PluginRegistry::Entry* entry = nullptr;
  // Of the type of entry->plugin->default_options(), holding the pipeline's values over the
  // defaults.
  std::unique_ptr<google::protobuf::Message> options;
  // Field path of the reference, e.g. "stage[0].data", for error positions.
  std::string path;
  // "stage 'train' data loader 'digits'", the context put in front of this plugin's errors.
  std::string context;
};

struct ResolvedCallback {
  ResolvedPluginRef ref;
  proto::CallbackRef::OnError on_error = proto::CallbackRef::DISABLE;
};

struct DeviceChoice {
  // "cpu" or "cuda:N".
  std::string device;
  // Why, for the plan: "requested", "auto: no CUDA in this LibTorch", ...
  std::string reason;
};

struct ResolvedStage {
  int index = 0;  // in the file
  std::string name;
  const proto::Stage* config = nullptr;
  uint64_t seed = 0;
  ResolvedPluginRef model;
  ResolvedPluginRef data;
  ResolvedPluginRef precision;
  // entry is null when the stage names no quantizer.
  ResolvedPluginRef quantizer;
  std::vector<ResolvedPluginRef> adapters;
  std::vector<ResolvedCallback> callbacks;
  // Stages that must finish first (after + from_stage), by index.
  std::vector<int> dependencies;
  // Index of the stage whose final weights this one starts from, if any.
  std::optional<int> from_stage;
  DeviceChoice device;
  // When its `pretrained` directory was moved (LoadOptions::moved_pretrained): the value the file
  // gave and the directory it resolved to, which the stage's fingerprint keeps. Empty otherwise.
  std::string pretrained_as_written;
  std::filesystem::path pretrained_moved_from;

  std::string path() const { return "stage[" + std::to_string(index) + "]"; }
  std::string subject() const { return StageSubject(name); }
};

struct ResolvedPipeline {
  std::string name;
  std::filesystem::path file;      // as given
  std::filesystem::path base_dir;  // absolute directory of the file
  std::filesystem::path output_dir;
  uint64_t seed = 0;
  proto::Pipeline config;
  std::unique_ptr<SourceMap> source_map;
  std::vector<ResolvedCallback> callbacks;  // the pipeline's own
  std::vector<ResolvedStage> stages;        // file order
  std::vector<int> run_order;               // indices into stages, dependencies first

  SourceLocation Locate(std::string_view path) const {
    return source_map->Locate(proto::Pipeline::descriptor(), path);
  }
};

}  // namespace engine
