#include "core/module_names.h"

namespace engine {

std::string TransformersModuleName(const std::string& name, const ModulePrefixes& prefixes) {
  for (const auto& [ours, theirs] : prefixes) {
    if (name.rfind(ours, 0) == 0) return theirs + name.substr(ours.size());
  }
  return name;
}

}  // namespace engine
