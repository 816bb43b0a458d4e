// `engine export`: a trained model as the tools people deploy with read it. `hf` writes a dense
// Hugging Face model directory (adapters merged, a 4-bit base dequantized first); `peft` writes
// the stage's adapters as PEFT loads them on its base; `bnb4` writes a 4-bit base as
// bitsandbytes serializes it. The directory appears whole or not at all.
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/peft_adapters.h"
#include "cli/arguments.h"
#include "cli/commands.h"
#include "core/atomic_file.h"
#include "engine/dtype.h"
#include "engine/untrusted_file.h"
#include "export/bnb4_weights.h"
#include "export/dense_weights.h"
#include "run/generation_source.h"

namespace engine::cli {

std::string ExportHelp() {
  return R"(usage: engine export SOURCE --to=DIR --format=hf|peft|bnb4 [flags]

Writes a trained model for other tools into DIR, a new directory (or an empty one). SOURCE is, as
for `engine generate`, a model directory (the final checkpoint of a stage that trained the whole
model) or PIPELINE.pbtxt[:STAGE] (default: the last stage in run order), built as its training
built it and given its final checkpoint (or --checkpoint).

  --format=hf      a dense Hugging Face model directory that transformers loads as it loads the
                   base: model.safetensors with every adapter merged into its layer's weight
                   (W + alpha/r * B A; a 4-bit base is dequantized first), no adapter or
                   quantization tensors; config.json (torch_dtype set to --dtype);
                   generation_config.json; the tokenizer files
  --format=peft    the stage's adapters as PEFT loads them on the base model:
                   adapter_model.safetensors and adapter_config.json (target_modules: the full
                   names of the adapted layers; modules_to_save: the modules with other trained
                   tensors, saved with them; base_model_name_or_path: --base, or the stage's
                   `pretrained` directory); the tokenizer files
  --format=bnb4    a 4-bit stage's base as transformers + bitsandbytes load it
                   (quantization_config with load_in_4bit in config.json): each NF4 layer in
                   bitsandbytes' serialization (weight, weight.absmax, weight.quant_map,
                   weight.quant_state.bitsandbytes__nf4), giving the stage's 4-bit weights
                   exactly; the other tensors in --dtype; the tokenizer files. Adapters are not
                   merged into 4 bits: export them with --format=peft and load them on it
  --to=DIR         where to write (required)
  --dtype=D        hf, bnb4: float32 (default), bfloat16 or float16
  --double_quant   bnb4: the scales double-quantized as bitsandbytes' bnb_4bit_use_double_quant
                   does (8-bit codes in its dynamic map, f32 per 256 scales): 0.37 fewer bits
                   per weight, and the weights within about 1% of the stage's instead of equal
  --base=DIR       peft: the base model to name in adapter_config.json (default: the stage's
                   `pretrained` directory, or the final checkpoint of the stage it started from
                   when that is a plain model)
  --checkpoint=DIR with a pipeline: a checkpoint of the stage instead of its final one
  --output_dir=DIR with a pipeline: its outputs are here instead of its output_dir
  --plugin_path=DIRS more plugin directories (as for check)
  --base_path=DIRS with a pipeline: where to look for the base of a slim checkpoint whose base
                   moved (as for eval)

Exit status 0 when DIR was written, 1 when the source cannot be exported in that format (peft from
a stage without adapters, a damaged checkpoint, DIR not empty, ...), 2 for a wrong command line.
)";
}

