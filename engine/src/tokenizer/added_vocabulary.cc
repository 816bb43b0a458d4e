#include "tokenizer/added_vocabulary.h"

#include "tokenizer/utf8.h"

namespace engine::tokenizer {
namespace {

bool IsWordChar(char32_t c) { return IsAlphanumeric(c) || c == '_'; }

bool EndsWithWord(const std::string& text, size_t end) {
  if (end == 0) return false;
  size_t start = 0;
  return IsWordChar(PreviousCodePoint(text, end, &start));
}

bool StartsWithWord(const std::string& text, size_t begin) {
  if (begin >= text.size()) return false;
  return IsWordChar(NextCodePoint(text, &begin));
}

// Where the whitespace that ends text[0, end) begins.
size_t WhitespaceBefore(const std::string& text, size_t end) {
  while (end > 0) {
    size_t start = 0;
    if (!IsWhitespace(PreviousCodePoint(text, end, &start))) break;
    end = start;
  }
  return end;
}

// Where the whitespace that starts text[begin, ...) ends.
size_t WhitespaceAfter(const std::string& text, size_t begin) {
  while (begin < text.size()) {
    size_t next = begin;
    if (!IsWhitespace(NextCodePoint(text, &next))) break;
    begin = next;
  }
  return begin;
}

}  // namespace

void AddedVocabulary::Trie::Insert(const std::string& text, int32_t token) {
  if (text.empty()) return;
  int32_t node = 0;
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    auto found = children[node].find(byte);
    if (found == children[node].end()) {
      children.emplace_back();
      token_at.push_back(-1);
      found = children[node].emplace(byte, static_cast<int32_t>(children.size() - 1)).first;
    }
    node = found->second;
  }
  if (token_at[node] < 0) token_at[node] = token;
  empty = false;
}

int32_t AddedVocabulary::Trie::LongestAt(const std::string& text, size_t pos, size_t* end) const {
  int32_t node = 0, best = -1;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto found = children[node].find(static_cast<unsigned char>(text[i]));
    if (found == children[node].end()) break;
    node = found->second;
    if (token_at[node] >= 0) {
      best = token_at[node];
      *end = i + 1;
    }
  }
  return best;
}

StatusOr<AddedVocabulary> AddedVocabulary::Parse(const Json& list, const std::string& path,
                                                 const Normalizer* normalizer) {
  AddedVocabulary vocabulary;
  if (list.is_null()) return vocabulary;
  if (!list.is_array()) return FieldError(path, "must be a list");
  for (size_t i = 0; i < list.size(); ++i) {
    const Json& entry = list[i];
    const std::string where = path + "[" + std::to_string(i) + "]";
    if (!entry.is_object()) return FieldError(where, "must be an object");
    AddedToken token;
    ENGINE_ASSIGN_OR_RETURN(token.id, IntField(entry, "id", where, -1));
    if (token.id < 0) return FieldError(where + ".id", "is required (a non-negative integer)");
    ENGINE_ASSIGN_OR_RETURN(token.content, StringField(entry, "content", where, ""));
    if (token.content.empty()) return FieldError(where + ".content", "is required");
    ENGINE_ASSIGN_OR_RETURN(token.single_word, BoolField(entry, "single_word", where, false));
    ENGINE_ASSIGN_OR_RETURN(token.lstrip, BoolField(entry, "lstrip", where, false));
    ENGINE_ASSIGN_OR_RETURN(token.rstrip, BoolField(entry, "rstrip", where, false));
    ENGINE_ASSIGN_OR_RETURN(token.special, BoolField(entry, "special", where, false));
    ENGINE_ASSIGN_OR_RETURN(token.normalized,
                            BoolField(entry, "normalized", where, !token.special));
    const auto index = static_cast<int32_t>(vocabulary.tokens_.size());
    if (token.normalized) {
      vocabulary.normalized_.Insert(
          normalizer != nullptr ? normalizer->Normalize(token.content) : token.content, index);
    } else {
      vocabulary.raw_.Insert(token.content, index);
    }
    vocabulary.by_id_[token.id] = vocabulary.tokens_.size();
    vocabulary.tokens_.push_back(std::move(token));
  }
  return vocabulary;
}

void AddedVocabulary::Split(const Piece& piece, bool normalized, std::vector<Piece>* out) const {
  const Trie& trie = normalized ? normalized_ : raw_;
  const std::string& text = piece.text;
  if (trie.empty) {
    if (!text.empty()) out->push_back(piece);
    return;
  }
  const auto emit_text = [&](size_t begin, size_t end) {
    if (end <= begin) return;
    Piece part;
    part.text = text.substr(begin, end - begin);
    part.at_origin = piece.at_origin && begin == 0;
    out->push_back(std::move(part));
  };
  size_t emitted = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = 0;
    const int32_t index = trie.LongestAt(text, pos, &end);
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[index];
    if (token.single_word && (EndsWithWord(text, pos) || StartsWithWord(text, end))) {
      pos = end;  // the tokenizers crate drops this match and looks on after it
      continue;
    }
    size_t begin = pos;
    if (token.lstrip) begin = std::max(WhitespaceBefore(text, pos), emitted);
    if (token.rstrip) end = WhitespaceAfter(text, end);
    emit_text(emitted, begin);
    Piece part;
    part.text = text.substr(begin, end - begin);
    part.added_id = token.id;
    out->push_back(std::move(part));
    emitted = pos = end;
  }
  emit_text(emitted, text.size());
}

const AddedToken* AddedVocabulary::Find(int64_t id) const {
  const auto found = by_id_.find(id);
  return found == by_id_.end() ? nullptr : &tokens_[found->second];
}

int64_t AddedVocabulary::Id(const std::string& content) const {
  for (const AddedToken& token : tokens_) {
    if (token.content == content) return token.id;
  }
  return -1;
}

}  // namespace engine::tokenizer
