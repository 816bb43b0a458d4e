// Errors found in a pipeline file, each with its position, reported all together.
//
//   pipelines/p.pbtxt:12:5: error: stage 'train': schedule.batch_size must be > 0 (got 0)
//
// Lines and columns are 1-based; 0 means "somewhere in this file". Diagnostics are collected rather
// than returned one at a time so that `engine check` can show every problem in one go.
#pragma once

#include <string>
#include <vector>

#include "engine/status.h"

namespace engine {

struct SourceLocation {
  std::string file;
  int line = 0;    // 1-based; 0 when unknown
  int column = 0;  // 1-based; 0 when unknown
  bool known() const { return line > 0; }
};

struct Diagnostic {
  SourceLocation location;
  std::string message;
  // "file:line:col: error: message".
  std::string ToString() const;
};

class Diagnostics {
 public:
  void Add(SourceLocation location, std::string message);
  bool empty() const { return entries_.empty(); }
  size_t size() const { return entries_.size(); }
  const std::vector<Diagnostic>& entries() const { return entries_; }
  // One line per diagnostic.
  std::string ToString() const;
  // An InvalidArgument status holding ToString(), or OK when empty.
  Status ToStatus() const;

 private:
  std::vector<Diagnostic> entries_;
};

}  // namespace engine
