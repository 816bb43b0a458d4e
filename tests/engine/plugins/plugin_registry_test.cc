#include "plugins/plugin_registry.h"

#include <gtest/gtest.h>

#include "engine/data.h"
#include "engine/model.h"
#include "engine/tokenizer.pb.h"
#include "plugins/plugin_library.h"
#include "plugins/search_path.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

// Data loaders digits, text, digits_captions and chat; models mlp, llama, vlm, qwen2_vl,
// qwen2_5_vl and qwen3_vl; quantizers nf4 and int8; the lora adapter; six precision policies and
// six callbacks.
constexpr size_t kBuiltinPlugins = 25;

std::filesystem::path PluginFixture(const std::string& name) {
  return std::filesystem::path(testing::kTestPluginDir) / name / ("engine_" + name + ".so");
}

std::string LoadError(const std::string& fixture) {
  auto loaded = LoadPluginLibrary(PluginFixture(fixture));
  return loaded.ok() ? std::string("(loaded)") : loaded.status().message();
}

TEST(PluginLibraryTest, LoadsABuiltinPlugin) {
  auto loaded =
      LoadPluginLibrary(std::filesystem::path(testing::kBuiltinPluginDir) / "engine_digits.so");
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  EXPECT_EQ(loaded->name, "digits");
  EXPECT_EQ(loaded->kind, PluginKind::kDataLoader);
  EXPECT_EQ(loaded->version, "0.1.0");
  EXPECT_FALSE(loaded->description.empty());
  ASSERT_NE(loaded->plugin, nullptr);
  EXPECT_EQ(loaded->plugin->default_options().GetDescriptor()->full_name(),
            "engine.plugins.DigitsOptions");
}

TEST(PluginLibraryTest, WrongApiVersionIsRefusedBeforeRegistration) {
  const std::string error = LoadError("wrong_api");
  EXPECT_NE(error.find("engine_wrong_api.so"), std::string::npos) << error;
  EXPECT_NE(error.find("built for engine plugin API 999"), std::string::npos) << error;
  EXPECT_NE(error.find("this engine speaks API " + std::to_string(ENGINE_PLUGIN_API_VERSION)),
            std::string::npos)
      << error;
}

TEST(PluginLibraryTest, WrongCxxAbiIsRefused) {
  const std::string error = LoadError("wrong_abi");
  EXPECT_NE(error.find("_GLIBCXX_USE_CXX11_ABI"), std::string::npos) << error;
}

TEST(PluginLibraryTest, WrongLibTorchIsRefused) {
  const std::string error = LoadError("wrong_torch");
  EXPECT_NE(error.find("built against LibTorch 0.4.1"), std::string::npos) << error;
  EXPECT_NE(error.find(compat::kTorchVersion), std::string::npos) << error;
}

TEST(PluginLibraryTest, MissingEntryPointIsNamed) {
  const std::string error = LoadError("no_entry");
  EXPECT_NE(error.find("exports no 'engine_plugin_register' entry point"), std::string::npos)
      << error;
}

TEST(PluginLibraryTest, LibraryWithoutManifestIsNotAPlugin) {
  const std::string error = LoadError("no_manifest");
  EXPECT_NE(error.find("is not an engine plugin"), std::string::npos) << error;
}

TEST(PluginLibraryTest, FileThatIsNotASharedLibrary) {
  const std::string error = LoadError("not_a_library");
  EXPECT_NE(error.find("cannot load plugin library"), std::string::npos) << error;
  EXPECT_NE(error.find("engine_not_a_library.so"), std::string::npos) << error;
}

TEST(PluginLibraryTest, UndefinedSymbolIsNamed) {
  const std::string error = LoadError("undefined_symbol");
  EXPECT_NE(error.find("engine_fixture_symbol_nobody_defines"), std::string::npos) << error;
}

TEST(PluginLibraryTest, ThrowingRegistrationIsAnErrorNotACrash) {
  const std::string error = LoadError("throwing_register");
  EXPECT_NE(error.find("registration failed"), std::string::npos) << error;
  EXPECT_NE(error.find("the fixture refuses to be built"), std::string::npos) << error;
}

