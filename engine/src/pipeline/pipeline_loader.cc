#include "pipeline/pipeline_loader.h"

#include <google/protobuf/descriptor.h>

#include "core/atomic_file.h"
#include "engine/paths.h"
#include "pipeline/pipeline_parser.h"
#include "pipeline/validator.h"

namespace engine {
namespace {

// Loads the libraries and directories the pipeline itself names.
void LoadPipelinePlugins(const proto::Pipeline& header, const std::filesystem::path& base_dir,
                         const SourceMap& map, PluginRegistry* registry, Diagnostics* diagnostics) {
  const auto* root = proto::Pipeline::descriptor();
  for (int i = 0; i < header.plugin_path_size(); ++i) {
    Status status = registry->LoadDirectory(ResolvePath(base_dir, header.plugin_path(i)));
    if (!status.ok()) {
      diagnostics->Add(map.Locate(root, "plugin_path[" + std::to_string(i) + "]"),
                       status.message());
    }
  }
  for (int i = 0; i < header.plugin_library_size(); ++i) {
    Status status = registry->LoadLibrary(ResolvePath(base_dir, header.plugin_library(i)));
    if (!status.ok()) {
      diagnostics->Add(map.Locate(root, "plugin_library[" + std::to_string(i) + "]"),
                       status.message());
    }
  }
}

// What the plugin reference at `ref_path` ("stage[i].<field>[j]", or the pipeline's callback[j])
// takes as options, for the error about an unknown options type: "; data loader 'digits' takes
// 'engine.plugins.DigitsOptions'", or that no such plugin is installed; empty when unknown.
std::string OptionsTypeHint(const proto::Pipeline& header, const std::string& ref_path,
                            const PluginRegistry& registry) {
  std::vector<FieldPathStep> steps = SplitFieldPath(ref_path);
  const google::protobuf::Message* owner = &header;
  if (steps.size() == 2 && steps[0].name == "stage" && steps[0].index >= 0 &&
      steps[0].index < header.stage_size()) {
    owner = &header.stage(steps[0].index);
    steps.erase(steps.begin());
  }
  if (steps.size() != 1) return "";
  const std::optional<PluginKind> kind = KindOfStageField(steps[0].name);
  const auto* field = owner->GetDescriptor()->FindFieldByName(steps[0].name);
  if (!kind.has_value() || field == nullptr ||
      field->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
    return "";
  }
  const std::string title(PluginKindTitle(kind.value()));
  const auto* reflection = owner->GetReflection();
  const google::protobuf::Message& ref =
      field->is_repeated()
          ? reflection->GetRepeatedMessage(*owner, field, std::max(steps[0].index, 0))
          : reflection->GetMessage(*owner, field);
  const auto* plugin_field = ref.GetDescriptor()->FindFieldByName("plugin");
  const std::string plugin = ref.GetReflection()->GetString(ref, plugin_field);
  if (const PluginRegistry::Entry* entry = registry.Find(kind.value(), plugin)) {
    return "; " + title + " '" + plugin + "' takes '" +
           entry->plugin->default_options().GetDescriptor()->full_name() + "'";
  }
  if (plugin.empty()) return "";
  return ", and no " + title + " plugin '" + plugin + "' is installed (see `engine plugins`)";
}

// Before the full parse: every options type must be known, or the parser stops at the first unknown
// one with a message that cannot say which plugin was meant.
bool CheckOptionTypes(const proto::Pipeline& header, const SourceMap& map,
                      const PluginRegistry& registry, Diagnostics* diagnostics) {
  bool ok = true;
  const auto* pool = google::protobuf::DescriptorPool::generated_pool();
  ForEachAny(header, [&](const std::string& path, const google::protobuf::Any& any) {
    const std::string type = TypeNameFromUrl(any.type_url());
    if (pool->FindMessageTypeByName(type) != nullptr) return;
    ok = false;
    // path is "stage[i].<field>[j].options"; find the plugin reference it belongs to.
    std::string message = "options type '" + type + "' is not defined by any loaded plugin";
    message += OptionsTypeHint(header, path.substr(0, path.rfind('.')), registry);
    diagnostics->Add(map.Locate(proto::Pipeline::descriptor(), path), message);
  });
  return ok;
}

}  // namespace

std::optional<PluginKind> KindOfStageField(std::string_view field) {
  if (field == "model") return PluginKind::kModelLoader;
  if (field == "data") return PluginKind::kDataLoader;
  if (field == "quantizer") return PluginKind::kQuantizer;
  if (field == "adapter") return PluginKind::kAdapter;
  if (field == "precision") return PluginKind::kPrecisionPolicy;
  if (field == "callback") return PluginKind::kCallback;
  return std::nullopt;
}

std::unique_ptr<ResolvedPipeline> LoadPipeline(const std::filesystem::path& file,
                                               const LoadOptions& options, PluginRegistry* registry,
                                               Diagnostics* diagnostics) {
  const std::string display = file.string();
  StatusOr<std::string> text = ReadFile(file);
  if (!text.ok()) {
    diagnostics->Add({display, 0, 0}, "cannot read the pipeline: " + text.status().message());
    return nullptr;
  }
  std::error_code ec;
  std::filesystem::path absolute = std::filesystem::absolute(file, ec);
  const std::filesystem::path base_dir = absolute.lexically_normal().parent_path();

  proto::Pipeline header;
  SourceMap header_map(display, *text);
  if (!ParsePipelineHeader(display, *text, &header, &header_map, diagnostics)) return nullptr;

  LoadPipelinePlugins(header, base_dir, header_map, registry, diagnostics);
  if (!CheckOptionTypes(header, header_map, *registry, diagnostics)) return nullptr;
  if (!diagnostics->empty()) return nullptr;

  auto pipeline = std::make_unique<ResolvedPipeline>();
  pipeline->file = file;
  pipeline->base_dir = base_dir;
  pipeline->source_map = std::make_unique<SourceMap>(display, *text);
  if (!ParsePipeline(display, *text, &pipeline->config, pipeline->source_map.get(), diagnostics)) {
    return nullptr;
  }
  ValidatePipeline(options, *registry, pipeline.get(), diagnostics);
  if (!diagnostics->empty()) return nullptr;
  return pipeline;
}

}  // namespace engine
