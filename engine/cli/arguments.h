// A small command-line parser for `engine <command> [flags] [arguments]`.
//
// Flags are `--name=value`, `--name value` or, for switches, `--name`; `-h`/`--help` anywhere asks
// for help. Anything else starting with '-' is an error naming the flag.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "engine/data.h"

namespace engine::cli {

struct Arguments {
  std::vector<std::string> positional;
  std::map<std::string, std::string> values;            // the last value of each flag
  std::map<std::string, std::vector<std::string>> all;  // every value of each flag, in order
  std::set<std::string> switches;
  bool help = false;
  std::string error;  // non-empty when the command line is malformed

  bool Has(const std::string& name) const { return values.count(name) || switches.count(name); }
  std::vector<std::string> GetAll(const std::string& name) const {
    auto it = all.find(name);
    return it == all.end() ? std::vector<std::string>() : it->second;
  }
  std::string Get(const std::string& name, const std::string& fallback = "") const {
    auto it = values.find(name);
    return it == values.end() ? fallback : it->second;
  }
};

Arguments ParseArguments(const std::vector<std::string>& args,
                         const std::set<std::string>& value_flags,
                         const std::set<std::string>& switch_flags);

// Flag `name`'s value as a number in [min, max], into `*out` (left as it is when the flag is
// absent). When the value is not such a number (the whole of it), sets args->error naming the flag
// and returns false; does nothing when args->error is already set.
bool ReadIntFlag(const std::string& name, int64_t min, int64_t max, Arguments* args, int64_t* out);
bool ReadDoubleFlag(const std::string& name, double min, double max, Arguments* args, double* out);

// --format=text|json: its value, "text" when absent. Another value sets args->error naming it
// (unless an error is already set) and gives "text".
std::string ReadTextOrJsonFormat(Arguments* args);

// --split=train|eval into `*out` (left as it is when the flag is absent), with the same error and
// return conventions.
bool ReadSplitFlag(Arguments* args, Split* out);

}  // namespace engine::cli
