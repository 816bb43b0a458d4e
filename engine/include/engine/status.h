// Status and StatusOr: errors as values, with context.
//
// Every call that can fail at a plugin boundary, on input from a user, or on the file system
// returns a Status (or a StatusOr<T> holding either a value or an error). Messages are written for
// the person who runs the engine: they say what was wrong, where, and if possible what to do.
// Callers add context as the error travels up, so a user sees "stage 'train' plugin 'digits':
// cannot open '/x.csv': ...".
//
//   StatusOr<int> ParseCount(std::string_view text);
//   ENGINE_ASSIGN_OR_RETURN(int count, ParseCount(text));
//   ENGINE_RETURN_IF_ERROR(WriteAll(path, bytes).WithContext("writing the manifest"));
//
// Thread safety: values; no shared state.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace engine {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // the user's input is wrong (a pipeline field, an option, a flag)
  kNotFound,            // a file, plugin or tensor that was named does not exist
  kFailedPrecondition,  // the request is well-formed but cannot run in this state or on this
                        // machine
  kAlreadyExists,
  kDataLoss,  // a file is corrupt or truncated
  kIo,        // the operating system refused a read or a write
  kAborted,   // stopped on purpose (a signal, a callback's FAIL_STAGE)
  kInternal,  // a bug, or an exception from a plugin or LibTorch
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  // OK.
  Status() = default;
  Status(StatusCode code, std::string message);

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "message" for errors, "OK" otherwise.
  std::string ToString() const;

  // Returns this error with "context: " in front of its message; OK stays OK.
  Status WithContext(std::string_view context) const;

  // Marks a Status as deliberately dropped.
  void IgnoreError() const {}

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

Status InvalidArgumentError(std::string message);
Status NotFoundError(std::string message);
Status FailedPreconditionError(std::string message);
Status AlreadyExistsError(std::string message);
Status DataLossError(std::string message);
Status IoError(std::string message);
Status AbortedError(std::string message);
Status InternalError(std::string message);

// Either a value or an error. Accessing the value of an error is a bug (asserted in debug builds).
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    assert(!status_.ok() && "StatusOr constructed from an OK status without a value");
    if (status_.ok()) status_ = InternalError("StatusOr constructed from an OK status");
  }
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  T& value() & {
    assert(ok());
    return *value_;
  }
  const T& value() const& {
    assert(ok());
    return *value_;
  }
  T&& value() && {
    assert(ok());
    return std::move(*value_);
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  StatusOr WithContext(std::string_view context) && {
    if (!ok()) return StatusOr(status_.WithContext(context));
    return std::move(*this);
  }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace engine

#define ENGINE_STATUS_CONCAT_INNER_(a, b) a##b
#define ENGINE_STATUS_CONCAT_(a, b) ENGINE_STATUS_CONCAT_INNER_(a, b)

// Returns from the current function when `expr` (a Status) is an error.
#define ENGINE_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::engine::Status engine_status_ = (expr);        \
    if (!engine_status_.ok()) return engine_status_; \
  } while (false)

// `lhs` = the value of `expr` (a StatusOr), or returns its error.
#define ENGINE_ASSIGN_OR_RETURN(lhs, expr) \
  ENGINE_ASSIGN_OR_RETURN_IMPL_(ENGINE_STATUS_CONCAT_(engine_statusor_, __LINE__), lhs, expr)
#define ENGINE_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()
