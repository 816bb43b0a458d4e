#include "core/required_fields.h"

#include <google/protobuf/descriptor.h>

#include "engine/options.pb.h"

namespace engine {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

bool Check(const google::protobuf::Message& message, const std::string& prefix,
           OptionErrors* errors) {
  bool ok = true;
  const Descriptor* descriptor = message.GetDescriptor();
  const auto* reflection = message.GetReflection();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor* field = descriptor->field(i);
    const std::string name = prefix.empty() ? field->name() : prefix + "." + field->name();
    const bool set = field->is_repeated() ? reflection->FieldSize(message, field) > 0
                                          : reflection->HasField(message, field);
    if (field->options().GetExtension(engine::required) && !set) {
      const std::string help = field->options().GetExtension(engine::help);
      errors->Add(name, "is required" + (help.empty() ? "" : " (" + help + ")"));
      ok = false;
    }
    if (set && !field->is_repeated() && field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      ok &= Check(reflection->GetMessage(message, field), name, errors);
    }
  }
  return ok;
}

}  // namespace

bool CheckRequiredFields(const google::protobuf::Message& message, OptionErrors* errors) {
  return Check(message, "", errors);
}

}  // namespace engine
