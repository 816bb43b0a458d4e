#include "engine/data.h"
#include "engine/dtype.h"

namespace engine {

std::string_view SplitName(Split split) { return split == Split::kTrain ? "train" : "eval"; }

const FieldSpec* DataSpec::Find(std::string_view name) const {
  for (const FieldSpec& field : fields) {
    if (field.name == name) return &field;
  }
  return nullptr;
}

std::string DataSpec::ToString() const {
  std::string out;
  for (const FieldSpec& field : fields) {
    if (!out.empty()) out += ", ";
    out += field.name + " " + std::string(DtypeShortName(field.dtype)) + "[";
    for (size_t i = 0; i < field.shape.size(); ++i) {
      if (i > 0) out += ",";
      out += field.shape[i] < 0 ? std::string("?") : std::to_string(field.shape[i]);
    }
    out += "]";
    if (field.num_classes > 0) out += " (" + std::to_string(field.num_classes) + " classes)";
  }
  return out;
}

}  // namespace engine
