#include "pipeline/pipeline_parser.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/empty.pb.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <vector>

namespace engine {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using google::protobuf::TextFormat;

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> previous(b.size() + 1), current(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) previous[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    current[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      current[j] = std::min(
          {previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    }
    std::swap(previous, current);
  }
  return previous[b.size()];
}

std::string Explain(const std::string& message);

class DiagnosticCollector : public google::protobuf::io::ErrorCollector {
 public:
  DiagnosticCollector(std::string file, Diagnostics* diagnostics, bool report_warnings)
      : file_(std::move(file)), diagnostics_(diagnostics), report_warnings_(report_warnings) {}
  void AddError(int line, int column, const std::string& message) override {
    diagnostics_->Add({file_, line + 1, column + 1}, Explain(message));
    ++errors_;
  }
  void AddWarning(int line, int column, const std::string& message) override {
    if (report_warnings_) AddError(line, column, message);
  }
  int errors() const { return errors_; }

 private:
  std::string file_;
  Diagnostics* diagnostics_;
  bool report_warnings_;
  int errors_ = 0;
};

// Protobuf's messages, with what a pipeline author needs to fix them.
std::string Explain(const std::string& message) {
  if (message.size() >= 5 && message.compare(message.size() - 5, 5, "got: ") == 0) {
    return message + "the end of the file (is a '}' missing?)";
  }
  static const std::string kPrefix = "Message type \"";
  static const std::string kMiddle = "\" has no field named \"";
  size_t middle = message.find(kMiddle);
  if (message.rfind(kPrefix, 0) != 0 || middle == std::string::npos) return message;
  const std::string type = message.substr(kPrefix.size(), middle - kPrefix.size());
  const size_t name_begin = middle + kMiddle.size();
  const std::string name = message.substr(name_begin, message.find('"', name_begin) - name_begin);
  const Descriptor* descriptor =
      google::protobuf::DescriptorPool::generated_pool()->FindMessageTypeByName(type);
  if (descriptor == nullptr) return message;
  std::string fields;
  std::string closest;
  size_t closest_distance = 3;
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const std::string& field = descriptor->field(i)->name();
    fields += (i ? ", " : "") + field;
    const size_t distance = EditDistance(name, field);
    if (distance < closest_distance) {
      closest_distance = distance;
      closest = field;
    }
  }
  std::string out = message;
  if (!out.empty() && out.back() == '.') out.pop_back();
  if (!closest.empty()) out += "; did you mean \"" + closest + "\"?";
  out += " (" + descriptor->name() + " has: " + fields + ")";
  return out;
}

// Pass 1 reads every Any body as an Empty with unknown fields allowed: the body is checked for
// syntax and skipped.
class SkipAnyBodies : public TextFormat::Finder {
 public:
  const Descriptor* FindAnyType(const Message&, const std::string&,
                                const std::string&) const override {
    return google::protobuf::Empty::descriptor();
  }
};

void ForEachAnyIn(
    const Message& message, const std::string& prefix,
    const std::function<void(const std::string&, const google::protobuf::Any&)>& visit) {
  const Reflection* reflection = message.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);
  for (const FieldDescriptor* field : fields) {
    if (field->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) continue;
    const bool is_any = field->message_type()->full_name() == "google.protobuf.Any";
    auto handle = [&](const Message& child, const std::string& path) {
      if (is_any) {
        const auto* any = google::protobuf::DynamicCastToGenerated<google::protobuf::Any>(&child);
        if (any != nullptr) visit(path, *any);
      } else {
        ForEachAnyIn(child, path, visit);
      }
    };
    const std::string base = prefix.empty() ? field->name() : prefix + "." + field->name();
    if (field->is_repeated()) {
      const int n = reflection->FieldSize(message, field);
      for (int i = 0; i < n; ++i) {
        handle(reflection->GetRepeatedMessage(message, field, i),
               base + "[" + std::to_string(i) + "]");
      }
    } else {
      handle(reflection->GetMessage(message, field), base);
    }
  }
}

}  // namespace

bool ParsePipelineHeader(const std::string& file, const std::string& text, proto::Pipeline* header,
                         SourceMap* map, Diagnostics* diagnostics) {
  TextFormat::Parser parser;
  DiagnosticCollector errors(file, diagnostics, /*report_warnings=*/false);
  SkipAnyBodies finder;
  parser.RecordErrorsTo(&errors);
  parser.SetFinder(&finder);
  parser.AllowUnknownField(true);
  if (map != nullptr) parser.WriteLocationsTo(map->tree());
  return parser.ParseFromString(text, header) && errors.errors() == 0;
}

bool ParsePipeline(const std::string& file, const std::string& text, proto::Pipeline* pipeline,
                   SourceMap* map, Diagnostics* diagnostics) {
  TextFormat::Parser parser;
  DiagnosticCollector errors(file, diagnostics, /*report_warnings=*/true);
  parser.RecordErrorsTo(&errors);
  if (map != nullptr) parser.WriteLocationsTo(map->tree());
  return parser.ParseFromString(text, pipeline) && errors.errors() == 0;
}

void ForEachAny(
    const Message& message,
    const std::function<void(const std::string&, const google::protobuf::Any&)>& visit) {
  ForEachAnyIn(message, "", visit);
}

std::string TypeNameFromUrl(const std::string& type_url) {
  size_t slash = type_url.rfind('/');
  return slash == std::string::npos ? type_url : type_url.substr(slash + 1);
}

}  // namespace engine
