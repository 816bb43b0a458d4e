// The C++ plugin interface shared by every plugin kind, and ENGINE_PLUGIN, which makes a shared
// library a plugin.
//
// A plugin library holds exactly one plugin. Its author derives from the interface of the kind
// (DataLoaderPlugin in engine/data.h, ModelLoaderPlugin in engine/model.h, QuantizerPlugin in
// engine/quantizer.h, AdapterPlugin in engine/adapter.h, PrecisionPolicyPlugin in
// engine/precision.h, CallbackPlugin in engine/callback.h) and ends one .cc file with:
//
//   ENGINE_PLUGIN("digits", ENGINE_KIND_DATA_LOADER, "0.1.0",
//                 "The 1,797 8x8 handwritten digits from scikit-learn", DigitsLoader)
//
// The engine creates the plugin object once, when it loads the library, and keeps it (and the
// library) until the process ends. Its const methods may be called from several threads at once.
//
// Errors: plugin methods return Status / StatusOr with a message for the user; they must not throw.
// The engine still guards every call, including the ones that return plain values (a dataset's
// description(), a model's architecture() and config_json(), a quantizer's targets(), the objects
// they return), and reports an escaped exception as an error of that plugin. Plain accessors are
// asked once, when the stage is planned, and their answers kept.
#pragma once

#include <google/protobuf/message.h>

#include <cassert>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/plugin_abi.h"
#include "engine/status.h"
#include "engine/torch_compat.h"

namespace engine {

enum class PluginKind {
  kModelLoader,
  kDataLoader,
  kQuantizer,
  kAdapter,
  kPrecisionPolicy,
  kCallback,
};

// "model_loader", ... as in manifests (ENGINE_KIND_*).
std::string_view PluginKindName(PluginKind kind);
// "model loader", ... for messages.
std::string_view PluginKindTitle(PluginKind kind);
std::optional<PluginKind> PluginKindFromName(std::string_view name);

// Problems a plugin finds in its options. Each names the field by its path inside the options
// message
// ("eval_fraction", "layers[1].width"); the engine turns it into "file:line:col: ...".
class OptionErrors {
 public:
  struct Entry {
    std::string field_path;
    std::string message;
  };
  void Add(std::string field_path, std::string message) {
    entries_.push_back({std::move(field_path), std::move(message)});
  }
  bool empty() const { return entries_.empty(); }
  const std::vector<Entry>& entries() const { return entries_; }

 private:
  std::vector<Entry> entries_;
};

class Plugin {
 public:
  virtual ~Plugin() = default;

  virtual PluginKind kind() const = 0;

  // An instance of the options message with its defaults. Its type is the one pipelines must use in
  // `options { [type.googleapis.com/<type>] {...} }`; the engine refuses any other. A plugin
  // without options returns google::protobuf::Empty::default_instance().
  virtual const google::protobuf::Message& default_options() const = 0;

  // Checks values the schema cannot (ranges, combinations) without side effects. Fields marked
  // `(engine.required) = true` are checked by the engine before this is called.
  virtual void ValidateOptions(const google::protobuf::Message& options,
                               OptionErrors* errors) const {
    (void)options;
    (void)errors;
  }
};

// The engine's side of registration; a library's entry point receives one.
class PluginRegistrar {
 public:
  virtual ~PluginRegistrar() = default;
  // Takes the library's plugin. Called once.
  virtual void Register(std::unique_ptr<Plugin> plugin) = 0;
  // Records why registration failed.
  virtual void Fail(std::string message) = 0;
};

// The options a plugin receives are always made from its default_options(), so their static type is
// the plugin's own message.
template <typename Options>
const Options& OptionsAs(const google::protobuf::Message& options) {
  assert(options.GetDescriptor() == Options::descriptor());
  return static_cast<const Options&>(options);
}

namespace internal {

// The body of engine_plugin_register: builds the plugin, and turns anything thrown into a failure
// reported through the registrar, so no exception leaves the library.
inline int RegisterPluginInstance(void* registrar_handle,
                                  const std::function<std::unique_ptr<Plugin>()>& make) {
  auto* registrar = static_cast<PluginRegistrar*>(registrar_handle);
  try {
    std::unique_ptr<Plugin> plugin = make();
    if (plugin == nullptr) {
      registrar->Fail("the plugin factory returned no plugin");
      return 1;
    }
    registrar->Register(std::move(plugin));
    return 0;
  } catch (const std::exception& e) {
    registrar->Fail(std::string("registration threw: ") + e.what());
  } catch (...) {
    registrar->Fail("registration threw a non-standard exception");
  }
  return 1;
}

}  // namespace internal
}  // namespace engine

#if defined(_GLIBCXX_USE_CXX11_ABI)
#define ENGINE_CXX11_ABI_VALUE _GLIBCXX_USE_CXX11_ABI
#else
#define ENGINE_CXX11_ABI_VALUE (-1)
#endif

#define ENGINE_PLUGIN_EXPORT extern "C" __attribute__((visibility("default")))

// Defines the library's manifest and registration entry point. CLASS must be default-constructible.
#define ENGINE_PLUGIN(NAME, KIND, VERSION, DESCRIPTION, CLASS)                     \
  ENGINE_PLUGIN_EXPORT const EnginePluginManifest* engine_plugin_manifest(void) {  \
    static const EnginePluginManifest manifest = {sizeof(EnginePluginManifest),    \
                                                  ENGINE_PLUGIN_API_VERSION,       \
                                                  NAME,                            \
                                                  KIND,                            \
                                                  VERSION,                         \
                                                  DESCRIPTION,                     \
                                                  TORCH_VERSION,                   \
                                                  ENGINE_CXX11_ABI_VALUE,          \
                                                  GOOGLE_PROTOBUF_VERSION};        \
    return &manifest;                                                              \
  }                                                                                \
  ENGINE_PLUGIN_EXPORT int engine_plugin_register(void* registrar) {               \
    return ::engine::internal::RegisterPluginInstance(                             \
        registrar, [] { return std::unique_ptr<::engine::Plugin>(new CLASS()); }); \
  }
