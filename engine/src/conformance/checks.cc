// The conformance checks every plugin takes (manifest, options schema, bad options) and the
// dispatch to a check by name, run in this process (isolation.cc runs them in children); each
// kind's contract is in contracts.cc.
#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>
#include <torch/nn/module.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <map>

#include "conformance/check_support.h"
#include "conformance/synthetic.h"
#include "core/atomic_file.h"
#include "core/guarded_call.h"
#include "core/remove_tree.h"
#include "core/required_fields.h"
#include "engine/conformance.h"
#include "engine/dtype.h"
#include "engine/format.h"
#include "engine/model.h"
#include "engine/precision_kit.h"
#include "engine/safetensors.h"
#include "pipeline/source_map.h"
#include "plugins/plugin_library.h"
#include "precision/device_capability.h"

namespace engine::conformance {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

class CollectErrors : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (first.empty()) {
      first = std::to_string(line + 1) + ":" + std::to_string(column + 1) + ": " + message;
    }
  }
  std::string first;
};

StatusOr<Subject> Load(const Target& target) {
  Subject subject;
  ENGINE_ASSIGN_OR_RETURN(subject.loaded, LoadPluginLibrary(target.library));
  subject.options.reset(subject.loaded.plugin->default_options().New());
  subject.base_dir = std::filesystem::current_path();
  if (!target.options_file.empty()) {
    ENGINE_ASSIGN_OR_RETURN(std::string text, ReadFile(target.options_file));
    google::protobuf::TextFormat::Parser parser;
    CollectErrors errors;
    parser.RecordErrorsTo(&errors);
    if (!parser.ParseFromString(text, subject.options.get())) {
      return InvalidArgumentError(target.options_file + ":" + errors.first + " (the file holds " +
                                  subject.options->GetDescriptor()->full_name() +
                                  " in text format)");
    }
    subject.base_dir =
        std::filesystem::absolute(target.options_file).lexically_normal().parent_path();
    subject.options_given = true;
  }
  return subject;
}

// Calls ValidateOptions, turning an escaped exception into an error.
Status Validate(const Plugin& plugin, const Message& options, OptionErrors* errors) {
  try {
    plugin.ValidateOptions(options, errors);
    return Status::Ok();
  } catch (...) {
    return InternalError("an exception escaped ValidateOptions: " + CurrentExceptionMessage());
  }
}

std::vector<const FieldDescriptor*> RequiredFields(const Descriptor* d) {
  std::vector<const FieldDescriptor*> out;
  for (int i = 0; i < d->field_count(); ++i) {
    if (d->field(i)->options().GetExtension(engine::required)) out.push_back(d->field(i));
  }
  return out;
}

// Whether `path` ("a.b[2]") names a field of `d`.
bool PathExists(const Descriptor* d, const std::string& path) {
  for (const FieldPathStep& step : SplitFieldPath(path)) {
    if (d == nullptr) return false;
    const FieldDescriptor* f = d->FindFieldByName(step.name);
    if (f == nullptr) return false;
    d = f->message_type();
  }
  return true;
}

}  // namespace

// The options the kind's factory is exercised with: the target's, or the defaults when they
// validate. Skip when neither works.
StatusOr<const Message*> UsableOptions(const Subject& s) {
  OptionErrors errors;
  if (CheckRequiredFields(*s.options, &errors)) {
    ENGINE_RETURN_IF_ERROR(Validate(*s.loaded.plugin, *s.options, &errors));
  }
  if (!errors.empty()) {
    return FailedPreconditionError(
        std::string(s.options_given ? "the given options do not validate: "
                                    : "needs --options: the defaults do not validate: ") +
        JoinErrors(errors));
  }
  return s.options.get();
}

