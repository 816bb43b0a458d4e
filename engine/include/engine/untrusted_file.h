// Reading files that come from outside: a model hub's configs, tokenizers, chat templates and
// processors, a dataset's lines and images. Users download these and run them unread, so every
// read is bounded: only regular files (a symlink is followed and what it leads to is checked;
// FIFOs, devices, sockets and directories are refused without blocking), and at most the limit of
// the file's kind, checked before and while reading, so `/dev/zero` or a file that grows while it
// is read never costs more memory than the limit.
//
// The limits have defaults that fit every real file by a wide margin and can be set for a run:
//   ENGINE_FILE_LIMITS="image=512MiB,data=16GiB"   (sizes in bytes, KiB, MiB or GiB)
// A malformed ENGINE_FILE_LIMITS makes every read fail, naming the variable.
//
// Failure is a Status naming the file, what it is instead of a regular file, or its size and the
// limit with the way to raise it. Thread-safe; the environment is read once per process.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "engine/status.h"

namespace engine {

enum class FileKind {
  kConfig,     // config.json, tokenizer_config.json, preprocessor and adapter configs
  kTokenizer,  // tokenizer.json, tokenizer.model
  kTemplate,   // chat_template.jinja and other template files
  kImage,      // an image file named by data or by a command
  kData,       // a data file (JSON Lines, text, CSV), after decompression
  kDataLine,   // one line of a data file
};
inline constexpr FileKind kFileKinds[] = {FileKind::kConfig,   FileKind::kTokenizer,
                                          FileKind::kTemplate, FileKind::kImage,
                                          FileKind::kData,     FileKind::kDataLine};

// "config", "tokenizer", "template", "image", "data", "data_line": the names ENGINE_FILE_LIMITS
// takes.
std::string_view FileKindName(FileKind kind);

// The limit in bytes for `kind`, or the error in ENGINE_FILE_LIMITS.
StatusOr<uint64_t> FileLimit(FileKind kind);

// "config 64 MiB, tokenizer 1 GiB, ..." (as `engine check` prints them), or the error.
StatusOr<std::string> FileLimitsSummary();

// The error for `bytes` of `kind` over its limit, naming `what` (a file, or FILE:LINE) and how to
// raise the limit; OK when within it.
Status CheckFileLimit(FileKind kind, uint64_t bytes, const std::string& what);

// Opens `path` for reading if it is a regular file, without blocking on a FIFO, and sets `size`;
// otherwise the error names the file and what it is ("a FIFO, not a regular `kind` file"). For
// files no limit applies to (weights, which are mapped). The caller owns the descriptor.
StatusOr<int> OpenRegularFile(const std::filesystem::path& path, std::string_view kind,
                              uint64_t* size);

// OpenRegularFile, and the file within the limit of `kind`.
StatusOr<int> OpenUntrustedFile(const std::filesystem::path& path, FileKind kind);

// The whole file, read as OpenUntrustedFile opens it, never more than the limit of `kind`.
StatusOr<std::string> ReadUntrustedFile(const std::filesystem::path& path, FileKind kind);

// Whether `path`, with every symlink resolved, lies inside `dir` (also resolved). Paths that a
// data file names must stay in its directory unless the pipeline allows others.
bool IsInsideDirectory(const std::filesystem::path& path, const std::filesystem::path& dir);

}  // namespace engine
