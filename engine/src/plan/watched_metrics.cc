#include "plan/watched_metrics.h"

#include <ATen/core/grad_mode.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <torch/nn/module.h>

#include <optional>
#include <set>

#include "core/guarded_call.h"
#include "engine/data.h"
#include "engine/model.h"

namespace engine {
namespace {

// The eval/ metric a callback watches by the `metric` option convention, or "".
std::string WatchedMetric(const ResolvedCallback& callback) {
  const google::protobuf::Message& options = *callback.ref.options;
  const google::protobuf::FieldDescriptor* field =
      options.GetDescriptor()->FindFieldByName("metric");
  if (field == nullptr || field->is_repeated() ||
      field->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_STRING) {
    return "";
  }
  std::string metric = options.GetReflection()->GetString(options, field);
  return metric.rfind("eval/", 0) == 0 ? metric : "";
}

// The metric names one evaluation reports ("eval/loss", "eval/<model metric>"), from one forward
// on the first evaluation example; nullopt when that cannot run here.
std::optional<std::set<std::string>> ReportedMetrics(const ResolvedStage& stage,
                                                     const StagePlan& plan) {
  if (plan.eval_examples <= 0 || plan.model == nullptr || plan.dataset == nullptr) {
    return std::nullopt;
  }
  torch::nn::Module& module = plan.model->module();
  const bool was_training = module.is_training();
  module.eval();
  StatusOr<ModelOutput> output = [&]() -> StatusOr<ModelOutput> {
    at::NoGradGuard no_grad;
    ENGINE_ASSIGN_OR_RETURN(Batch batch, GuardedCall(stage.data.context, [&] {
                              return plan.dataset->GetBatch(Split::kEval, {0});
                            }));
    return GuardedCall(stage.model.context, [&] { return plan.model->Forward(batch); });
  }();
  module.train(was_training);
  if (!output.ok()) return std::nullopt;
  std::set<std::string> names = {"eval/loss"};
  for (const auto& [name, metric] : output->metrics) names.insert("eval/" + name);
  return names;
}

}  // namespace

std::vector<WatchedMetricError> CheckWatchedMetrics(const ResolvedPipeline& pipeline,
                                                    const ResolvedStage& stage,
                                                    const StagePlan& plan) {
  std::vector<const ResolvedCallback*> watching;
  for (const auto* list : {&stage.callbacks, &pipeline.callbacks}) {
    for (const ResolvedCallback& c : *list) {
      if (!WatchedMetric(c).empty()) watching.push_back(&c);
    }
  }
  if (watching.empty()) return {};
  const std::optional<std::set<std::string>> reported = ReportedMetrics(stage, plan);
  if (!reported) return {};
  std::string known;
  for (const std::string& name : *reported) known += (known.empty() ? "" : ", ") + name;
  std::vector<WatchedMetricError> errors;
  for (const ResolvedCallback* c : watching) {
    const std::string metric = WatchedMetric(*c);
    if (reported->count(metric) == 0) {
      errors.push_back({c->ref.path + ".options", c->ref.context + ": watches '" + metric +
                                                      "', which " + stage.subject() +
                                                      "'s evaluation does not report (it "
                                                      "reports " +
                                                      known + ")"});
    }
  }
  return errors;
}

}  // namespace engine
