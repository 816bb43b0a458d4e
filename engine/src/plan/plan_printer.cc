#include "plan/plan_printer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "dist/gradient_reduce_scatter.h"
#include "engine/dtype.h"
#include "engine/format.h"
#include "engine/untrusted_file.h"
#include "precision/census.h"

namespace engine {
namespace {

std::string Dt(at::ScalarType t) { return std::string(DtypeShortName(t)); }

std::string OnErrorName(proto::CallbackRef::OnError e) {
  switch (e) {
    case proto::CallbackRef::WARN:
      return "warn";
    case proto::CallbackRef::FAIL_STAGE:
      return "fail the stage";
    case proto::CallbackRef::DISABLE:
      return "disable";
  }
  return "disable";
}

std::string Pad(std::string s, size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

std::string PadLeft(std::string s, size_t width) {
  if (s.size() < width) s.insert(0, width - s.size(), ' ');
  return s;
}

std::string EvalText(const StagePlan& s) {
  const auto every = s.stage->config->schedule().eval_every_steps();
  std::string out =
      every > 0 ? "every " + std::to_string(every) + " steps and at the end" : "at the end";
  out += ", batch " + std::to_string(s.eval_batch_size);
  const int64_t batches =
      (s.eval_examples + s.eval_batch_size - 1) / std::max<int64_t>(1, s.eval_batch_size);
  if (s.world_size > 1 && batches >= s.world_size) {
    // Matches Trainer::Evaluate: batch b goes to rank b % world_size.
    out += "; " + std::to_string(batches) + " batches split across the " +
           std::to_string(s.world_size) + " ranks";
  }
  if (s.eval_examples == 0) out = "none (the eval split is empty)";
  return out;
}

std::string CheckpointText(const StagePlan& s) {
  const auto& schedule = s.stage->config->schedule();
  const auto& c = s.stage->config->checkpoint();
  std::string out = schedule.checkpoint_every_steps() > 0
                        ? "every " + std::to_string(schedule.checkpoint_every_steps()) +
                              " steps (keeping the last " + std::to_string(c.keep_last()) +
                              ") and at the end"
                        : "at the end";
  out += c.save_optimizer_state() ? "; optimizer state saved" : "; weights only";
  return out;
}

std::string PrecisionHeadline(const PrecisionPlan& p) {
  std::string out =
      p.requested.empty() || p.requested == p.policy ? p.policy : p.requested + " -> " + p.policy;
  out += p.autocast ? "; autocast " + Dt(*p.autocast) : std::string("; no autocast");
  if (p.loss_scaling.enabled) {
    out += "; dynamic loss scaling from " + FormatNumber(p.loss_scaling.initial_scale) + " (x" +
           FormatNumber(p.loss_scaling.growth_factor) + " every " +
           std::to_string(p.loss_scaling.growth_interval) + " clean steps, x" +
           FormatNumber(p.loss_scaling.backoff_factor) + " on overflow)";
  } else {
    out += "; no loss scaling";
  }
  return out;
}

std::string EpochsText(double epochs) {
  if (epochs == std::floor(epochs)) {
    return FormatNumber(epochs) + (epochs == 1 ? " epoch" : " epochs");
  }
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.2f epochs", epochs);
  return buffer;
}

// What each rank holds for the stage's tensors and its optimizer (activations not counted).
struct RankMemory {
  int64_t model = 0;  // weights and buffers in their storage dtypes
  int64_t gradients = 0;
  int64_t masters = 0;
  int64_t optimizer_state = 0;  // this rank's share
  int64_t all_optimizer_state = 0;
  // f32 buffers the ranks reduce gradients through: a copy of every gradient under DDP and
  // shard_level 1; at shard_level 2 this rank's parts and the buckets on the wire.
  int64_t reduce_buckets = 0;
  // shard_level 3: the blocks' trainable parameters, which `model` holds 1/N of, and what is whole
  // at a time: the block that runs and the next one, gathered meanwhile.
  int64_t block_parameters = 0;
  int64_t gathered_block = 0;
};

RankMemory MemoryPerRank(const StagePlan& s) {
  RankMemory m;
  const proto::Optimizer& optimizer = s.stage->config->optimizer();
  const int64_t slots = optimizer.has_sgd() ? (optimizer.sgd().momentum() > 0 ? 1 : 0) : 2;
  int64_t trainable_elements = 0;
  int64_t trainable_storage_bytes = 0;
  for (const PrecisionGroupPlan& g : s.precision.groups) {
    const bool master = g.has_grad && g.master != g.storage;
    const int64_t master_bytes =
        master ? g.num_elements * static_cast<int64_t>(c10::elementSize(g.master)) : 0;
    m.model += g.bytes - master_bytes;
    m.masters += master_bytes;
    if (!g.has_grad) continue;
    trainable_elements += g.num_elements;
    trainable_storage_bytes += g.bytes - master_bytes;
    m.gradients += g.num_elements * static_cast<int64_t>(c10::elementSize(g.grad));
    m.all_optimizer_state +=
        g.num_elements * slots * static_cast<int64_t>(c10::elementSize(g.optimizer_state));
  }
  // A sharded optimizer keeps its rank's parts of the state and of the masters.
  if (s.shards_optimizer()) {
    m.optimizer_state = (m.all_optimizer_state + s.world_size - 1) / s.world_size;
    m.masters = (m.masters + s.world_size - 1) / s.world_size;
  } else {
    m.optimizer_state = m.all_optimizer_state;
  }
  if (s.process_group) m.reduce_buckets = trainable_elements * 4;
  // Level 2 keeps only this rank's parts of the gradients, in their dtype and in f32, and sends
  // the rest through a few f32 buffers of the largest bucket's size (dist/shard_layout.h: a bucket
  // holds shard_bucket_bytes of one storage dtype).
  if (s.shards_gradients()) {
    m.gradients = (m.gradients + s.world_size - 1) / s.world_size;
    std::map<at::ScalarType, int64_t> elements_of_dtype;
    for (const PrecisionGroupPlan& g : s.precision.groups) {
      if (g.has_grad) elements_of_dtype[g.storage] += g.num_elements;
    }
    int64_t largest_bucket = 0;
    for (const auto& [dtype, elements] : elements_of_dtype) {
      largest_bucket = std::max(
          largest_bucket,
          std::min(elements, s.shard_bucket_bytes / static_cast<int64_t>(c10::elementSize(dtype))));
    }
    m.reduce_buckets = (trainable_elements * 4 + s.world_size - 1) / s.world_size +
                       int64_t{GradientReduceScatter::kBucketsInFlight} * 4 * largest_bucket;
  }
  // Level 3 keeps 1/N of the blocks' trainable parameters (in their storage dtypes, taken here at
  // the trainable parameters' mean element size) and gathers one block at a time.
  if (s.shards_parameters() && trainable_elements > 0) {
    const double element_bytes =
        static_cast<double>(trainable_storage_bytes) / static_cast<double>(trainable_elements);
    m.block_parameters =
        static_cast<int64_t>(static_cast<double>(s.block_trainable_elements) * element_bytes);
    // The largest block twice where there are several: one runs while the next is gathered.
    m.gathered_block =
        static_cast<int64_t>(static_cast<double>(s.largest_block_trainable_elements) *
                             element_bytes) *
        (s.blocks.size() > 1 ? 2 : 1);
    m.model -= m.block_parameters - (m.block_parameters + s.world_size - 1) / s.world_size;
  }
  return m;
}

// "1 block", "24 blocks".
std::string BlocksText(const StagePlan& s) {
  return std::to_string(s.blocks.size()) + (s.blocks.size() == 1 ? " block" : " blocks");
}

// The strategy and what it splits.
std::string RanksText(const StagePlan& s) {
  if (!s.shards_optimizer()) return "DDP";
  if (s.shards_parameters()) {
    return "SHARDED (shard_level 3: the optimizer state, the gradients and the trainable "
           "parameters of the model's " +
           BlocksText(s) + " split across the ranks)";
  }
  return "SHARDED (shard_level " + std::to_string(s.shard_level) + ": the optimizer state" +
         (s.shards_gradients() ? " and the gradients" : "") + " split across the ranks)";
}

// The buckets the ranks' collectives move.
std::string BucketsText(const StagePlan& s) {
  if (s.shards_parameters()) {
    return "gradients reduce-scattered and weights all-gathered in buckets of " +
           HumanBytes(s.shard_bucket_bytes) +
           "; each block's weights gathered for its forward and again for its backward, which "
           "recomputes it";
  }
  if (s.shards_gradients()) {
    return "gradients reduce-scattered and weights all-gathered in buckets of " +
           HumanBytes(s.shard_bucket_bytes);
  }
  std::string out = "gradients all-reduced in f32 buckets of " + HumanBytes(s.bucket_bytes);
  if (s.shards_optimizer()) {
    out += ", weights all-gathered in buckets of " + HumanBytes(s.shard_bucket_bytes);
  }
  return out;
}

std::string PlanMemoryText(const StagePlan& s) {
  const RankMemory m = MemoryPerRank(s);
  std::string out = std::string(s.world_size > 1 ? "per rank: " : "") + "model " +
                    HumanBytes(m.model) + ", gradients " + HumanBytes(m.gradients) +
                    ", f32 masters " + HumanBytes(m.masters) + ", optimizer state " +
                    HumanBytes(m.optimizer_state);
  if (s.shards_optimizer()) {
    out += " (1/" + std::to_string(s.world_size) + " of " + HumanBytes(m.all_optimizer_state) +
           (s.shards_parameters()  ? ", and of the masters, gradients and block parameters"
            : s.shards_gradients() ? ", and of the masters and gradients"
                                   : ", and of the masters") +
           ": shard_level " + std::to_string(s.shard_level) + ")";
  }
  if (m.reduce_buckets > 0) {
    out +=
        std::string(s.shards_gradients() ? ", reduce-scatter buffers " : ", all-reduce buckets ") +
        HumanBytes(m.reduce_buckets);
  }
  if (s.shards_parameters()) {
    out += ", gathered blocks " + HumanBytes(m.gathered_block) +
           (s.blocks.size() > 1 ? " (the largest, twice: one runs while the next is gathered; of "
                                : " (of ") +
           HumanBytes(m.block_parameters) + " in " + BlocksText(s) + ")";
  }
  return out + "; activations not counted";
}

nlohmann::json CallbacksJson(const std::vector<ResolvedCallback>& callbacks) {
  nlohmann::json out = nlohmann::json::array();
  for (const ResolvedCallback& c : callbacks) {
    out.push_back({{"plugin", c.ref.entry->name}, {"on_error", OnErrorName(c.on_error)}});
  }
  return out;
}

void AddModelJson(const StagePlan& s, nlohmann::json& js) {
  const ResolvedStage& st = *s.stage;
  js["model"] = {{"plugin", st.model.entry->name},
                 {"version", st.model.entry->version},
                 {"architecture", s.architecture},
                 {"parameters", s.total_parameters},
                 {"trainable_parameters", s.trainable_parameters},
                 {"trainable_tensors", s.trainable_tensors},
                 {"frozen_parameters", s.total_parameters - s.trainable_parameters}};
  if (st.quantizer.entry != nullptr) {
    js["quantizer"] = {
        {"plugin", st.quantizer.entry->name},   {"format", s.layers.quantized_format},
        {"layers", s.layers.quantized_layers},  {"weights", s.layers.quantized_parameters},
        {"bytes", s.layers.quantized_bytes},    {"bits_per_weight", s.layers.bits_per_parameter()},
        {"compute", s.layers.quantized_compute}};
  }
  js["adapters"] = nlohmann::json::array();
  for (const LayerPluginReport::Adapter& adapter : s.layers.adapters) {
    js["adapters"].push_back({{"plugin", adapter.plugin},
                              {"layers", adapter.layers},
                              {"parameters", adapter.parameters}});
  }
}

void AddTrainingJson(const StagePlan& s, nlohmann::json& js) {
  const ResolvedStage& st = *s.stage;
  js["data"] = {{"plugin", st.data.entry->name},      {"version", st.data.entry->version},
                {"train_examples", s.train_examples}, {"eval_examples", s.eval_examples},
                {"fields", s.data_spec.ToString()},   {"description", s.data_description}};
  js["data"]["baselines"] = nlohmann::json::object();
  for (const auto& [metric, value] : s.data_baselines) {
    js["data"]["baselines"]["eval/" + metric] = value;
  }
  js["schedule"] = {{"epochs", s.epochs},
                    {"steps_per_epoch", s.steps_per_epoch},
                    {"micro_batches_per_epoch", s.micro_batches_per_epoch},
                    {"total_steps", s.total_steps},
                    {"batch_size", s.batch_size},
                    {"gradient_accumulation_steps", s.gradient_accumulation_steps},
                    {"global_batch", s.global_batch},
                    {"eval_batch_size", s.eval_batch_size},
                    {"eval_every_steps", st.config->schedule().eval_every_steps()},
                    {"checkpoint_every_steps", st.config->schedule().checkpoint_every_steps()},
                    {"warnings", s.schedule_warnings}};
  js["checkpoint_layout"] = {{"slim", s.checkpoint_layout.slim},
                             {"reason", s.checkpoint_layout.reason}};
  js["optimizer"] = {{"algorithm", st.config->optimizer().has_sgd() ? "sgd" : "adamw"},
                     {"learning_rate", st.config->optimizer().learning_rate()},
                     {"summary", s.optimizer_summary}};
}

nlohmann::json OptionalDtype(bool present, at::ScalarType dtype) {
  return present ? nlohmann::json(Dt(dtype)) : nlohmann::json();
}

nlohmann::json PrecisionJson(const PrecisionPlan& p) {
  nlohmann::json groups = nlohmann::json::array();
  for (const PrecisionGroupPlan& g : p.groups) {
    groups.push_back({{"name", g.name},
                      {"tensors", g.num_tensors},
                      {"elements", g.num_elements},
                      {"bytes", g.bytes},
                      {"storage", Dt(g.storage)},
                      {"compute", Dt(g.compute)},
                      {"grad", OptionalDtype(g.has_grad, g.grad)},
                      {"master", OptionalDtype(g.has_grad, g.master)},
                      {"optimizer_state", OptionalDtype(g.has_grad, g.optimizer_state)}});
  }
  const LossScalingPlan& ls = p.loss_scaling;
  nlohmann::json precision = {
      {"requested", p.requested},
      {"policy", p.policy},
      {"reason", p.reason},
      {"autocast", p.autocast ? nlohmann::json(Dt(*p.autocast)) : nlohmann::json()},
      {"loss_scaling", ls.enabled ? nlohmann::json{{"initial_scale", ls.initial_scale},
                                                   {"growth_factor", ls.growth_factor},
                                                   {"backoff_factor", ls.backoff_factor},
                                                   {"growth_interval", ls.growth_interval}}
                                  : nlohmann::json()},
      {"unsafe_low_precision_updates", p.unsafe_low_precision_updates},
      {"warnings", p.warnings},
      {"groups", groups}};
  nlohmann::json tensors = nlohmann::json::array();
  for (const TensorPlan& t : p.tensors) {
    auto optional = [](at::ScalarType d) {
      return OptionalDtype(d != at::ScalarType::Undefined, d);
    };
    tensors.push_back({{"name", t.name},
                       {"trainable", t.trainable},
                       {"buffer", t.is_buffer},
                       {"kept_fp32", t.kept_fp32},
                       {"storage", Dt(t.storage)},
                       {"compute", Dt(t.compute)},
                       {"grad", optional(t.grad)},
                       {"master", optional(t.master)},
                       {"optimizer_state", optional(t.optimizer_state)}});
  }
  precision["tensors"] = tensors;
  return precision;
}

nlohmann::json DeviceCapabilityJson(const DeviceCapability& d) {
  return {{"device", d.device},
          {"name", d.name},
          {"cuda", d.cuda},
          {"compute_capability", d.compute_capability},
          {"bf16", d.bf16},
          {"bf16_fast", d.bf16_fast},
          {"fp16", d.fp16},
          {"bf16_autocast", d.bf16_autocast},
          {"fp16_autocast", d.fp16_autocast}};
}

// Every tensor as loaded, and the census summarised by group and role.
void AddCensusJson(const StagePlan& s, nlohmann::json& js) {
  nlohmann::json census = nlohmann::json::array();
  for (const TensorCensusEntry& e : s.census) {
    census.push_back({{"name", e.name},
                      {"group", e.group},
                      {"dtype", Dt(e.dtype)},
                      {"elements", e.numel},
                      {"bytes", e.bytes()},
                      {"trainable", e.trainable},
                      {"buffer", e.is_buffer}});
  }
  js["census"] = census;
  nlohmann::json census_rows = nlohmann::json::array();
  for (const CensusRow& row : SummarizeCensus(s.census, &s.precision)) {
    census_rows.push_back({{"group", row.group},
                           {"role", row.role},
                           {"dtype", Dt(row.dtype)},
                           {"tensors", row.tensors},
                           {"elements", row.elements},
                           {"bytes", row.bytes}});
  }
  js["census_summary"] = census_rows;
}

}  // namespace

std::string CensusText(const ParameterCensus& census, const std::string& indent,
                       const PrecisionPlan* plan) {
  const std::vector<CensusRow> rows = SummarizeCensus(census, plan);
  size_t role_width = 11;
  size_t group_width = 18;
  for (const CensusRow& row : rows) {
    role_width = std::max(role_width, row.role.size() + 2);
    group_width = std::max(group_width, row.group.size() + 2);
  }
  std::ostringstream out;
  out << indent << Pad("group", group_width) << Pad("role", role_width) << Pad("dtype", 6)
      << PadLeft("tensors", 8) << PadLeft("elements", 14) << PadLeft("bytes", 11) << "\n";
  for (const CensusRow& row : rows) {
    out << indent << Pad(row.group, group_width) << Pad(row.role, role_width)
        << Pad(Dt(row.dtype), 6) << PadLeft(std::to_string(row.tensors), 8)
        << PadLeft(WithThousands(row.elements), 14) << PadLeft(HumanBytes(row.bytes), 11) << "\n";
  }
  return out.str();
}

std::string HumanBytes(int64_t bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1000 && unit < 4) {
    v /= 1000;
    ++unit;
  }
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), unit == 0 ? "%.0f %s" : "%.1f %s", v, units[unit]);
  return buffer;
}

