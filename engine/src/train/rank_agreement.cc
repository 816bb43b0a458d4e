#include "train/rank_agreement.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/text_format.h>

#include <cstdint>

#include "engine/hash.h"

namespace engine {
namespace {

// A field's values as text ("" when it is not set).
std::string FieldText(const google::protobuf::Message& message,
                      const google::protobuf::FieldDescriptor* field) {
  const google::protobuf::Reflection* reflection = message.GetReflection();
  std::string out, value;
  if (field->is_repeated()) {
    for (int i = 0; i < reflection->FieldSize(message, field); ++i) {
      google::protobuf::TextFormat::PrintFieldValueToString(message, field, i, &value);
      out += value + "\n";
    }
  } else if (reflection->HasField(message, field)) {
    google::protobuf::TextFormat::PrintFieldValueToString(message, field, -1, &value);
    out = value;
  }
  return out;
}

// A hash of `text` that a double holds exactly (the ranks exchange doubles).
double ExactHash(const std::string& text) {
  return static_cast<double>(Fnv1a64(text) & ((uint64_t{1} << 52) - 1));
}

}  // namespace

std::vector<std::pair<std::string, std::string>> StageAgreementEntries(
    const proto::Stage& stage, const std::string& stage_path,
    std::vector<std::pair<std::string, std::string>> extra) {
  std::vector<std::pair<std::string, std::string>> entries;
  const google::protobuf::Descriptor* descriptor = stage.GetDescriptor();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = descriptor->field(i);
    entries.emplace_back(stage_path + "." + field->name(), FieldText(stage, field));
  }
  for (auto& entry : extra) entries.push_back(std::move(entry));
  return entries;
}

Status AgreeOnTheStage(DataParallel& ranks,
                       const std::vector<std::pair<std::string, std::string>>& entries) {
  std::vector<double> hashes, negated;
  for (const auto& [what, text] : entries) {
    hashes.push_back(ExactHash(text));
    negated.push_back(-hashes.back());
  }
  ENGINE_ASSIGN_OR_RETURN(const std::vector<double> largest, ranks.Max(hashes));
  ENGINE_ASSIGN_OR_RETURN(const std::vector<double> smallest, ranks.Max(negated));
  for (size_t i = 0; i < entries.size(); ++i) {
    if (largest[i] != -smallest[i]) {
      return FailedPreconditionError(
          "the " + std::to_string(ranks.world_size()) +
          " ranks do not run the same stage: " + entries[i].first +
          " differs between them (were they started from different pipeline files, or data?); "
          "every rank must run the same plan");
    }
  }
  return Status::Ok();
}

}  // namespace engine
