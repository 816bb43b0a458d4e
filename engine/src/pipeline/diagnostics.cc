#include "pipeline/diagnostics.h"

#include "engine/utf8.h"

namespace engine {

std::string Diagnostic::ToString() const {
  std::string out = location.file;
  if (location.line > 0) {
    out += ":" + std::to_string(location.line);
    if (location.column > 0) out += ":" + std::to_string(location.column);
  }
  if (!out.empty()) out += ": ";
  out += "error: " + message;
  // Paths and quoted file bytes may be anything: never raw control bytes on a terminal.
  return Printable(out);
}

void Diagnostics::Add(SourceLocation location, std::string message) {
  entries_.push_back({std::move(location), std::move(message)});
}

std::string Diagnostics::ToString() const {
  std::string out;
  for (const Diagnostic& d : entries_) {
    out += d.ToString();
    out += "\n";
  }
  return out;
}

Status Diagnostics::ToStatus() const {
  if (entries_.empty()) return Status::Ok();
  std::string text = ToString();
  if (!text.empty() && text.back() == '\n') text.pop_back();
  return InvalidArgumentError(std::move(text));
}

}  // namespace engine
