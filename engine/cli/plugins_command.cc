#include <google/protobuf/descriptor.h>
#include <google/protobuf/text_format.h>

#include <iostream>
#include <sstream>

#include "cli/arguments.h"
#include "cli/commands.h"
#include "engine/options.pb.h"
#include "run/pipeline_session.h"

namespace engine::cli {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

std::string TypeName(const FieldDescriptor* f) {
  if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) return f->message_type()->full_name();
  if (f->cpp_type() == FieldDescriptor::CPPTYPE_ENUM) {
    std::string values;
    for (int i = 0; i < f->enum_type()->value_count(); ++i) {
      values += (i ? "|" : "") + f->enum_type()->value(i)->name();
    }
    return "enum " + values;
  }
  return f->type_name();
}

std::string DefaultText(const Message& defaults, const FieldDescriptor* f) {
  std::string text;
  google::protobuf::TextFormat::Printer printer;
  printer.SetSingleLineMode(true);
  printer.PrintFieldValueToString(defaults, f, -1, &text);
  return text;
}

void DescribeFields(const Message& defaults, int indent, std::ostream& out) {
  const Descriptor* d = defaults.GetDescriptor();
  const std::string pad(indent, ' ');
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    out << pad << f->name() << "  (" << (f->is_repeated() ? "repeated " : "") << TypeName(f);
    if (f->options().GetExtension(engine::required)) {
      out << ", required";
    } else if (!f->is_repeated() && f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) {
      out << ", default " << DefaultText(defaults, f);
    }
    out << ")\n";
    const std::string help = f->options().GetExtension(engine::help);
    if (!help.empty()) out << pad << "    " << help << "\n";
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && f->message_type() != d) {
      const Message& nested = defaults.GetReflection()->GetMessage(defaults, f);
      DescribeFields(nested, indent + 4, out);
    }
  }
}

void SnippetFields(const Message& defaults, int indent, std::ostream& out) {
  const Descriptor* d = defaults.GetDescriptor();
  const std::string pad(indent, ' ');
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    const bool required = f->options().GetExtension(engine::required);
    if (f->is_repeated()) {
      out << pad << "# " << f->name() << ": ...  (repeated)\n";
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      out << pad << f->name() << " {\n";
      SnippetFields(defaults.GetReflection()->GetMessage(defaults, f), indent + 2, out);
      out << pad << "}\n";
    } else if (required) {
      out << pad << f->name() << ": "
          << (f->cpp_type() == FieldDescriptor::CPPTYPE_STRING ? "\"\"" : "0") << "  # required\n";
    } else if (f->options().GetExtension(engine::help).find("unset:") != std::string::npos) {
      out << pad << "# " << f->name() << ": " << DefaultText(defaults, f)
          << "  (unset: see describe)\n";
    } else {
      out << pad << f->name() << ": " << DefaultText(defaults, f) << "\n";
    }
  }
}

std::string StageField(PluginKind kind) {
  switch (kind) {
    case PluginKind::kModelLoader:
      return "model";
    case PluginKind::kDataLoader:
      return "data";
    case PluginKind::kQuantizer:
      return "quantizer";
    case PluginKind::kAdapter:
      return "adapter";
    case PluginKind::kPrecisionPolicy:
      return "precision";
    case PluginKind::kCallback:
      return "callback";
  }
  return "?";
}

void Describe(const PluginRegistry::Entry& e, std::ostream& out) {
  const Message& defaults = e.plugin->default_options();
  const Descriptor* d = defaults.GetDescriptor();
  const bool has_options = d->field_count() > 0;
  out << e.name << " (" << PluginKindTitle(e.kind) << ") " << e.version << "\n";
  if (!e.description.empty()) out << "  " << e.description << "\n";
  out << "  library: " << e.library.string() << "\n\n";
  if (has_options) {
    out << "options: " << d->full_name() << "\n";
    DescribeFields(defaults, 2, out);
  } else {
    out << "options: none\n";
  }
  out << "\nsnippet for a stage:\n\n";
  out << "  " << StageField(e.kind) << " {\n";
  out << "    plugin: \"" << e.name << "\"\n";
  if (has_options) {
    out << "    options {\n";
    out << "      [type.googleapis.com/" << d->full_name() << "] {\n";
    SnippetFields(defaults, 8, out);
    out << "      }\n";
    out << "    }\n";
  }
  if (e.kind == PluginKind::kCallback) out << "    on_error: DISABLE  # or WARN, FAIL_STAGE\n";
  out << "  }\n";
}

}  // namespace

std::string PluginsHelp() {
  return R"(usage: engine plugins [--plugin_path=DIR[:DIR...]]
       engine plugins describe NAME [--plugin_path=DIR[:DIR...]]

Lists the plugins found on the search path (the built-in plugin directory, --plugin_path, then
$ENGINE_PLUGIN_PATH): name, kind, version and library. `describe` prints a plugin's options
schema with defaults and help, and a snippet to paste into a stage.

Libraries on the search path that cannot be loaded are listed with the reason; two libraries
providing the same plugin are an error (exit status 1).
)";
}

int PluginsCommand(const std::vector<std::string>& args) {
  Arguments a = ParseArguments(args, {"plugin_path"}, {});
  if (a.help) {
    std::cout << PluginsHelp();
    return kExitOk;
  }
  const bool describe = !a.positional.empty() && a.positional[0] == "describe";
  if (a.error.empty()) {
    if (describe && a.positional.size() != 2) a.error = "describe needs one plugin name";
    if (!describe && !a.positional.empty()) a.error = "unknown argument '" + a.positional[0] + "'";
  }
  if (!a.error.empty()) {
    std::cerr << "engine plugins: " << a.error << "\n\n" << PluginsHelp();
    return kExitUsage;
  }
  PluginRegistry registry;
  Status status = LoadPluginSearchPath(a.Get("plugin_path"), &registry);
  int exit_code = kExitOk;
  if (!status.ok()) {
    std::cerr << "engine plugins: error: " << status.message() << "\n";
    exit_code = kExitFailure;
  }
  if (describe) {
    const std::string& name = a.positional[1];
    std::vector<const PluginRegistry::Entry*> found = registry.FindByName(name);
    if (found.empty()) {
      std::cerr << "engine plugins: no plugin named '" << name
                << "' is installed; `engine plugins` lists them\n";
      return kExitFailure;
    }
    for (size_t i = 0; i < found.size(); ++i) {
      if (i > 0) std::cout << "\n";
      Describe(*found[i], std::cout);
    }
    return exit_code;
  }
  std::vector<const PluginRegistry::Entry*> all = registry.All();
  size_t name_width = 4, kind_width = 4, version_width = 7;
  for (const auto* e : all) {
    name_width = std::max(name_width, e->name.size());
    kind_width = std::max(kind_width, PluginKindName(e->kind).size());
    version_width = std::max(version_width, e->version.size());
  }
  auto pad = [](std::string s, size_t w) { return s + std::string(w + 2 - s.size(), ' '); };
  std::cout << pad("NAME", name_width) << pad("KIND", kind_width) << pad("VERSION", version_width)
            << "LIBRARY\n";
  for (const auto* e : all) {
    std::cout << pad(e->name, name_width) << pad(std::string(PluginKindName(e->kind)), kind_width)
              << pad(e->version, version_width) << e->library.string() << "\n";
  }
  for (const std::string& skipped : registry.skipped()) {
    std::cerr << "engine plugins: skipped: " << skipped << "\n";
  }
  return exit_code;
}

}  // namespace engine::cli
