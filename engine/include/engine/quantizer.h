// Quantizer plugins: store some of a model's linear layers in a compact format.
//
// After the model is built (and, for a stage with a parent, loaded), the engine finds every
// engine::Linear (engine/linear.h) whose name a target pattern matches and replaces its dense
// weight with what Quantize returns. The layer is then frozen: its weight is a buffer, and the
// backward pass gives the layer's input a gradient and the weight none. Everything else keeps its
// dtype. The plan prints how many layers and parameters were quantized and their bits per
// parameter.
//
// Target patterns: a pattern matches a layer when it matches the layer's whole name
// ("model.layers.*.mlp.*") or its last component ("q_proj"), with the globs of `trainable`. A
// pattern that matches no layer is an error, and so is a stage whose model has no engine::Linear.
//
// The plugin object is shared and its methods are const; Quantize may run on several layers at
// once from different threads. Errors are Statuses naming the problem; the engine prefixes the
// layer's name.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/linear.h"
#include "engine/plugin.h"

namespace engine {

class QuantizerPlugin : public Plugin {
 public:
  PluginKind kind() const final { return PluginKind::kQuantizer; }

  // The target patterns the options select; empty means every engine::Linear.
  virtual std::vector<std::string> targets(const google::protobuf::Message& options) const = 0;
  // The options' field that holds the patterns ("target_modules"), for error positions.
  virtual std::string targets_field() const { return "target_modules"; }

  // `weight` is a layer's dense weight [out, in] on the CPU in its stored dtype.
  virtual StatusOr<std::shared_ptr<QuantizedWeight>> Quantize(
      const google::protobuf::Message& options, const at::Tensor& weight) const = 0;
};

}  // namespace engine