TEST(PluginLibraryTest, KindMustMatchTheManifest) {
  const std::string error = LoadError("wrong_kind");
  EXPECT_NE(error.find("the manifest says it is a callback but it registered a data loader"),
            std::string::npos)
      << error;
}

TEST(PluginLibraryTest, ProtoClashAbortsOnlyTheProbeNotTheEngine) {
  PluginRegistry registry;
  ASSERT_TRUE(registry.LoadDirectory(testing::kBuiltinPluginDir).ok());
  Status clash = registry.LoadLibrary(PluginFixture("proto_clash"));
  ASSERT_FALSE(clash.ok());
  EXPECT_NE(clash.message().find("engine_proto_clash.so"), std::string::npos) << clash.message();
  EXPECT_NE(clash.message().find("crashed ("), std::string::npos) << clash.message();
  EXPECT_NE(clash.message().find(") while its static initialisers ran"), std::string::npos)
      << clash.message();
  EXPECT_NE(clash.message().find("digits_options.proto"), std::string::npos) << clash.message();
  // This process is intact and still has the built-in plugin.
  EXPECT_NE(registry.Find(PluginKind::kDataLoader, "digits"), nullptr);
  EXPECT_EQ(registry.Find(PluginKind::kDataLoader, "proto_clash"), nullptr);
}

TEST(PluginLibraryTest, ManifestEntryPointThatSegfaultsIsNamedAndSkipped) {
  PluginRegistry registry;
  ASSERT_TRUE(registry.LoadDirectory(testing::kBuiltinPluginDir).ok());
  ASSERT_TRUE(registry.LoadDirectory(PluginFixture("crashing_manifest").parent_path()).ok());
  ASSERT_EQ(registry.skipped().size(), 1u);
  const std::string& error = registry.skipped()[0];
  EXPECT_NE(error.find("engine_crashing_manifest.so"), std::string::npos) << error;
  EXPECT_NE(error.find("crashed (Segmentation fault) in its engine_plugin_manifest()"),
            std::string::npos)
      << error;
  // This process is intact and its other plugins are usable.
  EXPECT_NE(registry.Find(PluginKind::kDataLoader, "digits"), nullptr);
}

TEST(PluginLibraryTest, RegisterEntryPointThatSegfaultsIsNamed) {
  const std::string error = LoadError("crashing_register");
  EXPECT_NE(error.find("engine_crashing_register.so"), std::string::npos) << error;
  EXPECT_NE(error.find("crashed (Segmentation fault) in its engine_plugin_register()"),
            std::string::npos)
      << error;
}

TEST(PluginLibraryTest, MissingFile) {
  auto loaded = LoadPluginLibrary("/nonexistent/engine_x.so");
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), StatusCode::kNotFound);
  EXPECT_NE(loaded.status().message().find("does not exist"), std::string::npos);
}

TEST(PluginRegistryTest, DuplicateNamesBothLibraries) {
  PluginRegistry registry;
  ASSERT_TRUE(registry.LoadDirectory(testing::kBuiltinPluginDir).ok());
  Status dup = registry.LoadLibrary(PluginFixture("dup_digits"));
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(dup.message().find("data loader plugin 'digits' is provided by two libraries"),
            std::string::npos)
      << dup.message();
  EXPECT_NE(dup.message().find("engine_digits.so"), std::string::npos) << dup.message();
  EXPECT_NE(dup.message().find("engine_dup_digits.so"), std::string::npos) << dup.message();
  // The first registration stays.
  EXPECT_EQ(registry.Find(PluginKind::kDataLoader, "digits")->version, "0.1.0");
}

TEST(PluginRegistryTest, SameLibraryTwiceIsLoadedOnce) {
  PluginRegistry registry;
  ASSERT_TRUE(registry.LoadDirectory(testing::kBuiltinPluginDir).ok());
  ASSERT_TRUE(registry.LoadDirectory(testing::kBuiltinPluginDir).ok());
  EXPECT_EQ(registry.All().size(), kBuiltinPlugins);
}