namespace {

std::string CallbacksText(const std::vector<ResolvedCallback>& callbacks) {
  std::string out;
  for (size_t i = 0; i < callbacks.size(); ++i) {
    out += (i ? ", " : "") + callbacks[i].ref.entry->name +
           " (on error: " + OnErrorName(callbacks[i].on_error) + ")";
  }
  return out;
}

// The stage's place in the pipeline: what it waits for and the weights it starts from.
void StageOriginLines(const ResolvedPipeline& p, const StagePlan& s, std::ostringstream& out) {
  const ResolvedStage& st = *s.stage;
  if (!st.dependencies.empty()) {
    out << "  after       ";
    for (size_t i = 0; i < st.dependencies.size(); ++i) {
      out << (i ? ", " : "") << p.stages[st.dependencies[i]].name;
    }
    out << "\n";
  }
  if (st.from_stage) {
    out << "  starts from the final weights of stage '" << p.stages[*st.from_stage].name << "'";
    if (!s.parent_architecture.empty() && s.parent_architecture != s.architecture) {
      out << " (a '" << s.parent_architecture << "' model)";
    }
    if (!s.handoff_summary.empty()) out << ": " << s.handoff_summary;
    out << "\n";
  }
}

// The device, the model and what the quantizer and adapters did to it.
void ModelLines(const StagePlan& s, std::ostringstream& out) {
  const ResolvedStage& st = *s.stage;
  const int64_t frozen = s.total_parameters - s.trainable_parameters;
  out << "  device      " << st.device.device << " (" << st.device.reason << "), world size "
      << s.world_size << ", " << s.cpu_threads.threads << " CPU thread"
      << (s.cpu_threads.threads == 1 ? "" : "s") << " (" << s.cpu_threads.reason << ")\n";
  out << "  model       " << st.model.entry->name << " " << st.model.entry->version << ": "
      << WithThousands(s.total_parameters) << " parameters, "
      << WithThousands(s.trainable_parameters) << " trainable in " << s.trainable_tensors
      << " tensors, " << WithThousands(frozen) << " frozen\n";
  if (st.quantizer.entry != nullptr) {
    const LayerPluginReport& l = s.layers;
    out << "  quantizer   " << st.quantizer.entry->name << " " << st.quantizer.entry->version
        << ": " << l.quantized_layers << " linear layers, " << WithThousands(l.quantized_parameters)
        << " weights in " << HumanBytes(l.quantized_bytes) << " ("
        << FormatFixed(l.bits_per_parameter(), 3) << " bits per weight, scales included; "
        << HumanBytes(l.quantized_parameters * 4) << " in f32), frozen; matmuls in "
        << l.quantized_compute << "\n";
  }
  for (size_t a = 0; a < s.layers.adapters.size(); ++a) {
    const LayerPluginReport::Adapter& adapter = s.layers.adapters[a];
    out << "  adapter     " << adapter.plugin << " " << st.adapters[a].entry->version << ": "
        << adapter.layers.size() << " linear layers, " << WithThousands(adapter.parameters)
        << " parameters\n";
  }
}

// The data, the steps they make, and how evaluations and checkpoints fall.
void TrainingLines(const StagePlan& s, std::ostringstream& out) {
  const ResolvedStage& st = *s.stage;
  out << "  data        " << st.data.entry->name << " " << st.data.entry->version << ": "
      << WithThousands(s.train_examples) << " train / " << WithThousands(s.eval_examples)
      << " eval examples; " << s.data_spec.ToString() << "\n";
  out << "              " << s.data_description << "\n";
  if (!s.data_baselines.empty()) {
    out << "  baseline   ";
    for (const auto& [metric, value] : s.data_baselines) {
      out << " eval/" << metric << " " << FormatNumber(value);
    }
    out << " (what a model that learned nothing scores)\n";
  }
  out << "  steps       " << EpochsText(s.epochs) << " x " << s.steps_per_epoch
      << " steps = " << WithThousands(s.total_steps) << " steps; " << s.batch_size << " examples x "
      << s.gradient_accumulation_steps << " accumulation x " << s.world_size
      << (s.world_size == 1 ? " device" : " ranks") << " = " << s.global_batch
      << " examples per step\n";
  for (const std::string& warning : s.schedule_warnings) {
    out << "    warning: " << warning << "\n";
  }
  if (s.process_group) {
    out << "  ranks       " << RanksText(s) << " over " << BackendName(s.backend)
        << ": this is rank " << s.rank << " of " << s.world_size << "; "
        << WithThousands(s.shard_examples) << " examples per rank per epoch\n";
    out << "              " << BucketsText(s) << "\n";
  }
  out << "  memory      " << PlanMemoryText(s) << "\n";
  out << "  eval        " << EvalText(s) << "\n";
  out << "  checkpoint  " << CheckpointText(s) << "\n";
  if (s.checkpoint_layout.pretrained) {
    out << "              holds " << s.checkpoint_layout.reason << "\n";
  }
  out << "  optimizer   " << s.optimizer_summary << "\n";
}

// The census as loaded, then the precision plan group by group.
void PrecisionLines(const StagePlan& s, std::ostringstream& out) {
  out << "  census      as loaded (" << s.device.Describe() << ")\n";
  out << CensusText(s.census, "    ", &s.precision);
  out << "  precision   " << PrecisionHeadline(s.precision) << "\n";
  if (!s.precision.reason.empty()) out << "              " << s.precision.reason << "\n";
  out << "    " << Pad("group", 22) << PadLeft("tensors", 8) << PadLeft("elements", 14)
      << PadLeft("bytes", 11) << "  storage compute grad  master optim\n";
  for (const PrecisionGroupPlan& g : s.precision.groups) {
    out << "    " << Pad(g.name, 22) << PadLeft(std::to_string(g.num_tensors), 8)
        << PadLeft(WithThousands(g.num_elements), 14) << PadLeft(HumanBytes(g.bytes), 11) << "  "
        << Pad(Dt(g.storage), 8) << Pad(Dt(g.compute), 8) << Pad(g.has_grad ? Dt(g.grad) : "-", 6)
        << Pad(g.has_grad ? Dt(g.master) : "-", 7) << (g.has_grad ? Dt(g.optimizer_state) : "-")
        << "\n";
  }
  for (const std::string& warning : s.precision.warnings) {
    out << "    warning: " << warning << "\n";
  }
}

}  // namespace

