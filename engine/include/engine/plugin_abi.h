/* The plain-C face of a plugin library: what the engine reads before it touches any C++ symbol.
 *
 * Every plugin library exports two C functions:
 *
 *   const EnginePluginManifest* engine_plugin_manifest(void);
 *   int engine_plugin_register(void* registrar);
 *
 * The engine opens the library, calls `engine_plugin_manifest` and compares the manifest with
 * itself (API version, LibTorch version, C++ ABI, protobuf version). Only when they agree does it
 * call `engine_plugin_register`, passing its `engine::PluginRegistrar*`; from then on the two sides
 * speak C++. A mismatch is reported as a plain error naming the library and the field, never a
 * crash.
 *
 * Plugin authors do not write these by hand: `ENGINE_PLUGIN(...)` in engine/plugin.h defines both.
 *
 * Compatibility: fields are only ever appended. `struct_size` tells the engine how many a library
 * filled in. `api_version` changes when the C++ plugin interfaces change incompatibly.
 */
#ifndef ENGINE_PLUGIN_ABI_H_
#define ENGINE_PLUGIN_ABI_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The plugin interface version this SDK speaks. 12: Model gained EvaluatesBlockByBlock() (whether
   a shard_level 3 stage may evaluate a batch a block at a time), a new virtual function. 11: videos
   travel in batches (image_batch.h: ExampleImages and ImagesOfBatch gained the seconds of a video's
   temporal patch) and the Qwen2-VL image processor reads video processors (new members). 10:
   ModelContext gained plan_only (a plugin built against it reads the field, which an engine of API
   9 does not pass). 9: Model gained blocks() (the modules a model runs through RunBlock,
   engine/model_block.h, which a stage at shard_level 3 gathers one at a time), a new virtual
   function. 8: AdapterPlugin gained SavedModelTensors().
 */
#define ENGINE_PLUGIN_API_VERSION 12

#define ENGINE_PLUGIN_MANIFEST_SYMBOL "engine_plugin_manifest"
#define ENGINE_PLUGIN_REGISTER_SYMBOL "engine_plugin_register"

/* Plugin kinds, as spelled in manifests. */
#define ENGINE_KIND_MODEL_LOADER "model_loader"
#define ENGINE_KIND_DATA_LOADER "data_loader"
#define ENGINE_KIND_QUANTIZER "quantizer"
#define ENGINE_KIND_ADAPTER "adapter"
#define ENGINE_KIND_PRECISION_POLICY "precision_policy"
#define ENGINE_KIND_CALLBACK "callback"

typedef struct EnginePluginManifest {
  /* sizeof(EnginePluginManifest) in the SDK the plugin was built with. */
  uint32_t struct_size;
  /* ENGINE_PLUGIN_API_VERSION the plugin was built with. */
  uint32_t api_version;
  /* The name pipelines use, e.g. "digits". Letters, digits, '_', '-' and '.'. */
  const char* name;
  /* One of the ENGINE_KIND_* strings. */
  const char* kind;
  /* The plugin's own version, e.g. "0.1.0". */
  const char* version;
  /* One line saying what the plugin does. */
  const char* description;
  /* TORCH_VERSION of the LibTorch headers the plugin was compiled against, e.g. "1.13.0". */
  const char* torch_version;
  /* _GLIBCXX_USE_CXX11_ABI at compile time (1 or 0), or -1 when not built with libstdc++. */
  int32_t cxx11_abi;
  /* GOOGLE_PROTOBUF_VERSION at compile time, e.g. 3021012. */
  int32_t protobuf_version;
} EnginePluginManifest;

typedef const EnginePluginManifest* (*EnginePluginManifestFn)(void);
/* Returns 0 on success. On failure the registrar holds the reason. */
typedef int (*EnginePluginRegisterFn)(void* registrar);

#ifdef __cplusplus
}
#endif

#endif /* ENGINE_PLUGIN_ABI_H_ */
