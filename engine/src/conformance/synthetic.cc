#include "conformance/synthetic.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>

namespace engine::conformance {

DataSpec SyntheticDataSpec() {
  DataSpec spec;
  spec.fields = {{"features", at::kFloat, {8}, 0},
                 {"labels", at::kLong, {}, 3},
                 {"input_ids", at::kLong, {16}, 64},
                 {"pixel_values", at::kFloat, {3, 8, 8}, 0}};
  return spec;
}

Batch SyntheticBatch(const DataSpec& spec, int64_t batch_size) {
  at::Generator generator = at::detail::createCPUGenerator(1234);
  Batch batch;
  for (const FieldSpec& field : spec.fields) {
    std::vector<int64_t> shape = {batch_size};
    for (int64_t d : field.shape) shape.push_back(d < 0 ? 16 : d);
    if (at::isFloatingType(field.dtype)) {
      batch[field.name] = at::randn(shape, generator, at::TensorOptions().dtype(field.dtype));
    } else {
      const int64_t high = field.num_classes > 0 ? field.num_classes : 64;
      batch[field.name] =
          at::randint(0, high, shape, generator, at::TensorOptions().dtype(field.dtype));
    }
  }
  return batch;
}

std::vector<Event> SyntheticEvents() {
  std::vector<Event> events;
  auto make = [&](EventType type, int64_t step) {
    Event e;
    e.type = type;
    e.pipeline = "conformance";
    e.stage = type == EventType::kPipelineBegin || type == EventType::kPipelineEnd ? "" : "stage";
    e.step = step;
    e.total_steps = 5;
    e.elapsed_seconds = 0.1 * static_cast<double>(step);
    return e;
  };
  events.push_back(make(EventType::kPipelineBegin, 0));
  Event begin = make(EventType::kStageBegin, 0);
  begin.plan_json = "{\"name\":\"stage\"}";
  events.push_back(begin);
  for (int64_t step = 1; step <= 5; ++step) {
    Event e = make(EventType::kStepEnd, step);
    e.metrics = {
        {"loss", 1.0 / static_cast<double>(step)}, {"lr", 0.001}, {"examples", 32.0 * step}};
    e.memory = ReadMemoryStats();
    events.push_back(e);
  }
  Event eval = make(EventType::kEval, 5);
  eval.metrics = {{"eval/loss", 0.5}, {"eval/accuracy", 0.75}};
  events.push_back(eval);
  Event saved = make(EventType::kCheckpointSaved, 5);
  saved.path = "/nonexistent/checkpoint";
  events.push_back(saved);
  Event end = make(EventType::kStageEnd, 5);
  end.metrics = eval.metrics;
  end.message = "finished";
  end.memory = ReadMemoryStats();
  events.push_back(end);
  Event error = make(EventType::kError, 5);
  error.message = "a made-up error";
  events.push_back(error);
  Event pipeline_end = make(EventType::kPipelineEnd, 0);
  pipeline_end.message = "finished";
  events.push_back(pipeline_end);
  return events;
}

}  // namespace engine::conformance