namespace {

// --- Checks for every plugin
// ----------------------------------------------------------------------

CheckResult Manifest(const Subject& s) {
  const LoadedPlugin& p = s.loaded;
  if (p.version.empty()) return Fail("the manifest has no version");
  if (p.description.empty()) return Fail("the manifest has no description");
  return Pass("plugin '" + p.name + "' (" + std::string(PluginKindTitle(p.kind)) + ") " +
              p.version + ": manifest matches this engine (plugin API " +
              std::to_string(ENGINE_PLUGIN_API_VERSION) + ", LibTorch " + compat::kTorchVersion +
              "), one plugin registered");
}

CheckResult OptionsSchema(const Subject& s) {
  const Message& defaults = s.loaded.plugin->default_options();
  const Descriptor* d = defaults.GetDescriptor();
  if (d == nullptr || d->full_name().empty()) return Fail("the options message has no type");
  std::unique_ptr<Message> fresh(defaults.New());
  if (fresh->SerializeAsString() != defaults.SerializeAsString()) {
    return Fail("default_options() holds set fields; it must be the message's defaults");
  }
  const auto required = RequiredFields(d);
  OptionErrors errors;
  Status status = Validate(*s.loaded.plugin, *fresh, &errors);
  if (!status.ok()) return Fail(status.message());
  for (const auto& e : errors.entries()) {
    if (!e.field_path.empty() && !PathExists(d, e.field_path)) {
      return Fail("ValidateOptions names field '" + e.field_path + "', which " + d->full_name() +
                  " does not have");
    }
  }
  if (required.empty() && !errors.empty()) {
    return Fail("the defaults do not validate and no field is marked required: " +
                JoinErrors(errors));
  }
  if (s.options_given) {
    OptionErrors given;
    if (CheckRequiredFields(*s.options, &given))
      status = Validate(*s.loaded.plugin, *s.options, &given);
    if (!status.ok()) return Fail(status.message());
    if (!given.empty()) return Fail("the given options do not validate: " + JoinErrors(given));
  }
  return Pass(d->full_name() + ": " + std::to_string(d->field_count()) + " field(s), " +
              std::to_string(required.size()) + " required; " +
              (required.empty() ? "the defaults validate" : "defaults checked"));
}

// Variants of `base` with one field set to an unusual value each.
// Long by design: one case per protobuf field type, each with the unusual values that type allows.
std::vector<std::pair<std::string, std::unique_ptr<Message>>> BadVariants(const Message& base) {
  std::vector<std::pair<std::string, std::unique_ptr<Message>>> out;
  const Descriptor* d = base.GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_repeated() || f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) continue;
    auto add = [&](const std::string& what, auto&& set) {
      std::unique_ptr<Message> m(base.New());
      m->CopyFrom(base);
      set(m.get(), m->GetReflection());
      out.emplace_back(f->name() + " = " + what, std::move(m));
    };
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
        add("-1", [&](Message* m, auto* r) { r->SetInt32(m, f, -1); });
        add("max",
            [&](Message* m, auto* r) { r->SetInt32(m, f, std::numeric_limits<int32_t>::max()); });
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        add("-1", [&](Message* m, auto* r) { r->SetInt64(m, f, -1); });
        break;
      case FieldDescriptor::CPPTYPE_UINT32:
        add("0", [&](Message* m, auto* r) { r->SetUInt32(m, f, 0); });
        add("max",
            [&](Message* m, auto* r) { r->SetUInt32(m, f, std::numeric_limits<uint32_t>::max()); });
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        add("0", [&](Message* m, auto* r) { r->SetUInt64(m, f, 0); });
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
        add("-1", [&](Message* m, auto* r) { r->SetDouble(m, f, -1); });
        add("nan", [&](Message* m, auto* r) {
          r->SetDouble(m, f, std::numeric_limits<double>::quiet_NaN());
        });
        add("1e30", [&](Message* m, auto* r) { r->SetDouble(m, f, 1e30); });
        break;
      case FieldDescriptor::CPPTYPE_FLOAT:
        add("-1", [&](Message* m, auto* r) { r->SetFloat(m, f, -1); });
        add("nan", [&](Message* m, auto* r) {
          r->SetFloat(m, f, std::numeric_limits<float>::quiet_NaN());
        });
        break;
      case FieldDescriptor::CPPTYPE_STRING:
        add("\"\"", [&](Message* m, auto* r) { r->SetString(m, f, ""); });
        add("a path that does not exist", [&](Message* m, auto* r) {
          r->SetString(m, f, "/nonexistent/conformance/\x01garbage");
        });
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        add("flipped", [&](Message* m, auto* r) { r->SetBool(m, f, !r->GetBool(*m, f)); });
        break;
      case FieldDescriptor::CPPTYPE_ENUM:
        for (int v = 0; v < f->enum_type()->value_count(); ++v) {
          const auto* value = f->enum_type()->value(v);
          add(value->name(), [&](Message* m, auto* r) { r->SetEnum(m, f, value); });
        }
        break;
      default:
        break;
    }
  }
  return out;
}

