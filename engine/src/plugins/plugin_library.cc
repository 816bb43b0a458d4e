#define BOOST_DLL_USE_STD_FS
#include "plugins/plugin_library.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/dll/shared_library.hpp>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "core/child_output.h"

namespace engine {
namespace {

// Keeps every opened library loaded until the process ends.
void KeepLoaded(const boost::dll::shared_library& library) {
  static std::mutex mu;
  static auto* libraries = new std::vector<boost::dll::shared_library>();
  std::lock_guard<std::mutex> lock(mu);
  libraries->push_back(library);
}

std::string MajorMinor(std::string_view version) {
  size_t first = version.find('.');
  if (first == std::string_view::npos) return std::string(version);
  size_t second = version.find('.', first + 1);
  return std::string(version.substr(0, second));
}

bool ValidPluginName(const char* name) {
  if (name == nullptr || *name == '\0') return false;
  for (const char* p = name; *p; ++p) {
    char c = *p;
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.';
    if (!ok) return false;
  }
  return true;
}

class Registrar : public PluginRegistrar {
 public:
  void Register(std::unique_ptr<Plugin> plugin) override {
    if (plugin_ != nullptr) {
      failure_ = "it registered more than one plugin (a library holds exactly one)";
      return;
    }
    plugin_ = std::move(plugin);
  }
  void Fail(std::string message) override { failure_ = std::move(message); }

