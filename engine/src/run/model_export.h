// Writing a trained model for the tools people deploy with (`engine export`): `hf`, a dense
// Hugging Face model directory (adapters merged, a 4-bit base dequantized first); `peft`, the
// stage's adapters as PEFT loads them on its base; `bnb4`, a 4-bit base as bitsandbytes serializes
// it. Each with the source's tokenizer files and image processor.
//
// Contract: ExportModel builds the source's model, collects every file in memory, then publishes
// the directory whole (checkpoint.h's PublishDirectory): DIR appears complete or not at all, and
// nothing that was there is touched. Every error names the flag, file, stage or tensor. Prints
// nothing. Use from one thread.
#pragma once

#include <c10/core/ScalarType.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "engine/safetensors.h"
#include "engine/status.h"
#include "run/generation_source.h"

namespace engine {

enum class ExportFormat { kHf, kPeft, kBnb4 };

struct ExportOptions {
  ExportFormat format = ExportFormat::kHf;
  std::filesystem::path to;  // the new directory (absolute)
  // hf and bnb4: the dtype of the dense tensors, and its name in config.json ("float32").
  at::ScalarType dtype = at::kFloat;
  std::string dtype_name = "float32";
  // peft: the base model named in adapter_config.json (default: the source's base model).
  std::string base;
  // bnb4: the scales double-quantized, as bnb_4bit_use_double_quant.
  bool double_quant = false;
};

// "hf", "peft" or "bnb4"; an error naming --format otherwise.
StatusOr<ExportFormat> ParseExportFormat(const std::string& name);

// What an export wrote, by file name.
struct ExportedFiles {
  safetensors::NamedTensors tensors;              // of tensor_file
  std::string tensor_file;                        // model.safetensors or adapter_model.safetensors
  std::map<std::string, std::string> text_files;  // written from memory (configs)
  std::vector<std::filesystem::path> copied;      // copied as they are (tokenizer files)
};

// DIR must be new, or an empty directory whose nearest existing parent takes new entries; a
// symlink is refused rather than replaced. Checked before any model is built.
Status CheckExportDestination(const std::filesystem::path& to);

// Builds the source's model and writes options.to (CheckExportDestination first).
StatusOr<ExportedFiles> ExportModel(GenerationSource& source, const ExportOptions& options);

}  // namespace engine
