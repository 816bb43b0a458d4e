// Python's str behaviour that filters and methods share.
#include <cctype>

#include "jinja/builtins.h"
#include "jinja/unicode.h"

namespace engine::jinja {

ValueList PySplit(const std::string& s, const std::string* sep, int64_t maxsplit) {
  ValueList out;
  if (sep != nullptr) {
    size_t pos = 0;
    int64_t done = 0;
    while (maxsplit < 0 || done < maxsplit) {
      size_t found = s.find(*sep, pos);
      if (found == std::string::npos) break;
      out.push_back(Value::String(s.substr(pos, found - pos)));
      pos = found + sep->size();
      ++done;
    }
    out.push_back(Value::String(s.substr(pos)));
    return out;
  }
  // Runs of whitespace separate; none at either end makes an empty part.
  std::vector<size_t> offsets = CodePointOffsets(s);
  size_t n = offsets.size() - 1;
  auto space = [&](size_t i) {
    size_t length = 1;
    return IsPythonSpace(DecodeUtf8(s, offsets[i], &length));
  };
  size_t i = 0;
  int64_t done = 0;
  while (true) {
    while (i < n && space(i)) ++i;
    if (i == n) break;
    if (maxsplit >= 0 && done == maxsplit) {
      out.push_back(Value::String(s.substr(offsets[i])));
      break;
    }
    size_t start = i;
    while (i < n && !space(i)) ++i;
    out.push_back(Value::String(s.substr(offsets[start], offsets[i] - offsets[start])));
    ++done;
  }
  return out;
}

std::vector<std::string> PySplitLines(const std::string& s) {
  std::vector<std::string> lines;
  std::vector<size_t> offsets = CodePointOffsets(s);
  size_t start = 0;
  for (size_t i = 0; i + 1 < offsets.size(); ++i) {
    size_t length = 1;
    char32_t cp = DecodeUtf8(s, offsets[i], &length);
    bool is_break = cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C ||
                    cp == 0x1D || cp == 0x1E || cp == 0x85 || cp == 0x2028 || cp == 0x2029;
    if (!is_break) continue;
    lines.push_back(s.substr(start, offsets[i] - start));
    size_t next = offsets[i + 1];
    if (cp == '\r' && next < s.size() && s[next] == '\n') {
      ++i;
      next = offsets[i + 1];
    }
    start = next;
  }
  if (start < s.size()) lines.push_back(s.substr(start));
  return lines;
}

std::string AsciiUpper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string AsciiLower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string PyTitle(const std::string& s) {
  std::string out = s;
  bool previous_cased = false;
  for (char& c : out) {
    unsigned char u = static_cast<unsigned char>(c);
    if (std::isalpha(u)) {
      c = static_cast<char>(previous_cased ? std::tolower(u) : std::toupper(u));
      previous_cased = true;
    } else {
      previous_cased = u >= 0x80 && previous_cased;
    }
  }
  return out;
}

std::string PyCapitalize(const std::string& s) {
  std::string out = AsciiLower(s);
  if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}

int64_t PyLen(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kString:
      return static_cast<int64_t>(CodePointOffsets(v.as_string()).size()) - 1;
    case Value::Kind::kList:
      return static_cast<int64_t>(v.as_list().size());
    case Value::Kind::kDict:
      return static_cast<int64_t>(v.as_dict().size());
    default: {
      std::string type = v.TypeName();
      ThrowError("object of type '" + type.substr(0, type.find(' ')) + "' has no len()");
    }
  }
}

}  // namespace engine::jinja
