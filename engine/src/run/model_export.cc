#include "run/model_export.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/peft_adapters.h"
#include "core/atomic_file.h"
#include "engine/qwen2_vl_image_processor.h"
#include "engine/untrusted_file.h"
#include "export/bnb4_weights.h"
#include "export/dense_weights.h"

namespace engine {
namespace {

namespace fs = std::filesystem;

constexpr const char* kTokenizerFiles[] = {"tokenizer.json", "tokenizer_config.json",
                                           "tokenizer.model", "special_tokens_map.json",
                                           "chat_template.jinja"};

// The tokenizer files of the weights' directory, or else of the base model's.
std::vector<fs::path> TokenizerFiles(const GenerationSource& source) {
  for (const fs::path& dir : {source.files_dir(), source.base_model_dir()}) {
    std::vector<fs::path> found;
    std::error_code ec;
    for (const char* name : kTokenizerFiles) {
      if (!dir.empty() && fs::is_regular_file(dir / name, ec)) found.push_back(dir / name);
    }
    if (!found.empty()) return found;
  }
  return {};
}

// config.json of the model as built, with torch_dtype set to the export's (and the
// quantization_config, unless null); and generation_config.json: the source's own, or one holding
// the config's token ids.
Status AddHfConfigs(const Model& model, const GenerationSource& source,
                    const ExportOptions& options, const nlohmann::ordered_json& quantization_config,
                    ExportedFiles* files) {
  auto config = nlohmann::ordered_json::parse(model.config_json(), nullptr, false);
  if (!config.is_object()) {
    return InternalError("the model's config_json() is not a JSON object");
  }
  config["torch_dtype"] = options.dtype_name;
  if (config.contains("dtype")) config["dtype"] = options.dtype_name;
  if (!quantization_config.is_null()) config["quantization_config"] = quantization_config;
  files->text_files["config.json"] = config.dump(2) + "\n";
  std::error_code ec;
  for (const fs::path& dir : {source.files_dir(), source.base_model_dir()}) {
    if (!dir.empty() && fs::is_regular_file(dir / "generation_config.json", ec)) {
      files->copied.push_back(dir / "generation_config.json");
      return Status::Ok();
    }
  }
  nlohmann::ordered_json generation = nlohmann::ordered_json::object();
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
    if (config.contains(key) && !config[key].is_null()) generation[key] = config[key];
  }
  files->text_files["generation_config.json"] = generation.dump(2) + "\n";
  return Status::Ok();
}

// transformers' BitsAndBytesConfig for the bnb4 tensors, as transformers writes it in config.json.
nlohmann::ordered_json QuantizationConfig(const Bnb4Export& bnb, bool double_quant) {
  return {{"quant_method", "bitsandbytes"},
          {"_load_in_4bit", true},
          {"_load_in_8bit", false},
          {"load_in_4bit", true},
          {"load_in_8bit", false},
          {"bnb_4bit_quant_type", "nf4"},
          {"bnb_4bit_use_double_quant", double_quant},
          {"bnb_4bit_compute_dtype", bnb.compute_dtype},
          {"bnb_4bit_quant_storage", "uint8"},
          {"llm_int8_skip_modules", bnb.dense_linears},
          {"llm_int8_threshold", 6.0},
          {"llm_int8_has_fp16_weight", false},
          {"llm_int8_enable_fp32_cpu_offload", false}};
}

// The tensors and configs of the format.
Status AddModelFiles(Model& model, const GenerationSource& source, const ExportOptions& options,
                     ExportedFiles* files) {
  switch (options.format) {
    case ExportFormat::kHf: {
      ENGINE_ASSIGN_OR_RETURN(files->tensors, DenseWeights(model.module(), options.dtype));
      files->tensor_file = kModelFile;
      return AddHfConfigs(model, source, options, nullptr, files);
    }
    case ExportFormat::kBnb4: {
      ENGINE_ASSIGN_OR_RETURN(Bnb4Export bnb,
                              Bnb4Weights(model.module(), options.dtype, options.double_quant));
      files->tensors = std::move(bnb.tensors);
      files->tensor_file = kModelFile;
      return AddHfConfigs(model, source, options, QuantizationConfig(bnb, options.double_quant),
                          files);
    }
    case ExportFormat::kPeft: {
      const std::string base = options.base.empty() ? source.base_model_dir().string()
                                                    : fs::absolute(options.base).string();
      ENGINE_ASSIGN_OR_RETURN(
          PeftAdapterFiles peft,
          MakePeftAdapterFiles(*source.stage(), model.module(), base,
                               model.transformers_module_prefixes(), source.pipeline_dir()));
      files->tensors = std::move(peft.tensors);
      files->tensor_file = kAdapterFile;
      files->text_files[kAdapterConfigFile] = std::move(peft.config_json);
      return Status::Ok();
    }
  }
  return InternalError("unknown export format");
}

// Every file of the export, in memory.
StatusOr<ExportedFiles> CollectFiles(Model& model, const GenerationSource& source,
                                     const ExportOptions& options) {
  ExportedFiles files;
  ENGINE_RETURN_IF_ERROR(AddModelFiles(model, source, options, &files));
  for (const fs::path& file : TokenizerFiles(source)) files.copied.push_back(file);
  for (const auto& [name, file] :
       {std::pair<const char*, fs::path>{kImageProcessorFile, source.image_processor_file()},
        {kVideoProcessorFile, source.video_export_file()}}) {
    if (file.empty()) continue;
    ENGINE_ASSIGN_OR_RETURN(files.text_files[name], ReadUntrustedFile(file, FileKind::kConfig));
  }
  return files;
}

Status WriteFiles(const fs::path& dir, const ExportedFiles& files) {
  ENGINE_RETURN_IF_ERROR(
      safetensors::Write(dir / files.tensor_file, files.tensors, {{"format", "pt"}}));
  for (const auto& [name, text] : files.text_files) {
    ENGINE_RETURN_IF_ERROR(WriteFileAtomically(dir / name, text));
  }
  for (const fs::path& file : files.copied) {
    // Tokenizer files: tokenizer.json, tokenizer.model, their configs and templates.
    ENGINE_ASSIGN_OR_RETURN(std::string bytes, ReadUntrustedFile(file, FileKind::kTokenizer));
    ENGINE_RETURN_IF_ERROR(WriteFileAtomically(dir / file.filename(), bytes));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<ExportFormat> ParseExportFormat(const std::string& name) {
  if (name == "hf") return ExportFormat::kHf;
  if (name == "peft") return ExportFormat::kPeft;
  if (name == "bnb4") return ExportFormat::kBnb4;
  return InvalidArgumentError("--format must be hf, peft or bnb4, not '" + name + "'");
}

Status CheckExportDestination(const fs::path& to) {
  std::error_code ec;
  const fs::file_status status = fs::symlink_status(to, ec);
  if (fs::is_symlink(status)) {
    return FailedPreconditionError("--to '" + to.string() + "' is a symlink (to '" +
                                   fs::read_symlink(to, ec).string() +
                                   "'); export writes a new directory in its place: give the "
                                   "directory's own path, or a new one");
  }
  if (fs::exists(status) && (!fs::is_directory(status) || !fs::is_empty(to, ec))) {
    return FailedPreconditionError("--to '" + to.string() +
                                   "' exists and is not an empty directory; export writes a "
                                   "new one");
  }
  fs::path existing = fs::absolute(to, ec).parent_path();
  while (!existing.empty() && !fs::exists(existing, ec) && existing != existing.root_path()) {
    existing = existing.parent_path();
  }
  if (::access(existing.c_str(), W_OK | X_OK) != 0) {
    return FailedPreconditionError("--to '" + to.string() + "': cannot write in '" +
                                   existing.string() + "' (" + std::strerror(errno) + ")");
  }
  return Status::Ok();
}

StatusOr<ExportedFiles> ExportModel(GenerationSource& source, const ExportOptions& options) {
  ENGINE_RETURN_IF_ERROR(CheckExportDestination(options.to));
  if (options.format == ExportFormat::kPeft && source.stage() == nullptr) {
    return FailedPreconditionError(source.description() +
                                   " holds no adapters: export --format=peft from a stage that "
                                   "trained some (PIPELINE.pbtxt:STAGE)");
  }
  ExportedFiles files;
  ENGINE_RETURN_IF_ERROR(source.WithModel([&](Model& model) -> Status {
    ENGINE_ASSIGN_OR_RETURN(files, CollectFiles(model, source, options));
    return Status::Ok();
  }));
  ENGINE_RETURN_IF_ERROR(
      PublishDirectory(options.to, [&](const fs::path& temp) { return WriteFiles(temp, files); }));
  return files;
}

}  // namespace engine
