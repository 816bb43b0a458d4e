#include "cli/arguments.h"

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
    } else {
      out.error = "unknown flag '" + arg + "'";
      return out;
    }
  }
  return out;
}

}  // namespace engine::cli
