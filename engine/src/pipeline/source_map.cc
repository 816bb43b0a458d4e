#include "pipeline/source_map.h"

#include <google/protobuf/dynamic_message.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <optional>
#include <vector>

namespace engine {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::TextFormat;
namespace io = google::protobuf::io;

class SilentErrors : public io::ErrorCollector {
 public:
  void AddError(int, int, const std::string&) override { failed = true; }
  void AddWarning(int, int, const std::string&) override {}
  bool failed = false;
};

// Byte offset of a tokenizer position (0-based line; column counting tabs to the next multiple of
// 8).
std::optional<size_t> OffsetOf(const std::string& text, int line, int column) {
  size_t offset = 0;
  for (int l = 0; l < line; ++l) {
    offset = text.find('\n', offset);
    if (offset == std::string::npos) return std::nullopt;
    ++offset;
  }
  int col = 0;
  while (col < column) {
    if (offset >= text.size() || text[offset] == '\n') return std::nullopt;
    col = text[offset] == '\t' ? (col / 8 + 1) * 8 : col + 1;
    ++offset;
  }
  return offset;
}

// The byte range [begin, end) of the body of the Any whose field name starts at (line, column):
// `options { [type/url] { BODY } }`.
std::optional<std::pair<size_t, size_t>> FindAnyBody(const std::string& text, int line,
                                                     int column) {
  io::ArrayInputStream input(text.data(), static_cast<int>(text.size()));
  SilentErrors errors;
  io::Tokenizer tokenizer(&input, &errors);
  tokenizer.set_comment_style(io::Tokenizer::SH_COMMENT_STYLE);
  tokenizer.set_require_space_after_number(false);
  tokenizer.set_allow_multiline_strings(true);
  tokenizer.set_allow_f_after_float(true);
  auto next = [&]() -> const io::Tokenizer::Token* {
    return tokenizer.Next() ? &tokenizer.current() : nullptr;
  };
  const io::Tokenizer::Token* token = nullptr;
  while ((token = next()) != nullptr) {
    if (token->line == line && token->column == column) break;
  }
  if (token == nullptr) return std::nullopt;
  token = next();
  if (token && token->text == ":") token = next();
  if (!token || (token->text != "{" && token->text != "<")) return std::nullopt;
  token = next();
  if (!token || token->text != "[") return std::nullopt;
  while ((token = next()) != nullptr && token->text != "]") {
  }
  if (token == nullptr) return std::nullopt;
  token = next();
  if (token && token->text == ":") token = next();
  if (!token || (token->text != "{" && token->text != "<")) return std::nullopt;
  auto begin = OffsetOf(text, token->line, token->end_column);
  int depth = 1;
  while ((token = next()) != nullptr) {
    if (token->type != io::Tokenizer::TYPE_SYMBOL) continue;
    if (token->text == "{" || token->text == "<") ++depth;
    if (token->text == "}" || token->text == ">") {
      if (--depth == 0) break;
    }
  }
  if (token == nullptr || !begin) return std::nullopt;
  auto end = OffsetOf(text, token->line, token->column);
  if (!end || *end < *begin) return std::nullopt;
  return std::make_pair(*begin, *end);
}

std::string JoinSteps(const std::vector<FieldPathStep>& steps, size_t from) {
  std::string out;
  for (size_t i = from; i < steps.size(); ++i) {
    if (!out.empty()) out += ".";
    out += steps[i].name;
    if (steps[i].index >= 0) out += "[" + std::to_string(steps[i].index) + "]";
  }
  return out;
}

}  // namespace

std::vector<FieldPathStep> SplitFieldPath(std::string_view path) {
  std::vector<FieldPathStep> steps;
  size_t start = 0;
  while (start < path.size()) {
    size_t end = path.find('.', start);
    if (end == std::string_view::npos) end = path.size();
    std::string_view part = path.substr(start, end - start);
    FieldPathStep step;
    size_t bracket = part.find('[');
    if (bracket != std::string_view::npos && part.back() == ']') {
      step.name = std::string(part.substr(0, bracket));
      step.index = std::atoi(std::string(part.substr(bracket + 1)).c_str());
    } else {
      step.name = std::string(part);
    }
    steps.push_back(std::move(step));
    start = end + 1;
  }
  return steps;
}

SourceMap::SourceMap(std::string file, std::string text)
    : file_(std::move(file)), text_(std::move(text)) {}

SourceLocation SourceMap::Locate(const Descriptor* root, std::string_view path) const {
  SourceLocation best = FileOnly();
  const std::vector<FieldPathStep> steps = SplitFieldPath(path);
  const TextFormat::ParseInfoTree* tree = &tree_;
  const Descriptor* descriptor = root;
  std::vector<FieldPathStep> walked;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (descriptor == nullptr || tree == nullptr) return best;
    const FieldDescriptor* field = descriptor->FindFieldByName(steps[i].name);
    if (field == nullptr) return best;
    const int index = field->is_repeated() ? std::max(steps[i].index, 0) : -1;
    TextFormat::ParseLocation location = tree->GetLocation(field, index);
    if (location.line < 0) return best;
    best = {file_, location.line + 1, location.column + 1};
    walked.push_back({steps[i].name, field->is_repeated() ? index : -1});
    if (i + 1 == steps.size() || field->message_type() == nullptr) return best;
    if (field->message_type()->full_name() == "google.protobuf.Any") {
      auto body = any_bodies_.find(JoinSteps(walked, 0));
      if (body == any_bodies_.end()) return best;
      std::string rest = JoinSteps(steps, i + 1);
      SourceLocation inner = body->second.map->Locate(body->second.type, rest);
      return inner.known() ? inner : best;
    }
    tree = tree->GetTreeForNested(field, index);
    descriptor = field->message_type();
  }
  return best;
}

bool SourceMap::MapAnyBody(const Descriptor* root, std::string_view any_path,
                           const Descriptor* type) {
  SourceLocation any_location = Locate(root, any_path);
  if (!any_location.known() || type == nullptr) return false;
  auto range = FindAnyBody(text_, any_location.line - 1, any_location.column - 1);
  if (!range) return false;
  // Blank everything outside the body (keeping newlines), so positions stay those of the file.
  std::string masked = text_;
  for (size_t i = 0; i < masked.size(); ++i) {
    if ((i < range->first || i >= range->second) && masked[i] != '\n') masked[i] = ' ';
  }
  auto map = std::make_unique<SourceMap>(file_, masked);
  google::protobuf::DynamicMessageFactory factory;
  std::unique_ptr<google::protobuf::Message> scratch(factory.GetPrototype(type)->New());
  TextFormat::Parser parser;
  SilentErrors errors;
  parser.RecordErrorsTo(&errors);
  parser.WriteLocationsTo(map->tree());
  if (!parser.ParseFromString(masked, scratch.get()) || errors.failed) return false;
  std::vector<FieldPathStep> steps = SplitFieldPath(any_path);
  any_bodies_[JoinSteps(steps, 0)] = AnyBody{type, std::move(map)};
  return true;
}

}  // namespace engine
