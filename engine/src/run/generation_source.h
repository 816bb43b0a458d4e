// Where `engine generate` gets its model and text side from: a Hugging Face model directory (a
// `pretrained` directory, or a stage's `final` checkpoint of a full fine-tune), or a trained stage
// of a pipeline (PIPELINE.pbtxt[:STAGE]), whose model is built as its training built it (layers,
// adapters, 4-bit weights, precision, device) and given the stage's final checkpoint.
//
// The text side is the tokenizer, the chat template when there is one (tokenizer_config.json or
// chat_template.jinja), the image processor when there is one (preprocessor_config.json), and the
// ids that end a reply: the tokenizer's eos and the eos_token_id of config.json and
// generation_config.json.
//
// Failure: every error names the file, stage or flag (a directory without config.json or a
// tokenizer, a model_type the llama loader refuses, a checkpoint that does not match its
// manifest, a model that cannot generate). Use from one thread.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chat/tokenizer_config.h"
#include "engine/model.h"
#include "engine/qwen2_vl_image_processor.h"
#include "engine/status.h"
#include "engine/tokenizer.h"
#include "pipeline/resolved_pipeline.h"

namespace engine {

struct GenerationSourceOptions {
  std::string plugin_path;  // as --plugin_path
  // Pipeline form only.
  std::string base_path;   // as --base_path (run/moved_bases.h)
  std::string checkpoint;  // default: the stage's final checkpoint
  std::string output_dir;  // replaces the pipeline's output_dir when set
  // Directory form only: "auto" keeps the stored dtype; float32, bfloat16 or float16 cast to it.
  std::string dtype = "auto";
  std::string device = "cpu";
  // False for commands that need the model alone (export): a source without a tokenizer or
  // chat template is then not an error.
  bool need_text = true;
  // The command the errors suggest ("generate", "export").
  std::string command = "generate";
};

// "float32", "bfloat16", "float16" (or f32, bf16, f16) as a dtype; an error naming --dtype.
StatusOr<at::ScalarType> ParseDtype(const std::string& text);

class GenerationSource {
 public:
  virtual ~GenerationSource() = default;

  // SOURCE is a directory (a model directory), or PIPELINE.pbtxt with an optional :STAGE (default:
  // the last stage in run order).
  static StatusOr<std::unique_ptr<GenerationSource>> Open(const std::string& source,
                                                          const GenerationSourceOptions& options);

  // Calls `use` with the model ready to generate: its weights read, on its device, in eval mode,
  // inside its precision context.
  virtual Status WithModel(const std::function<Status(Model&)>& use) = 0;

  const Tokenizer& tokenizer() const { return *tokenizer_; }
  // Null when there is no chat template; chat_absence() then says where none was found.
  const chat::TokenizerChatConfig* chat() const { return chat_ ? &*chat_ : nullptr; }
  const std::string& chat_absence() const { return chat_absence_; }
  // The tokenizer's eos and the model's eos_token_id(s), without repeats.
  const std::vector<int64_t>& stop_ids() const { return stop_ids_; }
  // The image processor (preprocessor_config.json beside the tokenizer files); null when none.
  const Qwen2VlImageProcessor* image_processor() const {
    return image_processor_ ? &*image_processor_ : nullptr;
  }
  // The file it was read from (empty when none).
  const std::filesystem::path& image_processor_file() const { return image_processor_file_; }
  // The file the video processor is read from (empty: the image processor's file serves), and the
  // one an export carries as video_preprocessor_config.json (empty: none).
  const std::filesystem::path& video_processor_file() const { return video_processor_file_; }
  const std::filesystem::path& video_export_file() const { return video_export_file_; }
  // "model directory 'DIR'" or "stage 'sft' of 'p.pbtxt' (checkpoint DIR)".
  const std::string& description() const { return description_; }
  // The directory the weights are read from: the model directory, or the stage's checkpoint.
  const std::filesystem::path& files_dir() const { return files_dir_; }
  // The model directory the weights build on: the model directory itself, or for a stage
  // PeftBaseModel's (checkpoint/peft_adapters.h).
  const std::filesystem::path& base_model_dir() const { return base_model_dir_; }
  // The stage, for a pipeline source; null for a model directory.
  virtual const ResolvedStage* stage() const { return nullptr; }
  // The pipeline file's directory, against which its plugins resolve their options; empty for a
  // model directory.
  virtual std::filesystem::path pipeline_dir() const { return {}; }
  // What loading the pipeline found worth telling (PipelineSession::notes); the caller prints them.
  const std::vector<std::string>& notes() const { return notes_; }

 protected:
  // Reads the chat template of the tokenizer directory `dir`, when it has one (none is not an
  // error; a template file that cannot be read or parsed is).
  Status ReadChat(const std::filesystem::path& dir);
  // Adds eos ids from a config.json-style object (eos_token_id: a number, a list or null).
  void AddStopIds(const std::string& json_text);
  // Reads an image processor's preprocessor_config.json when `file` exists.
  Status ReadImageProcessor(const std::filesystem::path& file);

  std::unique_ptr<Tokenizer> tokenizer_;
  std::optional<chat::TokenizerChatConfig> chat_;
  std::optional<Qwen2VlImageProcessor> image_processor_;
  std::filesystem::path image_processor_file_;
  std::filesystem::path video_processor_file_;
  std::filesystem::path video_export_file_;
  std::string chat_absence_;
  std::vector<int64_t> stop_ids_;
  std::string description_;
  std::filesystem::path files_dir_;
  std::filesystem::path base_model_dir_;
  std::vector<std::string> notes_;
};

}  // namespace engine
