#include "cli/arguments.h"

#include <charconv>
#include <type_traits>

#include "engine/format.h"

namespace engine::cli {

Arguments ParseArguments(const std::vector<std::string>& args,
                         const std::set<std::string>& value_flags,
                         const std::set<std::string>& switch_flags) {
  Arguments out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "-h" || arg == "--help") {
      out.help = true;
      continue;
    }
    if (arg == "--") {
      out.positional.insert(out.positional.end(), args.begin() + i + 1, args.end());
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      out.positional.push_back(arg);
      continue;
    }
    std::string name = arg.substr(arg[1] == '-' ? 2 : 1);
    std::string value;
    bool has_value = false;
    size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    if (switch_flags.count(name)) {
      if (has_value) {
        out.error = "--" + name + " takes no value";
        return out;
      }
      out.switches.insert(name);
    } else if (value_flags.count(name)) {
      if (!has_value) {
        if (i + 1 >= args.size()) {
          out.error = "--" + name + " needs a value";
          return out;
        }
        value = args[++i];
      }
      out.values[name] = value;
      out.all[name].push_back(value);
    } else {
      out.error = "unknown flag '" + arg + "'";
      return out;
    }
  }
  return out;
}

namespace {

template <typename Number>
bool ReadNumberFlag(const std::string& name, Number min, Number max, const char* what,
                    Arguments* args, Number* out) {
  if (!args->error.empty()) return false;
  auto it = args->values.find(name);
  if (it == args->values.end()) return true;
  const std::string& text = it->second;
  Number value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty() ||
      !(value >= min && value <= max)) {
    const auto format = [](Number bound) {
      if constexpr (std::is_integral_v<Number>) {
        return std::to_string(bound);
      } else {
        return FormatNumber(bound);
      }
    };
    args->error = "--" + name + " must be " + what + " from " + format(min) + " to " + format(max) +
                  ", not '" + text + "'";
    return false;
  }
  *out = value;
  return true;
}

}  // namespace

bool ReadIntFlag(const std::string& name, int64_t min, int64_t max, Arguments* args, int64_t* out) {
  return ReadNumberFlag(name, min, max, "a whole number", args, out);
}

bool ReadDoubleFlag(const std::string& name, double min, double max, Arguments* args, double* out) {
  return ReadNumberFlag(name, min, max, "a number", args, out);
}

std::string ReadTextOrJsonFormat(Arguments* args) {
  const std::string format = args->Get("format", "text");
  if (format == "text" || format == "json") return format;
  if (args->error.empty()) args->error = "--format must be text or json, not '" + format + "'";
  return "text";
}

bool ReadSplitFlag(Arguments* args, Split* out) {
  if (!args->error.empty()) return false;
  auto it = args->values.find("split");
  if (it == args->values.end()) return true;
  for (Split split : {Split::kTrain, Split::kEval}) {
    if (it->second == SplitName(split)) {
      *out = split;
      return true;
    }
  }
  args->error = "--split must be train or eval, not '" + it->second + "'";
  return false;
}

}  // namespace engine::cli
