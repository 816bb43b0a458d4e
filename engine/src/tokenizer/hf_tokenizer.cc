#include "tokenizer/hf_tokenizer.h"

#include "engine/untrusted_file.h"
#include "tokenizer/utf8.h"

namespace engine::tokenizer {

StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::FromFile(const std::filesystem::path& path) {
  ENGINE_ASSIGN_OR_RETURN(const std::string bytes, ReadUntrustedFile(path, FileKind::kTokenizer));
  return FromJson(bytes, path.string());
}

StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::FromJson(std::string_view text,
                                                             const std::string& origin) {
  Json json = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return DataLossError("'" + origin + "' is not valid JSON");
  if (!json.is_object()) return DataLossError("'" + origin + "' is not a JSON object");
  auto tokenizer = std::unique_ptr<HfTokenizer>(new HfTokenizer());
  const Status parsed = tokenizer->ParseComponents(json);
  if (!parsed.ok()) return parsed.WithContext("'" + origin + "'");
  return tokenizer;
}

Status HfTokenizer::ParseComponents(const Json& json) {
  const Json null;
  const auto field = [&](const char* key) -> const Json& {
    const auto found = json.find(key);
    return found == json.end() ? null : *found;
  };
  if (field("model").is_null()) return FieldError("model", "is missing");
  ENGINE_ASSIGN_OR_RETURN(normalizer_, ParseNormalizer(field("normalizer"), "normalizer"));
  ENGINE_ASSIGN_OR_RETURN(pre_tokenizer_,
                          ParsePreTokenizer(field("pre_tokenizer"), "pre_tokenizer"));
  ENGINE_ASSIGN_OR_RETURN(model_, ParseModel(field("model"), "model"));
  ENGINE_ASSIGN_OR_RETURN(post_processor_,
                          PostProcessor::Parse(field("post_processor"), "post_processor"));
  ENGINE_ASSIGN_OR_RETURN(decoder_, ParseDecoder(field("decoder"), "decoder"));
  ENGINE_ASSIGN_OR_RETURN(
      added_, AddedVocabulary::Parse(field("added_tokens"), "added_tokens", normalizer_.get()));
  return Status::Ok();
}

std::vector<Piece> HfTokenizer::ExtractAndNormalize(std::string_view text) const {
  Piece whole;
  whole.text = AsValidUtf8(text);
  whole.at_origin = true;
  std::vector<Piece> raw;
  added_.Split(whole, /*normalized=*/false, &raw);
  std::vector<Piece> pieces;
  for (Piece& piece : raw) {
    if (piece.added_id >= 0) {
      pieces.push_back(std::move(piece));
      continue;
    }
    if (normalizer_ != nullptr) piece.text = normalizer_->Normalize(std::move(piece.text));
    added_.Split(piece, /*normalized=*/true, &pieces);
  }
  return pieces;
}

std::string HfTokenizer::Normalize(std::string_view text) const {
  return normalizer_ == nullptr ? AsValidUtf8(text) : normalizer_->Normalize(AsValidUtf8(text));
}

// Added tokens, the pieces between them and the pre-tokenizer's words are encoded independently
// of what follows them, so stopping after `max_tokens` keeps exactly the first ids of the whole.
std::vector<int64_t> HfTokenizer::Encode(std::string_view text, bool add_special_tokens,
                                         size_t max_tokens) const {
  std::vector<int64_t> ids;
  std::vector<Piece> words;
  for (const Piece& piece : ExtractAndNormalize(text)) {
    if (ids.size() >= max_tokens) break;
    if (piece.added_id >= 0) {
      ids.push_back(piece.added_id);
      continue;
    }
    words.clear();
    if (pre_tokenizer_ != nullptr) {
      pre_tokenizer_->Split(piece, &words);
    } else {
      words.push_back(piece);
    }
    for (const Piece& word : words) {
      if (ids.size() >= max_tokens) break;
      model_->Encode(word.text, &ids);
    }
  }
  if (ids.size() > max_tokens) ids.resize(max_tokens);
  return add_special_tokens ? post_processor_.Apply(ids) : ids;
}

std::string HfTokenizer::Decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int64_t id : ids) {
    if (skip_special_tokens && IsSpecial(id)) continue;
    if (const std::string* token = Token(id)) tokens.push_back(*token);
  }
  return DecodeTokens(decoder_.get(), std::move(tokens));
}

int64_t HfTokenizer::vocab_size() const {
  int64_t size = model_->size();
  for (const AddedToken& token : added_.tokens()) size = std::max(size, token.id + 1);
  return size;
}

int64_t HfTokenizer::TokenId(const std::string& token) const {
  const int64_t added = added_.Id(token);
  return added >= 0 ? added : model_->Id(token);
}

const std::string* HfTokenizer::Token(int64_t id) const {
  if (const AddedToken* added = added_.Find(id)) return &added->content;
  return model_->Token(id);
}

bool HfTokenizer::IsSpecial(int64_t id) const {
  const AddedToken* added = added_.Find(id);
  return added != nullptr && added->special;
}

}  // namespace engine::tokenizer