// Exercises the kind's factory with `options`; only an escaped exception is a failure.
Status ExerciseFactory(const Subject& s, const Message& options) {
  try {
    const Plugin& plugin = *s.loaded.plugin;
    switch (s.loaded.kind) {
      case PluginKind::kDataLoader:
        (void)static_cast<const DataLoaderPlugin&>(plugin).Open(options,
                                                                DataContext{s.base_dir, 1});
        break;
      case PluginKind::kModelLoader: {
        DataSpec spec = SyntheticDataSpec();
        (void)static_cast<const ModelLoaderPlugin&>(plugin).Create(
            options, ModelContext{&spec, s.base_dir, 1});
        break;
      }
      case PluginKind::kPrecisionPolicy: {
        auto policy = static_cast<const PrecisionPolicyPlugin&>(plugin).Create(options);
        if (policy.ok()) {
          PrecisionRequest request;
          request.census = {{"w", "w", at::kFloat, 8, true, false}};
          request.device = ProbeDevice("cpu");
          OptionErrors errors;
          (void)(*policy)->MakePlan(request, &errors);
        }
        break;
      }
      case PluginKind::kCallback:
        (void)static_cast<const CallbackPlugin&>(plugin).Create(
            options, CallbackContext{"conformance", s.base_dir,
                                     std::filesystem::temp_directory_path(), "stage"});
        break;
      default:
        break;
    }
    return Status::Ok();
  } catch (...) {
    return InternalError("an exception escaped the factory: " + CurrentExceptionMessage());
  }
}

CheckResult BadOptions(const Subject& s) {
  const Descriptor* d = s.loaded.plugin->default_options().GetDescriptor();
  auto variants = BadVariants(*s.options);
  int rejected = 0;
  for (auto& [what, options] : variants) {
    OptionErrors errors;
    Status status = Validate(*s.loaded.plugin, *options, &errors);
    if (!status.ok()) return Fail("with " + what + ": " + status.message());
    for (const auto& e : errors.entries()) {
      if (!e.field_path.empty() && !PathExists(d, e.field_path)) {
        return Fail("with " + what + ": ValidateOptions names field '" + e.field_path +
                    "', which " + d->full_name() + " does not have");
      }
      if (e.message.empty()) return Fail("with " + what + ": an error without a message");
    }
    if (!errors.empty()) {
      ++rejected;
      continue;
    }
    // Names the variant in the report should the plugin crash on it.
    std::fprintf(stderr, "bad_options: trying %s\n", what.c_str());
    std::fflush(stderr);
    status = ExerciseFactory(s, *options);
    if (!status.ok()) return Fail("with " + what + ": " + status.message());
  }
  return Pass(std::to_string(variants.size()) + " unusual value(s) tried, " +
              std::to_string(rejected) +
              " rejected by ValidateOptions, the rest handled by the factory without an exception");
}

}  // namespace

std::vector<std::string> CheckNames() {
  return {"manifest",       "options_schema",     "bad_options",      "data_contract",
          "model_contract", "precision_contract", "callback_contract"};
}

std::string ContractCheckFor(const std::string& plugin_kind) {
  if (plugin_kind == ENGINE_KIND_DATA_LOADER) return "data_contract";
  if (plugin_kind == ENGINE_KIND_MODEL_LOADER) return "model_contract";
  if (plugin_kind == ENGINE_KIND_PRECISION_POLICY) return "precision_contract";
  if (plugin_kind == ENGINE_KIND_CALLBACK) return "callback_contract";
  return "";
}

const char* OutcomeName(Outcome outcome) {
  switch (outcome) {
    case Outcome::kPass:
      return "PASS";
    case Outcome::kSkip:
      return "SKIP";
    case Outcome::kFail:
      return "FAIL";
  }
  return "FAIL";
}

CheckResult RunCheck(const std::string& check, const Target& target) {
  CheckResult result;
  auto subject = Load(target);
  if (!subject.ok()) {
    result = check == "manifest" ? Fail(subject.status().message())
                                 : Skip("the library does not load (see manifest)");
  } else {
    const PluginKind kind = subject->loaded.kind;
    result.plugin_kind = std::string(PluginKindName(kind));
    auto for_kind = [&](PluginKind wanted, CheckResult (*fn)(const Subject&)) {
      return kind == wanted ? fn(*subject) : Skip("not a " + std::string(PluginKindTitle(wanted)));
    };
    if (check == "manifest") {
      result = Manifest(*subject);
    } else if (check == "options_schema") {
      result = OptionsSchema(*subject);
    } else if (check == "bad_options") {
      result = BadOptions(*subject);
    } else if (check == "data_contract") {
      result = for_kind(PluginKind::kDataLoader, DataContract);
    } else if (check == "model_contract") {
      result = for_kind(PluginKind::kModelLoader, ModelContract);
    } else if (check == "precision_contract") {
      result = for_kind(PluginKind::kPrecisionPolicy, PrecisionContract);
    } else if (check == "callback_contract") {
      result = for_kind(PluginKind::kCallback, CallbackContract);
    } else {
      result = Fail("no check named '" + check + "'");
    }
    result.plugin_kind = std::string(PluginKindName(kind));
  }
  result.check = check;
  return result;
}

}  // namespace engine::conformance
