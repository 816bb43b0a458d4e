// How a stage that starts from a parent stage (`from_stage`) takes the parent's tensors: the one
// mapping used both by `engine check` (against the parent's planned model) and by the trainer
// (against the parent's checkpoint), so what check accepts is exactly what the run loads.
//
// For each tensor of the child's model:
//   - same name and shape in the parent: copied (dtype converted);
//   - a quantized layer of the child whose parent weight is dense [out, in]: the dense weight is
//     quantized into it (e.g. bf16 weights from stage 1 become NF4 in stage 2); a parent that was
//     quantized the same way is copied as is;
//   - the child's own new adapters: kept as initialised (LoRA's B is zero, so the model's output is
//     the parent's at step 0);
//   - other tensors the parent lacks that match one of the stage's `new_tensors` globs: kept as
//     initialised too (a `vlm` starting from a `llama` language model: its vision tower is new).
// The parent's adapters (its LoRA A/B tensors) are re-attached when the child has the same adapters
// (same names and shapes: they go on training), or merged into the base weight when the stage sets
// `parent_adapters: MERGE`. Anything else (a tensor only one side has, another shape, adapters with
// nowhere to go) is a problem, and problems are reported together, never half-loaded.
//
// Pure functions of their inputs; no I/O.
#pragma once

#include <torch/nn/module.h>

#include <map>
#include <set>
#include <string>
#include <vector>

namespace engine {

// What the parent leaves behind.
struct HandoffSource {
  std::string stage;                                    // for messages
  std::map<std::string, std::vector<int64_t>> tensors;  // model tensors by name, with shapes
  std::set<std::string> adapter_tensors;                // those among them that are adapters
  // Those stored as integers (quantized codes): never taken for a dense weight, whatever the shape.
  std::set<std::string> integer_tensors;
};

struct Handoff {
  // Child tensor names loaded from the parent tensor of the same name.
  std::vector<std::string> copied;
  // Child layers (engine::Linear names) set from the parent's dense "<layer>.weight" through
  // LinearImpl::LoadDenseWeight (quantized on the fly, and with merged adapters added first).
  std::vector<std::string> dense_layers;
  // Of those, the layers whose parent adapters are merged, with their parent adapter prefixes
  // ("<layer>.lora_A.weight" ...).
  std::map<std::string, std::vector<std::string>> merged_adapters;
  // Child tensors the parent does not have and that keep their initial values (new adapters).
  std::vector<std::string> fresh;
  // Child tensors the parent does not have that `new_tensors` keeps at their initial values.
  std::vector<std::string> initialised;
  std::vector<std::string> problems;

  int64_t quantized_layers = 0;  // dense_layers that are quantized in the child
  int64_t reattached_adapter_tensors = 0;
};

// `new_tensor_globs`: the stage's `new_tensors` patterns; one that matches no tensor the parent
// lacks is a problem.
Handoff PlanHandoff(const HandoffSource& parent, torch::nn::Module& child,
                    const std::set<std::string>& child_adapter_parameters, bool merge_adapters,
                    const std::vector<std::string>& new_tensor_globs = {});

// "52 tensors copied, 14 layers quantized from dense weights, 8 adapter tensors new"
std::string HandoffSummary(const Handoff& handoff);

// The problems joined for one error message (at most `limit`, then a count).
std::string HandoffProblems(const Handoff& handoff, size_t limit = 5);

}  // namespace engine
