// `engine export`: a trained model as the tools people deploy with read it. `hf` writes a dense
// Hugging Face model directory (adapters merged, a 4-bit base dequantized first); `peft` writes
// the stage's adapters as PEFT loads them on its base; `bnb4` writes a 4-bit base as
// bitsandbytes serializes it. The directory appears whole or not at all.
#include <filesystem>
#include <iostream>

#include "cli/arguments.h"
#include "cli/commands.h"
#include "engine/dtype.h"
#include "run/generation_source.h"
#include "run/model_export.h"

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

void PrintSummary(const GenerationSource& source, const std::string& format,
                  const ExportOptions& options, const ExportedFiles& files) {
  int64_t bytes = 0;
  for (const auto& [name, tensor] : files.tensors) bytes += tensor.numel() * tensor.element_size();
  std::cout << "exported " << source.description() << " to " << options.to.string() << " ("
            << format << (options.format != ExportFormat::kPeft ? ", " + options.dtype_name : "")
            << ")\n"
            << "  " << files.tensor_file << "  " << files.tensors.size() << " tensors, " << bytes
            << " bytes\n";
  for (const auto& [name, text] : files.text_files) std::cout << "  " << name << "\n";
  for (const fs::path& file : files.copied) {
    std::cout << "  " << file.filename().string() << "  (from " << file.parent_path().string()
              << ")\n";
  }
}

// The flags as ExportOptions; a.error says what is wrong.
ExportOptions ReadExportOptions(Arguments& a) {
  ExportOptions options;
  options.to = a.Get("to");
  options.base = a.Get("base");
  if (a.positional.size() != 1) a.error = "expected one SOURCE";
  if (a.error.empty() && options.to.empty()) a.error = "--to=DIR is required";
  if (a.error.empty()) {
    if (StatusOr<ExportFormat> format = ParseExportFormat(a.Get("format")); !format.ok()) {
      a.error = format.status().message();
    } else {
      options.format = *format;
    }
  }
  const bool peft = options.format == ExportFormat::kPeft;
  if (a.error.empty() && a.Has("dtype")) {
    if (peft) {
      a.error = "--dtype is for --format=hf and bnb4 (adapters keep their trained dtype)";
    } else if (StatusOr<at::ScalarType> dtype = ParseDtype(a.Get("dtype")); !dtype.ok()) {
      a.error = dtype.status().message();
    } else {
      options.dtype = *dtype;
      options.dtype_name = TorchDtypeName(*dtype);
    }
  }
  if (a.error.empty() && !options.base.empty() && !peft) a.error = "--base is for --format=peft";
  options.double_quant = a.Has("double_quant");
  if (a.error.empty() && options.double_quant && options.format != ExportFormat::kBnb4) {
    a.error = "--double_quant is for --format=bnb4";
  }
  if (!options.to.empty()) options.to = fs::absolute(options.to).lexically_normal();
  return options;
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
  const ExportOptions options = ReadExportOptions(a);
  if (!a.error.empty()) {
    std::cerr << "engine export: " << a.error << "\n\n" << ExportHelp();
    return kExitUsage;
  }
  const auto fail = [](const Status& status) {
    std::cerr << "engine export: " << status.message() << "\n";
    return kExitFailure;
  };
  // Before the source is opened: a destination that cannot be written fails in a second.
  if (Status free = CheckExportDestination(options.to); !free.ok()) return fail(free);
  GenerationSourceOptions source_options;
  source_options.plugin_path = a.Get("plugin_path");
  source_options.base_path = a.Get("base_path");
  source_options.checkpoint = a.Get("checkpoint");
  source_options.output_dir = a.Get("output_dir");
  source_options.need_text = false;
  source_options.command = "export";
  auto source = GenerationSource::Open(a.positional[0], source_options);
  if (!source.ok()) return fail(source.status());
  PrintNotes((*source)->notes());
  StatusOr<ExportedFiles> files = ExportModel(**source, options);
  if (!files.ok()) return fail(files.status());
  PrintSummary(**source, a.Get("format"), options, *files);
  return kExitOk;
}

}  // namespace engine::cli