  std::unique_ptr<Plugin> plugin_;
  std::string failure_;
};

// Everything the manifest must agree on. Returns the first disagreement in words.
Status CheckManifest(const EnginePluginManifest& m) {
  constexpr size_t kMinimumSize =
      offsetof(EnginePluginManifest, protobuf_version) + sizeof(int32_t);
  if (m.struct_size < kMinimumSize) {
    return FailedPreconditionError("its manifest is " + std::to_string(m.struct_size) +
                                   " bytes, shorter than any engine SDK writes");
  }
  if (m.api_version != ENGINE_PLUGIN_API_VERSION) {
    return FailedPreconditionError("it was built for engine plugin API " +
                                   std::to_string(m.api_version) + ", but this engine speaks API " +
                                   std::to_string(ENGINE_PLUGIN_API_VERSION) +
                                   "; rebuild the plugin against this engine's SDK");
  }
  if (!ValidPluginName(m.name)) {
    return FailedPreconditionError(
        "its manifest has no valid name (letters, digits, '_', '-' and '.')");
  }
  if (m.kind == nullptr || !PluginKindFromName(m.kind)) {
    return FailedPreconditionError(std::string("its manifest names an unknown kind '") +
                                   (m.kind ? m.kind : "") + "'");
  }
  const std::string plugin_torch = m.torch_version ? m.torch_version : "";
  if (MajorMinor(plugin_torch) != MajorMinor(compat::kTorchVersion)) {
    return FailedPreconditionError("it was built against LibTorch " + plugin_torch +
                                   ", but this engine runs LibTorch " + compat::kTorchVersion +
                                   "; rebuild the plugin against the same LibTorch");
  }
  if (m.cxx11_abi != ENGINE_CXX11_ABI_VALUE) {
    return FailedPreconditionError(
        "it was built with _GLIBCXX_USE_CXX11_ABI=" + std::to_string(m.cxx11_abi) +
        ", but this engine uses " + std::to_string(ENGINE_CXX11_ABI_VALUE) +
        "; C++ objects cannot cross between the two, rebuild the plugin with the engine's setting");
  }
  if (m.protobuf_version / 1000 != GOOGLE_PROTOBUF_VERSION / 1000) {
    return FailedPreconditionError("it was built against protobuf " +
                                   std::to_string(m.protobuf_version) + ", but this engine uses " +
                                   std::to_string(GOOGLE_PROTOBUF_VERSION));
  }
  return Status::Ok();
}

constexpr int kProbeLoaded = 0;
constexpr int kProbeRefused = 3;
constexpr int kProbeThrew = 4;

// The probe child announces each step on its error pipe before taking it, so that a crash can be
// blamed on the step that was running. A line starting with this byte is such an announcement.
constexpr char kPhaseMark = '\x1e';

void AnnouncePhase(const char* phase) {
  std::fprintf(stderr, "%c%s\n", kPhaseMark, phase);
  std::fflush(stderr);
}

// The probe child's work: dlopen (static initialisers), then the manifest and registration entry
// points, exactly as the real load calls them. Never returns. Refusals (no symbol, a manifest this
// engine does not accept, a throwing factory) are left for the real load to report in words; only a
// crash or a hang here is the probe's news.
[[noreturn]] void ProbeChild(const std::filesystem::path& path) {
  try {
    AnnouncePhase("while its static initialisers ran");
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) ::_exit(kProbeRefused);
    using ManifestFn = const EnginePluginManifest* (*)();
    auto manifest_fn = reinterpret_cast<ManifestFn>(::dlsym(handle, ENGINE_PLUGIN_MANIFEST_SYMBOL));
    if (manifest_fn == nullptr) ::_exit(kProbeRefused);
    AnnouncePhase("in its " ENGINE_PLUGIN_MANIFEST_SYMBOL "()");
    const EnginePluginManifest* manifest = manifest_fn();
    if (manifest == nullptr || !CheckManifest(*manifest).ok()) ::_exit(kProbeRefused);
    using RegisterFn = int (*)(void*);
    auto register_fn = reinterpret_cast<RegisterFn>(::dlsym(handle, ENGINE_PLUGIN_REGISTER_SYMBOL));
    if (register_fn == nullptr) ::_exit(kProbeRefused);
    AnnouncePhase("in its " ENGINE_PLUGIN_REGISTER_SYMBOL "()");
    try {
      Registrar registrar;
      register_fn(static_cast<PluginRegistrar*>(&registrar));
    } catch (...) {
      // The real load catches what registration throws and says so in words.
    }
    ::_exit(kProbeLoaded);
  } catch (const std::exception& e) {
    // Thrown by a static initialiser out of dlopen: it must not unwind into the caller's code here.
    std::fprintf(stderr, "%s\n", e.what());
  } catch (...) {
  }
  ::_exit(kProbeThrew);
}

// Splits what the probe child wrote into the step it was in (its last announcement) and what
// the library itself printed.
void SplitProbeOutput(const std::string& output, std::string* phase, std::string* said) {
  size_t begin = 0;
  while (begin < output.size()) {
    size_t end = output.find('\n', begin);
    if (end == std::string::npos) end = output.size();
    if (output[begin] == kPhaseMark) {
      *phase = output.substr(begin + 1, end - begin - 1);
    } else {
      said->append(output, begin, end - begin + 1);
    }
    begin = end + 1;
  }
  while (!said->empty() && (said->back() == '\n' || said->back() == ' ')) said->pop_back();
  if (said->size() > 600) *said = "..." + said->substr(said->size() - 600);
}

Status ProbeFailure(const std::string& where, const ChildOutcome& child) {
  std::string phase = "while its static initialisers ran";
  std::string said;
  SplitProbeOutput(child.output, &phase, &said);
  const bool at_load = phase.rfind("while", 0) == 0;
  return FailedPreconditionError(
      "loading " + where + " crashed (" +
      (WIFSIGNALED(child.wait_status) ? std::string(::strsignal(WTERMSIG(child.wait_status)))
                                      : std::string("an exception escaped")) +
      ") " + phase + ", so it was not loaded" +
      (said.empty() ? std::string() : "; it said: " + said) +
      (at_load ? ". Two plugins whose .proto files share a file name or a message name cause this"
               : ". The library is broken: rebuild it or remove it from the plugin path"));
}

// Opens the library and calls its entry points once in a forked child first. Static initialisers
// run at dlopen, before any manifest can be read, and some failures there abort the whole process:
// protobuf does so when two libraries define the same .proto file or message name; and an entry
// point may crash outright. In a child that costs only the child.
Status ProbeInChild(const std::filesystem::path& path, const std::string& where) {
  const char* skip = std::getenv("ENGINE_PLUGIN_PROBE");
  if (skip != nullptr && std::string(skip) == "0") return Status::Ok();
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return Status::Ok();  // cannot probe; load directly
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    return Status::Ok();
  }
  if (pid == 0) {
    ::dup2(pipe_fds[1], 2);
    const int null_fd = ::open("/dev/null", O_WRONLY);
    if (null_fd >= 0) ::dup2(null_fd, 1);
    ProbeChild(path);
  }
  ::close(pipe_fds[1]);
  const ChildOutcome child = CollectChild(pid, pipe_fds[0], 60);
  if (child.timed_out) {
    return FailedPreconditionError("loading " + where +
                                   " did not finish within 60 s (its static initialisers or entry "
                                   "points hang)");
  }
  if (WIFEXITED(child.wait_status) && (WEXITSTATUS(child.wait_status) == kProbeLoaded ||
                                       WEXITSTATUS(child.wait_status) == kProbeRefused)) {
    return Status::Ok();  // a refusal is reported, with its reason, by the real load
  }
  return ProbeFailure(where, child);
}