std::string PlanToText(const PipelinePlan& plan) {
  const ResolvedPipeline& p = *plan.pipeline;
  std::ostringstream out;
  out << "pipeline '" << p.name << "' (" << p.file.string() << ")\n";
  out << "  output      " << p.output_dir.string() << "\n";
  out << "  seed        " << p.seed << "\n";
  if (StatusOr<std::string> limits = FileLimitsSummary(); limits.ok()) {
    out << "  file limits " << *limits << " (ENGINE_FILE_LIMITS)\n";
  }
  out << "  run order   ";
  for (size_t i = 0; i < plan.stages.size(); ++i) {
    out << (i ? " -> " : "") << plan.stages[i].stage->name;
  }
  out << "\n";
  if (!p.callbacks.empty()) out << "  callbacks   " << CallbacksText(p.callbacks) << "\n";
  for (const StagePlan& s : plan.stages) {
    out << "\n" << s.stage->subject() << " (fingerprint " << s.fingerprint << ")\n";
    StageOriginLines(p, s, out);
    ModelLines(s, out);
    TrainingLines(s, out);
    PrecisionLines(s, out);
    if (!s.stage->callbacks.empty()) {
      out << "  callbacks   " << CallbacksText(s.stage->callbacks) << "\n";
    }
  }
  return out.str();
}

