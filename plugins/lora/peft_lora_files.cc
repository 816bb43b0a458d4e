#include "peft_lora_files.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <tuple>

#include "engine/dtype.h"
#include "engine/json_key_reader.h"
#include "engine/untrusted_file.h"

namespace engine::plugins {
namespace {

constexpr size_t kMaxPatternLength = 1000;
constexpr char kPrefix[] = "base_model.model.";
const std::string kA = ".lora_A.weight", kB = ".lora_B.weight";

// Keys that say nothing about what the adapters compute, or say which layers have them (the
// tensors say that exactly).
const std::set<std::string>& NeutralKeys() {
  static const std::set<std::string> keys = {"base_model_name_or_path",
                                             "revision",
                                             "inference_mode",
                                             "auto_mapping",
                                             "peft_version",
                                             "runtime_config",
                                             "megatron_core",
                                             "qalora_group_size",
                                             "ensure_weight_tying",
                                             "loftq_config",
                                             "eva_config",
                                             "corda_config",
                                             "lora_ga_config",
                                             "target_modules",
                                             "exclude_modules",
                                             "layers_to_transform",
                                             "layers_pattern"};
  return keys;
}

// Keys PEFT 0.21 has that change the computation, with the value that leaves it LoRA's.
bool IsUnset(const nlohmann::json& value) {
  return value.is_null() || (value.is_boolean() && !value.get<bool>()) ||
         ((value.is_array() || value.is_object()) && value.empty());
}

const std::map<std::string, std::string>& UnsupportedKeys() {
  static const std::map<std::string, std::string> keys = {
      {"use_dora", "DoRA's magnitude vectors"},
      {"lora_bias", "biases on lora_B"},
      {"target_parameters", "adapters on parameters rather than linear layers"},
      {"trainable_token_indices", "trainable token embeddings"},
      {"fan_in_fan_out", "transposed (Conv1D) weights"},
      {"megatron_config", "Megatron's parallel layers"},
      {"velora_config", "VeLoRA"},
      {"alora_invocation_tokens", "activated LoRA"},
      {"use_qalora", "QA-LoRA's pooled inputs"},
      {"monteclora_config", "MonteCLoRA"},
      {"layer_replication", "replicated layers"},
      {"use_bdlora", "block-diagonal LoRA"},
      {"arrow_config", "Arrow routing"},
      {"kasa_config", "KaSA"}};
  return keys;
}

// PEFT's get_pattern_key: the first key for which "(.*\.)?(KEY)" matches the whole name.
template <typename Value>
StatusOr<const Value*> PatternValue(const std::vector<std::pair<std::string, Value>>& patterns,
                                    const std::string& field, const std::filesystem::path& file,
                                    const std::string& module_name) {
  for (const auto& [key, value] : patterns) {
    try {
      if (std::regex_match(module_name, std::regex("(.*\\.)?(" + key + ")"))) return &value;
    } catch (const std::exception& error) {
      return InvalidArgumentError(
          file.string() + ": " + field + " key '" + key +
          "' is not a regular expression this engine reads: " + error.what());
    }
  }
  return static_cast<const Value*>(nullptr);
}

template <typename Value>
Status ReadPatterns(const nlohmann::ordered_json& json, const std::string& field,
                    const JsonKeyReader& keys,
                    std::vector<std::pair<std::string, Value>>* patterns) {
  auto it = json.find(field);
  if (it == json.end() || it->is_null()) return Status::Ok();
  if (!it->is_object()) return keys.Error(field, "must be an object of pattern: value");
  for (auto entry = it->begin(); entry != it->end(); ++entry) {
    if (entry.key().empty() || entry.key().size() > kMaxPatternLength) {
      return keys.Error(field, "has a pattern of " + std::to_string(entry.key().size()) +
                                   " characters (1 to 1,000)");
    }
    const nlohmann::ordered_json& v = entry.value();
    if constexpr (std::is_integral_v<Value>) {
      if (!v.is_number_integer() || v.get<int64_t>() <= 0) {
        return keys.Error(field,
                          "'" + entry.key() + "' must be a positive integer, not " + v.dump());
      }
    } else if (!v.is_number() || !std::isfinite(v.get<double>())) {
      return keys.Error(field, "'" + entry.key() + "' must be a number, not " + v.dump());
    }
    patterns->emplace_back(entry.key(), v.get<Value>());
  }
  return Status::Ok();
}

bool EndsWith(const std::string& name, const std::string& suffix) {
  return name.size() > suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The module `name` (a tensor of the file) belongs to, without PEFT's prefix, when it is one of
// modules_to_save or, with bias "all" or "lora_only", a bias: as the model names it
// ("...q_proj.bias" for PEFT's "...q_proj.base_layer.bias"). Empty otherwise.
std::string SavedTensorName(const std::string& name, const PeftLoraConfig& config) {
  if (name.rfind(kPrefix, 0) != 0 || EndsWith(name, kA) || EndsWith(name, kB)) return "";
  std::string tensor = name.substr(std::strlen(kPrefix));
  const std::string kBaseLayerBias = ".base_layer.bias";
  if (config.bias != "none" && (EndsWith(tensor, ".bias") || tensor == "bias")) {
    if (EndsWith(tensor, kBaseLayerBias)) {
      tensor = tensor.substr(0, tensor.size() - kBaseLayerBias.size()) + ".bias";
    }
    return tensor;
  }
  const size_t dot = tensor.rfind('.');
  const std::string module = dot == std::string::npos ? "" : tensor.substr(0, dot);
  for (const std::string& saved : config.modules_to_save) {
    // PEFT wraps every module whose name ends with the entry.
    if (module == saved || EndsWith(module, "." + saved)) return tensor;
  }
  return "";
}

}  // namespace

StatusOr<PeftLoraConfig> ReadPeftLoraConfig(const std::filesystem::path& dir) {
  PeftLoraConfig config;
  config.file = dir / kPeftConfigFile;
  StatusOr<std::string> read = ReadUntrustedFile(config.file, FileKind::kConfig);
  if (read.status().code() == StatusCode::kNotFound) {
    return read.status().WithContext("peft_adapter names a directory PEFT's save_pretrained wrote");
  }
  ENGINE_ASSIGN_OR_RETURN(const std::string text, std::move(read));
  const auto json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  const auto ordered = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) return DataLossError(config.file.string() + " is not a JSON object");
  JsonKeyReader keys(json, config.file.string());
  const nlohmann::json& type = keys.Take("peft_type");
  if (!type.is_null() && type != "LORA") {
    return keys.Error("peft_type", "is " + type.dump() + "; the lora plugin reads LORA adapters");
  }
  const nlohmann::json& task = keys.Take("task_type");
  if (task.is_string()) config.task_type = task.get<std::string>();
  ENGINE_RETURN_IF_ERROR(keys.PositiveInt("r", &config.r));
  for (auto [key, out] : {std::pair{"lora_alpha", &config.lora_alpha},
                          std::pair{"lora_dropout", &config.lora_dropout}}) {
    const nlohmann::json& v = keys.Take(key);
    if (v.is_null()) continue;
    if (!v.is_number() || !std::isfinite(v.get<double>())) {
      return keys.Error(key, "must be a number, not " + v.dump());
    }
    *out = v.get<double>();
  }
  if (!(config.lora_dropout >= 0 && config.lora_dropout < 1)) {
    return keys.Error("lora_dropout", "must be in [0, 1)");
  }
  ENGINE_RETURN_IF_ERROR(keys.Bool("use_rslora", &config.use_rslora));
  keys.MarkRead("rank_pattern");
  keys.MarkRead("alpha_pattern");
  ENGINE_RETURN_IF_ERROR(ReadPatterns(ordered, "rank_pattern", keys, &config.rank_pattern));
  ENGINE_RETURN_IF_ERROR(ReadPatterns(ordered, "alpha_pattern", keys, &config.alpha_pattern));
  // PiSSA, OLoRA, CorDA, LoftQ, LoRA-GA and MiCA initialisations also rewrite the base weights
  // when PEFT loads the adapter (unless it was saved converted, which writes true): the adapter
  // then belongs to a base this stage does not have.
  const nlohmann::json& init = keys.Take("init_lora_weights");
  if (init.is_string()) {
    const std::string method = init.get<std::string>();
    for (const char* rewrites : {"pissa", "olora", "corda", "loftq", "lora_ga", "mica"}) {
      if (method.rfind(rewrites, 0) == 0) {
        return keys.Error("init_lora_weights",
                          "is \"" + method +
                              "\", which changes the base weights when PEFT loads the adapter; "
                              "save it with PEFT's path_initial_model_for_weight_conversion to get "
                              "an adapter for the original base");
      }
    }
  }
  const nlohmann::json& bias = keys.Take("bias");
  if (!bias.is_null()) {
    if (bias != "none" && bias != "all" && bias != "lora_only") {
      return keys.Error("bias",
                        "is " + bias.dump() + "; PEFT's are \"none\", \"all\" and \"lora_only\"");
    }
    config.bias = bias.get<std::string>();
  }
  const nlohmann::json& saved = keys.Take("modules_to_save");
  if (!saved.is_null()) {
    if (!saved.is_array()) return keys.Error("modules_to_save", "must be a list of module names");
    for (const nlohmann::json& module : saved) {
      if (!module.is_string() || module.get<std::string>().empty() ||
          module.get<std::string>().size() > kMaxPatternLength) {
        return keys.Error(
            "modules_to_save",
            "holds " + module.dump() + "; each must be a module name (1 to 1,000 characters)");
      }
      config.modules_to_save.push_back(module.get<std::string>());
    }
  }
  for (const auto& [key, what] : UnsupportedKeys()) {
    const nlohmann::json& v = keys.Take(key);
    if (!IsUnset(v)) {
      return keys.Error(
          key, "(" + v.dump() + ") asks for " + what + ", which the lora plugin does not compute");
    }
  }
  for (const std::string& key : keys.Unread(NeutralKeys())) {
    if (!IsUnset(json[key])) {
      return keys.Error(key, "(" + json[key].dump() +
                                 ") is not a LoraConfig key of PEFT 0.21 that the lora plugin "
                                 "knows; it may change what the adapters compute");
    }
  }
  return config;
}

StatusOr<int64_t> PeftLoraConfig::RankOf(const std::string& module_name) const {
  ENGINE_ASSIGN_OR_RETURN(const int64_t* rank,
                          PatternValue(rank_pattern, "rank_pattern", file, module_name));
  return rank != nullptr ? *rank : r;
}

StatusOr<double> PeftLoraConfig::AlphaOf(const std::string& module_name) const {
  ENGINE_ASSIGN_OR_RETURN(const double* alpha,
                          PatternValue(alpha_pattern, "alpha_pattern", file, module_name));
  return alpha != nullptr ? *alpha : lora_alpha;
}

StatusOr<double> PeftLoraConfig::ScaleOf(const std::string& module_name) const {
  ENGINE_ASSIGN_OR_RETURN(const int64_t rank, RankOf(module_name));
  ENGINE_ASSIGN_OR_RETURN(const double alpha, AlphaOf(module_name));
  return alpha / (use_rslora ? std::sqrt(static_cast<double>(rank)) : static_cast<double>(rank));
}

StatusOr<std::vector<std::string>> PeftAdaptedModules(const safetensors::File& weights,
                                                      const PeftLoraConfig& config) {
  std::vector<std::string> modules;
  std::set<std::string> a, b;
  for (const safetensors::TensorInfo& info : weights.tensors()) {
    const std::string& name = info.name;
    const bool is_a = EndsWith(name, kA), is_b = EndsWith(name, kB);
    if (name.rfind(kPrefix, 0) != 0 || !(is_a || is_b)) {
      if (!SavedTensorName(name, config).empty()) continue;
      return InvalidArgumentError(
          weights.path().string() + ": tensor '" + name +
          "' is not a LoRA weight of a linear layer (base_model.model.<module>.lora_A.weight or "
          ".lora_B.weight), nor a tensor of adapter_config.json's modules_to_save, nor a bias "
          "with its bias \"all\" or \"lora_only\"; embedding adapters and DoRA magnitudes are "
          "not supported");
    }
    const std::string module =
        name.substr(std::strlen(kPrefix), name.size() - std::strlen(kPrefix) - kA.size());
    (is_a ? a : b).insert(module);
    if (is_a) modules.push_back(module);
  }
  for (const std::string& module : a) {
    if (b.count(module) == 0) {
      return InvalidArgumentError(weights.path().string() + " has no tensor '" + kPrefix + module +
                                  kB + "' beside its lora_A");
    }
  }
  for (const std::string& module : b) {
    if (a.count(module) == 0) {
      return InvalidArgumentError(weights.path().string() + " has no tensor '" + kPrefix + module +
                                  kA + "' beside its lora_B");
    }
  }
  if (modules.empty()) {
    return InvalidArgumentError(weights.path().string() + " holds no LoRA weights");
  }
  return modules;
}

StatusOr<safetensors::NamedTensors> PeftSavedModelTensors(const safetensors::File& weights,
                                                          const PeftLoraConfig& config) {
  safetensors::NamedTensors saved;
  std::set<std::string> modules_found;
  for (const safetensors::TensorInfo& info : weights.tensors()) {
    const std::string tensor = SavedTensorName(info.name, config);
    if (tensor.empty()) continue;
    if (!c10::isFloatingType(info.dtype)) {
      return InvalidArgumentError(weights.path().string() + ": tensor '" + info.name + "' is " +
                                  std::string(DtypeShortName(info.dtype)) +
                                  "; a saved module's tensors and biases are floating point");
    }
    ENGINE_ASSIGN_OR_RETURN(at::Tensor value, weights.Get(info.name));
    saved.emplace_back(tensor, value.to(at::kFloat));
    const size_t dot = tensor.rfind('.');
    if (dot != std::string::npos) modules_found.insert(tensor.substr(0, dot));
  }
  for (const std::string& module : config.modules_to_save) {
    bool found = false;
    for (const std::string& have : modules_found) {
      found = found || have == module || EndsWith(have, "." + module);
    }
    if (!found) {
      return InvalidArgumentError(config.file.string() + ": modules_to_save names '" + module +
                                  "', but " + weights.path().string() +
                                  " holds no tensor of such a module");
    }
  }
  return saved;
}

StatusOr<std::pair<at::Tensor, at::Tensor>> PeftLoraWeights(const safetensors::File& weights,
                                                            const std::string& module_name,
                                                            int64_t r, int64_t in_features,
                                                            int64_t out_features) {
  std::pair<at::Tensor, at::Tensor> ab;
  for (auto [suffix, shape, out] :
       {std::tuple{kA, std::vector<int64_t>{r, in_features}, &ab.first},
        std::tuple{kB, std::vector<int64_t>{out_features, r}, &ab.second}}) {
    const std::string name = kPrefix + module_name + suffix;
    const safetensors::TensorInfo* info = weights.Find(name);
    if (info == nullptr) {
      return NotFoundError(weights.path().string() + " has no tensor '" + name + "'");
    }
    if (!c10::isFloatingType(info->dtype) || info->shape != shape) {
      return InvalidArgumentError(
          weights.path().string() + ": tensor '" + name + "' is " +
          std::string(DtypeShortName(info->dtype)) + " " + c10::str(at::IntArrayRef(info->shape)) +
          "; the layer (" + std::to_string(out_features) + "x" + std::to_string(in_features) +
          ") with rank " + std::to_string(r) +
          " (adapter_config.json's r or rank_pattern) needs floating point " +
          c10::str(at::IntArrayRef(shape)));
    }
    ENGINE_ASSIGN_OR_RETURN(at::Tensor tensor, weights.Get(name));
    *out = tensor.to(at::kFloat);
  }
  return ab;
}

}  // namespace engine::plugins
