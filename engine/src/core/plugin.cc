#include <array>

#include "engine/plugin.h"

namespace engine {
namespace {

struct KindNames {
  PluginKind kind;
  std::string_view name;
  std::string_view title;
};

constexpr std::array<KindNames, 6> kKinds = {{
    {PluginKind::kModelLoader, ENGINE_KIND_MODEL_LOADER, "model loader"},
    {PluginKind::kDataLoader, ENGINE_KIND_DATA_LOADER, "data loader"},
    {PluginKind::kQuantizer, ENGINE_KIND_QUANTIZER, "quantizer"},
    {PluginKind::kAdapter, ENGINE_KIND_ADAPTER, "adapter"},
    {PluginKind::kPrecisionPolicy, ENGINE_KIND_PRECISION_POLICY, "precision policy"},
    {PluginKind::kCallback, ENGINE_KIND_CALLBACK, "callback"},
}};

}  // namespace

std::string_view PluginKindName(PluginKind kind) {
  for (const auto& k : kKinds) {
    if (k.kind == kind) return k.name;
  }
  return "unknown";
}

std::string_view PluginKindTitle(PluginKind kind) {
  for (const auto& k : kKinds) {
    if (k.kind == kind) return k.title;
  }
  return "unknown";
}

std::optional<PluginKind> PluginKindFromName(std::string_view name) {
  for (const auto& k : kKinds) {
    if (k.name == name) return k.kind;
  }
  return std::nullopt;
}

}  // namespace engine
