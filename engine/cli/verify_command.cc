// `engine verify DIR`: checks every checkpoint under DIR against its manifest, reading nothing
// into a model.
#include <algorithm>
#include <filesystem>
#include <iostream>

#include "checkpoint/checkpoint.h"
#include "cli/arguments.h"
#include "cli/commands.h"
#include "engine/utf8.h"
#include "run/stage_state.h"

namespace engine::cli {

std::string VerifyHelp() {
  return R"(usage: engine verify DIR

Checks every checkpoint in DIR (a checkpoint directory, a stage's directory or a whole output
directory): each file's size and content hash against those its manifest recorded when it was
written, and the tensors of model.safetensors against the manifest's list; for a slim checkpoint
(one that holds only what its stage trained), the files of the frozen base it names as well.
Prints one line per
checkpoint, "ok" or "DAMAGED" with the file and what is wrong. Nothing is written.

Exit status 0 when every checkpoint is whole, 1 when one is damaged or none was found, 2 for a
wrong command line.
)";
}

namespace {

// The checkpoint directories under `root` (itself included), in path order; never the hidden
// temporaries of writes that did not finish.
std::vector<std::filesystem::path> CheckpointDirs(const std::filesystem::path& root) {
  std::vector<std::filesystem::path> dirs;
  std::error_code ec;
  if (std::filesystem::exists(root / kManifestFile, ec)) dirs.push_back(root);
  std::filesystem::recursive_directory_iterator it(root, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (it->is_directory(ec) && !name.empty() && name[0] == '.') {
      it.disable_recursion_pending();
    } else if (name == kManifestFile && it->path().parent_path() != root) {
      dirs.push_back(it->path().parent_path());
    }
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

// "ok ..." or "DAMAGED ...": false when damaged.
bool VerifyOne(const std::filesystem::path& dir) {
  StatusOr<proto::CheckpointManifest> manifest = ReadManifest(dir);
  Status status = manifest.ok() ? VerifyCheckpointFiles(dir, *manifest) : manifest.status();
  if (!status.ok()) {
    std::cout << "DAMAGED " << Printable(dir.string()) << ": " << Printable(status.message())
              << "\n";
    return false;
  }
  std::cout << "ok      " << Printable(dir.string()) << " (step " << manifest->step() << ", "
            << manifest->file_size() << " files hashed"
            << (manifest->file_size() == 0 ? ": an older checkpoint, tensors checked only" : "")
            << (manifest->has_frozen_base()
                    ? ", and the " + std::to_string(manifest->frozen_base().file_size()) +
                          " files of its frozen base in " +
                          Printable(manifest->frozen_base().pretrained())
                    : std::string())
            << ")\n";
  return true;
}

}  // namespace

int VerifyCommand(const std::vector<std::string>& args) {
  Arguments a = ParseArguments(args, {}, {});
  if (a.help) {
    std::cout << VerifyHelp();
    return kExitOk;
  }
  if (a.error.empty() && a.positional.size() != 1) a.error = "expected one directory";
  if (!a.error.empty()) {
    std::cerr << "engine verify: " << a.error << "\n\n" << VerifyHelp();
    return kExitUsage;
  }
  const std::filesystem::path root = a.positional[0];
  std::error_code ec;
  if (!std::filesystem::is_directory(root, ec)) {
    std::cerr << "engine verify: '" << Printable(root.string()) << "' is not a directory\n";
    return kExitFailure;
  }
  const std::vector<std::filesystem::path> dirs = CheckpointDirs(root);
  if (dirs.empty()) {
    std::cerr << "engine verify: no checkpoint (no " << kManifestFile << ") under '"
              << Printable(root.string()) << "'\n";
    return kExitFailure;
  }
  size_t damaged = 0;
  for (const auto& dir : dirs) damaged += VerifyOne(dir) ? 0 : 1;
  std::cout << dirs.size() << " checkpoint" << (dirs.size() == 1 ? "" : "s") << ", " << damaged
            << " damaged\n";
  return damaged == 0 ? kExitOk : kExitFailure;
}

}  // namespace engine::cli