TEST(PluginRegistryTest, BrokenLibrariesInASearchedDirectoryAreSkippedWithTheReason) {
  PluginRegistry registry;
  ASSERT_TRUE(registry
                  .LoadSearchPath({testing::kBuiltinPluginDir,
                                   std::filesystem::path(testing::kTestPluginDir) / "wrong_api",
                                   std::filesystem::path(testing::kTestPluginDir) / "not_a_library",
                                   "/nonexistent-plugin-dir"})
                  .ok());
  EXPECT_EQ(registry.All().size(), kBuiltinPlugins);
  ASSERT_EQ(registry.skipped().size(), 2u);
  EXPECT_NE(registry.skipped()[0].find("API 999"), std::string::npos);
}

TEST(PluginRegistryTest, FindAndList) {
  PluginRegistry registry;
  ASSERT_TRUE(registry.LoadDirectory(testing::kBuiltinPluginDir).ok());
  EXPECT_NE(registry.Find(PluginKind::kModelLoader, "mlp"), nullptr);
  EXPECT_EQ(registry.Find(PluginKind::kDataLoader, "mlp"), nullptr);
  EXPECT_EQ(registry.FindByName("mlp").size(), 1u);
  EXPECT_EQ(registry.NamesOfKind(PluginKind::kCallback),
            (std::vector<std::string>{"checkpoint_every", "early_stopping", "memory_monitor",
                                      "metrics_jsonl", "progress", "tensorboard"}));
  EXPECT_EQ(registry.NamesOfKind(PluginKind::kQuantizer),
            (std::vector<std::string>{"int8", "nf4"}));
  EXPECT_EQ(registry.NamesOfKind(PluginKind::kAdapter), (std::vector<std::string>{"lora"}));
}

// A model loader of Llama checkpoints besides the built-in one.
class SecondLlamaLoader : public ModelLoaderPlugin {
 public:
  const google::protobuf::Message& default_options() const override {
    return proto::TokenizerOptions::default_instance();
  }
  StatusOr<std::unique_ptr<Model>> Create(const google::protobuf::Message&,
                                          const ModelContext&) const override {
    return InternalError("not built");
  }
  std::vector<std::string> model_types() const override { return {"qwen2"}; }
};

TEST(PluginRegistryTest, AModelDirectoryFindsTheLoaderThatDeclaresItsModelType) {
  PluginRegistry registry;
  ASSERT_TRUE(registry.LoadDirectory(testing::kBuiltinPluginDir).ok());
  for (const auto& [model_type, loader] :
       std::vector<std::pair<std::string, std::string>>{{"llama", "llama"},
                                                        {"mistral", "llama"},
                                                        {"qwen2", "llama"},
                                                        {"qwen3", "llama"},
                                                        {"qwen2_vl", "qwen2_vl"},
                                                        {"qwen2_5_vl", "qwen2_5_vl"},
                                                        {"qwen3_vl", "qwen3_vl"}}) {
    auto found = registry.FindModelLoaderFor(model_type);
    ASSERT_TRUE(found.ok()) << found.status().message();
    EXPECT_EQ((*found)->name, loader) << model_type;
  }
  auto missing = registry.FindModelLoaderFor("gpt2");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message(),
            "no installed model loader reads model_type 'gpt2' (the installed ones read llama, "
            "mistral, qwen2, qwen2_5_vl, qwen2_vl, qwen3, qwen3_vl; see `engine plugins`)");
  ASSERT_TRUE(registry
                  .Register("llama_too", "0.1.0", "another Llama loader", "",
                            std::make_unique<SecondLlamaLoader>())
                  .ok());
  auto twice = registry.FindModelLoaderFor("qwen2");
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.status().message(),
            "the model loaders 'llama' and 'llama_too' both read model_type 'qwen2'; remove one "
            "from the plugin path");
}

TEST(SearchPathTest, BuiltinThenFlagsThenEnvironment) {
  EXPECT_EQ(BuiltinPluginDir(), std::filesystem::path(testing::kBuiltinPluginDir));
  ::setenv("ENGINE_PLUGIN_PATH", "/env/a::/env/b", 1);
  auto dirs = PluginSearchPath({"/flag"});
  ::unsetenv("ENGINE_PLUGIN_PATH");
  ASSERT_EQ(dirs.size(), 4u);
  EXPECT_EQ(dirs[0], BuiltinPluginDir());
  EXPECT_EQ(dirs[1], "/flag");
  EXPECT_EQ(dirs[2], "/env/a");
  EXPECT_EQ(dirs[3], "/env/b");
}

}  // namespace
}  // namespace engine