nlohmann::json PlanToJson(const PipelinePlan& plan) {
  const ResolvedPipeline& p = *plan.pipeline;
  nlohmann::json j;
  j["pipeline"] = p.name;
  j["file"] = p.file.string();
  j["output_dir"] = p.output_dir.string();
  j["seed"] = p.seed;
  j["file_limits"] = nlohmann::json::object();
  for (FileKind kind : kFileKinds) {
    if (StatusOr<uint64_t> limit = FileLimit(kind); limit.ok()) {
      j["file_limits"][std::string(FileKindName(kind))] = *limit;
    }
  }
  j["stages"] = nlohmann::json::array();
  for (const StagePlan& s : plan.stages) j["stages"].push_back(StagePlanToJson(p, s));
  j["callbacks"] = CallbacksJson(p.callbacks);
  return j;
}

nlohmann::json StagePlanToJson(const ResolvedPipeline& p, const StagePlan& s) {
  const ResolvedStage& st = *s.stage;
  nlohmann::json js;
  js["name"] = st.name;
  js["fingerprint"] = s.fingerprint;
  js["after"] = nlohmann::json::array();
  for (int d : st.dependencies) js["after"].push_back(p.stages[d].name);
  js["from_stage"] =
      st.from_stage ? nlohmann::json(p.stages[*st.from_stage].name) : nlohmann::json(nullptr);
  js["handoff"] = st.from_stage ? nlohmann::json(s.handoff_summary) : nlohmann::json(nullptr);
  js["parent_architecture"] =
      st.from_stage ? nlohmann::json(s.parent_architecture) : nlohmann::json(nullptr);
  js["device"] = {{"device", st.device.device}, {"reason", st.device.reason}};
  js["world_size"] = s.world_size;
  js["cpu_threads"] = {{"threads", s.cpu_threads.threads}, {"reason", s.cpu_threads.reason}};
  js["rank"] = s.rank;
  js["shard_examples"] = s.shard_examples;
  js["process_group"] =
      s.process_group ? nlohmann::json(BackendName(s.backend)) : nlohmann::json(nullptr);
  js["shard_level"] = s.shard_level;
  const RankMemory memory = MemoryPerRank(s);
  js["memory_per_rank"] = {{"model", memory.model},
                           {"gradients", memory.gradients},
                           {"masters", memory.masters},
                           {"optimizer_state", memory.optimizer_state},
                           {"all_reduce_buckets", memory.reduce_buckets},
                           {"gathered_block", memory.gathered_block}};
  if (s.shards_parameters()) js["blocks"] = s.blocks;
  js["bucket_bytes"] = s.bucket_bytes;
  js["shard_bucket_bytes"] = s.shard_bucket_bytes;
  AddModelJson(s, js);
  AddTrainingJson(s, js);
  js["precision"] = PrecisionJson(s.precision);
  js["device_capability"] = DeviceCapabilityJson(s.device);
  AddCensusJson(s, js);
  js["callbacks"] = CallbacksJson(st.callbacks);
  return js;
}

}  // namespace engine