// The library at `canonical`, opened (and kept open) once the child probe passed.
StatusOr<boost::dll::shared_library> OpenLibrary(const std::filesystem::path& canonical,
                                                 const std::string& where) {
  ENGINE_RETURN_IF_ERROR(ProbeInChild(canonical, where));
  boost::dll::shared_library library;
  boost::dll::fs::error_code load_error;
  ::dlerror();  // clear any earlier message
  library.load(canonical, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local,
               load_error);
  if (load_error || !library.is_loaded()) {
    const char* reason = ::dlerror();
    return FailedPreconditionError(
        "cannot load " + where + ": " + (reason ? std::string(reason) : load_error.message()) +
        " (is it a shared library built for this machine and this engine?)");
  }
  // Even a library that fails the checks that follow stays loaded: its static initialisers may
  // already have registered descriptors (protobuf) that would dangle after dlclose.
  KeepLoaded(library);
  return library;
}

// The library's manifest, checked.
StatusOr<const EnginePluginManifest*> ReadManifest(boost::dll::shared_library& library,
                                                   const std::string& where) {
  if (!library.has(ENGINE_PLUGIN_MANIFEST_SYMBOL)) {
    return FailedPreconditionError(where + " is not an engine plugin: it exports no '" +
                                   ENGINE_PLUGIN_MANIFEST_SYMBOL +
                                   "' (define one with ENGINE_PLUGIN in engine/plugin.h)");
  }
  auto manifest_fn = library.get<const EnginePluginManifest*()>(ENGINE_PLUGIN_MANIFEST_SYMBOL);
  const EnginePluginManifest* manifest = manifest_fn();
  if (manifest == nullptr) return FailedPreconditionError(where + ": its manifest is null");
  ENGINE_RETURN_IF_ERROR(CheckManifest(*manifest).WithContext(where));
  return manifest;
}

// Calls the library's register function; the plugin it registered, of the manifest's kind.
StatusOr<std::unique_ptr<Plugin>> RegisterPlugin(boost::dll::shared_library& library,
                                                 PluginKind kind, const std::string& named) {
  if (!library.has(ENGINE_PLUGIN_REGISTER_SYMBOL)) {
    return FailedPreconditionError(named + " exports no '" + ENGINE_PLUGIN_REGISTER_SYMBOL +
                                   "' entry point");
  }
  auto register_fn = library.get<int(void*)>(ENGINE_PLUGIN_REGISTER_SYMBOL);
  Registrar registrar;
  int rc = 1;
  try {
    rc = register_fn(static_cast<PluginRegistrar*>(&registrar));
  } catch (const std::exception& e) {
    registrar.failure_ = std::string("an exception escaped registration: ") + e.what();
  } catch (...) {
    registrar.failure_ = "a non-standard exception escaped registration";
  }
  if (!registrar.failure_.empty()) {
    return FailedPreconditionError(named + ": registration failed: " + registrar.failure_);
  }
  if (rc != 0 || registrar.plugin_ == nullptr) {
    return FailedPreconditionError(named + ": registration failed: no plugin was registered");
  }
  if (registrar.plugin_->kind() != kind) {
    return FailedPreconditionError(named + ": the manifest says it is a " +
                                   std::string(PluginKindTitle(kind)) + " but it registered a " +
                                   std::string(PluginKindTitle(registrar.plugin_->kind())));
  }
  try {
    (void)registrar.plugin_->default_options().GetDescriptor();
  } catch (...) {
    return FailedPreconditionError(named + ": default_options() threw");
  }
  return std::move(registrar.plugin_);
}

}  // namespace

StatusOr<LoadedPlugin> LoadPluginLibrary(const std::filesystem::path& path) {
  const std::string where = "plugin library '" + path.string() + "'";
  std::error_code fs_error;
  if (!std::filesystem::exists(path, fs_error)) return NotFoundError(where + " does not exist");
  if (!std::filesystem::is_regular_file(path, fs_error)) {
    return InvalidArgumentError(where + " is not a regular file");
  }
  std::filesystem::path canonical = std::filesystem::canonical(path, fs_error);
  if (fs_error) canonical = std::filesystem::absolute(path);

  ENGINE_ASSIGN_OR_RETURN(boost::dll::shared_library library, OpenLibrary(canonical, where));
  ENGINE_ASSIGN_OR_RETURN(const EnginePluginManifest* manifest, ReadManifest(library, where));
  LoadedPlugin loaded;
  loaded.library = canonical;
  loaded.name = manifest->name;
  loaded.kind = *PluginKindFromName(manifest->kind);
  loaded.version = manifest->version ? manifest->version : "";
  loaded.description = manifest->description ? manifest->description : "";
  ENGINE_ASSIGN_OR_RETURN(loaded.plugin, RegisterPlugin(library, loaded.kind,
                                                        where + " (plugin '" + loaded.name + "')"));
  return loaded;
}

}  // namespace engine
