#include "tokenizer/wordpiece_model.h"

#include "tokenizer/utf8.h"

namespace engine::tokenizer {

StatusOr<std::unique_ptr<Model>> WordPieceModel::Parse(const Json& json, const std::string& path) {
  auto model = std::unique_ptr<WordPieceModel>(new WordPieceModel());
  ENGINE_ASSIGN_OR_RETURN(const Json* vocab, ObjectField(json, "vocab", path));
  ENGINE_ASSIGN_OR_RETURN(model->vocab_, Vocabulary::FromObject(*vocab, path + ".vocab"));
  ENGINE_ASSIGN_OR_RETURN(std::string unk, StringField(json, "unk_token", path, "[UNK]"));
  model->unk_id_ = static_cast<int32_t>(model->vocab_.Id(unk));
  if (model->unk_id_ < 0) {
    return FieldError(path + ".unk_token", "'" + unk + "' is not in the vocabulary");
  }
  ENGINE_ASSIGN_OR_RETURN(model->prefix_,
                          StringField(json, "continuing_subword_prefix", path, "##"));
  ENGINE_ASSIGN_OR_RETURN(model->max_chars_, IntField(json, "max_input_chars_per_word", path, 100));
  if (model->max_chars_ < 0) {
    return FieldError(path + ".max_input_chars_per_word", "must not be negative");
  }
  return std::unique_ptr<Model>(std::move(model));
}

void WordPieceModel::Encode(std::string_view word, std::vector<int64_t>* ids) const {
  if (word.empty()) return;
  int64_t chars = 0;
  for (size_t pos = 0; pos < word.size() && chars <= max_chars_; ++chars) NextCodePoint(word, &pos);
  if (chars > max_chars_) {
    ids->push_back(unk_id_);
    return;
  }
  const size_t first = ids->size();
  std::string candidate;
  for (size_t start = 0; start < word.size();) {
    // No entry is longer than the vocabulary's longest token, so the search starts there.
    const size_t longest =
        vocab_.longest() - (start > 0 ? std::min(prefix_.size(), vocab_.longest()) : 0);
    size_t end = std::min(word.size(), start + longest);
    while (end < word.size() && IsContinuationByte(word[end])) --end;
    int64_t found = -1;
    while (end > start) {
      candidate.assign(start > 0 ? prefix_ : std::string());
      candidate.append(word.substr(start, end - start));
      if ((found = vocab_.Id(candidate)) >= 0) break;
      size_t last = 0;
      PreviousCodePoint(word, end, &last);
      end = last;
    }
    if (found < 0) {
      ids->resize(first);
      ids->push_back(unk_id_);
      return;
    }
    ids->push_back(found);
    start = end;
  }
}

}  // namespace engine::tokenizer
