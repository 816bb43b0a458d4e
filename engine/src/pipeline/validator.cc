#include "pipeline/validator.h"

#include <google/protobuf/descriptor.h>
#include <unistd.h>

#include <cmath>
#include <functional>
#include <map>
#include <set>

#include "core/glob.h"
#include "core/guarded_call.h"
#include "core/required_fields.h"
#include "dist/dist_env.h"
#include "engine/format.h"
#include "engine/options.pb.h"
#include "engine/paths.h"
#include "pipeline/device_choice.h"
#include "pipeline/pretrained_dir.h"

namespace engine {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

// A trillion steps: far beyond any run, and far from where step counts (int64) and the products
// made of them overflow.
constexpr uint64_t kMaxScheduleSteps = 1000000000000ULL;

// What a plugin reference belongs to: "stage 'x'", or "pipeline" for the pipeline's own callbacks
// (`stage` empty).
std::string OwnerSubject(const std::string& stage) {
  return stage.empty() ? std::string("pipeline") : StageSubject(stage);
}

class StageChecker {
 public:
  StageChecker(const PluginRegistry& registry, ResolvedPipeline* pipeline, Diagnostics* diagnostics)
      : registry_(registry), pipeline_(pipeline), diagnostics_(diagnostics) {}

  void Error(const std::string& path, std::string message) {
    diagnostics_->Add(pipeline_->Locate(path), std::move(message));
  }

  // Binds `ref` (a PluginRef or CallbackRef at `path`) to a registered plugin and checks its
  // options. `ref` may be null when the stage leaves it out and `default_plugin` names the plugin
  // to use.
  bool Bind(PluginKind kind, const Message* ref, const std::string& path, const std::string& stage,
            const std::string& default_plugin, ResolvedPluginRef* out,
            const std::function<void(Message&)>& fill_defaults = {}) {
    std::string plugin_name = default_plugin;
    const google::protobuf::Any* options = nullptr;
    if (ref != nullptr && !ReadRef(kind, *ref, path, stage, &plugin_name, &options)) return false;
    const PluginRegistry::Entry* entry = registry_.Find(kind, plugin_name);
    if (entry == nullptr) {
      Error(ref != nullptr ? path + ".plugin" : path,
            OwnerSubject(stage) + ": " + UnknownPluginMessage(kind, plugin_name));
      return false;
    }
    out->entry = entry;
    out->path = path;
    out->context =
        OwnerSubject(stage) + " " + std::string(PluginKindTitle(kind)) + " '" + plugin_name + "'";
    if (!UnpackOptions(*entry, options, out)) return false;
    if (fill_defaults) fill_defaults(*out->options);
    return CheckOptions(*entry, *out);
  }

  // The plugin name and packed options a PluginRef or CallbackRef gives; false (reported) when it
  // names no plugin.
  bool ReadRef(PluginKind kind, const Message& ref, const std::string& path,
               const std::string& stage, std::string* plugin_name,
               const google::protobuf::Any** options) {
    const auto* reflection = ref.GetReflection();
    const auto* plugin_field = ref.GetDescriptor()->FindFieldByName("plugin");
    const auto* options_field = ref.GetDescriptor()->FindFieldByName("options");
    *plugin_name = reflection->GetString(ref, plugin_field);
    if (reflection->HasField(ref, options_field)) {
      *options = google::protobuf::DynamicCastToGenerated<google::protobuf::Any>(
          &reflection->GetMessage(ref, options_field));
    }
    if (!plugin_name->empty()) return true;
    Error(path, OwnerSubject(stage) + ": `plugin` is required: name the " +
                    std::string(PluginKindTitle(kind)) + " to use (see `engine plugins`)");
    return false;
  }

  // The plugin's defaults, overlaid with the given options when their type is the plugin's own.
  bool UnpackOptions(const PluginRegistry::Entry& entry, const google::protobuf::Any* options,
                     ResolvedPluginRef* out) {
    const Message& defaults = entry.plugin->default_options();
    out->options.reset(defaults.New());
    if (options == nullptr) return true;
    const std::string given = TypeNameFromUrlLocal(options->type_url());
    const std::string expected = defaults.GetDescriptor()->full_name();
    if (given != expected) {
      Error(out->path + ".options", out->context + ": options of type '" + given +
                                        "' were given, but this plugin takes '" + expected + "'");
      return false;
    }
    if (!options->UnpackTo(out->options.get())) {
      Error(out->path + ".options",
            out->context + ": the options cannot be decoded as '" + expected + "'");
      return false;
    }
    pipeline_->source_map->MapAnyBody(proto::Pipeline::descriptor(), out->path + ".options",
                                      defaults.GetDescriptor());
    return true;
  }

