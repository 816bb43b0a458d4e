// tokenizer.json's "post_processor": the special tokens put around an encoded text when special
// tokens are asked for (Llama's bos). Supported: TemplateProcessing (its "single" template),
// BertProcessing, RobertaProcessing, ByteLevel (ids unchanged) and Sequence; any other type is an
// error naming it.
//
// Immutable after parsing; any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/status.h"
#include "tokenizer/json_fields.h"

namespace engine::tokenizer {

class PostProcessor {
 public:
  // A null `json` adds nothing.
  static StatusOr<PostProcessor> Parse(const Json& json, const std::string& path);

  std::vector<int64_t> Apply(const std::vector<int64_t>& ids) const;
  // The ids put before the text (the bos of Llama-family tokenizers), in order.
  const std::vector<int64_t>& prefix() const { return prefix_; }
  const std::vector<int64_t>& suffix() const { return suffix_; }

 private:
  Status ParseTemplate(const Json& json, const std::string& path);
  Status ParseOne(const Json& json, const std::string& path);

  std::vector<int64_t> prefix_;
  std::vector<int64_t> suffix_;
};

}  // namespace engine::tokenizer
