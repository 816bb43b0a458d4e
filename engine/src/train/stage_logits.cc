#include "train/stage_logits.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/guarded_call.h"
#include "engine/image_batch.h"
#include "engine/model_logits.h"
#include "pipeline/resolved_pipeline.h"
#include "plan/pipeline_plan.h"

namespace engine {
namespace {

// The examples' batch from the data loader, on `device` but for the model's host fields.
StatusOr<Batch> FirstExamples(const StagePlan& plan, Split split, int64_t examples,
                              const at::Device& device,
                              const std::vector<std::string>& host_fields) {
  std::vector<int64_t> indices(static_cast<size_t>(examples));
  std::iota(indices.begin(), indices.end(), 0);
  ENGINE_ASSIGN_OR_RETURN(Batch batch, GuardedCall(plan.stage->data.context, [&] {
                            return plan.dataset->GetBatch(split, indices);
                          }));
  for (auto& [name, tensor] : batch) {
    if (std::find(host_fields.begin(), host_fields.end(), name) == host_fields.end()) {
      tensor = tensor.to(device);
    }
  }
  return batch;
}

// What LogitsModel promises: logits [batch, positions, vocabulary] and positions [batch, positions]
// or [3, batch, positions] for the batch's input_ids.
Status CheckShapes(const Batch& batch, const BatchLogits& out, const std::string& architecture) {
  const auto ids = batch.find("input_ids");
  if (ids == batch.end()) return InvalidArgumentError("the batch has no 'input_ids'");
  const int64_t rows = ids->second.size(0), positions = ids->second.size(1);
  const auto wrong = [&](const std::string& what, const at::Tensor& tensor) {
    return InternalError("the model '" + architecture + "' returned " + what + " of shape " +
                         (tensor.defined() ? c10::str(tensor.sizes()) : std::string("none")) +
                         " for input_ids [" + std::to_string(rows) + ", " +
                         std::to_string(positions) + "]");
  };
  const at::Tensor& logits = out.logits;
  if (!logits.defined() || logits.dim() != 3 || logits.size(0) != rows ||
      logits.size(1) != positions) {
    return wrong("logits", logits);
  }
  const at::Tensor& p = out.position_ids;
  const bool plain = p.defined() && p.dim() == 2 && p.size(0) == rows && p.size(1) == positions;
  const bool multimodal =
      p.defined() && p.dim() == 3 && p.size(0) == 3 && p.size(1) == rows && p.size(2) == positions;
  if (!plain && !multimodal) return wrong("position_ids", p);
  return Status::Ok();
}

// The batch's fields transformers' models take, the model's positions and logits, on the CPU.
StatusOr<safetensors::NamedTensors> FileTensors(const Batch& batch, const BatchLogits& out) {
  safetensors::NamedTensors tensors;
  for (const char* field : {"input_ids", "attention_mask", "labels"}) {
    if (auto it = batch.find(field); it != batch.end()) {
      tensors.emplace_back(field, it->second.to(at::kCPU, at::kLong));
    }
  }
  tensors.emplace_back("position_ids", out.position_ids.to(at::kCPU, at::kLong));
  tensors.emplace_back("logits", out.logits.to(at::kCPU, at::kFloat));
  for (const VisualFields& fields : {kImageFields, kVideoFields}) {
    if (batch.count(fields.pixels) == 0) continue;
    const at::Tensor& packed = batch.at(fields.pixels);
    ENGINE_ASSIGN_OR_RETURN(ImagesOfBatch visuals, UnpackImages(batch, packed.size(-1), fields));
    if (visuals.empty()) continue;
    std::vector<int64_t> grids;
    std::vector<double> seconds;
    for (size_t row = 0; row < visuals.row_grids.size(); ++row) {
      for (const ImageGrid& grid : visuals.row_grids[row]) {
        grids.insert(grids.end(), {grid.t, grid.h, grid.w});
      }
      const auto& row_seconds = visuals.row_seconds_per_grid[row];
      seconds.insert(seconds.end(), row_seconds.begin(), row_seconds.end());
    }
    tensors.emplace_back(fields.pixels, visuals.pixel_values.to(at::kCPU, at::kFloat));
    tensors.emplace_back(fields.grids, at::tensor(grids, at::kLong).view({-1, 3}));
    if (fields.seconds != nullptr) {
      tensors.emplace_back(fields.seconds, at::tensor(seconds, at::kDouble).to(at::kFloat));
    }
  }
  return tensors;
}

}  // namespace

StatusOr<StageLogits> ComputeStageLogits(const StageRunRequest& request,
                                         const std::filesystem::path& checkpoint, int64_t examples,
                                         Split split) {
  const StagePlan& plan = *request.plan;
  const ResolvedStage& stage = *plan.stage;
  const int64_t available = split == Split::kEval ? plan.eval_examples : plan.train_examples;
  if (available == 0) {
    return FailedPreconditionError("stage '" + stage.name + "' has no " +
                                   std::string(SplitName(split)) +
                                   " examples to compute logits on");
  }
  examples = std::min(examples > 0 ? examples : plan.eval_batch_size, available);
  StageLogits result;
  Status used = WithStageModel(request, checkpoint, [&](Model& model) -> Status {
    auto* logits_model = dynamic_cast<LogitsModel*>(&model);
    if (logits_model == nullptr) {
      return FailedPreconditionError("the model '" + model.architecture() +
                                     "' does not report its logits (engine/model_logits.h)");
    }
    ENGINE_ASSIGN_OR_RETURN(Batch batch, FirstExamples(plan, split, examples, stage.device.device,
                                                       model.host_fields()));
    at::NoGradGuard no_grad;
    ENGINE_ASSIGN_OR_RETURN(BatchLogits out, logits_model->Logits(batch));
    ENGINE_RETURN_IF_ERROR(CheckShapes(batch, out, model.architecture()));
    ENGINE_ASSIGN_OR_RETURN(result.tensors, FileTensors(batch, out));
    result.metadata = {{"stage", stage.name},
                       {"checkpoint", checkpoint.string()},
                       {"architecture", model.architecture()},
                       {"examples", std::to_string(examples)},
                       {"split", std::string(SplitName(split))}};
    return Status::Ok();
  });
  if (!used.ok()) return used;
  return result;
}

}  // namespace engine
