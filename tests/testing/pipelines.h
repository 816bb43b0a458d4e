// Pipeline texts for tests: one stage of the mlp on the real digits data.
#pragma once

#include <string>

#include "testing/temp_dir.h"

namespace engine::testing {

// `stage_extra` goes inside the stage; `model_options` inside MlpOptions.
inline std::string DigitsStage(const std::string& name, const std::string& stage_extra,
                               const std::string& model_options = "") {
  return "stage {\n  name: \"" + name +
         "\"\n  model { plugin: \"mlp\" options { [type.googleapis.com/engine.plugins.MlpOptions] "
         "{ " +
         model_options +
         " } } }\n  data { plugin: \"digits\" options { "
         "[type.googleapis.com/engine.plugins.DigitsOptions] { path: \"" +
         DigitsDataPath().string() + "\" } } }\n" + stage_extra + "\n}\n";
}

inline std::string Precision(const std::string& policy, const std::string& options = "") {
  return "  precision { plugin: \"" + policy + "\"" +
         (options.empty() ? std::string()
                          : " options { [type.googleapis.com/engine.proto.PrecisionOptions] { " +
                                options + " } }") +
         " }\n";
}

}  // namespace engine::testing
