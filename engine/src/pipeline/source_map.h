// Where each field of a parsed pipeline sits in its file, so that any error can name
// "file:line:col".
//
// Fields are addressed by paths such as "stage[1].schedule.batch_size". Paths continue into plugin
// options ("stage[0].data.options.eval_fraction") once the body of that Any has been mapped with
// MapAnyBody. A field that was not written in the file (a default) resolves to the nearest
// enclosing field that was, so every error points somewhere useful.
#pragma once

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/text_format.h>

#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "pipeline/diagnostics.h"

namespace engine {

class SourceMap {
 public:
  SourceMap(std::string file, std::string text);

  const std::string& file() const { return file_; }
  const std::string& text() const { return text_; }
  // Receives locations during a parse (TextFormat::Parser::WriteLocationsTo).
  google::protobuf::TextFormat::ParseInfoTree* tree() { return &tree_; }

  // The position of the field at `path` below a message of type `root`.
  SourceLocation Locate(const google::protobuf::Descriptor* root, std::string_view path) const;
  SourceLocation FileOnly() const { return {file_, 0, 0}; }

  // Finds the text of the Any at `any_path` (which must be located in this map), parses it again as
  // `type` to record where its fields are, and lets Locate descend into it. Returns false when the
  // body cannot be found or parsed; Locate then stops at the Any itself.
  bool MapAnyBody(const google::protobuf::Descriptor* root, std::string_view any_path,
                  const google::protobuf::Descriptor* type);

 private:
  struct AnyBody {
    const google::protobuf::Descriptor* type;
    std::unique_ptr<SourceMap> map;
  };

  std::string file_;
  std::string text_;
  google::protobuf::TextFormat::ParseInfoTree tree_;
  std::map<std::string, AnyBody, std::less<>> any_bodies_;
};

// A field path split into steps: "stage[1].data" -> {("stage", 1), ("data", -1)}.
struct FieldPathStep {
  std::string name;
  int index = -1;
};
std::vector<FieldPathStep> SplitFieldPath(std::string_view path);

}  // namespace engine
