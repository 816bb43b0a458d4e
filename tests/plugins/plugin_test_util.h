// Helpers for testing built-in plugins through the registry, as the engine uses them.
#pragma once

#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "plugins/plugin_registry.h"
#include "testing/test_paths.h"

namespace engine::testing {

inline PluginRegistry& BuiltinRegistry() {
  static PluginRegistry* registry = [] {
    auto* r = new PluginRegistry();
    Status s = r->LoadDirectory(kBuiltinPluginDir);
    EXPECT_TRUE(s.ok()) << s.message();
    return r;
  }();
  return *registry;
}

template <typename PluginType>
const PluginType& BuiltinPlugin(PluginKind kind, const std::string& name) {
  const PluginRegistry::Entry* entry = BuiltinRegistry().Find(kind, name);
  EXPECT_NE(entry, nullptr) << name;
  return static_cast<const PluginType&>(*entry->plugin);
}

// The plugin's options with `text` (protobuf text format) over the defaults.
inline std::unique_ptr<google::protobuf::Message> Options(const Plugin& plugin,
                                                          const std::string& text) {
  std::unique_ptr<google::protobuf::Message> options(plugin.default_options().New());
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, options.get())) << text;
  return options;
}

}  // namespace engine::testing
