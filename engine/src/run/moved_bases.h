// Finding the base of a slim checkpoint where it is now. A slim checkpoint leaves out the frozen
// base it was trained on and records that base by content (checkpoint/frozen_base.h). When the
// base's directory has moved, or the outputs were copied to another machine, the stage's
// `pretrained` directory no longer holds it: MovedBaseFinder finds the directory that does, looking
// where the checkpoint recorded it and then in a search path (--base_path, $ENGINE_BASE_PATH), so
// that `engine run`, `eval`, `generate` and `export` read the stage on the base found
// (LoadOptions::find_moved_base), with its fingerprint unchanged.
//
// Hashes files only while searching for a base that is gone, and only those whose names and sizes
// agree (about a second per 2 GB from the page cache). Use from one thread.
// A base found nowhere is not an error here: it is reported (not_found), and the command that needs
// it fails with that report.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine/status.h"
#include "pipeline/diagnostics.h"
#include "pipeline/resolved_pipeline.h"

namespace engine {

// The environment variable that holds more directories to look for bases in, ':'-separated.
inline constexpr const char* kBaseSearchPathVariable = "ENGINE_BASE_PATH";

struct BaseSearch {
  // Where to look, in order, after the directory each checkpoint recorded.
  std::vector<std::filesystem::path> dirs;
  // A checkpoint named on the command line (--checkpoint), looked at before the final and periodic
  // checkpoints of the stage its manifest names.
  std::filesystem::path checkpoint;
};

// The directories of `flag` (--base_path, split on ':') followed by $ENGINE_BASE_PATH's, absolute.
std::vector<std::filesystem::path> BaseSearchPath(const std::string& flag);

class MovedBaseFinder {
 public:
  explicit MovedBaseFinder(BaseSearch search) : search_(std::move(search)) {}

  // For a stage of `pipeline` whose model reads `pretrained_dir` and that has a slim checkpoint
  // (search.checkpoint when it is the stage's, else its final one, else its newest periodic one),
  // when the directory no longer holds files of the names the checkpoint's base has and the
  // pipeline still writes `pretrained` as it did: the directory that holds that base
  // (FindBaseByContent over the directory the checkpoint recorded, then search.dirs), or nothing
  // when none does (then recorded in not_found). Nothing otherwise: a base changed in place, or a
  // `pretrained` the pipeline now names otherwise, is the stage's to train on again. A stage
  // without a slim checkpoint reading a directory moved for a stage before it in the file gets the
  // same move. Each directory and recorded base is looked for once.
  std::optional<std::filesystem::path> Find(const ResolvedPipeline& pipeline,
                                            const ResolvedStage& stage,
                                            const std::filesystem::path& pretrained_dir);

  struct Missing {
    SourceLocation model;  // the stage's `model` in the pipeline file
    Status why;            // the stage, the directory, the hashes expected, where it looked
  };
  // "stage 'sft': its base is no longer in 'A'; found by its content in 'B'", one per directory
  // moved (naming the first stage that reads it).
  const std::vector<std::string>& notes() const { return notes_; }
  // By stage name: the stages whose slim checkpoint's base was found nowhere.
  const std::map<std::string, Missing>& not_found() const { return not_found_; }

 private:
  void AddMissing(const ResolvedPipeline& pipeline, const ResolvedStage& stage,
                  const std::filesystem::path& pretrained_dir, const Status& why);

  BaseSearch search_;
  // By directory and recorded files (DescribeBaseFiles).
  std::map<std::string, std::optional<std::filesystem::path>> found_;
  std::map<std::string, Status> missing_;
  // The directories moved so far, for stages without a slim checkpoint of their own.
  std::map<std::filesystem::path, std::filesystem::path> moved_dirs_;
  std::vector<std::string> notes_;
  std::map<std::string, Missing> not_found_;
};

}  // namespace engine
