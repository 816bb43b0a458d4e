#include "core/fingerprint.h"

#include <google/protobuf/any.pb.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/text_format.h>

namespace engine {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

void AppendScalar(const Message& m, const FieldDescriptor* f, int index, std::string* out) {
  google::protobuf::TextFormat::Printer printer;
  printer.SetSingleLineMode(true);
  std::string value;
  printer.PrintFieldValueToString(m, f, index, &value);
  *out += value;
}

void Append(const Message& m, std::string* out) {
  const auto* d = m.GetDescriptor();
  const auto* r = m.GetReflection();
  // Plugin options are hashed from the unpacked message by the caller; only the type counts here.
  if (const auto* any = google::protobuf::DynamicCastToGenerated<google::protobuf::Any>(&m)) {
    *out += "{" + any->type_url() + "}";
    return;
  }
  *out += "{";
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    // Inside a oneof only the chosen field counts.
    if (f->containing_oneof() != nullptr && !r->HasField(m, f)) continue;
    *out += f->name();
    *out += ":";
    if (f->is_repeated()) {
      *out += "[";
      for (int j = 0; j < r->FieldSize(m, f); ++j) {
        if (j > 0) *out += ",";
        if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
          Append(r->GetRepeatedMessage(m, f, j), out);
        } else {
          AppendScalar(m, f, j, out);
        }
      }
      *out += "]";
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      Append(r->GetMessage(m, f), out);
    } else {
      AppendScalar(m, f, -1, out);
    }
    *out += ";";
  }
  *out += "}";
}

}  // namespace

std::string CanonicalText(const Message& message) {
  std::string out = message.GetDescriptor()->full_name();
  Append(message, &out);
  return out;
}

}  // namespace engine