  // Required fields, then the plugin's own ValidateOptions (guarded): every problem reported.
  bool CheckOptions(const PluginRegistry::Entry& entry, const ResolvedPluginRef& ref) {
    const std::string& path = ref.path;
    OptionErrors required;
    bool ok = CheckRequiredFields(*ref.options, &required);
    for (const OptionErrors::Entry& e : required.entries()) {
      Error(path + ".options", ref.context + ": options." + e.field_path + " " + e.message);
    }
    OptionErrors option_errors;
    Status status = GuardedCall(ref.context, [&]() -> Status {
      entry.plugin->ValidateOptions(*ref.options, &option_errors);
      return Status::Ok();
    });
    if (!status.ok()) {
      Error(path, status.message());
      return false;
    }
    for (const OptionErrors::Entry& e : option_errors.entries()) {
      Error(e.field_path.empty() ? path + ".options" : path + ".options." + e.field_path,
            ref.context + ": " + (e.field_path.empty() ? "" : "options." + e.field_path + ": ") +
                e.message);
      ok = false;
    }
    return ok;
  }

  std::string UnknownPluginMessage(PluginKind kind, const std::string& name) {
    const std::string title(PluginKindTitle(kind));
    std::string message = "unknown " + title + " plugin '" + name + "'";
    std::vector<std::string> known = registry_.NamesOfKind(kind);
    if (known.empty()) {
      message += "; no " + title + " plugins are installed";
    } else {
      message += "; installed " + title + " plugins: ";
      for (size_t i = 0; i < known.size(); ++i) message += (i ? ", " : "") + known[i];
    }
    for (const PluginRegistry::Entry* other : registry_.FindByName(name)) {
      message += " ('" + name + "' is a " + std::string(PluginKindTitle(other->kind)) + ")";
    }
    if (!registry_.skipped().empty()) {
      message += "; libraries on the plugin path that could not be loaded: ";
      for (size_t i = 0; i < registry_.skipped().size(); ++i) {
        message += (i ? "; " : "") + registry_.skipped()[i];
      }
    }
    return message;
  }

  static std::string TypeNameFromUrlLocal(const std::string& url) {
    size_t slash = url.rfind('/');
    return slash == std::string::npos ? url : url.substr(slash + 1);
  }

  void CheckOptimizer(const proto::Stage& stage, const std::string& path, const std::string& name) {
    const std::string where = StageSubject(name) + ": ";
    const proto::Optimizer& o = stage.optimizer();
    const std::string p = path + ".optimizer";
    if (!(o.learning_rate() > 0) || !std::isfinite(o.learning_rate())) {
      Error(p + ".learning_rate", where +
                                      "optimizer.learning_rate must be a positive number (got " +
                                      FormatNumber(o.learning_rate()) + ")");
    }
    if (!(o.max_grad_norm() >= 0) || !std::isfinite(o.max_grad_norm())) {
      Error(p + ".max_grad_norm", where +
                                      "optimizer.max_grad_norm must be >= 0 (0 turns clipping "
                                      "off; got " +
                                      FormatNumber(o.max_grad_norm()) + ")");
    }
    if (o.has_adamw()) {
      const auto& a = o.adamw();
      CheckUnitInterval(a.beta1(), p + ".adamw.beta1", where + "optimizer.adamw.beta1");
      CheckUnitInterval(a.beta2(), p + ".adamw.beta2", where + "optimizer.adamw.beta2");
      if (!(a.epsilon() > 0)) {
        Error(p + ".adamw.epsilon", where + "optimizer.adamw.epsilon must be > 0 (got " +
                                        FormatNumber(a.epsilon()) + ")");
      }
      if (!(a.weight_decay() >= 0)) {
        Error(p + ".adamw.weight_decay", where + "optimizer.adamw.weight_decay must be >= 0 (got " +
                                             FormatNumber(a.weight_decay()) + ")");
      }
    }
    if (o.has_sgd()) {
      const auto& s = o.sgd();
      if (!(s.momentum() >= 0 && s.momentum() < 1)) {
        Error(p + ".sgd.momentum", where + "optimizer.sgd.momentum must be in [0, 1) (got " +
                                       FormatNumber(s.momentum()) + ")");
      }
      if (s.nesterov() && !(s.momentum() > 0)) {
        Error(p + ".sgd.nesterov", where + "optimizer.sgd.nesterov needs a momentum > 0");
      }
      if (!(s.weight_decay() >= 0)) {
        Error(p + ".sgd.weight_decay", where + "optimizer.sgd.weight_decay must be >= 0 (got " +
                                           FormatNumber(s.weight_decay()) + ")");
      }
    }
    const proto::LrSchedule& lr = o.lr_schedule();
    if (lr.kind() == proto::LrSchedule::CONSTANT && lr.warmup_steps() > 0) {
      Error(p + ".lr_schedule.warmup_steps",
            where +
                "optimizer.lr_schedule.warmup_steps needs kind LINEAR_WARMUP or COSINE "
                "(a CONSTANT schedule has no warm-up)");
    }
    if (!(lr.min_lr_ratio() >= 0 && lr.min_lr_ratio() <= 1)) {
      Error(p + ".lr_schedule.min_lr_ratio",
            where + "optimizer.lr_schedule.min_lr_ratio must be in [0, 1] (got " +
                FormatNumber(lr.min_lr_ratio()) + ")");
    } else if (lr.min_lr_ratio() > 0 && lr.kind() != proto::LrSchedule::COSINE) {
      Error(p + ".lr_schedule.min_lr_ratio",
            where + "optimizer.lr_schedule.min_lr_ratio only applies to kind COSINE");
    }
  }

