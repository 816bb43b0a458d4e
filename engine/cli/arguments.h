// A small command-line parser for `engine <command> [flags] [arguments]`.
//
// Flags are `--name=value`, `--name value` or, for switches, `--name`; `-h`/`--help` anywhere asks
// for help. Anything else starting with '-' is an error naming the flag.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

namespace engine::cli {

struct Arguments {
  std::vector<std::string> positional;
  std::map<std::string, std::string> values;
  std::set<std::string> switches;
  bool help = false;
  std::string error;  // non-empty when the command line is malformed

  bool Has(const std::string& name) const { return values.count(name) || switches.count(name); }
  std::string Get(const std::string& name, const std::string& fallback = "") const {
    auto it = values.find(name);
    return it == values.end() ? fallback : it->second;
  }
};

Arguments ParseArguments(const std::vector<std::string>& args,
                         const std::set<std::string>& value_flags,
                         const std::set<std::string>& switch_flags);

}  // namespace engine::cli
