#include "tokenizer/utf8.h"

#include <unicode/brkiter.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/ustring.h>
#include <unicode/utext.h>

#include <cctype>
#include <memory>

namespace engine::tokenizer {
namespace {

constexpr char32_t kReplacement = 0xFFFD;

}  // namespace

char32_t NextCodePoint(std::string_view text, size_t* pos) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(*pos);
  if (lead < 0x80) {
    ++*pos;
    return lead;
  }
  size_t length = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
  char32_t c = lead & (lead >= 0xF0 ? 0x07 : lead >= 0xE0 ? 0x0F : 0x1F);
  for (size_t k = 1; k < length && *pos + k < text.size(); ++k)
    c = (c << 6) | (byte(*pos + k) & 0x3F);
  *pos += length;
  return c;
}

char32_t PreviousCodePoint(std::string_view text, size_t end, size_t* start) {
  size_t begin = end - 1;
  while (begin > 0 && IsContinuationByte(static_cast<unsigned char>(text[begin]))) --begin;
  *start = begin;
  size_t pos = begin;
  return NextCodePoint(text, &pos);
}

bool IsValidUtf8(std::string_view bytes) {
  size_t invalid = 0;
  for (size_t pos = 0; pos < bytes.size();) {
    const size_t length = Utf8SequenceLength(bytes.substr(pos), &invalid);
    if (length == 0) return false;
    pos += length;
  }
  return true;
}

std::string ToValidUtf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t invalid = 0;
  for (size_t pos = 0; pos < bytes.size();) {
    const size_t length = Utf8SequenceLength(bytes.substr(pos), &invalid);
    if (length == 0) {
      AppendUtf8(kReplacement, &out);
      pos += invalid;
    } else {
      out.append(bytes.substr(pos, length));
      pos += length;
    }
  }
  return out;
}

bool IsWhitespace(char32_t c) { return u_isUWhiteSpace(static_cast<UChar32>(c)); }

bool IsAlphanumeric(char32_t c) {
  const auto code = static_cast<UChar32>(c);
  if (u_hasBinaryProperty(code, UCHAR_ALPHABETIC)) return true;
  const int8_t type = u_charType(code);
  return type == U_DECIMAL_DIGIT_NUMBER || type == U_LETTER_NUMBER || type == U_OTHER_NUMBER;
}

bool IsPunctuation(char32_t c) {
  if (c < 0x80) return c > 0x20 && c < 0x7F && !std::isalnum(static_cast<int>(c));
  switch (u_charType(static_cast<UChar32>(c))) {
    case U_CONNECTOR_PUNCTUATION:
    case U_DASH_PUNCTUATION:
    case U_START_PUNCTUATION:
    case U_END_PUNCTUATION:
    case U_INITIAL_PUNCTUATION:
    case U_FINAL_PUNCTUATION:
    case U_OTHER_PUNCTUATION:
      return true;
    default:
      return false;
  }
}

bool IsOther(char32_t c) {
  switch (u_charType(static_cast<UChar32>(c))) {
    case U_CONTROL_CHAR:
    case U_FORMAT_CHAR:
    case U_SURROGATE:
    case U_PRIVATE_USE_CHAR:
      return true;
    default:
      return false;
  }
}

bool IsNonspacingMark(char32_t c) {
  return u_charType(static_cast<UChar32>(c)) == U_NON_SPACING_MARK;
}

bool IsMark(char32_t c) {
  const int8_t type = u_charType(static_cast<UChar32>(c));
  return type == U_NON_SPACING_MARK || type == U_COMBINING_SPACING_MARK || type == U_ENCLOSING_MARK;
}

void AppendLowercase(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c));
    return;
  }
  // One character alone: ICU's full mapping without the context a final sigma needs.
  UChar source[2];
  int32_t length = 0;
  U16_APPEND_UNSAFE(source, length, static_cast<UChar32>(c));
  UChar lower[8];
  UErrorCode error = U_ZERO_ERROR;
  const int32_t lower_length = u_strToLower(lower, 8, source, length, "", &error);
  if (U_FAILURE(error)) {
    AppendUtf8(c, out);
    return;
  }
  for (int32_t i = 0; i < lower_length;) {
    UChar32 code_point;
    U16_NEXT(lower, i, lower_length, code_point);
    AppendUtf8(static_cast<char32_t>(code_point), out);
  }
}

std::vector<size_t> GraphemeStarts(std::string_view text) {
  std::vector<size_t> starts;
  if (text.empty()) return starts;
  // One iterator is made once; each call clones it (creating one loads ICU's rules, cloning does
  // not).
  static const icu::BreakIterator* const kPrototype = [] {
    UErrorCode created = U_ZERO_ERROR;
    icu::BreakIterator* prototype =
        icu::BreakIterator::createCharacterInstance(icu::Locale::getRoot(), created);
    return U_SUCCESS(created) ? prototype : nullptr;
  }();
  UErrorCode error = kPrototype == nullptr ? U_MISSING_RESOURCE_ERROR : U_ZERO_ERROR;
  UText* utext = utext_openUTF8(nullptr, text.data(), static_cast<int64_t>(text.size()), &error);
  std::unique_ptr<icu::BreakIterator> breaks(U_SUCCESS(error) ? kPrototype->clone() : nullptr);
  if (breaks == nullptr && U_SUCCESS(error)) error = U_MEMORY_ALLOCATION_ERROR;
  if (U_SUCCESS(error)) breaks->setText(utext, error);
  if (U_FAILURE(error)) {  // ICU's data is built in; this does not happen. Each character alone.
    for (size_t pos = 0; pos < text.size(); NextCodePoint(text, &pos)) starts.push_back(pos);
  } else {
    // Over UTF-8 text, ICU's boundaries are byte offsets.
    for (int32_t at = breaks->first();
         at != icu::BreakIterator::DONE && static_cast<size_t>(at) < text.size();
         at = breaks->next()) {
      starts.push_back(static_cast<size_t>(at));
    }
  }
  utext_close(utext);
  return starts;
}

std::string NormalizeUnicode(std::string_view text, UnicodeForm form) {
  UErrorCode error = U_ZERO_ERROR;
  const icu::Normalizer2* normalizer = nullptr;
  switch (form) {
    case UnicodeForm::kNfc:
      normalizer = icu::Normalizer2::getNFCInstance(error);
      break;
    case UnicodeForm::kNfd:
      normalizer = icu::Normalizer2::getNFDInstance(error);
      break;
    case UnicodeForm::kNfkc:
      normalizer = icu::Normalizer2::getNFKCInstance(error);
      break;
    case UnicodeForm::kNfkd:
      normalizer = icu::Normalizer2::getNFKDInstance(error);
      break;
  }
  if (U_FAILURE(error)) return std::string(text);  // ICU's data is built in; this does not happen.
  const icu::UnicodeString source = icu::UnicodeString::fromUTF8(
      icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
  icu::UnicodeString result = normalizer->normalize(source, error);
  if (U_FAILURE(error)) return std::string(text);
  std::string out;
  result.toUTF8String(out);
  return out;
}

}  // namespace engine::tokenizer