  void CheckUnitInterval(double v, const std::string& path, const std::string& what) {
    if (!(v >= 0 && v < 1)) Error(path, what + " must be in [0, 1) (got " + FormatNumber(v) + ")");
  }

  void CheckSchedule(const proto::Stage& stage, const std::string& path, const std::string& name) {
    const std::string where = StageSubject(name) + ": ";
    const proto::Schedule& s = stage.schedule();
    const std::string p = path + ".schedule";
    if (s.batch_size() == 0) {
      Error(p + ".batch_size", where + "schedule.batch_size must be > 0 (got 0)");
    }
    if (s.gradient_accumulation_steps() == 0) {
      Error(p + ".gradient_accumulation_steps",
            where + "schedule.gradient_accumulation_steps must be > 0 (got 0)");
    }
    if (s.length_case() == proto::Schedule::kEpochs && s.epochs() == 0) {
      Error(p + ".epochs", where + "schedule.epochs must be > 0 (got 0)");
    }
    if (s.length_case() == proto::Schedule::kMaxSteps && s.max_steps() == 0) {
      Error(p + ".max_steps", where + "schedule.max_steps must be > 0 (got 0)");
    }
    if (s.length_case() == proto::Schedule::kMaxSteps && s.max_steps() > kMaxScheduleSteps) {
      Error(p + ".max_steps", where + "schedule.max_steps must be at most " +
                                  std::to_string(kMaxScheduleSteps) + " (got " +
                                  std::to_string(s.max_steps()) + ")");
    }
  }

  void CheckTrainable(const proto::Stage& stage, const std::string& path, const std::string& name) {
    const auto check = [&](const google::protobuf::RepeatedPtrField<std::string>& patterns,
                           const std::string& field) {
      for (int i = 0; i < patterns.size(); ++i) {
        std::string problem = GlobSyntaxError(patterns.Get(i));
        if (!problem.empty()) {
          Error(path + ".trainable." + field + "[" + std::to_string(i) + "]",
                StageSubject(name) + ": trainable." + field + " pattern '" + patterns.Get(i) +
                    "': " + problem);
        }
      }
    };
    check(stage.trainable().include(), "include");
    check(stage.trainable().exclude(), "exclude");
  }

  void CheckNewTensors(const proto::Stage& stage, const std::string& path,
                       const std::string& name) {
    if (stage.new_tensors_size() > 0 && !stage.has_from_stage()) {
      Error(path + ".new_tensors[0]",
            StageSubject(name) +
                ": new_tensors names tensors a from_stage parent lacks, and this stage has no "
                "from_stage");
    }
    for (int i = 0; i < stage.new_tensors_size(); ++i) {
      std::string problem = GlobSyntaxError(stage.new_tensors(i));
      if (!problem.empty()) {
        Error(path + ".new_tensors[" + std::to_string(i) + "]",
              StageSubject(name) + ": new_tensors pattern '" + stage.new_tensors(i) +
                  "': " + problem);
      }
    }
  }