namespace {

namespace fs = std::filesystem;

constexpr const char* kTokenizerFiles[] = {"tokenizer.json", "tokenizer_config.json",
                                           "tokenizer.model", "special_tokens_map.json",
                                           "chat_template.jinja"};

struct ExportFlags {
  std::string format;
  fs::path to;
  at::ScalarType dtype = at::kFloat;
  std::string dtype_name = "float32";
  std::string base;
  bool double_quant = false;
};

// What goes into the directory, by file name.
struct ExportFiles {
  safetensors::NamedTensors tensors;  // model.safetensors or adapter_model.safetensors
  std::string tensor_file;
  std::map<std::string, std::string> text_files;
  std::vector<fs::path> copied;  // files copied as they are
};

// DIR must be new, or an empty directory: an export never mixes with what was there. A symlink
// is refused rather than replaced by the directory, and the nearest directory that exists above
// DIR must take new entries: all found before the model is built.
Status CheckDestination(const fs::path& to) {
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
Status AddHfConfigs(const Model& model, const GenerationSource& source, const ExportFlags& flags,
                    const nlohmann::ordered_json& quantization_config, ExportFiles* files) {
  auto config = nlohmann::ordered_json::parse(model.config_json(), nullptr, false);
  if (!config.is_object()) {
    return InternalError("the model's config_json() is not a JSON object");
  }
  config["torch_dtype"] = flags.dtype_name;
  if (config.contains("dtype")) config["dtype"] = flags.dtype_name;
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

StatusOr<ExportFiles> CollectFiles(Model& model, const GenerationSource& source,
                                   const ExportFlags& flags) {
  ExportFiles files;
  if (flags.format == "hf") {
    ENGINE_ASSIGN_OR_RETURN(files.tensors, DenseWeights(model.module(), flags.dtype));
    files.tensor_file = kModelFile;
    ENGINE_RETURN_IF_ERROR(AddHfConfigs(model, source, flags, nullptr, &files));
  } else if (flags.format == "bnb4") {
    ENGINE_ASSIGN_OR_RETURN(Bnb4Export bnb,
                            Bnb4Weights(model.module(), flags.dtype, flags.double_quant));
    files.tensors = std::move(bnb.tensors);
    files.tensor_file = kModelFile;
    ENGINE_RETURN_IF_ERROR(
        AddHfConfigs(model, source, flags, QuantizationConfig(bnb, flags.double_quant), &files));
  } else {
    const std::string base =
        flags.base.empty() ? source.base_model_dir().string() : fs::absolute(flags.base).string();
    ENGINE_ASSIGN_OR_RETURN(
        PeftAdapterFiles peft,
        MakePeftAdapterFiles(*source.stage(), model.module(), base,
                             model.transformers_module_prefixes(), source.pipeline_dir()));
    files.tensors = std::move(peft.tensors);
    files.tensor_file = kAdapterFile;
    files.text_files[kAdapterConfigFile] = std::move(peft.config_json);
  }
  for (const fs::path& file : TokenizerFiles(source)) files.copied.push_back(file);
  if (!source.image_processor_file().empty()) {
    ENGINE_ASSIGN_OR_RETURN(files.text_files[kImageProcessorFile],
                            ReadUntrustedFile(source.image_processor_file(), FileKind::kConfig));
  }
  return files;
}

Status WriteFiles(const fs::path& dir, const ExportFiles& files) {
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

void PrintSummary(const GenerationSource& source, const ExportFlags& flags,
                  const ExportFiles& files) {
  int64_t bytes = 0;
  for (const auto& [name, tensor] : files.tensors) bytes += tensor.numel() * tensor.element_size();
  std::cout << "exported " << source.description() << " to " << flags.to.string() << " ("
            << flags.format << (flags.format != "peft" ? ", " + flags.dtype_name : "") << ")\n"
            << "  " << files.tensor_file << "  " << files.tensors.size() << " tensors, " << bytes
            << " bytes\n";
  for (const auto& [name, text] : files.text_files) std::cout << "  " << name << "\n";
  for (const fs::path& file : files.copied) {
    std::cout << "  " << file.filename().string() << "  (from " << file.parent_path().string()
              << ")\n";
  }
}

// The flags as ExportFlags; a.error says what is wrong.
ExportFlags ReadExportFlags(Arguments& a) {
  ExportFlags flags;
  flags.format = a.Get("format");
  flags.to = a.Get("to");
  flags.base = a.Get("base");
  if (a.positional.size() != 1) a.error = "expected one SOURCE";
  if (a.error.empty() && flags.to.empty()) a.error = "--to=DIR is required";
  if (a.error.empty() && flags.format != "hf" && flags.format != "peft" && flags.format != "bnb4") {
    a.error = "--format must be hf, peft or bnb4, not '" + flags.format + "'";
  }
  if (a.error.empty() && a.Has("dtype")) {
    if (flags.format == "peft") {
      a.error = "--dtype is for --format=hf and bnb4 (adapters keep their trained dtype)";
    } else if (StatusOr<at::ScalarType> dtype = ParseDtype(a.Get("dtype")); !dtype.ok()) {
      a.error = dtype.status().message();
    } else {
      flags.dtype = *dtype;
      flags.dtype_name = TorchDtypeName(*dtype);
    }
  }
  if (a.error.empty() && !flags.base.empty() && flags.format != "peft") {
    a.error = "--base is for --format=peft";
  }
  flags.double_quant = a.Has("double_quant");
  if (a.error.empty() && flags.double_quant && flags.format != "bnb4") {
    a.error = "--double_quant is for --format=bnb4";
  }
  if (!flags.to.empty()) flags.to = fs::absolute(flags.to).lexically_normal();
  return flags;
}

}  // namespace

int ExportCommand(const std::vector<std::string>& args) {
  Arguments a = ParseArguments(
      args,
      {"to", "format", "dtype", "base", "checkpoint", "output_dir", "plugin_path", "base_path"},
      {"double_quant"});
  if (a.help) {
    std::cout << ExportHelp();
    return kExitOk;
  }
  const ExportFlags flags = ReadExportFlags(a);
  if (!a.error.empty()) {
    std::cerr << "engine export: " << a.error << "\n\n" << ExportHelp();
    return kExitUsage;
  }
  const auto fail = [](const Status& status) {
    std::cerr << "engine export: " << status.message() << "\n";
    return kExitFailure;
  };
  if (Status free = CheckDestination(flags.to); !free.ok()) return fail(free);
  GenerationSourceOptions options;
  options.plugin_path = a.Get("plugin_path");
  options.base_path = a.Get("base_path");
  options.checkpoint = a.Get("checkpoint");
  options.output_dir = a.Get("output_dir");
  options.need_text = false;
  options.command = "export";
  auto source = GenerationSource::Open(a.positional[0], options);
  if (!source.ok()) return fail(source.status());
  PrintNotes((*source)->notes());
  if (flags.format == "peft" && (*source)->stage() == nullptr) {
    return fail(FailedPreconditionError((*source)->description() +
                                        " holds no adapters: export --format=peft from a stage "
                                        "that trained some (PIPELINE.pbtxt:STAGE)"));
  }
  ExportFiles files;
  Status status = (*source)->WithModel([&](Model& model) -> Status {
    ENGINE_ASSIGN_OR_RETURN(files, CollectFiles(model, **source, flags));
    return Status::Ok();
  });
  if (status.ok()) {
    status =
        PublishDirectory(flags.to, [&](const fs::path& temp) { return WriteFiles(temp, files); });
  }
  if (!status.ok()) return fail(status);
  PrintSummary(**source, flags, files);
  return kExitOk;
}

}  // namespace engine::cli