 private:
  const PluginRegistry& registry_;
  ResolvedPipeline* pipeline_;
  Diagnostics* diagnostics_;
};

bool ValidStageName(const std::string& name) {
  if (name.empty()) return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

// Kahn's algorithm, taking ready stages in file order. Returns the cycle's stages when there is
// one.
std::vector<int> RunOrder(const std::vector<ResolvedStage>& stages, std::vector<int>* cycle) {
  const int n = static_cast<int>(stages.size());
  std::vector<int> pending(n, 0);
  std::vector<std::vector<int>> dependents(n);
  for (const ResolvedStage& s : stages) {
    for (int dep : s.dependencies) {
      ++pending[s.index];
      dependents[dep].push_back(s.index);
    }
  }
  std::vector<int> order;
  std::set<int> ready;
  for (int i = 0; i < n; ++i) {
    if (pending[i] == 0) ready.insert(i);
  }
  while (!ready.empty()) {
    int next = *ready.begin();
    ready.erase(ready.begin());
    order.push_back(next);
    for (int d : dependents[next]) {
      if (--pending[d] == 0) ready.insert(d);
    }
  }
  if (static_cast<int>(order.size()) < n) {
    // Walk dependencies from a stage that never became ready until a stage repeats.
    int start = 0;
    while (pending[start] == 0) ++start;
    std::vector<int> seen_at(n, -1);
    std::vector<int> walk;
    int current = start;
    while (seen_at[current] < 0) {
      seen_at[current] = static_cast<int>(walk.size());
      walk.push_back(current);
      int next = -1;
      for (int dep : stages[current].dependencies) {
        if (pending[dep] > 0) {
          next = dep;
          break;
        }
      }
      if (next < 0) break;
      current = next;
    }
    cycle->assign(walk.begin() + std::max(seen_at[current], 0), walk.end());
  }
  return order;
}

}  // namespace

std::string OutputDirProblem(const std::filesystem::path& dir) {
  std::error_code ec;
  if (std::filesystem::exists(dir, ec)) {
    if (!std::filesystem::is_directory(dir, ec)) return "'" + dir.string() + "' is not a directory";
    if (::access(dir.c_str(), W_OK | X_OK) != 0) return "'" + dir.string() + "' is not writable";
    return "";
  }
  std::filesystem::path parent = dir.parent_path();
  while (!parent.empty() && !std::filesystem::exists(parent, ec)) {
    if (parent == parent.parent_path()) break;
    parent = parent.parent_path();
  }
  if (parent.empty()) parent = ".";
  if (!std::filesystem::is_directory(parent, ec)) {
    return "'" + dir.string() + "' cannot be created: '" + parent.string() + "' is not a directory";
  }
  if (::access(parent.c_str(), W_OK | X_OK) != 0) {
    return "'" + dir.string() + "' cannot be created: '" + parent.string() + "' is not writable";
  }
  return "";
}

namespace {

// The pipeline's name, seed and output directory (--output_dir over the file's output_dir over
// runs/<name>, relative to the file), which must be writable or creatable.
void ResolveTopLevel(const LoadOptions& options, ResolvedPipeline* pipeline,
                     Diagnostics* diagnostics) {
  const proto::Pipeline& config = pipeline->config;
  pipeline->name = config.has_name() ? config.name() : pipeline->file.stem().string();
  pipeline->seed = config.seed();
  if (options.output_dir) {
    pipeline->output_dir = std::filesystem::absolute(*options.output_dir).lexically_normal();
  } else {
    pipeline->output_dir =
        ResolvePath(pipeline->base_dir, config.has_output_dir()
                                            ? std::filesystem::path(config.output_dir())
                                            : std::filesystem::path("runs") / pipeline->name);
  }
  const std::string output_problem = OutputDirProblem(pipeline->output_dir);
  if (!output_problem.empty()) {
    diagnostics->Add(
        options.output_dir ? pipeline->source_map->FileOnly() : pipeline->Locate("output_dir"),
        "output directory " + output_problem);
  }
}

void BindPipelineCallbacks(StageChecker& checker, ResolvedPipeline* pipeline) {
  const proto::Pipeline& config = pipeline->config;
  for (int c = 0; c < config.callback_size(); ++c) {
    ResolvedCallback callback;
    callback.on_error = config.callback(c).on_error();
    if (checker.Bind(PluginKind::kCallback, &config.callback(c),
                     "callback[" + std::to_string(c) + "]", "", "", &callback.ref)) {
      pipeline->callbacks.push_back(std::move(callback));
    }
  }
}

// A name every stage has, usable as a directory name, once in the pipeline.
void NameStage(StageChecker& checker, const ResolvedPipeline& pipeline, ResolvedStage& s,
               std::map<std::string, int>* index_by_name) {
  const std::string path = s.path();
  if (!s.config->has_name()) {
    checker.Error(path, "stage " + std::to_string(s.index + 1) + " has no name");
    s.name = "#" + std::to_string(s.index + 1);
  } else if (!ValidStageName(s.name)) {
    checker.Error(path + ".name", "stage name '" + s.name +
                                      "' may only hold letters, digits, '_' and '-' (it names "
                                      "the stage's output directory)");
  } else if (auto [it, inserted] = index_by_name->emplace(s.name, s.index); !inserted) {
    checker.Error(
        path + ".name",
        "stage name '" + s.name + "' is used twice (first at line " +
            std::to_string(pipeline.Locate("stage[" + std::to_string(it->second) + "].name").line) +
            ")");
  }
}

void BindStagePlugins(StageChecker& checker, const ResolvedPipeline& pipeline,
                      const LoadOptions& options, ResolvedStage& s) {
  const std::filesystem::path& base_dir = pipeline.base_dir;
  const proto::Stage& stage = *s.config;
  const std::string path = s.path();
  if (!stage.has_model()) {
    checker.Error(path, s.subject() +
                            ": `model` is required: name a model loader, e.g. "
                            "model { plugin: \"mlp\" }");
  } else {
    checker.Bind(PluginKind::kModelLoader, &stage.model(), path + ".model", s.name, "", &s.model,
                 [&](Message& model_options) {
                   if (!options.find_moved_base) return;
                   MovePretrainedDir(
                       base_dir,
                       [&](const std::filesystem::path& dir) {
                         return options.find_moved_base(pipeline, s, dir);
                       },
                       model_options, &s);
                 });
  }
  if (!stage.has_data()) {
    checker.Error(path, s.subject() +
                            ": `data` is required: name a data loader, e.g. "
                            "data { plugin: \"digits\" }");
  } else {
    checker.Bind(PluginKind::kDataLoader, &stage.data(), path + ".data", s.name, "", &s.data,
                 [&](Message& options) { UseThePretrainedTokenizer(s, base_dir, options); });
  }
  checker.Bind(PluginKind::kPrecisionPolicy, stage.has_precision() ? &stage.precision() : nullptr,
               path + ".precision", s.name, "auto", &s.precision);
  if (stage.has_quantizer()) {
    checker.Bind(PluginKind::kQuantizer, &stage.quantizer(), path + ".quantizer", s.name, "",
                 &s.quantizer);
  }
  for (int a = 0; a < stage.adapter_size(); ++a) {
    ResolvedPluginRef adapter;
    if (checker.Bind(PluginKind::kAdapter, &stage.adapter(a),
                     path + ".adapter[" + std::to_string(a) + "]", s.name, "", &adapter)) {
      s.adapters.push_back(std::move(adapter));
    }
  }
  for (int c = 0; c < stage.callback_size(); ++c) {
    ResolvedCallback callback;
    callback.on_error = stage.callback(c).on_error();
    if (checker.Bind(PluginKind::kCallback, &stage.callback(c),
                     path + ".callback[" + std::to_string(c) + "]", s.name, "", &callback.ref)) {
      s.callbacks.push_back(std::move(callback));
    }
  }
}

// Under DDP (or SHARDED) each local rank takes its own device; a malformed environment is reported
// with the stage's ranks (plan/pipeline_plan.cc).
void ChooseStageDevice(StageChecker& checker, ResolvedStage& s) {
  const proto::Parallel& parallel = s.config->parallel();
  std::optional<RankPlacement> placement;
  if (parallel.strategy() != proto::Parallel::NONE) {
    StatusOr<DistEnv> env = ReadDistEnv();
    placement = env.ok() ? RankPlacement{env->local_rank, env->world_size} : RankPlacement{};
  }
  StatusOr<DeviceChoice> device = ChooseDevice(parallel.device(), placement);
  if (device.ok()) {
    s.device = *device;
  } else {
    checker.Error(s.path() + ".parallel.device", s.subject() + ": " + device.status().message());
  }
}

void ResolveStage(StageChecker& checker, const LoadOptions& options, ResolvedPipeline* pipeline,
                  int i, std::map<std::string, int>* index_by_name) {
  const proto::Stage& stage = pipeline->config.stage(i);
  ResolvedStage& s = pipeline->stages[i];
  s.index = i;
  s.config = &stage;
  s.name = stage.name();
  s.seed = stage.has_seed() ? stage.seed() : pipeline->config.seed();
  NameStage(checker, *pipeline, s, index_by_name);
  BindStagePlugins(checker, *pipeline, options, s);
  checker.CheckTrainable(stage, s.path(), s.name);
  checker.CheckNewTensors(stage, s.path(), s.name);
  checker.CheckOptimizer(stage, s.path(), s.name);
  checker.CheckSchedule(stage, s.path(), s.name);
  ChooseStageDevice(checker, s);
}

// Each stage's dependencies (`after` and `from_stage`), by index.
void ResolveStageGraph(StageChecker& checker, const std::map<std::string, int>& index_by_name,
                       ResolvedPipeline* pipeline) {
  for (ResolvedStage& s : pipeline->stages) {
    const std::string path = s.path();
    std::set<int> deps;
    auto resolve = [&](const std::string& other, const std::string& field_path,
                       const std::string& field) -> std::optional<int> {
      auto it = index_by_name.find(other);
      if (it == index_by_name.end()) {
        checker.Error(field_path,
                      s.subject() + ": " + field + " names an unknown stage '" + other + "'");
        return std::nullopt;
      }
      if (it->second == s.index) {
        checker.Error(field_path, s.subject() + ": " + field + " names the stage itself");
        return std::nullopt;
      }
      return it->second;
    };
    for (int a = 0; a < s.config->after_size(); ++a) {
      if (auto dep =
              resolve(s.config->after(a), path + ".after[" + std::to_string(a) + "]", "`after`")) {
        deps.insert(*dep);
      }
    }
    if (s.config->has_from_stage()) {
      if (auto dep = resolve(s.config->from_stage(), path + ".from_stage", "`from_stage`")) {
        deps.insert(*dep);
        s.from_stage = *dep;
      }
    }
    s.dependencies.assign(deps.begin(), deps.end());
  }
}

// Each stage writes <output_dir>/<stage>/: one that exists must be a writable directory, or the
// stage would train in full and then fail at its first checkpoint.
void CheckStageDirs(StageChecker& checker, const ResolvedPipeline& pipeline) {
  for (const ResolvedStage& stage : pipeline.stages) {
    const std::filesystem::path dir = pipeline.output_dir / stage.name;
    std::error_code ec;
    if (!std::filesystem::exists(dir, ec)) continue;
    const std::string problem = OutputDirProblem(dir);
    if (!problem.empty()) {
      checker.Error(stage.path() + ".name", stage.subject() + ": its output directory " + problem);
    }
  }
}

void OrderStages(StageChecker& checker, ResolvedPipeline* pipeline) {
  std::vector<int> cycle;
  pipeline->run_order = RunOrder(pipeline->stages, &cycle);
  if (!cycle.empty()) {
    std::string text;
    for (int i : cycle) text += "'" + pipeline->stages[i].name + "' -> ";
    text += "'" + pipeline->stages[cycle.front()].name + "'";
    checker.Error(pipeline->stages[cycle.front()].path(),
                  "the stages form a cycle: " + text + " (each waits for the next)");
  }
}

}  // namespace

void ValidatePipeline(const LoadOptions& options, const PluginRegistry& registry,
                      ResolvedPipeline* pipeline, Diagnostics* diagnostics) {
  StageChecker checker(registry, pipeline, diagnostics);
  ResolveTopLevel(options, pipeline, diagnostics);
  if (pipeline->config.stage_size() == 0) {
    diagnostics->Add(pipeline->source_map->FileOnly(),
                     "the pipeline has no stage; add `stage { name: ... model {...} data {...} }`");
    return;
  }
  BindPipelineCallbacks(checker, pipeline);
  std::map<std::string, int> index_by_name;
  pipeline->stages.resize(pipeline->config.stage_size());
  for (int i = 0; i < pipeline->config.stage_size(); ++i) {
    ResolveStage(checker, options, pipeline, i, &index_by_name);
  }
  ResolveStageGraph(checker, index_by_name, pipeline);
  if (!diagnostics->empty()) return;
  CheckStageDirs(checker, *pipeline);
  OrderStages(checker, pipeline);
}

}  // namespace engine
